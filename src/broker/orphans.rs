//! Orphaned topics: a node that dies leaves the open ledgers its bookie wrote open. A topic with
//! a client is taken over when that client looks it up again; an idle one would stay as it is,
//! and every read of it elsewhere (SQL on any node, `verify`) would fail on the dead bookie. So
//! each node watches the live bookies and, when one goes, loads every topic whose open
//! replicated ledger it wrote and that placement gives to this node: loading fences the ledger
//! on its replicas, recovers it and seals it (as a lookup would), after which any node reads
//! it from the replicas. The topic is then unloaded when idle, like any other.
//!
//! Invariants:
//! - A topic is only loaded where placement puts it, through [`Broker::topic`], so the claim
//!   (compare-and-set on its owner key) still decides between nodes whose views differ.
//! - Open ledgers without replicas are left alone: nobody can recover them but their own
//!   bookie (`OwnershipError::HolderDown` until it returns).
//! - Driven by the registrations' watch (list, then every change after it): a node that
//!   registers and dies between two looks is still seen going. A bookie stays pending until a
//!   scan for it finished without an error; nothing scans the topics on a timer.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::Broker;
use crate::cluster::membership::NodeRecord;
use crate::cluster::ownership::Placement;
use crate::coord::WatchEvent;
use crate::ledger::LedgerState;
use crate::naming::TopicName;

/// The wait before a failed scan, or a failed listing of the nodes, is tried again.
pub const RETRY: Duration = Duration::from_secs(5);

impl Broker {
    /// Starts watching for bookies that go, and taking over their idle topics placed here.
    pub(crate) fn spawn_orphan_takeover(self: &Arc<Self>) {
        let broker = self.clone();
        self.tasks.spawn(async move {
            // Registration key → bookie id of every node seen registered.
            let mut known: HashMap<String, String> = HashMap::new();
            let mut pending: BTreeSet<String> = BTreeSet::new();
            loop {
                let (nodes, mut watch) = tokio::select! {
                    _ = broker.stop.cancelled() => return,
                    listed = broker.ownership.watch_nodes() => match listed {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::debug!(error = %e, "listing the nodes failed; retrying");
                            tokio::time::sleep(RETRY).await;
                            continue;
                        }
                    },
                };
                // Nodes that went while no watch ran.
                let now: HashMap<String, String> =
                    nodes.into_iter().map(|(k, n)| (k, n.bookie)).collect();
                let live: HashSet<&String> = now.values().collect();
                pending.extend(known.values().filter(|b| !live.contains(b)).cloned());
                known = now;
                let mut retry_at = tokio::time::Instant::now();
                loop {
                    let scan = !pending.is_empty();
                    let event = tokio::select! {
                        _ = broker.stop.cancelled() => return,
                        e = watch.next() => e,
                        () = tokio::time::sleep_until(retry_at), if scan => {
                            match broker.take_over_orphans(&pending).await {
                                Ok(()) => pending.clear(),
                                Err(e) => {
                                    tracing::warn!(error = %e, "taking over the topics of a gone bookie failed; retrying");
                                    retry_at = tokio::time::Instant::now() + RETRY;
                                }
                            }
                            continue;
                        }
                    };
                    match event {
                        None => break,
                        Some(WatchEvent::Put { key, value, .. }) => {
                            if let Ok(node) = NodeRecord::decode(&value) {
                                pending.remove(&node.bookie);
                                // The same node id with another bookie: the old one is gone.
                                if let Some(old) = known.insert(key, node.bookie.clone()) {
                                    if old != node.bookie {
                                        pending.insert(old);
                                    }
                                }
                            }
                        }
                        Some(WatchEvent::Delete { key, .. }) => {
                            if let Some(bookie) = known.remove(&key) {
                                pending.insert(bookie);
                            }
                        }
                    }
                }
            }
        });
    }

    /// Loads every topic placed here whose open, replicated ledger one of `gone` wrote.
    async fn take_over_orphans(&self, gone: &BTreeSet<String>) -> Result<(), String> {
        let meta = self.metadata();
        let open = meta
            .ledgers_in_states(&[LedgerState::Open])
            .await
            .map_err(|e| e.to_string())?;
        let topics: BTreeSet<_> = open
            .iter()
            .filter(|l| gone.contains(&l.bookie) && !l.replicas.is_empty())
            .map(|l| l.topic_id)
            .collect();
        tracing::info!(
            ?gone,
            topics = topics.len(),
            "bookies gone: taking over their idle topics placed here"
        );
        let mut failed = None;
        for id in topics {
            let Some(topic) = meta.get_topic_by_id(id).await.map_err(|e| e.to_string())? else {
                continue;
            };
            let Ok(name) = topic.name.parse::<TopicName>() else {
                continue;
            };
            match self.placement(&name, false).await {
                Ok(Placement::Local { .. }) => {}
                Ok(Placement::Remote { .. }) => continue,
                Err(e) => {
                    failed = Some(format!("{name}: {e}"));
                    continue;
                }
            }
            match self.topic(&name).await {
                Ok(_) => {
                    tracing::info!(topic = %name, "took over an idle topic whose writer is gone")
                }
                Err(e) => failed = Some(format!("{name}: {e}")),
            }
        }
        failed.map_or(Ok(()), Err)
    }
}
