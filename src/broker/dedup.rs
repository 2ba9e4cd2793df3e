//! Message deduplication with Pulsar's semantics: per producer name, the highest sequence id
//! pushed (accepted for appending) and the highest persisted (durable).
//!
//! For a SEND with highest id `h` ([`highest_sequence_id`]: the send's `highest_sequence_id`
//! when it is above `sequence_id`, else `sequence_id + num_messages - 1`, so a batch counts by
//! its last message as Pulsar does):
//! - `h > pushed`: new; append it.
//! - `h <= pushed` and `h <= persisted`: duplicate; answer a receipt with id (-1, -1), append
//!   nothing.
//! - `h <= pushed` but `h > persisted`: the original is still in flight, so whether this one is a
//!   duplicate cannot be known yet; answer SEND_ERROR(PersistenceError).
//!
//! The state survives restarts: a snapshot (map + the position it covers) is saved in the
//! metadata store under [`DEDUP_SNAPSHOT`]; it is computed from the log itself (the producer name
//! and sequence ids in each entry's metadata), never from receipts, so an entry that became
//! durable but whose receipt was lost in a crash is still known. At load, the entries after the
//! snapshot are folded in the same way, through replay's [`EntryReader`] (the one reader of
//! positions): ranges offloaded and deleted locally are read from the lake.

use std::collections::HashMap;
use std::time::Duration;

use crate::ledger::{Position, TopicLog};
use crate::protocol::frame::entry_metadata;
use crate::replay::{EntryReader, ReplayError, TopicLake};

use crate::ledger::cursor::DEDUP_SNAPSHOT;
const SNAPSHOT_VERSION: u8 = 1;
const FOLD_BATCH: usize = 1024;
/// How long the fold waits before asking a lake read in progress again.
const PENDING_RETRY: Duration = Duration::from_millis(20);

/// The sequence id a SEND (or a stored entry) counts as: `highest` when the client set it above
/// `sequence_id`, else the last id of the batch (`sequence_id + num_messages - 1`; one message
/// when unbatched).
pub fn highest_sequence_id(
    sequence_id: u64,
    highest: Option<u64>,
    num_messages: Option<i32>,
) -> i64 {
    let first = sequence_id as i64;
    match highest {
        Some(h) if h as i64 > first => h as i64,
        _ => first.saturating_add(i64::from(num_messages.unwrap_or(1).max(1)) - 1),
    }
}

/// The decision for one SEND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Append it.
    New,
    /// Already persisted: acknowledge without appending.
    Duplicate,
    /// The original is in flight: the client must retry later.
    Unknown,
}

/// Live deduplication state of one topic partition (consulted on every SEND).
#[derive(Debug, Default)]
pub struct DedupState {
    /// Invariant: `persisted[p] <= pushed[p]` for every producer.
    pushed: HashMap<String, i64>,
    persisted: HashMap<String, i64>,
}

/// The persisted form: highest sequence id per producer as of `position`, folded from the log.
#[derive(Debug)]
pub struct DedupSnapshot {
    /// Invariant: folded from every entry up to and including `snapshot_position`.
    snapshot: HashMap<String, i64>,
    snapshot_position: Option<Position>,
    /// Reads the entries to fold, from the log or the lake.
    reader: EntryReader,
}

impl DedupState {
    /// The live state a loaded snapshot implies (everything in it is persisted).
    pub fn from_snapshot(s: &DedupSnapshot) -> Self {
        DedupState {
            pushed: s.snapshot.clone(),
            persisted: s.snapshot.clone(),
        }
    }

    /// Decides for a SEND and, when new, records it as pushed.
    pub fn check(&mut self, producer: &str, highest: i64) -> Verdict {
        let pushed = self.pushed.get(producer).copied().unwrap_or(-1);
        if highest > pushed {
            self.pushed.insert(producer.to_string(), highest);
            return Verdict::New;
        }
        if highest <= self.persisted.get(producer).copied().unwrap_or(-1) {
            Verdict::Duplicate
        } else {
            Verdict::Unknown
        }
    }

