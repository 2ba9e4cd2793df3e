//! Message deduplication with Pulsar's semantics: per producer name, the highest sequence id
//! pushed (accepted for appending) and the highest persisted (durable).
//!
//! For a SEND with highest id `h = max(highest_sequence_id, sequence_id)`:
//! - `h > pushed`: new; append it.
//! - `h <= pushed` and `h <= persisted`: duplicate; answer a receipt with id (-1, -1), append
//!   nothing.
//! - `h <= pushed` but `h > persisted`: the original is still in flight, so whether this one is a
//!   duplicate cannot be known yet; answer SEND_ERROR(PersistenceError).
//!
//! The state survives restarts: a snapshot (map + the position it covers) is saved in the
//! metadata store under [`SNAPSHOT_NAME`]; it is computed from the log itself (the producer name
//! and sequence ids in each entry's metadata), never from receipts, so an entry that became
//! durable but whose receipt was lost in a crash is still known. At load, the entries after the
//! snapshot are folded in the same way.

use std::collections::HashMap;

use crate::ledger::{Position, ReadError, TopicLog};
use crate::protocol::frame::entry_metadata;

/// Name under which the snapshot is stored with the topic's cursors.
pub const SNAPSHOT_NAME: &str = "__ledgerlake_dedup";
const SNAPSHOT_VERSION: u8 = 1;
const FOLD_BATCH: usize = 1024;

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
#[derive(Debug, Default)]
pub struct DedupSnapshot {
    snapshot: HashMap<String, i64>,
    snapshot_position: Option<Position>,
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
    fn encode_snapshot(&self) -> Vec<u8> {
        let mut out = vec![SNAPSHOT_VERSION, u8::from(self.snapshot_position.is_some())];
        let p = self.snapshot_position.unwrap_or(Position::new(0, 0));
        out.extend_from_slice(&p.ledger.to_le_bytes());
        out.extend_from_slice(&p.entry.to_le_bytes());
        out.extend_from_slice(&(self.snapshot.len() as u32).to_le_bytes());
        let mut names: Vec<_> = self.snapshot.iter().collect();
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

    /// Loads the snapshot of `topic` and folds in the entries after it.
    pub async fn load(topic: &TopicLog) -> Result<DedupSnapshot, ReadError> {
        let saved = topic
            .cursors()
            .await
            .ok()
            .and_then(|c| c.into_iter().find(|(n, _)| n == SNAPSHOT_NAME))
            .and_then(|(_, blob)| Self::decode_snapshot(&blob));
        let mut st = DedupSnapshot::default();
        if let Some((position, map)) = saved {
            st.snapshot = map;
            st.snapshot_position = position;
        }
        st.fold_to_tail(topic).await?;
        Ok(st)
    }

    /// Folds every durable entry after the snapshot position into the snapshot map.
    async fn fold_to_tail(&mut self, topic: &TopicLog) -> Result<(), ReadError> {
        let mut from = match self.snapshot_position {
            Some(p) => Position::new(p.ledger, p.entry + 1),
            None => topic.first_position(),
        };
        loop {
            let entries = topic.read_from(from, FOLD_BATCH).await?;
            let Some(last) = entries.last().map(|e| e.position) else {
                return Ok(());
            };
            for e in &entries {
                if let Ok(m) = entry_metadata(&e.payload) {
                    let seq = m.sequence_id as i64;
                    let highest = m.highest_sequence_id.map_or(seq, |h| seq.max(h as i64));
                    let v = self.snapshot.entry(m.producer_name).or_insert(-1);
                    *v = (*v).max(highest);
                }
            }
            self.snapshot_position = Some(last);
            from = Position::new(last.ledger, last.entry + 1);
        }
    }

    /// Brings the snapshot up to the log's tail and returns its encoding to save, or `None`
    /// when nothing new was appended since the last one.
    pub async fn snapshot(&mut self, topic: &TopicLog) -> Result<Option<Vec<u8>>, ReadError> {
        let before = self.snapshot_position;
        self.fold_to_tail(topic).await?;
        Ok((before != self.snapshot_position).then(|| self.encode_snapshot()))
    }
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
    fn snapshot_round_trips() {
        let mut d = DedupSnapshot::default();
        d.snapshot.insert("a".into(), 5);
        d.snapshot.insert("bé".into(), -1);
        d.snapshot_position = Some(Position::new(3, 9));
        let blob = d.encode_snapshot();
        let (pos, map) = DedupSnapshot::decode_snapshot(&blob).unwrap_or_default();
        assert_eq!(pos, Some(Position::new(3, 9)));
        assert_eq!(map, d.snapshot);
        assert!(DedupSnapshot::decode_snapshot(&blob[..blob.len() - 1]).is_none());
    }
}
