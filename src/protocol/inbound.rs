//! Typed bodies of the inbound commands whose raw fields carry meaning in numbers: enum codes
//! (`i32`) and sentinel message ids (`u64::MAX`, `i64::MAX`). They are decoded here once, so the
//! broker matches on enums and options, never on wire codes.
//!
//! Invariant: an unknown enum code decodes to the protocol's default for that field (as the
//! Java broker does with protobuf defaults): Exclusive for a subscription type, Shared for a
//! producer access mode, Latest for an initial position.

use super::proto::{self, command_ack::AckType, command_subscribe};

pub use super::proto::command_subscribe::SubType;

/// Where a new subscription (or reader) starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// The first entry the topic holds.
    Earliest,
    /// After the last entry written so far.
    Latest,
    /// A reader's start message (the whole entry is delivered; the client filters by batch
    /// index).
    Message {
        /// Ledger id.
        ledger: u64,
        /// Entry id.
        entry: u64,
    },
}

/// SUBSCRIBE.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscribe {
    /// Topic as the client named it.
    pub topic: String,
    /// Subscription name.
    pub subscription: String,
    /// Subscription type.
    pub sub_type: SubType,
    /// Consumer id on the connection.
    pub consumer_id: u64,
    /// Request id of the reply.
    pub request_id: u64,
    /// Consumer name (orders Failover consumers); empty when the client sent none.
    pub consumer_name: String,
    /// Priority level (lower first, for Failover).
    pub priority: i32,
    /// Whether the cursor is stored (false for readers).
    pub durable: bool,
    /// Where a new subscription starts.
    pub start: StartAt,
    /// The consumer's schema, checked against the topic's.
    pub schema: Option<proto::Schema>,
}

impl From<proto::CommandSubscribe> for Subscribe {
    fn from(s: proto::CommandSubscribe) -> Self {
        let start = match &s.start_message_id {
            Some(id) if id.ledger_id == u64::MAX && id.entry_id == u64::MAX => StartAt::Earliest,
            Some(id) if id.ledger_id == i64::MAX as u64 && id.entry_id == i64::MAX as u64 => {
                StartAt::Latest
            }
            Some(id) => StartAt::Message {
                ledger: id.ledger_id,
                entry: id.entry_id,
            },
            None => match s.initial_position {
                Some(p) if p == command_subscribe::InitialPosition::Earliest as i32 => {
                    StartAt::Earliest
                }
                _ => StartAt::Latest,
            },
        };
        Subscribe {
            sub_type: SubType::try_from(s.sub_type).unwrap_or(SubType::Exclusive),
            durable: s.durable.unwrap_or(true),
            consumer_name: s.consumer_name.unwrap_or_default(),
            priority: s.priority_level.unwrap_or(0),
            start,
            topic: s.topic,
            subscription: s.subscription,
            consumer_id: s.consumer_id,
            request_id: s.request_id,
            schema: s.schema,
        }
    }
}

/// PRODUCER.
#[derive(Debug, Clone, PartialEq)]
pub struct Producer {
    /// Topic as the client named it.
    pub topic: String,
    /// Producer id on the connection.
    pub producer_id: u64,
    /// Request id of the reply.
    pub request_id: u64,
    /// The name the client asked for (`None`: the broker names it).
    pub name: Option<String>,
    /// Any access mode but Shared: the producer must be alone on the topic.
    pub exclusive: bool,
    /// `WaitForExclusive`: it waits its turn rather than being refused while others are there.
    pub wait_for_exclusive: bool,
    /// The access mode as Pulsar names it (`Shared` when absent or unknown), for stats.
    pub access_mode: &'static str,
    /// The producer's schema, registered or matched.
    pub schema: Option<proto::Schema>,
}

impl From<proto::CommandProducer> for Producer {
    fn from(p: proto::CommandProducer) -> Self {
        let mode = p
            .producer_access_mode
            .and_then(|m| proto::ProducerAccessMode::try_from(m).ok())
            .unwrap_or(proto::ProducerAccessMode::Shared);
        Producer {
            name: p.producer_name.filter(|n| !n.is_empty()),
            exclusive: mode != proto::ProducerAccessMode::Shared,
            wait_for_exclusive: mode == proto::ProducerAccessMode::WaitForExclusive,
            access_mode: mode.as_str_name(),
            topic: p.topic,
            producer_id: p.producer_id,
            request_id: p.request_id,
            schema: p.schema,
        }
    }
}

/// One acknowledged message id of an ACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckedId {
    /// Ledger id.
    pub ledger: u64,
    /// Entry id.
    pub entry: u64,
    /// For a batch acknowledged in part: the bit words of the indices still unacknowledged
    /// (`ack_set`); `None` for the whole entry.
    pub unacked_in_batch: Option<Vec<i64>>,
}

/// ACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// Consumer id on the connection.
    pub consumer_id: u64,
    /// Cumulative (everything up to the id) rather than individual.
    pub cumulative: bool,
    /// The ids acknowledged.
    pub ids: Vec<AckedId>,
}

impl From<proto::CommandAck> for Ack {
    fn from(a: proto::CommandAck) -> Self {
        Ack {
            consumer_id: a.consumer_id,
            cumulative: a.ack_type == AckType::Cumulative as i32,
            ids: a
                .message_id
                .into_iter()
                .map(|m| AckedId {
                    ledger: m.ledger_id,
                    entry: m.entry_id,
                    unacked_in_batch: (!m.ack_set.is_empty()).then_some(m.ack_set),
                })
                .collect(),
        }
    }
}

/// Where a SEEK goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekTo {
    /// A message id.
    Message {
        /// Ledger id.
        ledger: u64,
        /// Entry id.
        entry: u64,
    },
    /// The first message published at or after this time (ms since the epoch).
    PublishTime(i64),
}

/// SEEK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seek {
    /// Consumer id on the connection.
    pub consumer_id: u64,
    /// Request id of the reply.
    pub request_id: u64,
    /// The target; `None` when the client sent neither a message id nor a time.
    pub to: Option<SeekTo>,
}

impl From<proto::CommandSeek> for Seek {
    fn from(s: proto::CommandSeek) -> Self {
        let to = match (&s.message_id, s.message_publish_time) {
            (Some(id), _) => Some(SeekTo::Message {
                ledger: id.ledger_id,
                entry: id.entry_id,
            }),
            (None, Some(t)) => Some(SeekTo::PublishTime(t as i64)),
            (None, None) => None,
        };
        Seek {
            consumer_id: s.consumer_id,
            request_id: s.request_id,
            to,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ledger: u64, entry: u64) -> proto::MessageIdData {
        proto::MessageIdData {
            ledger_id: ledger,
            entry_id: entry,
            ..Default::default()
        }
    }

    #[test]
    fn subscribe_start_positions_decode_from_sentinels() {
        let sub = |start: Option<proto::MessageIdData>, initial: Option<i32>| {
            Subscribe::from(proto::CommandSubscribe {
                start_message_id: start,
                initial_position: initial,
                ..Default::default()
            })
            .start
        };
        let earliest = command_subscribe::InitialPosition::Earliest as i32;
        assert_eq!(sub(Some(id(u64::MAX, u64::MAX)), None), StartAt::Earliest);
        let max = i64::MAX as u64;
        assert_eq!(sub(Some(id(max, max)), Some(earliest)), StartAt::Latest);
        assert_eq!(
            sub(Some(id(3, 7)), None),
            StartAt::Message {
                ledger: 3,
                entry: 7
            }
        );
        assert_eq!(sub(None, Some(earliest)), StartAt::Earliest);
        assert_eq!(sub(None, None), StartAt::Latest);
    }

    #[test]
    fn unknown_codes_take_the_protocol_defaults() {
        let s = Subscribe::from(proto::CommandSubscribe {
            sub_type: 99,
            ..Default::default()
        });
        assert_eq!((s.sub_type, s.durable), (SubType::Exclusive, true));
        let p = Producer::from(proto::CommandProducer {
            producer_access_mode: Some(99),
            producer_name: Some(String::new()),
            ..Default::default()
        });
        assert_eq!((p.exclusive, p.name), (false, None));
        let p = Producer::from(proto::CommandProducer {
            producer_access_mode: Some(proto::ProducerAccessMode::Exclusive as i32),
            ..Default::default()
        });
        assert!(p.exclusive);
    }

    #[test]
    fn acks_and_seeks_decode() {
        let a = Ack::from(proto::CommandAck {
            consumer_id: 4,
            ack_type: AckType::Cumulative as i32,
            message_id: vec![
                id(1, 2),
                proto::MessageIdData {
                    ack_set: vec![5],
                    ..id(1, 3)
                },
            ],
            ..Default::default()
        });
        assert!(a.cumulative);
        assert_eq!(a.ids[0].unacked_in_batch, None);
        assert_eq!(a.ids[1].unacked_in_batch, Some(vec![5]));
        let s = Seek::from(proto::CommandSeek {
            message_publish_time: Some(1_700),
            ..Default::default()
        });
        assert_eq!(s.to, Some(SeekTo::PublishTime(1_700)));
        let s = Seek::from(proto::CommandSeek::default());
        assert_eq!(s.to, None);
    }
}
