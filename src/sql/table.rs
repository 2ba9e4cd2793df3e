//! One topic as one SQL table: the Iceberg table at the snapshot pinned when the query resolves
//! the table, unioned with the live tail of the ledgers that snapshot does not hold.
//!
//! The seam, per partition `p`:
//! 1. load the table once: its current snapshot `S` and its watermark `W[p]` (the highest
//!    ledger committed; both come from the same metadata file, so they agree);
//! 2. then read the log's last durable position `E[p]`;
//! 3. lake = `S`; tail = the local ledgers `W[p] < id <= E[p].ledger`, entries up to `E[p]`.
//!
//! `S` holds exactly the ledgers `<= W[p]` (the commit protocol, `lake::commit`), the tail holds
//! the rest up to `E[p]`, so every message durable before step 2 is seen once. Offload running
//! meanwhile changes neither: a ledger committed after `S` is still read by the tail (from the
//! newest snapshot if its local copy is deleted during the query, see [`super::tail`]).
//!
//! Invariants:
//! - Both sides produce the table's Arrow schema exactly (lake batches are conformed: names,
//!   types, see [`super::lake_scan`]), so the union is well typed whatever engine wrote the
//!   files.
//! - Filters are pushed to both sides as `Inexact`: the Iceberg scan prunes partitions and files
//!   by statistics, the tail prunes ledgers and entries; DataFusion re-applies them above.

use std::any::Any;
use std::sync::Arc;

use super::lake_scan::{self, LakeSide, ScanRequest};
use super::prune::Bounds;
use super::tail::{TailExec, TailSource};
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::config::ConfigOptions;
use datafusion::common::{DFSchema, Result as DFResult};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter_pushdown::{FilterDescription, FilterPushdownPhase};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};

/// A topic's table (or the lake table alone, as of a snapshot).
#[derive(Debug)]
pub(crate) struct TopicTable {
    schema: SchemaRef,
    /// The Iceberg table and the pinned snapshot (`None`: nothing offloaded yet).
    lake: Option<LakeSide>,
    /// The live tail (`None` for time travel: lake only).
    tail: Option<Arc<TailSource>>,
}

impl TopicTable {
    pub fn new(
        schema: SchemaRef,
        lake: Option<LakeSide>,
        tail: Option<Arc<TailSource>>,
    ) -> TopicTable {
        TopicTable { schema, lake, tail }
    }
}

#[async_trait]
impl TableProvider for TopicTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let projected = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let mut inputs: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        if let Some(side) = &self.lake {
            let request = ScanRequest {
                table_schema: &self.schema,
                projection,
                projected: projected.clone(),
                filters,
                limit,
            };
            inputs.push(lake_scan::plan(side, state, request).await?);
        }
        if let Some(tail) = &self.tail {
            let predicate = match conjunction(filters.iter().cloned()) {
                None => None,
                Some(expr) => {
                    let df_schema = DFSchema::try_from(self.schema.as_ref().clone())?;
                    Some(state.create_physical_expr(expr, &df_schema)?)
                }
            };
            inputs.push(Arc::new(TailExec::new(
                tail.clone(),
                projection.cloned(),
                projected.clone(),
                Bounds::from_filters(filters),
                predicate,
            )));
        }
        match inputs.len() {
            0 => Ok(Arc::new(EmptyExec::new(projected))),
            1 => Ok(inputs.remove(0)),
            _ => Ok(Arc::new(SeamExec::new(inputs)?)),
        }
    }
}

/// The lake scan and the tail side by side: the partitions of each, in order (a union).
///
/// DataFusion's own `UnionExec` takes projections into its children, and DataFusion 53 then
/// mis-orders a sort above it when the projection names one column twice (`SELECT partition AS
/// c0, ... ORDER BY ..., partition`: SanityCheckPlan). This node leaves projections above it
/// and otherwise passes filters and limits through as a union does.
#[derive(Debug)]
pub(crate) struct SeamExec {
    inputs: Vec<Arc<dyn ExecutionPlan>>,
    props: Arc<PlanProperties>,
}

impl SeamExec {
    fn new(inputs: Vec<Arc<dyn ExecutionPlan>>) -> DFResult<SeamExec> {
        let Some(first) = inputs.first() else {
            return datafusion::common::internal_err!("a seam of no inputs");
        };
        let partitions = inputs
            .iter()
            .map(|i| i.output_partitioning().partition_count())
            .sum();
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(first.schema()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(SeamExec { inputs, props })
    }
}

impl DisplayAs for SeamExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "LakeAndTailExec")
    }
}

impl ExecutionPlan for SeamExec {
    fn name(&self) -> &str {
        "LakeAndTailExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.inputs.iter().collect()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(SeamExec::new(children)?))
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false; self.inputs.len()]
    }

    fn supports_limit_pushdown(&self) -> bool {
        true
    }

    fn gather_filters_for_pushdown(
        &self,
        _phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> DFResult<FilterDescription> {
        FilterDescription::from_children(parent_filters, &self.children())
    }

    fn execute(
        &self,
        mut partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        for input in &self.inputs {
            let count = input.output_partitioning().partition_count();
            if partition < count {
                return input.execute(partition, context);
            }
            partition -= count;
        }
        datafusion::common::internal_err!("LakeAndTailExec has no partition {partition}")
    }
}
