//! What the admin API asks of a topic partition beyond its stats (Pulsar's paths): its
//! subscriptions (create at a position, delete, skip, clear, expire, reset), peeking and
//! examining messages, its last message id, and unloading it.
//!
//! Every call names one topic partition (or non-partitioned topic) that must exist: none
//! creates a topic. A call that needs the topic loaded loads it, as a client would.

use std::sync::Arc;

use super::backlog::{end_position, nth_entry_from, nth_entry_from_end};
use super::subscription::{CursorRequest, SeekTarget, SubscriptionCommand, SubscriptionHandle};
use super::topic::SubscribeRequest;
use super::{Broker, BrokerError, BrokerTopic};
use crate::cluster::ownership::OwnershipError;
use crate::ledger::{now_ms, Entry, Position};
use crate::naming::TopicName;
use crate::protocol::inbound::StartAt;
use crate::protocol::proto::command_subscribe::SubType;
use crate::replay::EntryReader;

/// How a subscription moves forward without its consumers acknowledging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// The next `n` entries of its backlog.
    Entries(u64),
    /// Its whole backlog (`clear-backlog`).
    All,
    /// The entries published more than this many seconds ago (`expireMessages`).
    OlderThanSeconds(u64),
}

/// Where `examinemessage` counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Examine {
    /// The n-th entry from the first (1-based).
    Earliest(u64),
    /// The n-th entry back from the last (1 = the last).
    Latest(u64),
}

impl Broker {
    /// The loaded topic partition `name`, loaded when it exists; `TopicNotFound` otherwise
    /// (an admin call never creates a topic).
    async fn existing(&self, name: &TopicName) -> Result<Arc<BrokerTopic>, BrokerError> {
        if !self.log.topic_exists(&name.to_string()).await? {
            return Err(BrokerError::TopicNotFound(format!(
                "Topic {name} not found"
            )));
        }
        self.topic(name).await
    }

    async fn subscription(
        &self,
        topic: &BrokerTopic,
        sub: &str,
    ) -> Result<SubscriptionHandle, BrokerError> {
        topic
            .subscriptions()
            .await
            .into_iter()
            .find(|h| h.name == sub)
            .ok_or_else(|| {
                BrokerError::SubscriptionNotFound(format!(
                    "Subscription {sub} not found on {}",
                    topic.name
                ))
            })
    }

