//! Retention: which ledgers of a topic partition the namespace's retention policy removes now.
//! Pure functions of the ledger records, the durable cursors, the policy and the clock.
//!
//! Rules (Pulsar's, at ledger granularity):
//! - Only *consumed* data expires: a ledger is a candidate only when every durable subscription
//!   of the partition has acknowledged all of it (its last entry is before the subscription's
//!   first unacknowledged entry). With no durable subscription, everything is consumed.
//!   Unconsumed backlog is the business of backlog quotas (a later issue), not retention.
//! - A consumed ledger expires when it is beyond either limit: its newest message is older than
//!   `retentionTimeInMinutes`, or the partition's retained bytes exceed `retentionSizeInMB`
//!   (oldest ledgers go first). -1 disables a limit; both -1 keeps everything.
//! - What expires is always a prefix of the partition's closed ledgers in id order, and never
//!   the open ledger: readers only ever see a suffix of the topic disappear from its start.
//!
//! The engine ([`super::OffloadEngine`]) marks the chosen ledgers `Expired` first (from then on
//! no reader sees them and their local copies go), then removes their rows from the table
//! ([`crate::lake::expire`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use iceberg::table::Table;

use super::pass::{PassLog, PassTable, PassTopic};
use super::{lock, OffloadError};
use crate::lake::expire::Live;
use crate::ledger::cursor::{CursorState, DEDUP_SNAPSHOT};
use crate::ledger::{now_ms, LedgerId, LedgerRecord, LedgerState, Log, Position, TopicLog};
use crate::policies::{EffectivePolicies, RetentionPolicy};

/// The oldest first-unacknowledged position among stored durable cursors; `None` when the
/// partition has none. Blobs that are not cursors (the deduplication snapshot) are skipped; a
/// cursor that cannot be read holds everything back (position 0:0).
pub fn slowest_cursor(cursors: &[(String, Vec<u8>)]) -> Option<Position> {
    cursors
        .iter()
        .filter(|(name, _)| name != DEDUP_SNAPSHOT)
        .map(|(name, blob)| match CursorState::decode(blob) {
            Ok(c) => c.first_unacked,
            Err(e) => {
                tracing::warn!(subscription = %name, error = %e,
                    "retention: unreadable cursor holds back expiry");
                Position::new(0, 0)
            }
        })
        .min()
}

fn consumed(l: &LedgerRecord, slowest: Option<Position>) -> bool {
    let Some(first_unacked) = slowest else {
        return true;
    };
    let entries = l.seal.map_or(0, |s| s.entry_count);
    l.id < first_unacked.ledger || (l.id == first_unacked.ledger && entries <= first_unacked.entry)
}

/// The ledgers of one partition that expire now, oldest first.
pub fn expirable(
    ledgers: &[LedgerRecord],
    policy: &RetentionPolicy,
    slowest: Option<Position>,
    now_ms: i64,
) -> Vec<LedgerId> {
    if policy.is_infinite() {
        return Vec::new();
    }
    let mut sorted: Vec<&LedgerRecord> = ledgers
        .iter()
        .filter(|l| l.state != LedgerState::Expired)
        .collect();
    sorted.sort_by_key(|l| l.id);
    let size = |l: &LedgerRecord| l.seal.map_or(0, |s| s.size_bytes);
    let mut retained: u64 = sorted.iter().map(|l| size(l)).sum();
    let size_limit = u64::try_from(policy.retention_size_in_mb)
        .ok()
        .map(|mb| mb.saturating_mul(1 << 20));
    let time_limit_ms = u64::try_from(policy.retention_time_in_minutes)
        .ok()
        .map(|m| m.saturating_mul(60_000) as i64);
    let mut out = Vec::new();
    for l in sorted {
        if l.state == LedgerState::Open || !consumed(l, slowest) {
            break;
        }
        let newest = l
            .seal
            .and_then(|s| s.max_publish_ms)
            .unwrap_or(l.created_at_ms);
        let too_old = time_limit_ms.is_some_and(|limit| now_ms.saturating_sub(newest) > limit);
        let too_big = size_limit.is_some_and(|limit| retained > limit);
        if !(too_old || too_big) {
            break;
        }
        retained -= size(l);
        out.push(l.id);
    }
    out
}

/// What the log side of one retention step found and did for a table's partitions.
#[derive(Debug, Default)]
pub(crate) struct LogExpiry {
    /// Ledgers this step marked `Expired`.
    pub newly: Vec<LedgerId>,
    /// Ledgers that stay (any state but `Expired`).
    pub live: BTreeSet<LedgerId>,
    /// Some ledger of the table is `Expired` (now or before).
    pub any_expired: bool,
}

