//! Topic operations of the admin API beyond partitions and deletion (Pulsar's paths): create a
//! non-partitioned topic, partitioned stats, internal stats (ledgers with their tier, cursors),
//! subscriptions (list, create at a position, delete, skip, clear, expire, reset), peek and
//! examine, the last message id, and unload.

use serde_json::json;

use super::{Operations, OpsError};
use crate::broker::manage::{Examine, Skip};
use crate::broker::subscription::SeekTarget;
use crate::ledger::{Entry, LedgerState, Position};
use crate::naming::TopicName;
use crate::protocol::inbound::StartAt;

/// Where a subscription created by the admin API starts, or a cursor is reset to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The first entry.
    Earliest,
    /// After the last entry.
    Latest,
    /// This entry.
    Position(Position),
}

impl Operations {
    fn partition_names(&self, name: &TopicName, partitions: u32) -> Vec<TopicName> {
        if partitions == 0 {
            vec![name.clone()]
        } else {
            (0..partitions).map(|i| name.partition_name(i)).collect()
        }
    }

    /// Creates non-partitioned topic `name` (`PUT …/{topic}`): 409 when it or a partitioned
    /// topic of that name exists.
    pub async fn create_topic(&self, name: &TopicName) -> Result<(), OpsError> {
        self.existing_namespace(&name.namespace).await?;
        if self.partitions(name).await? > 0 || self.log.topic_exists(&name.to_string()).await? {
            return Err(OpsError::Conflict(format!(
                "This topic already exists: {name}"
            )));
        }
        self.broker.check_topic_quota(&name.namespace, 1).await?;
        self.log.ensure_topic(&name.to_string()).await?;
        tracing::info!(topic = %name, "topic created");
        Ok(())
    }

