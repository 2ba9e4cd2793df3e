//! `ledgerlake admin topics …` verbs beyond listing, stats and permissions, as pulsar-admin
//! names them: create, update-partitioned-topic, partitioned-stats, stats-internal,
//! subscriptions and their cursors (create-subscription, unsubscribe, skip, clear-backlog,
//! expire-messages, reset-cursor), last-message-id, unload, and reading messages
//! (peek-messages, examine-message), which print each message's id, metadata and payload.

use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::{json, Value};

use super::{get, topic_path, with, Request};

/// Topic verbs of `admin topics`.
#[derive(Debug, Subcommand)]
pub enum TopicOpVerb {
    /// Create a non-partitioned topic.
    Create { topic: String },
    /// Raise a partitioned topic's partition count (clients pick the new partitions up).
    UpdatePartitionedTopic {
        topic: String,
        #[arg(long, short = 'p')]
        partitions: u32,
    },
    /// A partitioned topic's stats, summed, with each partition's.
    PartitionedStats {
        topic: String,
        /// Include each partition's stats.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        per_partition: bool,
    },
    /// Ledgers with their tier (local, offloaded, lake) and cursors of a topic or partition.
    StatsInternal { topic: String },
    /// The topic's durable subscriptions.
    Subscriptions { topic: String },
    /// Create a durable subscription at a position.
    CreateSubscription {
        topic: String,
        #[arg(long, short = 's')]
        subscription: String,
        /// `latest`, `earliest` or a message id `ledger:entry`.
        #[arg(long = "messageId", short = 'm', default_value = "latest")]
        message_id: String,
    },
    /// Delete a subscription (`--force` disconnects its consumers first).
    Unsubscribe {
        topic: String,
        #[arg(long, short = 's')]
        subscription: String,
        #[arg(long, short = 'f')]
        force: bool,
    },
    /// Skip the next N messages of a subscription's backlog.
    Skip {
        topic: String,
        #[arg(long, short = 's')]
        subscription: String,
        #[arg(long = "count", short = 'n')]
        count: u64,
    },
    /// Skip a subscription's whole backlog.
    ClearBacklog {
        topic: String,
        #[arg(long, short = 's')]
        subscription: String,
    },
    /// Skip the messages older than a time (e.g. `1h`) of one or every subscription.
    ExpireMessages {
        topic: String,
        #[arg(long, short = 's', required_unless_present = "all_subscriptions")]
        subscription: Option<String>,
        /// Age, e.g. `30s`, `10m`, `1h`.
        #[arg(long = "expireTime", short = 't')]
        expire_time: String,
        /// Every subscription of the topic.
        #[arg(long = "all-subscriptions", short = 'e')]
        all_subscriptions: bool,
    },
    /// Move a subscription back or forward: to a time ago (`-t 10m`) or a message id.
    ResetCursor {
        topic: String,
        #[arg(long, short = 's')]
        subscription: String,
        /// How long ago, e.g. `10m`.
        #[arg(long, short = 't', conflicts_with = "message_id")]
        time: Option<String>,
        /// A message id `ledger:entry`.
        #[arg(long = "messageId", short = 'm')]
        message_id: Option<String>,
    },
    /// The id of the topic's last message.
    LastMessageId { topic: String },
    /// Disconnect the topic's clients and unload it (they reconnect at once).
    Unload { topic: String },
    /// Print the next N messages of a subscription's backlog without consuming them.
    PeekMessages {
        topic: String,
        #[arg(long, short = 's')]
        subscription: String,
        #[arg(long = "count", short = 'n', default_value_t = 1,
              value_parser = clap::value_parser!(u64).range(1..))]
        count: u64,
    },
    /// Print one message counted from the first (`-i earliest`) or back from the last.
    ExamineMessage {
        topic: String,
        #[arg(long = "initialPosition", short = 'i', default_value = "latest")]
        initial_position: String,
        #[arg(long = "messagePosition", short = 'm', default_value_t = 1)]
        message_position: u64,
    },
}

/// `ledger:entry` as Pulsar's `MessageId` JSON.
fn message_id_json(id: &str) -> anyhow::Result<Value> {
    match id {
        "earliest" => Ok(json!({"ledgerId": -1, "entryId": -1})),
        "latest" => Ok(json!({"ledgerId": i64::MAX, "entryId": i64::MAX})),
        _ => {
            let (l, e) = id
                .split_once(':')
                .with_context(|| format!("'{id}' is not ledger:entry, earliest or latest"))?;
            Ok(json!({"ledgerId": l.parse::<u64>()?, "entryId": e.parse::<u64>()?}))
        }
    }
}

fn seconds(text: &str) -> anyhow::Result<u64> {
    Ok(humantime::parse_duration(text)
        .with_context(|| format!("'{text}' is not a duration like 30s, 10m or 1h"))?
        .as_secs())
}

