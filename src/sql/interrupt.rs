//! Stopping a query inside an operator's own loop: a per-query cancellation token that every
//! nested-loop join's filter reads before each evaluation.
//!
//! Aborting a query's task (cancel, deadline, client gone) lands only when a task yields, and
//! [`super::coop`] makes every join's *output* spend tokio's budget. But a nested-loop join
//! whose filter keeps no pair tests every buffered left row against a right batch inside one
//! poll before it has a row to emit: a right batch of 8,192 rows against 200,000 left rows is
//! 1.6 × 10^9 filter tests, minutes in one poll. Such a join runs in a task DataFusion spawned
//! (a partition of an exchange); aborting the query drops that task's handle but cannot stop a
//! poll in progress, so the work went on for minutes after the client got its error, holding a
//! query thread (and, with both threads held, every other aborted query waited to be dropped).
//!
//! [`arm`] wraps each nested-loop join's filter in [`InterruptibleExpr`], which fails with
//! [`STOPPED`] once the query's token is cancelled (`SqlEngine::execute` cancels it, through
//! drop guards, when the result stream drops or the query's task ends); the join returns that
//! error from its poll at the next left row (a few milliseconds) and its task ends.
//!
//! Invariants:
//! - After [`arm`], every `NestedLoopJoinExec` filter in the plan is an [`InterruptibleExpr`]
//!   reading the query's token; nothing else in the plan changes.

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::{NestedLoopJoinExec, NestedLoopJoinExecBuilder};
use datafusion::physical_plan::ExecutionPlan;
use tokio_util::sync::CancellationToken;

/// The error an interrupted operator returns (nobody reads it: its query has already ended).
pub(super) const STOPPED: &str = "query stopped (cancelled, timed out or its client went away)";

/// `plan` with every nested-loop join's filter reading `stop`.
pub(super) fn arm(
    plan: Arc<dyn ExecutionPlan>,
    stop: &CancellationToken,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(join) = node.as_any().downcast_ref::<NestedLoopJoinExec>() else {
            return Ok(Transformed::no(node));
        };
        let Some(filter) = join.filter() else {
            return Ok(Transformed::no(node));
        };
        let expr: Arc<dyn PhysicalExpr> = Arc::new(InterruptibleExpr {
            inner: filter.expression().clone(),
            stop: stop.clone(),
        });
        let filter = JoinFilter::new(
            expr,
            filter.column_indices().to_vec(),
            filter.schema().clone(),
        );
        let armed = NestedLoopJoinExecBuilder::from(join)
            .with_filter(Some(filter))
            .build()?;
        Ok(Transformed::yes(Arc::new(armed) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

/// An expression that evaluates `inner` until its query is interrupted, then fails.
#[derive(Debug)]
pub(super) struct InterruptibleExpr {
    inner: Arc<dyn PhysicalExpr>,
    stop: CancellationToken,
}

// By the wrapped expression alone: the token is not part of what the expression computes.
impl PartialEq for InterruptibleExpr {
    fn eq(&self, other: &Self) -> bool {
        self.inner.eq(&other.inner)
    }
}

impl Eq for InterruptibleExpr {}

impl Hash for InterruptibleExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.hash(state);
    }
}

impl fmt::Display for InterruptibleExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl PhysicalExpr for InterruptibleExpr {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn data_type(&self, input_schema: &Schema) -> Result<DataType> {
        self.inner.data_type(input_schema)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.inner.nullable(input_schema)
    }

    fn return_field(&self, input_schema: &Schema) -> Result<FieldRef> {
        self.inner.return_field(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        if self.stop.is_cancelled() {
            return Err(DataFusionError::Execution(STOPPED.to_string()));
        }
        self.inner.evaluate(batch)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.inner]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        match (children.pop(), children.is_empty()) {
            (Some(inner), true) => Ok(Arc::new(InterruptibleExpr {
                inner,
                stop: self.stop.clone(),
            })),
            _ => Err(DataFusionError::Internal(
                "an interruptible expression has exactly one child".into(),
            )),
        }
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt_sql(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;

    // Never true: every pair is tested and none is kept, the shape that looped for minutes.
    const JOIN: &str = "SELECT count(*) FROM range(300) a CROSS JOIN range(300) b \
                        WHERE a.value + b.value < 0";

    async fn armed_plan(stop: &CancellationToken) -> (Arc<dyn ExecutionPlan>, SessionContext) {
        let ctx = SessionContext::new();
        let plan = ctx
            .sql(JOIN)
            .await
            .expect("plans")
            .create_physical_plan()
            .await
            .expect("physical plan");
        (arm(plan, stop).expect("arms"), ctx)
    }

    fn armed_filters(plan: &Arc<dyn ExecutionPlan>) -> (usize, usize) {
        let (mut joins, mut armed) = (0, 0);
        plan.apply(|node| {
            if let Some(join) = node.as_any().downcast_ref::<NestedLoopJoinExec>() {
                joins += 1;
                if join
                    .filter()
                    .is_some_and(|f| f.expression().as_any().is::<InterruptibleExpr>())
                {
                    armed += 1;
                }
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .expect("walks");
        (joins, armed)
    }

    #[tokio::test]
    async fn every_nested_loop_filter_is_armed_and_the_answer_is_unchanged() {
        let stop = CancellationToken::new();
        let (plan, ctx) = armed_plan(&stop).await;
        assert_eq!(armed_filters(&plan), (1, 1));
        let batches = collect(plan, ctx.task_ctx()).await.expect("runs");
        let count = batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .expect("a count")
            .value(0);
        assert_eq!(count, 0);
    }

    #[tokio::test]
    async fn a_cancelled_token_fails_the_join_at_its_next_filter_test() {
        let stop = CancellationToken::new();
        let (plan, ctx) = armed_plan(&stop).await;
        stop.cancel();
        let err = collect(plan, ctx.task_ctx())
            .await
            .expect_err("an interrupted join fails");
        assert!(err.to_string().contains(STOPPED), "{err}");
    }
}
