//! What a pass does after its commit: local copies of offloaded ledgers deleted after the
//! lag (only by the bookie holding them), routine snapshot expiry, and the periodic sweep of
//! orphan files. None of them fails the pass's commit.

use std::time::Instant;

use iceberg::table::Table;

use super::{lock, plan, Inner, OffloadError, TableSlot};
use crate::lake::orphans;
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
            // Only the bookie holding a ledger deletes its copy.
            for l in plan::deletable(&records, policies, now)
                .into_iter()
                .filter(|l| self.log.writes(l))
            {
                crate::failpoint::hit("offload.before_delete_local");
                self.log.delete_local(l.id).await?;
                tracing::info!(topic = %log.name(), ledger = l.id, "deleted local copy of an offloaded ledger");
            }
        }
        Ok(())
    }

    /// Routine snapshot expiry ([`crate::lake::history`]); a failure is logged and retried
    /// after the next commit, it never fails the pass.
    pub(super) async fn expire_history(&self, base: &TopicName, table: Table) -> Option<Table> {
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