    /// The subscriptions of topic partition `name`.
    pub async fn subscription_names(&self, name: &TopicName) -> Result<Vec<String>, BrokerError> {
        let topic = self.existing(name).await?;
        let mut names: Vec<String> = topic
            .subscriptions()
            .await
            .into_iter()
            .filter(|h| h.durable)
            .map(|h| h.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Creates durable subscription `sub` at `start` (Pulsar's `PUT …/subscription/{sub}`):
    /// `SubscriptionExists` when it exists.
    pub async fn create_subscription(
        &self,
        name: &TopicName,
        sub: &str,
        start: StartAt,
    ) -> Result<(), BrokerError> {
        let topic = self.existing(name).await?;
        if self.subscription(&topic, sub).await.is_ok() {
            return Err(BrokerError::SubscriptionExists(format!(
                "Subscription {sub} already exists on {name}"
            )));
        }
        let handle = topic
            .subscribe(SubscribeRequest {
                name: sub.to_string(),
                sub_type: SubType::Exclusive,
                durable: true,
                start,
            })
            .await?;
        // Saved now, so it survives a restart even if nobody ever attaches.
        handle.ask(SubscriptionCommand::Flush).await;
        Ok(())
    }

    /// Deletes subscription `sub`: refused (`TopicBusy`) while consumers are attached unless
    /// `force`, which closes them first.
    pub async fn delete_subscription(
        &self,
        name: &TopicName,
        sub: &str,
        force: bool,
    ) -> Result<(), BrokerError> {
        let topic = self.existing(name).await?;
        let handle = self.subscription(&topic, sub).await?;
        let stats = handle.ask(SubscriptionCommand::Stats).await;
        if !force && stats.is_some_and(|s| !s.consumers.is_empty()) {
            return Err(BrokerError::TopicBusy(format!(
                "Subscription {sub} of {name} has active consumers"
            )));
        }
        topic.forget_subscription(handle.clone()).await;
        // An answer lost with the task: it stopped meanwhile (an unload), its cursor saved.
        handle
            .ask(SubscriptionCommand::Delete)
            .await
            .unwrap_or_else(|| Err(super::subscription::stopped_before_delete()))
    }

    /// Moves subscription `sub` forward; returns how many entries left its backlog.
    pub async fn skip(&self, name: &TopicName, sub: &str, how: Skip) -> Result<u64, BrokerError> {
        let topic = self.existing(name).await?;
        let handle = self.subscription(&topic, sub).await?;
        let ledgers = topic.log.ledgers();
        let to = match how {
            Skip::All => end_position(&ledgers),
            Skip::Entries(n) => {
                return handle
                    .ask(|r| SubscriptionCommand::Cursor(CursorRequest::SkipEntries(n, r)))
                    .await
                    .ok_or_else(|| gone(name));
            }
            Skip::OlderThanSeconds(secs) => {
                let age_ms = i64::try_from(secs).ok().and_then(|s| s.checked_mul(1000));
                // Older than the epoch: nothing is that old.
                let cutoff = age_ms.map_or(i64::MIN, |ms| now_ms().saturating_sub(ms));
                let reader = EntryReader::new(topic.log.clone(), topic.lake.clone());
                reader
                    .find_by_publish_time(cutoff)
                    .await
                    .map_err(|e| BrokerError::Storage(e.to_string()))?
            }
        };
        handle
            .ask(|r| SubscriptionCommand::SkipTo(to, r))
            .await
            .ok_or_else(|| gone(name))
    }

    /// Resets subscription `sub` to a position or a publish time (`resetcursor`); its
    /// consumers are disconnected and reconnect there.
    pub async fn reset_cursor(
        &self,
        name: &TopicName,
        sub: &str,
        to: SeekTarget,
    ) -> Result<(), BrokerError> {
        let topic = self.existing(name).await?;
        let handle = self.subscription(&topic, sub).await?;
        handle
            .ask(|reply| SubscriptionCommand::Seek {
                to: Box::new(to),
                reply,
            })
            .await
            .ok_or_else(|| gone(name))?
    }

    /// The `n`-th (1-based) unacknowledged entry of subscription `sub` (`peek`), from
    /// whichever tier holds it; `None` when the backlog is shorter.
    pub async fn peek(
        &self,
        name: &TopicName,
        sub: &str,
        n: u64,
    ) -> Result<Option<Entry>, BrokerError> {
        let topic = self.existing(name).await?;
        let handle = self.subscription(&topic, sub).await?;
        let Some(k) = n.checked_sub(1) else {
            return Ok(None);
        };
        let at = handle
            .ask(|r| SubscriptionCommand::Cursor(CursorRequest::NthUnacked(k, r)))
            .await
            .ok_or_else(|| gone(name))?;
        read_at(&topic, at).await
    }

    /// An entry counted from the first or the last (`examinemessage`); `None` when the topic
    /// has fewer.
    pub async fn examine(
        &self,
        name: &TopicName,
        from: Examine,
    ) -> Result<Option<Entry>, BrokerError> {
        let topic = self.existing(name).await?;
        let ledgers = topic.log.ledgers();
        let at = match from {
            Examine::Earliest(n) => n
                .checked_sub(1)
                .and_then(|k| nth_entry_from(&ledgers, Position::new(0, 0), k)),
            Examine::Latest(n) => nth_entry_from_end(&ledgers, n),
        };
        read_at(&topic, at).await
    }

    /// The last entry's position (`lastMessageId`); `None` when the topic has no entry.
    pub async fn last_position(&self, name: &TopicName) -> Result<Option<Position>, BrokerError> {
        let topic = self.existing(name).await?;
        Ok(nth_entry_from_end(&topic.log.ledgers(), 1))
    }

    /// Unloads topic partition `name`: its producers and consumers are closed (they
    /// reconnect and load it anew), cursors saved, owner stopped. Returns whether it was
    /// loaded.
    pub async fn unload(self: &Arc<Self>, name: &TopicName) -> Result<bool, BrokerError> {
        self.unload_to(name, None).await
    }

    /// [`Broker::unload`], then the topic's open ledger is sealed (its entries stay on this
    /// node's bookie and are read from there), so that any node may serve it next: the node
    /// with id `destination` when one is named (a planned move), else the one placement picks.
    /// Nothing is copied. A log whose seal failed stays in memory until the seal tried again
    /// lands. Meanwhile its open ledger pins the topic to this node: an unload's next lookup
    /// loads it here again, while a planned move's topic is served nowhere (the destination
    /// does not hold the ledger, and this node defers to the destination).
    pub async fn unload_to(
        self: &Arc<Self>,
        name: &TopicName,
        destination: Option<&str>,
    ) -> Result<bool, BrokerError> {
        let key = name.to_string();
        if !self.log.topic_exists(&key).await? {
            return Err(BrokerError::TopicNotFound(format!(
                "Topic {name} not found"
            )));
        }
        let target = match destination {
            Some(id) => Some(
                self.ownership
                    .live_node(id)
                    .await?
                    .ok_or_else(|| OwnershipError::UnknownNode(id.to_string()))?,
            ),
            None => None,
        };
        let slot = self.slot(&key);
        let mut loaded = slot.0.lock().await;
        let Some(topic) = loaded.take() else {
            self.check_served_here(name).await?;
            // Claimed but never loaded: give the claim up all the same.
            if let Some(to) = &target {
                self.ownership.hand_over(&key, to).await?;
            }
            self.ownership.release(&key).await?;
            return Ok(false);
        };
        self.forget_loaded(&topic);
        topic.save_dedup_snapshot().await;
        topic.unload().await;
        if let Err(e) = topic.log.seal_current().await {
            // Still released: the open ledger then pins the topic to this node (see above).
            tracing::warn!(topic = %name, error = %e, "sealing at unload failed");
        }
        // Nothing of it stays in memory; a log whose ledger could not be sealed goes once the
        // seal tried again lands (with the claim, if handing it over below failed; the let-go
        // waits for this slot's lock).
        if !self.log.forget(&topic.log).await {
            self.let_go_once_sealed(key.clone(), topic.log.clone(), false);
        }
        if let Some(to) = &target {
            self.ownership.hand_over(&key, to).await?;
        }
        self.ownership.release(&key).await?;
        tracing::info!(topic = %name, to = ?destination, "unloaded");
        Ok(true)
    }
}

impl Broker {
    /// Refuses (naming the owner) when another node owns topic partition `name`: what this
    /// node knows of it may be stale, the owner's answer is not. A topic nobody owns may be
    /// described by any node.
    pub async fn check_served_here(&self, name: &TopicName) -> Result<(), BrokerError> {
        let key = name.to_string();
        match self.ownership.owner(&key).await? {
            Some(owner) if owner.id != self.ownership.me().id => {
                Err(OwnershipError::OwnedElsewhere {
                    topic: key,
                    owner: Box::new(owner),
                }
                .into())
            }
            _ => Ok(()),
        }
    }

    /// Once this node's coordination session is no longer live, unloads every loaded topic
    /// (its clients look the topic up again and find its new owner); loading is refused from
    /// then on, since ownership is.
    pub(crate) async fn stop_serving_when_session_ends(&self) {
        let mut session = self.ownership.session();
        if session
            .wait_for(|s| *s != crate::coord::SessionState::Live)
            .await
            .is_err()
        {
            return;
        }
        let topics = self.loaded_topics();
        tracing::error!(
            topics = topics.len(),
            "coordination session ended: unloading every topic"
        );
        // No metadata call before a topic stops: the store may be what is unreachable.
        for t in topics {
            let slot = self.slot(&t.name.to_string());
            let mut loaded = slot.0.lock().await;
            if let Some(topic) = loaded.take() {
                self.forget_loaded(&topic);
                topic.unload().await;
            }
        }
    }
}

fn gone(name: &TopicName) -> BrokerError {
    BrokerError::Stopped(format!("topic {name} was unloaded meanwhile; retry"))
}

/// Reads the entry at `at` from whichever tier holds it.
async fn read_at(topic: &BrokerTopic, at: Option<Position>) -> Result<Option<Entry>, BrokerError> {
    let Some(at) = at else { return Ok(None) };
    let mut reader = EntryReader::new(topic.log.clone(), topic.lake.clone());
    reader
        .read_entry(at)
        .await
        .map(Some)
        .map_err(|e| BrokerError::Storage(format!("reading {at} of {}: {e}", topic.name)))
}
