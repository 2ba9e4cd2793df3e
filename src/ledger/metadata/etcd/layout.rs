//! Where the etcd store keeps each record, and how a record's value is encoded (ADR 0006).
//!
//! Every key starts with the store's prefix (`/ledgerlake` by default) and a kind:
//!
//! ```text
//! P/ids/topic | P/ids/ledger             next id to hand out (absent: 1)
//! P/topics/name/<name>                   topic record (immutable once written)
//! P/topics/id/<topic:020>                the same record, listed in id order
//! P/ledgers/<topic:020>/<ledger:020>     ledger record (compare-and-set on its mod revision)
//! P/ledger-topic/<ledger:020>            the ledger's topic id (to find its record by id)
//! P/writers/<topic:020>                  epoch the topic's writers are fenced at (absent: 0)
//! P/cursors/<topic:020>/<subscription>   cursor blob (owned by the broker, stored as given)
//! P/partitioned/<name>                   partition count
//! P/schemas/<topic>\0<version:020>       schema blob (owned by the broker, stored as given)
//! P/policies/<scope>                     policies blob (owned by its module, stored as given)
//! ```
//!
//! Ids are zero-padded so that etcd's byte order is id order. A NUL separates a schema's topic
//! from its version because no name the broker accepts contains one.
//!
//! Records written by this store (topics, ledgers, counters, partition counts) are one format
//! byte ([`FORMAT`]) followed by JSON; a reader refuses any other format byte instead of
//! guessing. Blobs owned by other modules carry their own versions and are stored unchanged.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::super::{
    LedgerId, LedgerRecord, LedgerState, MetadataError, SealInfo, TopicId, TopicRecord,
};

/// Format byte of every record this store writes.
pub const FORMAT: u8 = 1;

/// Key builder for one store prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    /// Invariant: no trailing `/`.
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (a trailing `/` is dropped).
    pub fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    /// The prefix every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The counter of topic ids.
    pub fn topic_ids(&self) -> String {
        format!("{}/ids/topic", self.prefix)
    }

    /// The counter of ledger ids.
    pub fn ledger_ids(&self) -> String {
        format!("{}/ids/ledger", self.prefix)
    }

    /// A topic by name.
    pub fn topic_by_name(&self, name: &str) -> String {
        format!("{}/topics/name/{name}", self.prefix)
    }

    /// A topic by id.
    pub fn topic_by_id(&self, id: TopicId) -> String {
        format!("{}/topics/id/{id:020}", self.prefix)
    }

    /// Every topic, in id order.
    pub fn topics_by_id(&self) -> String {
        format!("{}/topics/id/", self.prefix)
    }

    /// One ledger's record.
    pub fn ledger(&self, topic: TopicId, id: LedgerId) -> String {
        format!(
            "{}/{id:020}",
            self.topic_ledgers(topic).trim_end_matches('/')
        )
    }

    /// Every ledger of one topic, in id order.
    pub fn topic_ledgers(&self, topic: TopicId) -> String {
        format!("{}/ledgers/{topic:020}/", self.prefix)
    }

    /// Every ledger of every topic.
    pub fn all_ledgers(&self) -> String {
        format!("{}/ledgers/", self.prefix)
    }

    /// The epoch a topic's writers are fenced at (ADR 0008).
    pub fn writers(&self, topic: TopicId) -> String {
        format!("{}/writers/{topic:020}", self.prefix)
    }

    /// The topic a ledger belongs to.
    pub fn ledger_topic(&self, id: LedgerId) -> String {
        format!("{}/ledger-topic/{id:020}", self.prefix)
    }

    /// One cursor.
    pub fn cursor(&self, topic: TopicId, subscription: &str) -> String {
        format!("{}{subscription}", self.topic_cursors(topic))
    }

    /// Every cursor of one topic, by subscription name.
    pub fn topic_cursors(&self, topic: TopicId) -> String {
        format!("{}/cursors/{topic:020}/", self.prefix)
    }

    /// A partitioned topic's count; with a partial name, the prefix of a listing.
    pub fn partitioned(&self, name: &str) -> String {
        format!("{}/partitioned/{name}", self.prefix)
    }

    /// Length of the part of a partitioned-topic key before the name.
    pub fn partitioned_name_offset(&self) -> usize {
        self.partitioned("").len()
    }

    /// One schema version.
    pub fn schema(&self, topic: &str, version: u64) -> Vec<u8> {
        let mut key = self.topic_schemas(topic);
        key.extend_from_slice(format!("{version:020}").as_bytes());
        key
    }

    /// Every schema version of one topic, ascending.
    pub fn topic_schemas(&self, topic: &str) -> Vec<u8> {
        let mut key = format!("{}/schemas/{topic}", self.prefix).into_bytes();
        key.push(0);
        key
    }

    /// A policies scope; with a partial scope, the prefix of a listing.
    pub fn policies(&self, scope: &str) -> String {
        format!("{}/policies/{scope}", self.prefix)
    }

    /// Length of the part of a policies key before the scope.
    pub fn policies_scope_offset(&self) -> usize {
        self.policies("").len()
    }
}