/// The request of a verb answered with JSON; `None` for the verbs that read messages.
pub(super) fn request(v: &TopicOpVerb) -> anyhow::Result<Option<Request>> {
    use reqwest::Method as M;
    Ok(Some(match v {
        TopicOpVerb::Create { topic } => with(M::PUT, topic_path(topic)?, None),
        TopicOpVerb::UpdatePartitionedTopic { topic, partitions } => with(
            M::POST,
            format!("{}/partitions", topic_path(topic)?),
            Some(json!(partitions)),
        ),
        TopicOpVerb::PartitionedStats {
            topic,
            per_partition,
        } => get(format!(
            "{}/partitioned-stats?perPartition={per_partition}",
            topic_path(topic)?
        )),
        TopicOpVerb::StatsInternal { topic } => {
            get(format!("{}/internalStats", topic_path(topic)?))
        }
        TopicOpVerb::Subscriptions { topic } => {
            get(format!("{}/subscriptions", topic_path(topic)?))
        }
        TopicOpVerb::CreateSubscription { .. }
        | TopicOpVerb::Unsubscribe { .. }
        | TopicOpVerb::Skip { .. }
        | TopicOpVerb::ClearBacklog { .. }
        | TopicOpVerb::ExpireMessages { .. }
        | TopicOpVerb::ResetCursor { .. } => subscription_request(v)?,
        TopicOpVerb::LastMessageId { topic } => {
            get(format!("{}/lastMessageId", topic_path(topic)?))
        }
        TopicOpVerb::Unload { topic } => {
            with(M::PUT, format!("{}/unload", topic_path(topic)?), None)
        }
        TopicOpVerb::PeekMessages { .. } | TopicOpVerb::ExamineMessage { .. } => return Ok(None),
    }))
}

/// The request of a verb on one subscription.
fn subscription_request(v: &TopicOpVerb) -> anyhow::Result<Request> {
    use reqwest::Method as M;
    let sub = |t: &str, s: &str| -> anyhow::Result<String> {
        Ok(format!("{}/subscription/{s}", topic_path(t)?))
    };
    Ok(match v {
        TopicOpVerb::CreateSubscription {
            topic,
            subscription,
            message_id,
        } => with(
            M::PUT,
            sub(topic, subscription)?,
            Some(message_id_json(message_id)?),
        ),
        TopicOpVerb::Unsubscribe {
            topic,
            subscription,
            force,
        } => with(
            M::DELETE,
            format!("{}?force={force}", sub(topic, subscription)?),
            None,
        ),
        TopicOpVerb::Skip {
            topic,
            subscription,
            count,
        } => with(
            M::POST,
            format!("{}/skip/{count}", sub(topic, subscription)?),
            None,
        ),
        TopicOpVerb::ClearBacklog {
            topic,
            subscription,
        } => with(
            M::POST,
            format!("{}/skip_all", sub(topic, subscription)?),
            None,
        ),
        TopicOpVerb::ExpireMessages {
            topic,
            subscription,
            expire_time,
            all_subscriptions,
        } => {
            let secs = seconds(expire_time)?;
            let path = match (all_subscriptions, subscription) {
                (true, _) => format!(
                    "{}/all_subscription/expireMessages/{secs}",
                    topic_path(topic)?
                ),
                (false, Some(s)) => format!("{}/expireMessages/{secs}", sub(topic, s)?),
                (false, None) => bail!("give --subscription or --all-subscriptions"),
            };
            with(M::POST, path, None)
        }
        TopicOpVerb::ResetCursor {
            topic,
            subscription,
            time,
            message_id,
        } => match (time, message_id) {
            (Some(t), None) => {
                let now_ms = crate::ledger::now_ms();
                let at = now_ms - i64::try_from(seconds(t)?.saturating_mul(1000))?;
                with(
                    M::POST,
                    format!("{}/resetcursor/{at}", sub(topic, subscription)?),
                    None,
                )
            }
            (None, Some(id)) => with(
                M::POST,
                format!("{}/resetcursor", sub(topic, subscription)?),
                Some(message_id_json(id)?),
            ),
            _ => bail!("give --time or --messageId"),
        },
        other => bail!("{other:?} is not a subscription verb"),
    })
}

/// The message reads of `peek-messages` (one request per position, stopping at the end of
/// the backlog) or `examine-message`.
pub(super) fn message_paths(v: &TopicOpVerb) -> anyhow::Result<Vec<String>> {
    Ok(match v {
        TopicOpVerb::PeekMessages {
            topic,
            subscription,
            count,
        } => (1..=*count)
            .map(|n| {
                Ok(format!(
                    "{}/subscription/{subscription}/position/{n}",
                    topic_path(topic)?
                ))
            })
            .collect::<anyhow::Result<Vec<_>>>()?,
        TopicOpVerb::ExamineMessage {
            topic,
            initial_position,
            message_position,
        } => vec![format!(
            "{}/examinemessage?initialPosition={initial_position}&messagePosition={message_position}",
            topic_path(topic)?
        )],
        _ => Vec::new(),
    })
}

/// One message as the service answered it: the `X-Pulsar-*` headers and the payload.
pub(super) fn message_json(headers: &reqwest::header::HeaderMap, body: &[u8]) -> Value {
    let mut meta = serde_json::Map::new();
    let mut properties = serde_json::Map::new();
    for (name, value) in headers {
        let (name, value) = (name.as_str(), value.to_str().unwrap_or_default());
        if let Some(key) = name.strip_prefix("x-pulsar-property-") {
            properties.insert(key.to_string(), json!(value));
        } else if let Some(field) = name.strip_prefix("x-pulsar-") {
            meta.insert(field.to_string(), json!(value));
        }
    }
    meta.insert("properties".into(), Value::Object(properties));
    let payload = match std::str::from_utf8(body) {
        Ok(text) => json!(text),
        Err(_) => json!({ "hex": body.iter().map(|b| format!("{b:02x}")).collect::<String>() }),
    };
    meta.insert("payload".into(), payload);
    Value::Object(meta)
}
