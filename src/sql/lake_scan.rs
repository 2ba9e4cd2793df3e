//! The lake side of a topic table: one pinned snapshot, its files planned once by Iceberg
//! (partition and file-statistics pruning against the pushed filters), then read in parallel.
//!
//! Two readers, chosen per scan:
//! - **DataFusion's Parquet reader** (`DataSourceExec`), when every planned file is a plain data
//!   file (no delete files) in the warehouse's store: row-group and page-index pruning, filters
//!   evaluated while decoding (only the rows they keep are decoded for the other columns),
//!   footers cached across queries in the engine's metadata cache, byte-range splitting of large
//!   files. Columns are matched by name and cast to the table's types (typed columns are only
//!   ever added, never renamed, so a file lacking one reads it as null).
//! - **Iceberg's `ArrowReader`** ([`LakeScanExec`]) otherwise: field-id projection, delete files
//!   and schema evolution stay Iceberg's. iceberg-rust's own `to_arrow()` decodes every file in
//!   the one task that polls its stream, so the planned tasks are split into `target_partitions`
//!   groups of about equal bytes, each read by its own reader.
//!
//! Invariants:
//! - Every planned file is read by exactly one partition (whole, or as disjoint byte ranges).
//! - Batches leave in exactly the plan's schema (Iceberg's reader: conformed by name and type,
//!   see [`super::tail::conform_batch`]; DataFusion's: its schema adapter casts to the table's
//!   schema), whatever engine wrote the files.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::config::TableParquetOptions;
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{DataFusionError, Result as DFResult, ScalarValue};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::object_store::ObjectStoreUrl;
use datafusion::datasource::physical_plan::parquet::CachedParquetFileReaderFactory;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::ArrowReaderBuilder;
use iceberg::expr::{Predicate, Reference};
use iceberg::scan::FileScanTask;
use iceberg::spec::{DataFileFormat, Datum};
use iceberg::table::Table;
use iceberg_datafusion::physical_plan::convert_filters_to_predicate;

use super::tail::conform_batch;
use crate::lake::schema::partition_topic;
use crate::lake::LakeHandle;

/// The URL the warehouse's scan store is registered under in every SQL session's runtime.
pub(crate) const LAKE_STORE_URL: &str = "ledgerlake-lake://warehouse/";

fn external(e: iceberg::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// The lake side of one table in a query.
#[derive(Debug, Clone)]
pub(crate) struct LakeSide {
    pub table: Table,
    /// Invariant: a snapshot of `table`, pinned when the query resolved the table.
    pub snapshot: i64,
    /// Where the table's files are read from by DataFusion's reader.
    pub lake: LakeHandle,
    /// In a namespace's shared table, the topic whose rows this side reads (`None`: the
    /// table is the topic's own).
    /// Invariant: then only files whose `identity(topic)` partition value is this topic are
    /// planned, so every row read is the topic's.
    pub topic: Option<String>,
}

/// What a scan of the lake side reads: the table's full schema, the projected columns, the
/// pushed filters and an optional row limit (from the table provider's `scan`).
pub(crate) struct ScanRequest<'a> {
    pub table_schema: &'a SchemaRef,
    pub projection: Option<&'a Vec<usize>>,
    pub projected: SchemaRef,
    pub filters: &'a [Expr],
    pub limit: Option<usize>,
}

/// Plans the scan of `side` for `request`: files planned by Iceberg, read by DataFusion's
/// Parquet reader when they allow it, else by Iceberg's.
pub(crate) async fn plan(
    side: &LakeSide,
    state: &dyn Session,
    request: ScanRequest<'_>,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let own = side
        .topic
        .as_ref()
        .map(|t| Reference::new(crate::lake::schema::TOPIC_COLUMN).equal_to(Datum::string(t)));
    let predicate = convert_filters_to_predicate(&prunable(request.filters));
    let with_own = |p: Option<Predicate>| match (p, own.clone()) {
        (Some(p), Some(o)) => Some(p.and(o)),
        (p, o) => p.or(o),
    };
    let columns: Vec<String> = request
        .projected
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let (tasks, predicate) = match plan_files(side, &columns, with_own(predicate.clone())).await {
        Ok(tasks) => (tasks, with_own(predicate)),
        // The filters are hints (DataFusion applies them above): a predicate Iceberg cannot
        // bind costs pruning, not the query.
        Err(e) if predicate.is_some() => {
            tracing::debug!(error = %e, "lake scan planned without its predicate");
            (plan_files(side, &columns, own.clone()).await?, own.clone())
        }
        Err(e) => return Err(e),
    };
    let tasks = own_files(side, tasks)?;
    if tasks.is_empty() {
        return Ok(Arc::new(EmptyExec::new(request.projected)));
    }
    let partitions = state.config().target_partitions();
    match plain_files(&side.lake, &tasks) {
        Some(files) => parquet_scan(state, files, request, partitions),
        None => Ok(Arc::new(LakeScanExec::new(
            side,
            predicate,
            tasks,
            request.projected,
            partitions,
        ))),
    }
}

