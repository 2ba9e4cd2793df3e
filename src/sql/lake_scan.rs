//! The lake side of a topic table: an Iceberg scan of one pinned snapshot, planned once (files
//! pruned by partition and file statistics against the pushed filters) and read in parallel.
//!
//! iceberg-rust's own `to_arrow()` decodes every file in the one task that polls its stream, so
//! a scan used one core whatever DataFusion's partitioning. Here the planned file tasks are
//! split into `target_partitions` groups of about equal bytes, and each DataFusion partition
//! reads its group with its own Iceberg `ArrowReader` (field-id projection, schema evolution,
//! delete files and row-group pruning stay Iceberg's).
//!
//! Invariants:
//! - Every planned file task is read by exactly one partition.
//! - Batches leave in exactly the plan's schema (conformed by name and type, see
//!   [`super::tail::conform_batch`]), whatever engine wrote the files.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::ArrowReaderBuilder;
use iceberg::expr::Predicate;
use iceberg::scan::FileScanTask;
use iceberg::table::Table;
use iceberg_datafusion::physical_plan::convert_filters_to_predicate;

use super::tail::conform_batch;

fn external(e: iceberg::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Reads the data files of one snapshot, split across partitions.
#[derive(Debug)]
pub(crate) struct LakeScanExec {
    table: Table,
    snapshot_id: i64,
    predicate: Option<Predicate>,
    /// Invariant: each task appears in exactly one group.
    groups: Vec<Vec<FileScanTask>>,
    files: usize,
    schema: SchemaRef,
    props: Arc<PlanProperties>,
}

impl LakeScanExec {
    /// Plans the scan of `snapshot_id` for the columns of `projected` under `filters`.
    pub async fn plan(
        table: &Table,
        snapshot_id: i64,
        projected: SchemaRef,
        filters: &[Expr],
        partitions: usize,
    ) -> DFResult<LakeScanExec> {
        let predicate = convert_filters_to_predicate(filters);
        let columns: Vec<String> = projected
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let mut builder = table.scan().snapshot_id(snapshot_id).select(columns);
        if let Some(p) = &predicate {
            builder = builder.with_filter(p.clone());
        }
        let scan = builder.build().map_err(external)?;
        let mut tasks: Vec<FileScanTask> = scan
            .plan_files()
            .await
            .map_err(external)?
            .try_collect()
            .await
            .map_err(external)?;
        let files = tasks.len();
        // Largest first into the lightest group: groups of about equal bytes.
        tasks.sort_by_key(|t| std::cmp::Reverse(t.length));
        let n = partitions.clamp(1, files.max(1));
        let mut groups: Vec<(u64, Vec<FileScanTask>)> = (0..n).map(|_| (0, Vec::new())).collect();
        for t in tasks {
            if let Some(g) = groups.iter_mut().min_by_key(|(bytes, _)| *bytes) {
                g.0 += t.length;
                g.1.push(t);
            }
        }
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(projected.clone()),
            Partitioning::UnknownPartitioning(n),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(LakeScanExec {
            table: table.clone(),
            snapshot_id,
            predicate,
            groups: groups.into_iter().map(|(_, g)| g).collect(),
            files,
            schema: projected,
            props,
        })
    }
}

impl DisplayAs for LakeScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergTableScan: table={} snapshot={} files={} partitions={} projection:[{}] predicate:[{}]",
            self.table.identifier(),
            self.snapshot_id,
            self.files,
            self.groups.len(),
            self.schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(","),
            self.predicate
                .as_ref()
                .map_or(String::new(), |p| p.to_string())
        )
    }
}

impl ExecutionPlan for LakeScanExec {
    fn name(&self) -> &str {
        "IcebergTableScan"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let tasks = self.groups.get(partition).cloned().ok_or_else(|| {
            DataFusionError::Internal(format!("lake scan has no partition {partition}"))
        })?;
        let runtime = iceberg::Runtime::try_current().map_err(external)?;
        let reader = ArrowReaderBuilder::new(self.table.file_io().clone(), runtime)
            .with_data_file_concurrency_limit(2)
            .build();
        let schema = self.schema.clone();
        let out = schema.clone();
        let stream = futures::stream::once(async move {
            let tasks = futures::stream::iter(tasks.into_iter().map(Ok)).boxed();
            reader
                .read(tasks)
                .map(|r| r.stream().map_err(external))
                .map_err(external)
        })
        .try_flatten()
        .map(move |b| b.and_then(|b| conform_batch(&b, &out)));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}
