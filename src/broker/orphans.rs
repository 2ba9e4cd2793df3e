//! Orphaned topics: a node that dies leaves the open ledgers its bookie wrote open. A topic with
//! a client is taken over when that client looks it up again; an idle one would stay as it is,
//! and every read of it elsewhere (SQL on any node, `verify`) would fail on the dead bookie. So
//! each node, when it starts and whenever a registration goes, looks for open ledgers that can
//! be recovered without their writer (replicated, ack quorum of 2 or more) and whose writer's
//! bookie no live node has, and loads each such topic that placement gives to this node. The
//! replicated ledgers this node's own previous process left open are looked for too: their
//! bookie is live again (this node), so no other node takes them over, and without a client
//! they would stay open, never offloaded. Loading such a topic fences the ledger on its
//! replicas, recovers it and seals it (as a lookup would), after which any node reads it from
//! the replicas. The topic is then unloaded when idle, like any other.
//!
//! Invariants:
//! - A topic is only loaded where placement puts it, through [`Broker::topic`], so the claim
//!   (compare-and-set on its owner key) still decides between nodes whose views differ.
//! - The scan works from the current state (open ledgers against registered bookies), not from
//!   remembered departures: a bookie gone before this node started, a topic placed on a node
//!   that died before loading it, a registration lost while the watch was being renewed are all
//!   found by the next scan. Scans run at start, whenever a bookie registered at the last look
//!   is no longer (the membership's watch-fed copy, which the scan and placement read too),
//!   and again while the last one failed (after [`RETRY`], doubling up to [`MAX_RETRY`]; a
//!   topic whose ledger this node's previous process left open and that another node holds
//!   for now counts as failed, so it is looked at again); never on a timer over every topic
//!   otherwise.
//! - A ledger that cannot be recovered without its writer (ack quorum 1, no replicas) is left
//!   to its bookie's return (`OwnershipError::HolderDown` until then) and never rescanned for.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::Broker;
use crate::cluster::ownership::Placement;
use crate::ledger::LedgerState;
use crate::naming::TopicName;

/// The wait before a failed scan, or a failed listing of the nodes, is tried again.
pub const RETRY: Duration = Duration::from_secs(5);
/// The longest wait between scans that keep failing.
pub const MAX_RETRY: Duration = Duration::from_secs(300);

impl Broker {
    /// Starts looking for topics whose writer is gone and taking over those placed here.
    pub(crate) fn spawn_orphan_takeover(self: &Arc<Self>) {
        let broker = self.clone();
        self.tasks.spawn(async move {
            let stop = broker.stop.clone();
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = broker.watch_orphans() => {}
            }
        });
    }

    /// Scans at once, then whenever a registered bookie goes or a failed scan is due again.
    /// It follows the membership's watch-fed copy of the registrations, the same copy the
    /// scan and placement read, so a scan woken by a departure sees it.
    async fn watch_orphans(&self) {
        let Some(mut changes) = self.ownership.follow_nodes(self.stop.clone()) else {
            return;
        };
        // Read before the first scan, so a bookie that goes between this read and the copy's
        // first listing shows as gone at that listing.
        let mut seen = self.live_bookies().await.ok();
        // A scan is due at once: bookies may have gone before this node started.
        let mut due = Some(tokio::time::Instant::now());
        // Scans failed in a row (the wait before the next one doubles with each).
        let mut failures = 0u32;
        loop {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let now = match self.live_bookies().await {
                        Ok(now) => now,
                        Err(e) => {
                            tracing::debug!(error = %e, "listing the nodes failed; retrying");
                            due.get_or_insert_with(|| tokio::time::Instant::now() + RETRY);
                            continue;
                        }
                    };
                    // A departure scans now, even while failed scans back off; unknown before
                    // (the first read failed): a scan too, to be sure.
                    if seen.as_ref().is_none_or(|s| !s.is_subset(&now)) {
                        due = Some(tokio::time::Instant::now());
                    }
                    seen = Some(now);
                }
                () = sleep_until(due), if due.is_some() => {
                    due = match self.take_over_orphans().await {
                        Ok(()) => {
                            failures = 0;
                            None
                        }
                        Err(e) => {
                            failures = failures.saturating_add(1);
                            let wait = retry_after(failures);
                            tracing::warn!(error = %e, ?wait, "taking over the topics of a gone bookie failed; retrying");
                            Some(tokio::time::Instant::now() + wait)
                        }
                    };
                }
            }
        }
    }

    /// The bookies of the registered nodes.
    async fn live_bookies(&self) -> Result<HashSet<String>, String> {
        let nodes = self.ownership.nodes().await.map_err(|e| e.to_string())?;
        Ok(nodes.into_iter().map(|n| n.bookie).collect())
    }

    /// Loads every topic placed here whose open, recoverable ledger a bookie wrote that no
    /// registered node has, or that this bookie's previous process left open.
    async fn take_over_orphans(&self) -> Result<(), String> {
        let live = self.live_bookies().await?;
        let meta = self.metadata();
        let open = meta
            .ledgers_in_states(&[LedgerState::Open])
            .await
            .map_err(|e| e.to_string())?;
        // This bookie's own replicated ledgers its previous process left open (a crash, or the
        // whole cluster down at once): no other node takes them over while it is live.
        let left_here: HashSet<crate::ledger::LedgerId> = self
            .log
            .recovery_report()
            .left_open_replicated
            .iter()
            .copied()
            .collect();
        let mine: HashSet<_> = open
            .iter()
            .filter(|l| left_here.contains(&l.id))
            .map(|l| l.topic_id)
            .collect();
        let topics: BTreeSet<_> = open
            .iter()
            .filter(|l| !live.contains(&l.bookie) && crate::ledger::recoverable(l))
            .map(|l| l.topic_id)
            .chain(mine.iter().copied())
            .collect();
        if topics.is_empty() {
            return Ok(());
        }
        tracing::info!(
            topics = topics.len(),
            "open ledgers whose writer is gone: taking over the topics placed here"
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
                // Its ledger is this bookie's: the node holding the topic cannot take it over
                // while this bookie is live, and gives it up; looked at again then.
                Ok(Placement::Remote { node, .. }) if mine.contains(&id) => {
                    failed = Some(format!("{name}: held by {} for now", node.id));
                    continue;
                }
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

/// The wait before the next scan after `failures` failed in a row: [`RETRY`], doubling, at
/// most [`MAX_RETRY`] (a ledger that cannot be taken over yet costs a scan that often).
fn retry_after(failures: u32) -> Duration {
    RETRY
        .saturating_mul(1 << failures.saturating_sub(1).min(6))
        .min(MAX_RETRY)
}

/// Sleeps until `at` (`None`: forever).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
