//! Load reports: every node publishes its load under `load/<node id>`, an ephemeral key of its
//! session, for the load managers of all nodes ([`crate::broker`]'s `balance`). A report of a
//! node that stopped goes with its session; one of a stopping (draining) node is not listed.
//!
//! Record: `[format 1][JSON]` of [`LoadReport`].

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::cluster::membership::{Membership, MembershipError};
use crate::coord::{CoordError, Coordination, Expect};

/// Format byte of a load report.
pub const FORMAT: u8 = 1;
/// Where load reports live, relative to the coordination root.
pub const LOAD: &str = "load/";

/// One node's load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadReport {
    /// The node's id.
    pub node: String,
    /// Messages per second in and out over the metrics' rate window, all its topics.
    pub msg_rate: f64,
    /// Topic partitions it serves.
    pub topics: u64,
    /// When it was measured (ms since epoch).
    pub at_ms: i64,
}

/// Errors of load reporting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A stored report could not be read.
    #[error("load report: {0}")]
    Corrupt(String),
    /// The coordination store failed.
    #[error(transparent)]
    Coordination(#[from] CoordError),
    /// Listing the live nodes failed.
    #[error(transparent)]
    Membership(#[from] MembershipError),
}

/// This node's view of the load reports.
#[derive(Debug, Clone)]
pub struct LoadBoard {
    coord: Arc<dyn Coordination>,
    membership: Arc<Membership>,
}

impl LoadBoard {
    /// A board over `coord`, for the node registered by `membership`.
    pub fn new(coord: Arc<dyn Coordination>, membership: Arc<Membership>) -> LoadBoard {
        LoadBoard { coord, membership }
    }

    /// Publishes this node's report (replacing its previous one).
    pub async fn publish(&self, report: &LoadReport) -> Result<(), LoadError> {
        let key = format!("{LOAD}{}", self.membership.me().id);
        let value = crate::versioned::encode(FORMAT, report);
        self.coord.put(&key, &value, Expect::Any, true).await?;
        Ok(())
    }

    /// The reports of the live nodes that are not stopping.
    pub async fn reports(&self) -> Result<Vec<LoadReport>, LoadError> {
        let live: Vec<String> = self
            .membership
            .nodes()
            .await?
            .into_iter()
            .filter(|n| !n.draining)
            .map(|n| n.id)
            .collect();
        let (items, _) = self.coord.list(LOAD).await?;
        let mut out = Vec::new();
        for (_, v) in items {
            let report: LoadReport = crate::versioned::decode(FORMAT, "load report", &v.value)
                .map_err(LoadError::Corrupt)?;
            if live.contains(&report.node) {
                out.push(report);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::membership::tests::record;
    use crate::coord::memory::MemoryCoordination;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn reports_round_trip(node in ".*", whole in 0u64..(1 << 40), topics in any::<u64>(), at in any::<i64>()) {
            // Whole rates: JSON parsing may round a fraction's last bit (a rate is a measure).
            let r = LoadReport { node, msg_rate: whole as f64, topics, at_ms: at };
            let bytes = crate::versioned::encode(FORMAT, &r);
            prop_assert_eq!(bytes[0], FORMAT);
            prop_assert_eq!(crate::versioned::decode(FORMAT, "load report", &bytes), Ok(r));
        }
    }

    #[tokio::test]
    async fn only_live_nodes_that_are_not_stopping_are_listed(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let first = MemoryCoordination::new();
        let second: Arc<dyn Coordination> = Arc::new(first.new_session());
        let first: Arc<dyn Coordination> = Arc::new(first);
        let a = Arc::new(
            Membership::join(first.clone(), record("a:1"), std::time::Duration::ZERO).await?,
        );
        let b = Arc::new(
            Membership::join(second.clone(), record("b:1"), std::time::Duration::ZERO).await?,
        );
        let (board_a, board_b) = (
            LoadBoard::new(first, a),
            LoadBoard::new(second.clone(), b.clone()),
        );
        for (board, node, rate) in [(&board_a, "a:1", 10.0), (&board_b, "b:1", 20.0)] {
            board
                .publish(&LoadReport {
                    node: node.into(),
                    msg_rate: rate,
                    topics: 1,
                    at_ms: 0,
                })
                .await?;
        }
        assert_eq!(board_a.reports().await?.len(), 2);
        b.drain().await?;
        let listed: Vec<String> = board_a
            .reports()
            .await?
            .into_iter()
            .map(|r| r.node)
            .collect();
        assert_eq!(listed, vec!["a:1".to_string()]);
        second.close().await?;
        assert_eq!(board_a.reports().await?.len(), 1);
        Ok(())
    }
}