/// The version number at the end of a schema key.
pub fn schema_version_of(key: &[u8]) -> Result<u64, MetadataError> {
    let digits = key
        .len()
        .checked_sub(20)
        .and_then(|start| std::str::from_utf8(&key[start..]).ok())
        .ok_or_else(|| MetadataError::Corrupt("schema key without a version".into()))?;
    digits
        .parse()
        .map_err(|_| MetadataError::Corrupt(format!("schema key version '{digits}'")))
}

/// Encodes a record: the format byte, then JSON.
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    crate::versioned::encode(FORMAT, record)
}

/// Decodes a record written by [`encode`], refusing other format bytes.
pub fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, MetadataError> {
    crate::versioned::decode(FORMAT, what, bytes).map_err(MetadataError::Corrupt)
}

/// A topic as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredTopic {
    pub(crate) id: TopicId,
    pub(crate) name: String,
    pub(crate) created_at_ms: i64,
}

impl From<&TopicRecord> for StoredTopic {
    fn from(t: &TopicRecord) -> Self {
        StoredTopic {
            id: t.id,
            name: t.name.clone(),
            created_at_ms: t.created_at_ms,
        }
    }
}

impl From<StoredTopic> for TopicRecord {
    fn from(t: StoredTopic) -> Self {
        TopicRecord {
            id: t.id,
            name: t.name,
            created_at_ms: t.created_at_ms,
        }
    }
}

/// A ledger as stored; `state` is [`LedgerState`]'s persisted discriminant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredLedger {
    pub(crate) id: LedgerId,
    pub(crate) topic_id: TopicId,
    pub(crate) state: u8,
    pub(crate) first_segment: u32,
    pub(crate) seal: Option<SealInfo>,
    pub(crate) created_at_ms: i64,
    pub(crate) state_changed_at_ms: i64,
    pub(crate) offload_ref: Option<String>,
    /// Added by ADR 0007; absent in records written before it (read as empty).
    #[serde(default)]
    pub(crate) bookie: String,
    /// Added by ADR 0010; absent in records written before it (unreplicated).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) replicas: Vec<String>,
    /// Added by ADR 0010; absent in records written before it (1).
    #[serde(default = "one")]
    pub(crate) ack_quorum: u8,
    /// Added by ADR 0011; absent in records written before it (0: as many as listed).
    #[serde(default)]
    pub(crate) write_quorum: u8,
    /// Added by ADR 0017; absent when 0 (whole copies, and every record written before it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) stripe_width: u8,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

fn one() -> u8 {
    1
}

impl From<&LedgerRecord> for StoredLedger {
    fn from(l: &LedgerRecord) -> Self {
        StoredLedger {
            id: l.id,
            topic_id: l.topic_id,
            state: l.state.as_u8(),
            first_segment: l.first_segment,
            seal: l.seal,
            created_at_ms: l.created_at_ms,
            state_changed_at_ms: l.state_changed_at_ms,
            offload_ref: l.offload_ref.clone(),
            bookie: l.bookie.clone(),
            replicas: l.replicas.clone(),
            ack_quorum: l.ack_quorum,
            write_quorum: l.write_quorum,
            stripe_width: l.stripe_width,
        }
    }
}

impl TryFrom<StoredLedger> for LedgerRecord {
    type Error = MetadataError;
    fn try_from(l: StoredLedger) -> Result<Self, MetadataError> {
        let state = LedgerState::from_u8(l.state)
            .ok_or_else(|| MetadataError::Corrupt(format!("ledger {}: state {}", l.id, l.state)))?;
        Ok(LedgerRecord {
            id: l.id,
            topic_id: l.topic_id,
            state,
            first_segment: l.first_segment,
            seal: l.seal,
            created_at_ms: l.created_at_ms,
            state_changed_at_ms: l.state_changed_at_ms,
            offload_ref: l.offload_ref,
            bookie: l.bookie,
            replicas: l.replicas,
            ack_quorum: l.ack_quorum,
            write_quorum: l.write_quorum,
            stripe_width: l.stripe_width,
        })
    }
}

