//! What a pass does after its commit: local copies of offloaded ledgers deleted after the
//! lag (only by the bookie holding them), routine snapshot expiry, and the periodic sweep of
//! orphan files. None of them fails the pass's commit. And the finisher: the task that
//! finishes retention's removals once their grace has passed ([`crate::lake::finish`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iceberg::table::Table;
use iceberg::TableIdent;
use tokio::sync::mpsc::UnboundedReceiver;

use super::{lock, plan, Inner, OffloadError, TableSlot};
use crate::lake::{finish, orphans, LakeError};
use crate::ledger::{now_ms, TopicLog};
use crate::naming::TopicName;

impl Inner {
    pub(super) async fn delete_expired(
        &self,
        logs: &[(i32, TopicLog)],
        policies: &crate::policies::EffectivePolicies,
    ) -> Result<(), OffloadError> {
        let meta = self.log.metadata();
        let now = now_ms();
        for (_, log) in logs {
            let records = meta.topic_ledgers(log.id()).await?;
            // Only the node offloading a ledger deletes it (its bookie's copy).
            let here = self.log.offloaded_here(&records).await;
            for l in plan::deletable(&records, policies, now)
                .into_iter()
                .filter(|l| here.contains(&l.id))
            {
                crate::failpoint::hit("offload.before_delete_local");
                self.log.delete_local(l.id).await?;
                tracing::info!(topic = %log.name(), ledger = l.id, "deleted local copy of an offloaded ledger");
            }
        }
        Ok(())
    }

    /// Routine snapshot expiry ([`crate::lake::history`]); a failure is logged and retried
    /// after the next commit, it never fails the pass. Removals of the table still to finish
    /// (left by another node, or by this one before a restart) are handed to the finisher.
    pub(super) async fn expire_history(&self, base: &TopicName, table: Table) -> Option<Table> {
        if let Some(due) = finish::due(table.metadata(), self.config.removed_file_grace) {
            let _ = self.finish_tx.send((table.identifier().clone(), due));
            if due > now_ms() {
                // Routine expiry could take a removal's elders (a day old in an idle table)
                // within its grace, and the orphan sweep their files: wait for the finish.
                return Some(table);
            }
        }
        match crate::lake::history::expire_old_snapshots(&self.lake, table, now_ms()).await {
            Ok((table, 0)) => Some(table),
            Ok((table, n)) => {
                tracing::info!(topic = %base, table = %table.identifier(), expired = n,
                    "old snapshots expired");
                Some(table)
            }
            Err(e) => {
                tracing::warn!(topic = %base, error = %e, "expiring old snapshots failed");
                None
            }
        }
    }

    pub(super) async fn sweep_orphans(
        &self,
        ident: &iceberg::TableIdent,
        slot: &TableSlot,
        table: Option<Table>,
    ) {
        {
            let mut last = lock(&slot.last_orphan_check);
            if last.is_some_and(|t| t.elapsed() < self.config.orphan_check_interval) {
                return;
            }
            *last = Some(Instant::now());
        }
        let table = match table {
            Some(t) => Some(t),
            None => self.lake.load_table(ident).await.ok().flatten(),
        };
        let Some(table) = table else { return };
        match orphans::delete_orphans(&self.lake, &table, self.config.orphan_file_age).await {
            Ok(r) if !r.deleted.is_empty() => {
                tracing::info!(table = %ident, deleted = r.deleted.len(), "orphan files removed")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(table = %ident, error = %e, "orphan sweep failed"),
        }
    }
}

/// How long a finish that failed waits before it is tried again.
const FINISH_RETRY: Duration = Duration::from_secs(30);

impl Inner {
    /// The finisher: finishes each reported table's removals once their grace has passed, one
    /// table at a time, under the table's writer lock (no pass of this node commits to it
    /// meanwhile). Runs until the engine stops.
    pub(super) async fn finish_removals(
        self: Arc<Self>,
        mut reports: UnboundedReceiver<(TableIdent, i64)>,
    ) {
        // Invariant: per table, the earliest time a reported removal ripens and has not been
        // finished since (a finish that finds it early puts the true time back).
        let mut due: BTreeMap<String, (TableIdent, i64)> = BTreeMap::new();
        loop {
            let wait = due
                .values()
                .map(|(_, at)| *at)
                .min()
                .map_or(Duration::from_secs(3600), |at| {
                    Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0))
                });
            tokio::select! {
                _ = self.stop.cancelled() => return,
                report = reports.recv() => {
                    let Some((ident, at)) = report else { return };
                    due.entry(ident.to_string())
                        .and_modify(|(_, t)| *t = (*t).min(at))
                        .or_insert((ident, at));
                }
                _ = tokio::time::sleep(wait) => {
                    let now = now_ms();
                    let ripe: Vec<String> = due
                        .iter()
                        .filter(|(_, (_, at))| *at <= now)
                        .map(|(key, _)| key.clone())
                        .collect();
                    for key in ripe {
                        if self.stop.is_cancelled() {
                            return;
                        }
                        let Some((ident, _)) = due.remove(&key) else { continue };
                        // A finish that started completes (its commit is not cut in half).
                        let outcome = self.finish_table(&ident).await;
                        let next = match outcome {
                            Ok(next) => next.map(|at| at.max(now_ms() + 1000)),
                            Err(e) => {
                                tracing::warn!(table = %ident, error = %e,
                                    "finishing retention removals failed; trying again later");
                                Some(now_ms() + FINISH_RETRY.as_millis() as i64)
                            }
                        };
                        if let Some(at) = next {
                            due.insert(key, (ident, at));
                        }
                    }
                }
            }
        }
    }

    /// Finishes `ident`'s ripe removals; returns when the next one ripens.
    async fn finish_table(&self, ident: &TableIdent) -> Result<Option<i64>, LakeError> {
        let writer = self.writer(ident);
        let _writing = writer.lock().await;
        let Some(table) = self.lake.load_table(ident).await? else {
            return Ok(None);
        };
        let grace = self.config.removed_file_grace;
        let (_, done) = finish::finish_removals(&self.lake, table, grace, now_ms()).await?;
        Ok(done.next_due_ms)
    }
}