/// The log side of retention, with or without a lake: marks `Expired` the ledgers of `logs`
/// (one table's partitions) that `policy` removes now; their local files go with it.
pub(crate) async fn expire_ledgers(
    log: &Log,
    logs: &[(i32, TopicLog)],
    policy: &RetentionPolicy,
) -> Result<LogExpiry, OffloadError> {
    let meta = log.metadata();
    let now = now_ms();
    let mut out = LogExpiry::default();
    for (_, topic) in logs {
        let records = meta.topic_ledgers(topic.id()).await?;
        let chosen = if policy.is_infinite() {
            Vec::new()
        } else {
            let slowest = slowest_cursor(&topic.cursors().await?);
            expirable(&records, policy, slowest, now)
        };
        for r in &records {
            if r.state == LedgerState::Expired || chosen.contains(&r.id) {
                out.any_expired = true;
            } else {
                out.live.insert(r.id);
            }
        }
        for id in chosen {
            log.expire_ledger(id).await?;
            tracing::info!(topic = %topic.name(), ledger = id, "ledger expired by retention");
            out.newly.push(id);
        }
    }
    Ok(out)
}

impl super::Inner {
    /// Expires the ledgers the retention policy removes (log first), then removes their files
    /// from the table (in a shared table, only files of the pass's topics). Returns the table
    /// when it was loaded.
    pub(super) async fn apply_retention(
        &self,
        table: &PassTable,
        work: &[PassTopic],
        logs: &[PassLog],
        policies: &EffectivePolicies,
    ) -> Result<Option<Table>, OffloadError> {
        let mut all = LogExpiry::default();
        let mut live_of: BTreeMap<String, BTreeSet<LedgerId>> = BTreeMap::new();
        for (index, w) in work.iter().enumerate() {
            let mine: Vec<(i32, TopicLog)> = logs
                .iter()
                .filter(|l| l.topic_index == index)
                .map(|l| (l.partition, l.log.clone()))
                .collect();
            let expiry = expire_ledgers(&self.log, &mine, &policies.retention).await?;
            if !expiry.any_expired {
                // No ledger of the topic is expired: the table holds no files of one.
                w.slot.retention_pending.store(false, Ordering::Release);
            }
            if !expiry.newly.is_empty() {
                w.slot.retention_pending.store(true, Ordering::Release);
                lock(&w.slot.status).retention.expired_ledgers += expiry.newly.len() as u64;
            }
            all.newly.extend(expiry.newly);
            all.any_expired |= expiry.any_expired;
            if table.shared {
                live_of.insert(w.base.local.clone(), expiry.live);
            } else {
                all.live.extend(expiry.live);
            }
        }
        let pending = work
            .iter()
            .any(|w| w.slot.retention_pending.load(Ordering::Acquire));
        if !all.any_expired || !pending {
            return Ok(None);
        }
        let clear = || {
            for w in work {
                w.slot.retention_pending.store(false, Ordering::Release);
            }
        };
        let Some(loaded) = self.lake.load_table(&table.ident).await? else {
            clear();
            return Ok(None);
        };
        let live = if table.shared {
            Live::Topics(&live_of)
        } else {
            Live::Table(&all.live)
        };
        let grace = self.config.removed_file_grace;
        let (loaded, outcome) =
            crate::lake::expire::remove_expired(&self.lake, loaded, live, &all.newly, grace)
                .await?;
        clear();
        if let Some(due) = outcome.finish_due_ms {
            let _ = self.finish_tx.send((table.ident.clone(), due));
        }
        for w in work {
            lock(&w.slot.status).retention.last_error.clear();
        }
        if let Some(snapshot) = outcome.snapshot_id {
            tracing::info!(table = %loaded.identifier(), files = outcome.files_removed.len(),
                rows = outcome.rows_removed, snapshots_expired = outcome.snapshots_expired,
                files_deleted = outcome.files_deleted, "retention removed expired files");
            // What one removal did for the table, on each topic that took part.
            for w in work {
                let mut st = lock(&w.slot.status);
                st.retention.removed_files += outcome.files_removed.len() as u64;
                st.retention.removed_rows += outcome.rows_removed;
                st.retention.last_snapshot_id = Some(snapshot);
            }
        }
        Ok(Some(loaded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::metadata::SealInfo;

    const MIN: i64 = 60_000;

    fn ledger(id: u64, state: LedgerState, entries: u64, newest_ms: i64) -> LedgerRecord {
        LedgerRecord {
            id,
            topic_id: 1,
            state,
            first_segment: 0,
            seal: (state != LedgerState::Open).then_some(SealInfo {
                entry_count: entries,
                size_bytes: entries << 20,
                min_publish_ms: Some(newest_ms - 1),
                max_publish_ms: Some(newest_ms),
                last_segment: 0,
                checksum: 0,
            }),
            created_at_ms: newest_ms - 1,
            state_changed_at_ms: newest_ms,
            offload_ref: None,
            bookie: String::new(),
            replicas: Vec::new(),
            ack_quorum: 1,
            write_quorum: 1,
            stripe_width: 0,
        }
    }

    fn policy(minutes: i64, mb: i64) -> RetentionPolicy {
        RetentionPolicy {
            retention_time_in_minutes: minutes,
            retention_size_in_mb: mb,
        }
    }

    /// Ledgers 1..=4 of 10 entries (10 MiB) each, newest messages at minutes 0, 10, 20, 30;
    /// ledger 5 open.
    fn sample() -> Vec<LedgerRecord> {
        vec![
            ledger(3, LedgerState::Offloaded, 10, 20 * MIN),
            ledger(1, LedgerState::Deleted, 10, 0),
            ledger(2, LedgerState::Deleted, 10, 10 * MIN),
            ledger(4, LedgerState::Sealed, 10, 30 * MIN),
            ledger(5, LedgerState::Open, 0, 40 * MIN),
        ]
    }

    #[test]
    fn infinite_keeps_everything() {
        assert!(expirable(&sample(), &RetentionPolicy::INFINITE, None, 1 << 50).is_empty());
    }

    #[test]
    fn time_limit_expires_a_prefix_of_old_ledgers() {
        // At minute 35 with 15 minutes: ledgers whose newest message is older than minute 20.
        assert_eq!(
            expirable(&sample(), &policy(15, -1), None, 35 * MIN),
            vec![1, 2]
        );
        // Zero minutes: every closed ledger, never the open one.
        assert_eq!(
            expirable(&sample(), &policy(0, -1), None, 35 * MIN),
            vec![1, 2, 3, 4]
        );
    }

    #[test]
    fn size_limit_expires_oldest_until_under() {
        // 40 MiB retained; a 25 MiB limit drops two ledgers (to 20 MiB).
        assert_eq!(expirable(&sample(), &policy(-1, 25), None, 0), vec![1, 2]);
        assert!(expirable(&sample(), &policy(-1, 40), None, 0).is_empty());
    }

    #[test]
    fn either_limit_expires() {
        assert_eq!(
            expirable(&sample(), &policy(25, 35), None, 35 * MIN),
            vec![1]
        );
        assert_eq!(
            expirable(&sample(), &policy(15, 35), None, 35 * MIN),
            vec![1, 2]
        );
    }

    #[test]
    fn unconsumed_ledgers_are_kept() {
        // The slowest subscription is inside ledger 2: only ledger 1 is consumed.
        let at = Some(Position::new(2, 3));
        assert_eq!(expirable(&sample(), &policy(0, -1), at, 35 * MIN), vec![1]);
        // Ledger 2 fully acknowledged (next to read is entry 10, its end).
        let at = Some(Position::new(2, 10));
        assert_eq!(
            expirable(&sample(), &policy(0, -1), at, 35 * MIN),
            vec![1, 2]
        );
        // Nothing acknowledged.
        let at = Some(Position::new(0, 0));
        assert!(expirable(&sample(), &policy(0, -1), at, 35 * MIN).is_empty());
    }

    #[test]
    fn expired_ledgers_are_not_counted_again() {
        let mut ledgers = sample();
        ledgers[1].state = LedgerState::Expired; // ledger 1
        assert_eq!(expirable(&ledgers, &policy(-1, 25), None, 0), vec![2]);
    }

    #[test]
    fn slowest_cursor_skips_the_dedup_snapshot_and_reads_cursors() {
        let c = |ledger, entry| CursorState {
            sub_type: 0,
            first_unacked: Position::new(ledger, entry),
            acked_after: Vec::new(),
            partial: Vec::new(),
        };
        let cursors = vec![
            ("a".to_string(), c(7, 3).encode()),
            ("b".to_string(), c(5, 9).encode()),
            (DEDUP_SNAPSHOT.to_string(), b"not a cursor".to_vec()),
        ];
        assert_eq!(slowest_cursor(&cursors), Some(Position::new(5, 9)));
        assert_eq!(slowest_cursor(&[]), None);
        // An unreadable cursor holds everything back.
        let bad = vec![("x".to_string(), vec![0xff, 1, 2])];
        assert_eq!(slowest_cursor(&bad), Some(Position::new(0, 0)));
    }
}