/// The files of `side`'s snapshot that may hold rows `predicate` keeps.
async fn plan_files(
    side: &LakeSide,
    columns: &[String],
    predicate: Option<Predicate>,
) -> DFResult<Vec<FileScanTask>> {
    let mut builder = side
        .table
        .scan()
        .snapshot_id(side.snapshot)
        .select(columns.iter().cloned());
    if let Some(p) = predicate {
        builder = builder.with_filter(p);
    }
    let scan = builder.build().map_err(external)?;
    scan.plan_files()
        .await
        .map_err(external)?
        .try_collect()
        .await
        .map_err(external)
}

/// In a shared table, the planned files of the side's topic: each file of ours holds one
/// topic (partitioned by `identity(topic)` first); a file without a topic partition value
/// (an outside engine rewrote the table under another spec) cannot be read exactly here.
fn own_files(side: &LakeSide, tasks: Vec<FileScanTask>) -> DFResult<Vec<FileScanTask>> {
    let Some(topic) = &side.topic else {
        return Ok(tasks);
    };
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        match t.partition.as_ref().and_then(partition_topic) {
            Some(s) => {
                if s == topic {
                    out.push(t);
                }
            }
            None => {
                return Err(DataFusionError::Execution(format!(
                    "data file {} of the shared table {} is not partitioned by topic",
                    t.data_file_path,
                    side.table.identifier()
                )))
            }
        }
    }
    Ok(out)
}

/// The filters Iceberg may prune with: those without a cast (iceberg-datafusion 0.10 drops a
/// cast over a column and compares the bare column with the literal: `CAST(x AS REAL) = l`
/// pruned as `x = l`, wrong rows) and without a 32-bit float literal (it converts them to
/// doubles that a `float` column cannot bind). The others still filter, above the scan.
fn prunable(filters: &[Expr]) -> Vec<Expr> {
    filters
        .iter()
        .filter(|f| {
            !f.exists(|e| {
                Ok(matches!(
                    e,
                    Expr::Cast(_) | Expr::TryCast(_) | Expr::Literal(ScalarValue::Float32(_), _)
                ))
            })
            .unwrap_or(true)
        })
        .cloned()
        .collect()
}

/// The planned files as DataFusion files, `None` when one needs Iceberg's reader (it has
/// delete files, is not Parquet, is read in part, or lies outside the warehouse's store).
fn plain_files(lake: &LakeHandle, tasks: &[FileScanTask]) -> Option<Vec<PartitionedFile>> {
    tasks
        .iter()
        .map(|t| {
            let whole = t.start == 0 && t.length == t.file_size_in_bytes;
            if !t.deletes.is_empty() || t.data_file_format != DataFileFormat::Parquet || !whole {
                return None;
            }
            let path = lake.lake().object_path(&t.data_file_path)?;
            let mut file = PartitionedFile::new("", t.file_size_in_bytes);
            file.object_meta.location = path;
            Some(file)
        })
        .collect()
}

/// DataFusion's Parquet scan of `files`, balanced over `partitions` groups by bytes.
fn parquet_scan(
    state: &dyn Session,
    files: Vec<PartitionedFile>,
    request: ScanRequest<'_>,
    partitions: usize,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let url = ObjectStoreUrl::parse(LAKE_STORE_URL)?;
    let store = state.runtime_env().object_store(&url)?;
    let cache = state.runtime_env().cache_manager.get_file_metadata_cache();
    // Strings are read as views, the table's type for them (`catalog::iceberg_to_arrow`).
    let options = TableParquetOptions::default();
    // No predicate here: DataFusion's physical filter pushdown hands the filters above the
    // scan to the source (row groups, pages, rows), once.
    let source = ParquetSource::new(request.table_schema.clone())
        .with_table_parquet_options(options)
        .with_parquet_file_reader_factory(Arc::new(CachedParquetFileReaderFactory::new(
            store, cache,
        )))
        .with_enable_page_index(true)
        .with_pushdown_filters(true)
        .with_reorder_filters(true);
    let config = FileScanConfigBuilder::new(url, Arc::new(source))
        .with_file_groups(
            balanced(files, partitions, |f| f.object_meta.size)
                .into_iter()
                .map(FileGroup::from)
                .collect(),
        )
        .with_projection_indices(request.projection.cloned())?
        .with_limit(request.limit)
        .build();
    Ok(DataSourceExec::from_data_source(config))
}

/// `items` in `n` groups (at most one per item) of about equal size: largest first into the
/// lightest group.
fn balanced<T>(mut items: Vec<T>, n: usize, size: impl Fn(&T) -> u64) -> Vec<Vec<T>> {
    items.sort_by_key(|t| std::cmp::Reverse(size(t)));
    let n = n.clamp(1, items.len().max(1));
    let mut groups: Vec<(u64, Vec<T>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for item in items {
        if let Some(g) = groups.iter_mut().min_by_key(|(bytes, _)| *bytes) {
            g.0 += size(&item);
            g.1.push(item);
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// Reads the data files of one snapshot with Iceberg's reader, split across partitions.
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
    fn new(
        side: &LakeSide,
        predicate: Option<Predicate>,
        tasks: Vec<FileScanTask>,
        projected: SchemaRef,
        partitions: usize,
    ) -> LakeScanExec {
        let files = tasks.len();
        let groups = balanced(tasks, partitions, |t| t.length);
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(projected.clone()),
            Partitioning::UnknownPartitioning(groups.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        LakeScanExec {
            table: side.table.clone(),
            snapshot_id: side.snapshot,
            predicate,
            groups,
            files,
            schema: projected,
            props,
        }
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
