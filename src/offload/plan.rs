//! Which ledgers of a topic partition to offload and to delete now: pure functions of the
//! ledger records, the namespace policies and the clock (unit-tested without I/O).
//!
//! Invariants:
//! - Offload candidates are the partition's `Sealed` ledgers in id order, and what is chosen
//!   is always a prefix of them: ledgers reach the lake in id order per partition, which is
//!   what makes the table's watermark exact.
//! - A ledger is deleted locally only in state `Offloaded` (its commit is durable) and only
//!   once the deletion lag has passed since that state was recorded.

use crate::ledger::{LedgerRecord, LedgerState};
use crate::policies::EffectivePolicies;

/// The partition's ledgers that may be offloaded (state `Sealed`), in id order.
///
/// A ledger still `Open` (the current one, or an older one whose seal is still running in the
/// background while the next one already filled and sealed) ends the candidates: ledgers reach
/// the lake strictly in id order, so the watermark never passes a ledger that is not in it.
pub fn candidates(ledgers: &[LedgerRecord]) -> Vec<&LedgerRecord> {
    let mut sorted: Vec<&LedgerRecord> = ledgers.iter().collect();
    sorted.sort_by_key(|l| l.id);
    sorted
        .into_iter()
        .take_while(|l| l.state != LedgerState::Open)
        .filter(|l| l.state == LedgerState::Sealed)
        .collect()
}

fn size(l: &LedgerRecord) -> u64 {
    l.seal.map_or(0, |s| s.size_bytes)
}

/// How many leading candidates the policies make eligible now. `open_bytes` is the size of the
/// partition's open ledger (it counts toward the size threshold but is never offloaded);
/// `manual` makes every candidate eligible.
pub fn eligible(
    candidates: &[&LedgerRecord],
    open_bytes: u64,
    policies: &EffectivePolicies,
    now_ms: i64,
    manual: bool,
) -> usize {
    if manual {
        return candidates.len();
    }
    let by_size = match policies.offload_threshold_bytes {
        t if t < 0 => 0,
        0 => candidates.len(),
        t => {
            let threshold = t as u64;
            let mut local: u64 = candidates.iter().map(|l| size(l)).sum::<u64>() + open_bytes;
            let mut n = 0;
            for l in candidates {
                if local <= threshold {
                    break;
                }
                local -= size(l);
                n += 1;
            }
            n
        }
    };
    let by_age = match policies.offload_threshold_seconds {
        s if s < 0 => 0,
        s => candidates
            .iter()
            .take_while(|l| now_ms.saturating_sub(l.created_at_ms) >= s.saturating_mul(1000))
            .count(),
    };
    by_size.max(by_age)
}

/// Ledgers whose local copy may be deleted now.
pub fn deletable<'a>(
    ledgers: &'a [LedgerRecord],
    policies: &EffectivePolicies,
    now_ms: i64,
) -> Vec<&'a LedgerRecord> {
    let lag = policies.offload_deletion_lag.as_millis() as i64;
    ledgers
        .iter()
        .filter(|l| l.state == LedgerState::Offloaded)
        .filter(|l| now_ms.saturating_sub(l.state_changed_at_ms) >= lag)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::LakePartitioning;
    use crate::ledger::metadata::SealInfo;

    fn ledger(id: u64, state: LedgerState, size: u64, created: i64) -> LedgerRecord {
        LedgerRecord {
            id,
            topic_id: 1,
            state,
            first_segment: 0,
            seal: (state != LedgerState::Open).then_some(SealInfo {
                entry_count: size / 10,
                size_bytes: size,
                min_publish_ms: Some(created),
                max_publish_ms: Some(created),
                last_segment: 0,
                checksum: 0,
            }),
            created_at_ms: created,
            state_changed_at_ms: created + 10,
            offload_ref: None,
            bookie: String::new(),
            replicas: Vec::new(),
            ack_quorum: 1,
            write_quorum: 1,
            stripe_width: 0,
        }
    }

    fn policies(bytes: i64, secs: i64, lag_ms: u64) -> EffectivePolicies {
        EffectivePolicies {
            offload_threshold_bytes: bytes,
            offload_threshold_seconds: secs,
            offload_deletion_lag: Duration::from_millis(lag_ms),
            lake_partitioning: LakePartitioning::Day,
            lake_table_layout: Default::default(),
            retention: crate::policies::RetentionPolicy::INFINITE,
        }
    }

    fn sample() -> Vec<LedgerRecord> {
        vec![
            ledger(1, LedgerState::Deleted, 100, 0),
            ledger(2, LedgerState::Offloaded, 100, 1_000),
            ledger(3, LedgerState::Sealed, 100, 2_000),
            ledger(5, LedgerState::Sealed, 300, 3_000),
            ledger(7, LedgerState::Open, 0, 4_000),
        ]
    }

    #[test]
    fn zero_threshold_offloads_every_sealed_ledger_in_order() {
        let l = sample();
        let c = candidates(&l);
        assert_eq!(c.iter().map(|l| l.id).collect::<Vec<_>>(), vec![3, 5]);
        assert_eq!(eligible(&c, 50, &policies(0, -1, 0), 10_000, false), 2);
    }

    #[test]
    fn a_ledger_still_sealing_holds_back_newer_sealed_ones() {
        let l = vec![
            ledger(1, LedgerState::Sealed, 100, 0),
            ledger(2, LedgerState::Open, 100, 0),
            ledger(3, LedgerState::Sealed, 100, 0),
            ledger(4, LedgerState::Open, 10, 0),
        ];
        let c = candidates(&l);
        assert_eq!(c.iter().map(|l| l.id).collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn size_threshold_keeps_the_newest_bytes_local() {
        let l = sample();
        let c = candidates(&l);
        // 100 + 300 sealed + 50 open = 450 local; keep at most 360 → offload ledger 3 only.
        assert_eq!(eligible(&c, 50, &policies(360, -1, 0), 10_000, false), 1);
        assert_eq!(eligible(&c, 50, &policies(1_000, -1, 0), 10_000, false), 0);
        assert_eq!(eligible(&c, 50, &policies(-1, -1, 0), 10_000, false), 0);
    }

    #[test]
    fn age_threshold_and_manual_requests() {
        let l = sample();
        let c = candidates(&l);
        // Ledger 3 is 8 s old, ledger 5 is 7 s old at t = 10 s.
        assert_eq!(eligible(&c, 0, &policies(-1, 8, 0), 10_000, false), 1);
        assert_eq!(eligible(&c, 0, &policies(-1, 7, 0), 10_000, false), 2);
        assert_eq!(eligible(&c, 0, &policies(-1, -1, 0), 10_000, true), 2);
    }

    #[test]
    fn deletion_waits_for_the_lag_after_the_commit() {
        let l = sample();
        let p = policies(0, -1, 5_000);
        assert!(
            deletable(&l, &p, 6_000).is_empty(),
            "ledger 2 offloaded at 1010"
        );
        assert_eq!(
            deletable(&l, &p, 6_010)
                .iter()
                .map(|l| l.id)
                .collect::<Vec<_>>(),
            vec![2]
        );
    }
}
