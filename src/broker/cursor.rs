//! The persisted state of a durable subscription's cursor, and its versioned encoding.
//!
//! ```text
//! version u8 (=1) | sub_type u8 | first_unacked: ledger u64, entry u64 | count u32 | (ledger u64, entry u64)*count
//! ```
//! Little-endian. `first_unacked` is the oldest entry not acknowledged (Pulsar's mark-delete
//! position is the entry just before it); the list holds entries after it that were acknowledged
//! individually. Changing the layout needs a new version and an ADR.

use crate::ledger::Position;

/// Version of the layout written by this build.
pub const CURSOR_VERSION: u8 = 1;

/// A durable cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorState {
    /// Subscription type as the protocol numbers it.
    pub sub_type: i32,
    /// Oldest unacknowledged entry (or the next entry to read when all are acknowledged).
    pub first_unacked: Position,
    /// Individually acknowledged entries after `first_unacked`, ascending.
    pub acked_after: Vec<Position>,
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
        out
    }

    /// Decodes a cursor written by [`CursorState::encode`].
    pub fn decode(buf: &[u8]) -> Result<Self, CursorDecodeError> {
        let err = |m: &str| CursorDecodeError(m.to_string());
        if buf.len() < 22 {
            return Err(err("too short"));
        }
        if buf[0] != CURSOR_VERSION {
            return Err(CursorDecodeError(format!("unsupported version {}", buf[0])));
        }
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let count = u32::from_le_bytes([buf[18], buf[19], buf[20], buf[21]]) as usize;
        if buf.len() != 22 + count * 16 {
            return Err(err("length does not match the entry count"));
        }
        let acked_after = (0..count)
            .map(|i| Position::new(u64_at(22 + i * 16), u64_at(30 + i * 16)))
            .collect();
        Ok(CursorState {
            sub_type: i32::from(buf[1]),
            first_unacked: Position::new(u64_at(2), u64_at(10)),
            acked_after,
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
                              acked in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..50)) {
            let c = CursorState {
                sub_type: sub,
                first_unacked: Position::new(l, e),
                acked_after: acked.into_iter().map(|(l, e)| Position::new(l, e)).collect(),
            };
            prop_assert_eq!(CursorState::decode(&c.encode()), Ok(c));
        }

        #[test]
        fn truncated_cursor_is_refused(cut in 0usize..21) {
            let c = CursorState { sub_type: 1, first_unacked: Position::new(1, 2), acked_after: vec![Position::new(1, 5)] };
            let bytes = c.encode();
            prop_assert!(CursorState::decode(&bytes[..cut]).is_err());
            prop_assert!(CursorState::decode(&bytes[..bytes.len() - 1]).is_err());
        }
    }
}
