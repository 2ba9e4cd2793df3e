//! Joins that give their thread back: a physical optimizer rule that puts DataFusion's
//! `CooperativeExec` above every join.
//!
//! A query stops (cancelled, past its deadline, its client gone) when its task is aborted, and
//! a task is aborted only when it yields. DataFusion makes leaves and exchanges spend tokio's
//! task budget, but a join can turn a few input batches into millions of output batches (a
//! cross join of two 200,000-message topics tests 4 × 10^10 pairs) that the operator above it
//! drains in one loop without ever yielding: such a query ran on for hours after its client
//! got the error, holding a query slot and a query thread. Above a join, every output batch
//! spends budget, so the task yields every 128 batches and an abort lands within
//! milliseconds.
//!
//! Invariant: after this rule, every join's output passes through a `CooperativeExec`.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec, SymmetricHashJoinExec,
};
use datafusion::physical_plan::ExecutionPlan;

/// Puts a `CooperativeExec` above every join.
#[derive(Debug, Default)]
pub(super) struct YieldAboveJoins;

fn is_join(plan: &dyn ExecutionPlan) -> bool {
    let any = plan.as_any();
    any.is::<NestedLoopJoinExec>()
        || any.is::<CrossJoinExec>()
        || any.is::<HashJoinExec>()
        || any.is::<SortMergeJoinExec>()
        || any.is::<SymmetricHashJoinExec>()
}

impl PhysicalOptimizerRule for YieldAboveJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            Ok(if is_join(node.as_ref()) {
                Transformed::yes(Arc::new(CooperativeExec::new(node)) as Arc<dyn ExecutionPlan>)
            } else {
                Transformed::no(node)
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "YieldAboveJoins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn every_join_is_under_a_cooperative_exec() {
        let ctx = SessionContext::new();
        let sql =
            "SELECT count(*) FROM generate_series(1, 10) a CROSS JOIN generate_series(1, 10) b \
                   JOIN generate_series(1, 10) c ON a.value = c.value";
        let plan = ctx
            .sql(sql)
            .await
            .expect("plans")
            .create_physical_plan()
            .await
            .expect("physical plan");
        let plan = YieldAboveJoins
            .optimize(plan, &ConfigOptions::default())
            .expect("optimizes");
        let mut joins = 0;
        plan.apply(|node| {
            for child in node.children() {
                if is_join(child.as_ref()) {
                    joins += 1;
                    assert!(
                        node.as_any().is::<CooperativeExec>(),
                        "{} is under {}",
                        child.name(),
                        node.name()
                    );
                }
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .expect("walks");
        assert!(joins >= 2, "the plan has {joins} joins");
    }
}