/// Decodes a stored ledger record.
pub fn decode_ledger(bytes: &[u8]) -> Result<LedgerRecord, MetadataError> {
    decode::<StoredLedger>("ledger record", bytes)?.try_into()
}

/// Encodes a ledger record.
pub fn encode_ledger(ledger: &LedgerRecord) -> Vec<u8> {
    encode(&StoredLedger::from(ledger))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state() -> impl Strategy<Value = LedgerState> {
        (1u8..=5).prop_map(|v| LedgerState::from_u8(v).unwrap_or(LedgerState::Open))
    }

    fn seal() -> impl Strategy<Value = Option<SealInfo>> {
        proptest::option::of(
            (
                any::<u64>(),
                any::<u64>(),
                any::<Option<i64>>(),
                any::<Option<i64>>(),
                any::<u32>(),
                any::<u32>(),
            )
                .prop_map(|(e, s, lo, hi, seg, c)| SealInfo {
                    entry_count: e,
                    size_bytes: s,
                    min_publish_ms: lo,
                    max_publish_ms: hi,
                    last_segment: seg,
                    checksum: c,
                }),
        )
    }

    proptest! {
        #[test]
        fn ledger_records_round_trip(
            id in any::<u64>(), topic in any::<u64>(), state in state(), first in any::<u32>(),
            seal in seal(), created in any::<i64>(), changed in any::<i64>(),
            offload in proptest::option::of(".*"), bookie in ".*",
            replicas in proptest::collection::vec(".*", 0..4), ack_quorum in 1u8..4,
            write_quorum in any::<u8>(), stripe_width in any::<u8>(),
        ) {
            let record = LedgerRecord {
                id, topic_id: topic, state, first_segment: first, seal,
                created_at_ms: created, state_changed_at_ms: changed, offload_ref: offload,
                bookie, replicas, ack_quorum, write_quorum, stripe_width,
            };
            let bytes = encode_ledger(&record);
            prop_assert_eq!(bytes[0], FORMAT);
            prop_assert_eq!(decode_ledger(&bytes).ok(), Some(record));
        }

        #[test]
        fn topic_records_round_trip(id in any::<u64>(), name in ".*", created in any::<i64>()) {
            let record = TopicRecord { id, name, created_at_ms: created };
            let bytes = encode(&StoredTopic::from(&record));
            let back: StoredTopic = decode("topic", &bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(TopicRecord::from(back), record);
        }

        #[test]
        fn counters_round_trip(n in any::<u64>()) {
            prop_assert_eq!(decode::<u64>("counter", &encode(&n)).ok(), Some(n));
        }

        #[test]
        fn schema_keys_give_back_their_version(topic in "[a-z/:]{0,30}", version in any::<u64>()) {
            let keys = Keys::new("/p");
            let key = keys.schema(&topic, version);
            prop_assert!(key.starts_with(&keys.topic_schemas(&topic)));
            prop_assert_eq!(schema_version_of(&key).ok(), Some(version));
        }
    }

    #[test]
    fn other_formats_are_refused() {
        let mut bytes = encode(&7u64);
        bytes[0] = FORMAT + 1;
        assert!(matches!(
            decode::<u64>("counter", &bytes),
            Err(MetadataError::Corrupt(_))
        ));
        assert!(decode::<u64>("counter", &[]).is_err());
        let mut ledger = encode_ledger(&LedgerRecord {
            id: 1,
            topic_id: 1,
            state: LedgerState::Open,
            first_segment: 0,
            seal: None,
            created_at_ms: 0,
            state_changed_at_ms: 0,
            offload_ref: None,
            bookie: String::new(),
            replicas: Vec::new(),
            ack_quorum: 1,
            write_quorum: 1,
            stripe_width: 0,
        });
        // A state this build does not know is corrupt, not a default.
        let text = String::from_utf8_lossy(&ledger[1..]).replace("\"state\":1", "\"state\":9");
        ledger.truncate(1);
        ledger.extend_from_slice(text.as_bytes());
        assert!(decode_ledger(&ledger).is_err());
    }

    #[test]
    fn ids_sort_as_keys() {
        let keys = Keys::new("/p/");
        assert!(keys.topic_by_id(9) < keys.topic_by_id(10));
        assert!(keys.ledger(3, 99) < keys.ledger(3, 100));
        assert!(keys.ledger(3, 5).starts_with(&keys.topic_ledgers(3)));
        assert!(!keys.ledger(31, 5).starts_with(&keys.topic_ledgers(3)));
        assert_eq!(keys.topic_ids(), "/p/ids/topic");
    }
}