    /// Records that a SEND became durable.
    pub fn persisted(&mut self, producer: &str, highest: i64) {
        let e = self.persisted.entry(producer.to_string()).or_insert(-1);
        *e = (*e).max(highest);
    }

    /// Forgets a push that failed to append (so a retry is not refused as in flight).
    pub fn failed(&mut self, producer: &str) {
        let persisted = self.persisted.get(producer).copied().unwrap_or(-1);
        self.pushed.insert(producer.to_string(), persisted);
    }

    /// `last_sequence_id` for PRODUCER_SUCCESS.
    pub fn last_sequence_id(&self, producer: &str) -> i64 {
        self.pushed.get(producer).copied().unwrap_or(-1)
    }
}

impl DedupSnapshot {
    /// Encodes the snapshot: `version u8 | has_pos u8 | ledger u64 | entry u64 | count u32 |
    /// (name_len u16, name, seq i64)*` (little-endian).
    /// Loads the snapshot of `log` and folds in the entries after it, reading ranges deleted
    /// locally from `lake`.
    pub async fn load(
        log: TopicLog,
        lake: Option<TopicLake>,
    ) -> Result<DedupSnapshot, ReplayError> {
        let saved = log
            .cursors()
            .await
            .ok()
            .and_then(|c| c.into_iter().find(|(n, _)| n == DEDUP_SNAPSHOT))
            .and_then(|(_, blob)| decode_snapshot(&blob));
        let mut st = DedupSnapshot {
            snapshot: HashMap::new(),
            snapshot_position: None,
            reader: EntryReader::new(log, lake),
        };
        if let Some((position, map)) = saved {
            st.snapshot = map;
            st.snapshot_position = position;
        }
        st.fold_to_tail().await?;
        Ok(st)
    }