    /// Pulsar's `partitioned-stats`: the partitions' stats summed, the partition count, and
    /// with `per_partition` each partition's own stats.
    pub async fn partitioned_stats(
        &self,
        name: &TopicName,
        per_partition: bool,
    ) -> Result<serde_json::Value, OpsError> {
        let n = self.partitions(name).await?;
        if n == 0 {
            return Err(OpsError::NotFound(format!(
                "Partitioned Topic not found: {name} is not a partitioned topic"
            )));
        }
        let mut stats = self.topic_stats(name).await?;
        let mut partitions = serde_json::Map::new();
        let mut subscriptions = serde_json::Map::new();
        for p in self.partition_names(name, n) {
            match self.topic_stats(&p).await {
                Ok(s) => {
                    if let Some(subs) = s["subscriptions"].as_object() {
                        for (sub, one) in subs {
                            add_numbers(subscriptions.entry(sub.clone()).or_insert(json!({})), one);
                        }
                    }
                    partitions.insert(p.to_string(), s);
                }
                // A declared partition nobody used yet has no log.
                Err(OpsError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if !per_partition {
            partitions.clear();
        }
        if let Some(o) = stats.as_object_mut() {
            o.insert("metadata".into(), json!({ "partitions": n }));
            o.insert("partitions".into(), serde_json::Value::Object(partitions));
            // Keyed by subscription name, summed over the partitions (as Pulsar aggregates).
            o.insert(
                "subscriptions".into(),
                serde_json::Value::Object(subscriptions),
            );
        }
        Ok(stats)
    }

    /// Pulsar's `internalStats` of a topic partition (or non-partitioned topic): entries,
    /// size, the last confirmed entry, each ledger with its tier (`local`, `offloaded`: in the
    /// lake and still local, `lake`: in the lake only), and the loaded cursors.
    pub async fn internal_stats(&self, name: &TopicName) -> Result<serde_json::Value, OpsError> {
        if self.partitions(name).await? > 0 {
            return Err(OpsError::Invalid(format!(
                "{name} is a partitioned topic: ask one of its partitions"
            )));
        }
        self.broker.check_served_here(name).await?;
        let key = name.to_string();
        if !self.log.topic_exists(&key).await? {
            return Err(OpsError::NotFound(format!("Topic {name} not found")));
        }
        let Some(log) = self.log.topic_view(&key).await? else {
            return Err(OpsError::NotFound(format!("Topic {name} not found")));
        };
        let ledgers = log.ledgers();
        let (mut entries, mut size) = (0u64, 0u64);
        let listed: Vec<serde_json::Value> = ledgers
            .iter()
            // A discarded ledger (opened for a producer that sent nothing, or found empty by
            // recovery) holds nothing in any tier.
            .filter(|l| !(l.state == LedgerState::Deleted && l.entry_count == 0))
            .map(|l| {
                entries += l.entry_count;
                size += l.size_bytes;
                // Where this node reads it: an offloaded ledger it does not hold whole (another
                // bookie's, or striped) is read from the lake only.
                let tier = match l.state {
                    _ if l.from_lake => "lake",
                    LedgerState::Open | LedgerState::Sealed => "local",
                    LedgerState::Offloaded => "offloaded",
                    _ => "lake",
                };
                json!({
                    "ledgerId": l.id,
                    "entries": l.entry_count,
                    "size": l.size_bytes,
                    "offloaded": tier != "local",
                    "tier": tier,
                    "state": l.state,
                })
            })
            .collect();
        let mut cursors = serde_json::Map::new();
        for (sub, s) in self.broker.subscription_stats(&key).await {
            let mark_delete = log
                .position_before(s.first_unacked)
                .map_or_else(|| "-1:-1".to_string(), |p| p.to_string());
            cursors.insert(
                sub,
                json!({
                    "markDeletePosition": mark_delete,
                    "readPosition": s.read_position,
                    "messagesConsumedCounter": serde_json::Value::Null,
                    "numberOfEntriesSinceFirstNotAckedMessage": s.msg_backlog,
                    "totalNonContiguousDeletedMessagesRange": 0,
                    "state": if s.consumers.is_empty() { "NoConsumers" } else { "Open" },
                }),
            );
        }
        let last = log
            .last_confirmed()
            .map_or_else(|| "-1:-1".to_string(), |p| p.to_string());
        Ok(json!({
            "entriesAddedCounter": entries,
            "numberOfEntries": entries,
            "totalSize": size,
            "currentLedgerEntries": ledgers.last().map_or(0, |l| l.entry_count),
            "currentLedgerSize": ledgers.last().map_or(0, |l| l.size_bytes),
            "lastConfirmedEntry": last,
            "state": "LedgerOpened",
            "ledgers": listed,
            "cursors": cursors,
        }))
    }

    /// The durable subscriptions of `name` (every partition's, once, for a partitioned topic).
    pub async fn subscriptions(&self, name: &TopicName) -> Result<Vec<String>, OpsError> {
        let n = self.partitions(name).await?;
        let mut all = std::collections::BTreeSet::new();
        for p in self.partition_names(name, n) {
            match self.broker.subscription_names(&p).await {
                Ok(names) => all.extend(names),
                Err(crate::broker::BrokerError::TopicNotFound(_)) if n > 0 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(all.into_iter().collect())
    }

    /// Creates durable subscription `sub` at `at` (on every partition of a partitioned topic).
    pub async fn create_subscription(
        &self,
        name: &TopicName,
        sub: &str,
        at: Target,
    ) -> Result<(), OpsError> {
        let start = match at {
            Target::Earliest => StartAt::Earliest,
            Target::Latest => StartAt::Latest,
            Target::Position(p) => StartAt::Message {
                ledger: p.ledger,
                entry: p.entry,
            },
        };
        let n = self.partitions(name).await?;
        for p in self.partition_names(name, n) {
            if n > 0 {
                // A declared partition nobody used yet gets its log, as Pulsar creates the
                // partitions of a partitioned topic, so the subscription exists on all.
                self.log.ensure_topic(&p.to_string()).await?;
            }
            self.broker.create_subscription(&p, sub, start).await?;
        }
        tracing::info!(topic = %name, subscription = sub, "subscription created");
        Ok(())
    }

    /// The partitions of `name` on which `sub` exists (the topic itself when it is not
    /// partitioned); `NotFound` when none has it. Partitions without a log or without the
    /// subscription are passed over, before anything changes.
    async fn with_subscription(
        &self,
        name: &TopicName,
        sub: &str,
    ) -> Result<Vec<TopicName>, OpsError> {
        let n = self.partitions(name).await?;
        if n == 0 {
            return Ok(vec![name.clone()]);
        }
        let mut found = Vec::new();
        for p in self.partition_names(name, n) {
            match self.broker.subscription_names(&p).await {
                Ok(names) if names.iter().any(|s| s == sub) => found.push(p),
                Ok(_) | Err(crate::broker::BrokerError::TopicNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if found.is_empty() {
            return Err(OpsError::NotFound(format!(
                "Subscription {sub} not found on {name}"
            )));
        }
        Ok(found)
    }

    /// Deletes subscription `sub` (from every partition); 412 while consumers are attached
    /// unless `force`.
    pub async fn delete_subscription(
        &self,
        name: &TopicName,
        sub: &str,
        force: bool,
    ) -> Result<(), OpsError> {
        for p in self.with_subscription(name, sub).await? {
            self.broker.delete_subscription(&p, sub, force).await?;
        }
        tracing::info!(topic = %name, subscription = sub, "subscription deleted");
        Ok(())
    }

    /// Moves subscription `sub` forward (every partition); returns the entries skipped.
    pub async fn skip(&self, name: &TopicName, sub: &str, how: Skip) -> Result<u64, OpsError> {
        let mut total = 0;
        for p in self.with_subscription(name, sub).await? {
            total += self.broker.skip(&p, sub, how).await?;
        }
        tracing::info!(topic = %name, subscription = sub, ?how, entries = total,
            "subscription skipped forward");
        Ok(total)
    }

    /// Resets subscription `sub` to a publish time (every partition) or to a message id (its
    /// partition); its consumers reconnect there.
    pub async fn reset_cursor(
        &self,
        name: &TopicName,
        sub: &str,
        to: SeekTarget,
        partition: Option<u32>,
    ) -> Result<(), OpsError> {
        let n = self.partitions(name).await?;
        let targets = match (to, partition) {
            (SeekTarget::Position(_), Some(i)) if n > 0 => vec![name.partition_name(i)],
            (SeekTarget::Position(_), None) if n > 0 => {
                return Err(OpsError::NotAllowed(format!(
                    "Reset-cursor at a position is not allowed for a partitioned topic ({name}): \
                     name the partition (partitionIndex) or reset by time"
                )))
            }
            _ => self.with_subscription(name, sub).await?,
        };
        for p in targets {
            self.broker.reset_cursor(&p, sub, to).await?;
        }
        tracing::info!(topic = %name, subscription = sub, ?to, "cursor reset");
        Ok(())
    }

    /// The `n`-th message of subscription `sub`'s backlog (1-based).
    pub async fn peek(&self, name: &TopicName, sub: &str, n: u64) -> Result<Entry, OpsError> {
        self.broker.peek(name, sub, n).await?.ok_or_else(|| {
            OpsError::NotFound(format!(
                "Message not found: the backlog of {sub} on {name} has fewer than {n} entries"
            ))
        })
    }

    /// An entry counted from the first or the last (`examinemessage`).
    pub async fn examine(&self, name: &TopicName, from: Examine) -> Result<Entry, OpsError> {
        self.broker.examine(name, from).await?.ok_or_else(|| {
            OpsError::NotFound(format!("Message not found: {name} has fewer entries"))
        })
    }

    /// Pulsar's `lastMessageId`: `{ledgerId, entryId, partitionIndex}` (-1s when empty).
    pub async fn last_message_id(&self, name: &TopicName) -> Result<serde_json::Value, OpsError> {
        let p = self.broker.last_position(name).await?;
        let partition = name.partition().map_or(-1, |p| p as i64);
        Ok(match p {
            Some(p) => {
                json!({"ledgerId": p.ledger, "entryId": p.entry, "partitionIndex": partition})
            }
            None => json!({"ledgerId": -1, "entryId": -1, "partitionIndex": partition}),
        })
    }

    /// Every loaded topic partition's rates, backlog, offload lag and flags in Pulsar's
    /// `broker-stats/topics` shape: namespace → bundle → `persistent` → topic → stats.
    pub fn broker_topic_stats(&self) -> Result<serde_json::Value, OpsError> {
        let families = self.broker.metric_families().ok_or_else(|| {
            OpsError::Disabled("metrics are disabled (metrics.enabled = false)".into())
        })?;
        let mut out = serde_json::Map::new();
        for r in families.rows {
            let subs: serde_json::Map<String, serde_json::Value> = r
                .subscriptions_rows
                .iter()
                .map(|s| {
                    let stats = json!({
                        "msgBacklog": s.back_log,
                        "backlogSize": s.backlog_size,
                        "msgRateOut": s.rate_out,
                        "messageAckRate": s.ack_rate,
                        "unackedMessages": s.unacked_messages,
                        "consumerCount": s.consumers,
                        "readingLake": s.reading_lake,
                        "lagGrowing": s.lag_growing,
                        "hotConsumers": s.hot_consumers,
                    });
                    (s.name.clone(), stats)
                })
                .collect();
            let stats = json!({
                "msgRateIn": r.rate_in,
                "msgThroughputIn": r.throughput_in,
                "msgRateOut": r.rate_out,
                "msgThroughputOut": r.throughput_out,
                "producerCount": r.producers,
                "consumerCount": r.consumers,
                "storageSize": r.storage_size,
                "offloadedStorageSize": r.offloaded_size,
                "msgBacklog": r.msg_backlog,
                "backlogSize": r.backlog_size,
                "backlogAgeSeconds": r.backlog_age_seconds,
                "offloadLagBytes": r.offload_lag_bytes,
                "offloadLagSeconds": r.offload_lag_seconds,
                "inRateShare": r.in_rate_share,
                "hot": r.hot,
                "subscriptions": subs,
            });
            let bundles = out
                .entry(r.namespace.clone())
                .or_insert_with(|| json!({ "0x00000000_0xffffffff": { "persistent": {} } }));
            if let Some(topics) = bundles
                .pointer_mut("/0x00000000_0xffffffff/persistent")
                .and_then(|v| v.as_object_mut())
            {
                topics.insert(r.topic.clone(), stats);
            }
        }
        Ok(serde_json::Value::Object(out))
    }

    /// Unloads `name` (every partition of a partitioned topic): clients reconnect and load it
    /// anew, on node `to` when one is named (a planned move; nothing is copied).
    pub async fn unload(&self, name: &TopicName, to: Option<&str>) -> Result<(), OpsError> {
        let n = self.partitions(name).await?;
        // All or nothing: no partition is unloaded while another node serves one of them.
        for p in self.partition_names(name, n) {
            self.broker.check_served_here(&p).await?;
        }
        for p in self.partition_names(name, n) {
            match self.broker.unload_to(&p, to).await {
                Ok(_) => {}
                Err(crate::broker::BrokerError::TopicNotFound(_)) if n > 0 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// Adds the numbers of `one` into `sum` field by field (a subscription's stats summed over the
/// partitions) and appends its arrays (each partition's consumers, as Pulsar's partitioned
/// stats list them); other fields keep the first partition's value.
fn add_numbers(sum: &mut serde_json::Value, one: &serde_json::Value) {
    let (Some(sum), Some(one)) = (sum.as_object_mut(), one.as_object()) else {
        return;
    };
    for (k, v) in one {
        match (sum.get(k), v) {
            (Some(serde_json::Value::Number(a)), serde_json::Value::Number(b)) => {
                let total = match (a.as_u64(), b.as_u64()) {
                    (Some(x), Some(y)) => json!(x + y),
                    _ => json!(a.as_f64().unwrap_or(0.0) + b.as_f64().unwrap_or(0.0)),
                };
                sum.insert(k.clone(), total);
            }
            (Some(serde_json::Value::Array(_)), serde_json::Value::Array(more)) => {
                if let Some(serde_json::Value::Array(all)) = sum.get_mut(k) {
                    all.extend(more.iter().cloned());
                }
            }
            (None, _) => {
                sum.insert(k.clone(), v.clone());
            }
            _ => {}
        }
    }
}
