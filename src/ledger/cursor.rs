//! The persisted state of a durable subscription's cursor, and its versioned encoding.
//!
//! ```text
//! version u8 (=2) | sub_type u8 | first_unacked: ledger u64, entry u64 | count u32 | (ledger u64, entry u64)*count
//!   | partial_count u32 | (ledger u64, entry u64, words u32, word i64 * words)*partial_count
//! ```
//! Little-endian. `first_unacked` is the oldest entry not acknowledged (Pulsar's mark-delete
//! position is the entry just before it); the list holds entries after it that were acknowledged
//! individually; `partial` holds batch entries acknowledged in part (batch-index acks), with the
//! bit words of the indices still unacknowledged. Version 1 (no `partial` section) is still read.
//! Changing the layout needs a new version and an ADR (`docs/adr/0003-cursor-v2.md`).
//!
//! The log keeps the cursors of a topic partition (as BookKeeper's managed ledger does); the
//! broker's subscriptions write them, retention reads the slowest. One stored name is not a
//! subscription: [`DEDUP_SNAPSHOT`], the broker's deduplication snapshot, kept beside them so it
//! goes with the topic.

use crate::ledger::Position;

/// The stored name of the deduplication snapshot among a topic's cursors (its blob is not a
/// [`CursorState`]; readers of cursors skip it).
pub const DEDUP_SNAPSHOT: &str = "__ledgerlake_dedup";

/// Version of the layout written by this build.
pub const CURSOR_VERSION: u8 = 2;

/// A durable cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorState {
    /// Subscription type as the protocol numbers it.
    pub sub_type: i32,
    /// Oldest unacknowledged entry (or the next entry to read when all are acknowledged).
    pub first_unacked: Position,
    /// Individually acknowledged entries after `first_unacked`, ascending.
    pub acked_after: Vec<Position>,
    /// Batch entries acknowledged in part: the bit words (`ack_set`) of the indices still
    /// unacknowledged, ascending by position.
    pub partial: Vec<(Position, Vec<i64>)>,
}

/// Why a stored cursor could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored cursor is invalid: {0}")]
pub struct CursorDecodeError(pub String);

impl CursorState {
    /// Encodes the cursor.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(22 + 16 * self.acked_after.len());
        out.push(CURSOR_VERSION);
        out.push(self.sub_type.clamp(0, 255) as u8);
        out.extend_from_slice(&self.first_unacked.ledger.to_le_bytes());
        out.extend_from_slice(&self.first_unacked.entry.to_le_bytes());
        out.extend_from_slice(&(self.acked_after.len() as u32).to_le_bytes());
        for p in &self.acked_after {
            out.extend_from_slice(&p.ledger.to_le_bytes());
            out.extend_from_slice(&p.entry.to_le_bytes());
        }
        out.extend_from_slice(&(self.partial.len() as u32).to_le_bytes());
        for (p, words) in &self.partial {
            out.extend_from_slice(&p.ledger.to_le_bytes());
            out.extend_from_slice(&p.entry.to_le_bytes());
            out.extend_from_slice(&(words.len() as u32).to_le_bytes());
            for w in words {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        out
    }

    /// Decodes a cursor written by [`CursorState::encode`].
    pub fn decode(buf: &[u8]) -> Result<Self, CursorDecodeError> {
        let err = |m: &str| CursorDecodeError(m.to_string());
        if buf.len() < 22 {
            return Err(err("too short"));
        }
        let version = buf[0];
        if version != 1 && version != CURSOR_VERSION {
            return Err(CursorDecodeError(format!("unsupported version {version}")));
        }
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let u32_at = |o: usize| u32::from_le_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
        let count = u32_at(18) as usize;
        let acked_end = count
            .checked_mul(16)
            .and_then(|n| n.checked_add(22))
            .ok_or_else(|| err("entry count overflows"))?;
        if buf.len() < acked_end || (version == 1 && buf.len() != acked_end) {
            return Err(err("length does not match the entry count"));
        }
        let acked_after = (0..count)
            .map(|i| Position::new(u64_at(22 + i * 16), u64_at(30 + i * 16)))
            .collect();
        let mut partial = Vec::new();
        if version >= 2 {
            let mut at = acked_end;
            if buf.len() < at + 4 {
                return Err(err("missing partial-ack section"));
            }
            let n = u32_at(at) as usize;
            at += 4;
            for _ in 0..n {
                if buf.len() < at + 20 {
                    return Err(err("truncated partial ack"));
                }
                let pos = Position::new(u64_at(at), u64_at(at + 8));
                let words = u32_at(at + 16) as usize;
                at += 20;
                if buf.len() < at + words.saturating_mul(8) {
                    return Err(err("truncated partial-ack words"));
                }
                let w = (0..words).map(|i| u64_at(at + i * 8) as i64).collect();
                at += words * 8;
                partial.push((pos, w));
            }
            if at != buf.len() {
                return Err(err("trailing bytes after the partial-ack section"));
            }
        }
        Ok(CursorState {
            sub_type: i32::from(buf[1]),
            first_unacked: Position::new(u64_at(2), u64_at(10)),
            acked_after,
            partial,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    proptest! {
        #![proptest_config(ProptestConfig {
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
            ..ProptestConfig::default()
        })]
        #[test]
        fn cursor_round_trips(sub in 0i32..4, l in any::<u64>(), e in any::<u64>(),
                              acked in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..50),
                              partial in proptest::collection::vec(
                                  ((any::<u64>(), any::<u64>()), proptest::collection::vec(any::<i64>(), 0..4)),
                                  0..10)) {
            let c = CursorState {
                sub_type: sub,
                first_unacked: Position::new(l, e),
                acked_after: acked.into_iter().map(|(l, e)| Position::new(l, e)).collect(),
                partial: partial.into_iter().map(|((l, e), w)| (Position::new(l, e), w)).collect(),
            };
            prop_assert_eq!(CursorState::decode(&c.encode()), Ok(c));
        }

        #[test]
        fn version_1_cursors_are_still_read(l in any::<u64>(), e in any::<u64>(),
                                            acked in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..20)) {
            let mut v1 = vec![1u8, 1];
            v1.extend_from_slice(&l.to_le_bytes());
            v1.extend_from_slice(&e.to_le_bytes());
            v1.extend_from_slice(&(acked.len() as u32).to_le_bytes());
            for (l, e) in &acked {
                v1.extend_from_slice(&l.to_le_bytes());
                v1.extend_from_slice(&e.to_le_bytes());
            }
            let c = CursorState::decode(&v1).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(c.first_unacked, Position::new(l, e));
            prop_assert_eq!(c.acked_after.len(), acked.len());
            prop_assert!(c.partial.is_empty());
        }

        #[test]
        fn truncated_cursor_is_refused(cut in 0usize..21) {
            let c = CursorState { sub_type: 1, first_unacked: Position::new(1, 2), acked_after: vec![Position::new(1, 5)], partial: vec![(Position::new(1, 7), vec![6])] };
            let bytes = c.encode();
            prop_assert!(CursorState::decode(&bytes[..cut]).is_err());
            prop_assert!(CursorState::decode(&bytes[..bytes.len() - 1]).is_err());
        }
    }
}