    /// Folds every durable entry after the snapshot position into the snapshot map.
    async fn fold_to_tail(&mut self) -> Result<(), ReplayError> {
        let mut from = match self.snapshot_position {
            Some(p) => Position::new(p.ledger, p.entry + 1),
            None => self.reader.log().first_position(),
        };
        loop {
            let entries = match self.reader.read_from(from, FOLD_BATCH).await {
                Ok(entries) => entries,
                Err(ReplayError::Pending) => {
                    tokio::time::sleep(PENDING_RETRY).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some(last) = entries.last().map(|e| e.position) else {
                return Ok(());
            };
            for e in &entries {
                if let Ok(m) = entry_metadata(&e.payload) {
                    let highest = highest_sequence_id(
                        m.sequence_id,
                        m.highest_sequence_id,
                        m.num_messages_in_batch,
                    );
                    let v = self.snapshot.entry(m.producer_name).or_insert(-1);
                    *v = (*v).max(highest);
                }
            }
            self.snapshot_position = Some(last);
            self.reader.forget_before(last);
            from = Position::new(last.ledger, last.entry + 1);
        }
    }

    /// Brings the snapshot up to the log's tail and returns its encoding to save, or `None`
    /// when nothing new was appended since the last one.
    pub async fn snapshot(&mut self) -> Result<Option<Vec<u8>>, ReplayError> {
        let before = self.snapshot_position;
        self.fold_to_tail().await?;
        Ok((before != self.snapshot_position)
            .then(|| encode_snapshot(&self.snapshot, self.snapshot_position)))
    }
}

/// Encodes a snapshot: `version u8 | has_pos u8 | ledger u64 | entry u64 | count u32 |
/// (name_len u16, name, seq i64)*` (little-endian).
fn encode_snapshot(snapshot: &HashMap<String, i64>, position: Option<Position>) -> Vec<u8> {
    let mut out = vec![SNAPSHOT_VERSION, u8::from(position.is_some())];
    let p = position.unwrap_or(Position::new(0, 0));
    out.extend_from_slice(&p.ledger.to_le_bytes());
    out.extend_from_slice(&p.entry.to_le_bytes());
    out.extend_from_slice(&(snapshot.len() as u32).to_le_bytes());
    let mut names: Vec<_> = snapshot.iter().collect();
    names.sort();
    for (name, seq) in names {
        let bytes = name.as_bytes();
        let len = bytes.len().min(u16::MAX as usize);
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.extend_from_slice(&bytes[..len]);
        out.extend_from_slice(&seq.to_le_bytes());
    }
    out
}

fn decode_snapshot(buf: &[u8]) -> Option<(Option<Position>, HashMap<String, i64>)> {
    if buf.len() < 22 || buf[0] != SNAPSHOT_VERSION {
        return None;
    }
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[o..o + 8]);
        u64::from_le_bytes(b)
    };
    let position = (buf[1] == 1).then(|| Position::new(u64_at(2), u64_at(10)));
    let count = u32::from_le_bytes(buf[18..22].try_into().ok()?) as usize;
    let mut at = 22;
    let mut map = HashMap::with_capacity(count);
    for _ in 0..count {
        let len = u16::from_le_bytes(buf.get(at..at + 2)?.try_into().ok()?) as usize;
        at += 2;
        let name = std::str::from_utf8(buf.get(at..at + len)?)
            .ok()?
            .to_string();
        at += len;
        let seq = i64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?);
        at += 8;
        map.insert(name, seq);
    }
    (at == buf.len()).then_some((position, map))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_pulsar() {
        let mut d = DedupState::default();
        assert_eq!(d.check("p", 0), Verdict::New);
        assert_eq!(d.check("p", 0), Verdict::Unknown, "in flight");
        d.persisted("p", 0);
        assert_eq!(d.check("p", 0), Verdict::Duplicate);
        assert_eq!(d.check("p", 1), Verdict::New);
        d.failed("p");
        assert_eq!(
            d.check("p", 1),
            Verdict::New,
            "a failed append may be retried"
        );
        assert_eq!(d.last_sequence_id("p"), 1);
        assert_eq!(d.last_sequence_id("other"), -1);
    }

    #[test]
    fn batches_count_by_their_last_sequence_id() {
        assert_eq!(highest_sequence_id(900, None, Some(100)), 999);
        assert_eq!(
            highest_sequence_id(900, Some(0), Some(100)),
            999,
            "unset highest (0)"
        );
        assert_eq!(highest_sequence_id(900, Some(999), Some(100)), 999);
        assert_eq!(highest_sequence_id(900, Some(1200), None), 1200);
        assert_eq!(highest_sequence_id(7, None, None), 7);
        assert_eq!(
            highest_sequence_id(7, None, Some(0)),
            7,
            "a batch of 0 counts as 1"
        );
    }

    #[test]
    fn snapshot_round_trips() {
        let map = HashMap::from([("a".to_string(), 5), ("bé".to_string(), -1)]);
        let blob = encode_snapshot(&map, Some(Position::new(3, 9)));
        let (pos, back) = decode_snapshot(&blob).unwrap_or_default();
        assert_eq!(pos, Some(Position::new(3, 9)));
        assert_eq!(back, map);
        assert!(decode_snapshot(&blob[..blob.len() - 1]).is_none());
    }

    proptest::proptest! {
        #[test]
        fn snapshot_encoding_round_trips(
            map in proptest::collection::hash_map(".{0,40}", proptest::num::i64::ANY, 0..20),
            pos in proptest::option::of((proptest::num::u64::ANY, proptest::num::u64::ANY)),
        ) {
            let pos = pos.map(|(l, e)| Position::new(l, e));
            let blob = encode_snapshot(&map, pos);
            proptest::prop_assert_eq!(decode_snapshot(&blob), Some((pos, map)));
        }
    }
}
