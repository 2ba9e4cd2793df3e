//! A loaded topic partition as connections, subscriptions and the broker hold it:
//! [`BrokerTopic`], the handle of the task that owns the partition ([`super::owner`]), plus what
//! never changes while it is loaded (name, partition index, log, lake).
//!
//! Every change to the partition's producers, subscriptions, deduplication state and policies,
//! and every append of a producer's message, is a [`TopicCommand`] to its owner task; the owner
//! handles them one at a time, so none of that state has a lock. The publish rate limits are
//! the exception: token buckets the producers' connections take from directly (a small lock,
//! [`super::throttle`]), so throttling costs no round trip to the owner.
//!
//! Invariants:
//! - A command whose owner has stopped (the topic was deleted, unloaded or the broker is
//!   shutting down, or the owner failed) fails with [`BrokerError::Stopped`]; the client
//!   retries and loads the topic anew.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::dedup::DedupSnapshot;
use super::subscription::SubscriptionHandle;
use super::BrokerError;
use crate::ledger::{AppendError, Position, TopicLog};
use crate::naming::TopicName;
use crate::protocol::inbound::StartAt;
use crate::protocol::proto::command_subscribe::SubType;

/// Commands queued per topic owner before senders wait (a producer's connection stops being
/// read meanwhile: the topic's backpressure).
pub(crate) const OWNER_QUEUE: usize = 1024;

/// Bytes of SENDs queued to owners and not yet appended, across the broker. A SEND waits for
/// its share before it is queued, so the owners' queues hold at most this much payload
/// whatever the message size (after the append, the log's own budget takes over).
pub(crate) const PUBLISH_BUDGET: usize = 64 * 1024 * 1024;

/// A loaded topic partition: the handle of its owner task.
#[derive(Debug)]
pub struct BrokerTopic {
    /// Full name.
    pub name: TopicName,
    /// Partition index, -1 when the topic is not partitioned.
    pub partition: i32,
    /// Its log (reads; appends go through the owner).
    pub log: TopicLog,
    /// The lake table replay reads for ranges deleted locally (`None`: lake disabled).
    pub(crate) lake: Option<crate::replay::TopicLake>,
    /// The owner task's queue. Invariant: the only way to change the partition's producers,
    /// subscriptions, deduplication state and policies, or to append a producer's message.
    /// Invariant: closed while the topic is in its broker slot only once its owner failed
    /// and wound up its clients and subscriptions (every other stop takes the topic out of
    /// the slot under the slot's lock before letting the lock go).
    pub(crate) owner: mpsc::Sender<TopicCommand>,
    /// The broker-wide budget of queued SEND bytes ([`PUBLISH_BUDGET`]).
    pub(crate) publish_budget: Arc<tokio::sync::Semaphore>,
    /// Publish rate limits in force (shared with producers' connections, which stop reading
    /// while a limit is in debt; the broker replaces them when policies change).
    pub(crate) throttle: super::throttle::TopicThrottle,
    /// Dispatch rate limits in force (read by the subscriptions before each read; the broker
    /// replaces them when policies change).
    pub(crate) dispatch: super::throttle::DispatchThrottle,
    /// The policies the owner has in force, so that the broker's periodic pass skips topics
    /// whose policies did not change. Invariant: written by the owner only, once it applied
    /// them; `None` while they must be handed over again (deduplication could not be enabled).
    pub(crate) in_force: std::sync::Mutex<Option<TopicPolicies>>,
    /// The subscribe rate in force (`subscribeRate`), per consumer.
    pub(crate) subscribe_gate: super::throttle::SubscribeGate,
    /// Consumer and unacked-message limits in force (read by the subscriptions, written by
    /// the owner) and the count of attached consumers.
    pub(crate) limits: super::limits::ConsumerLimits,
    /// Rates, latencies and the subscriptions' cursors as metrics and stats read them.
    pub(crate) measures: super::measure::TopicMeasures,
}

/// A producer connected to a topic.
#[derive(Debug, Clone)]
pub(crate) struct ProducerSlot {
    /// Its connection.
    pub conn: u64,
    /// Any access mode but Shared: alone on the topic.
    pub exclusive: bool,
    /// This registration: its id on the connection, name, client, and the counters of its
    /// durable appends (its stats).
    pub publisher: Arc<super::publisher::PublisherMeasure>,
    /// Cancelled by the owner to close the producer (the topic is unloaded or deleted, or a
    /// backlog quota holds it). The connection then answers every SEND the owner took before
    /// it sends CLOSE_PRODUCER, so a client never resends what was stored.
    pub close: tokio_util::sync::CancellationToken,
}

/// The policies in force for one topic partition, as the broker resolved them (topic setting,
/// else namespace, else broker default). Publish rates are not here: they live in
/// [`BrokerTopic::throttle`], which connections use directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopicPolicies {
    /// Message deduplication.
    pub deduplication: bool,
    /// Most producers connected at once (`maxProducersPerTopic`; `None`: no limit).
    pub max_producers: Option<u32>,
    /// Consumer and unacked-message limits.
    pub consumers: super::limits::ConsumerLimitValues,
    /// Backlog quotas and message TTL.
    pub backlog: crate::policies::BacklogLimits,
    /// Deletion once inactive (`None`: never; non-partitioned topics only).
    pub inactive: Option<crate::policies::InactiveRule>,
    /// How new ledgers are replicated (the namespace's persistence policy).
    pub replication: crate::ledger::Replication,
}

/// What became of one SEND, once it is settled.
#[derive(Debug)]
pub(crate) enum Published {
    /// Appended: durable at this position, or the append failed.
    Persisted(Result<Position, AppendError>),
    /// Already persisted (deduplication): acknowledge without appending.
    Duplicate,
    /// The original is still in flight: the client must retry.
    InFlight,
    /// Deduplication is on but its state could not be built (the reason): the client must
    /// retry.
    DedupUnavailable(String),
    /// Refused before the append (a backlog quota holds the topic's producers).
    Refused(BrokerError),
}

/// One SEND of a producer for the owner to publish.
#[derive(Debug)]
pub(crate) struct PublishRequest {
    /// The producer registration that sent it (its name is the deduplication key).
    pub publisher: Arc<super::publisher::PublisherMeasure>,
    /// The SEND's highest sequence id ([`super::dedup::highest_sequence_id`]).
    pub highest: i64,
    /// Publish time of its first message.
    pub publish_time_ms: i64,
    /// The entry to append (metadata and payload as the client sent them).
    pub entry: Bytes,
    /// Answered once the SEND is settled (durable, duplicate or refused).
    pub reply: oneshot::Sender<Published>,
    /// Its share of the publish budget, released once it is appended.
    pub budget: tokio::sync::OwnedSemaphorePermit,
}

/// How a consumer's SUBSCRIBE wants its subscription.
#[derive(Debug, Clone)]
pub(crate) struct SubscribeRequest {
    /// Subscription name.
    pub name: String,
    /// Its type when it is created.
    pub sub_type: SubType,
    /// Whether its cursor is saved.
    pub durable: bool,
    /// Where a new subscription starts.
    pub start: StartAt,
}

/// A producer to register (boxed in [`TopicCommand::AddProducer`]).
#[derive(Debug)]
pub(crate) struct NewProducer {
    /// Its connection, access mode and registration (id, name).
    pub slot: ProducerSlot,
    /// Answered with its `last_sequence_id` (-1 without deduplication).
    pub reply: oneshot::Sender<Result<i64, BrokerError>>,
    /// `Some` for a `WaitForExclusive` producer: fired when it is queued to wait its turn
    /// (other producers are there), before `reply`.
    pub queued: Option<oneshot::Sender<()>>,
}

/// A producer to forget (boxed in [`TopicCommand::RemoveProducer`]).
#[derive(Debug)]
pub(crate) struct GoneProducer {
    /// Its name.
    pub name: String,
    /// Its connection.
    pub conn: u64,
    /// Its id on that connection.
    pub producer_id: u64,
}

/// Requests to a topic's owner task.
///
/// Every payload larger than a pointer or two is boxed: tokio's channel allocates its first
/// block of 32 slots when the queue is made, so every loaded topic holds 32 commands' worth of
/// memory whether or not a client ever sends it one (the assertion below keeps it small).
#[derive(Debug)]
pub(crate) enum TopicCommand {
    /// Deduplication verdict, append, then the answer once durable.
    Publish(Box<PublishRequest>),
    /// Register a producer; replies with its `last_sequence_id` (-1 without deduplication).
    AddProducer(Box<NewProducer>),
    /// Forget a producer (only if it is still this connection's producer id).
    RemoveProducer(Box<GoneProducer>),
    /// The subscription of that name, created when new.
    Subscribe {
        request: Box<SubscribeRequest>,
        reply: oneshot::Sender<Result<SubscriptionHandle, BrokerError>>,
    },
    /// A backlog check (run beside the owner) finished.
    BacklogChecked(Box<super::backlog::BacklogVerdict>),
    /// Forget this subscription (if it is still the one of its name); replies when done.
    ForgetSubscription {
        handle: Box<SubscriptionHandle>,
        reply: oneshot::Sender<()>,
    },
    /// The subscriptions now.
    Subscriptions(oneshot::Sender<Vec<SubscriptionHandle>>),
    /// Apply resolved policies (enabling deduplication folds its state first).
    SetPolicies {
        policies: Box<TopicPolicies>,
        reply: oneshot::Sender<()>,
    },
    /// The deduplication snapshot to save, when deduplication is on.
    DedupSnapshot(oneshot::Sender<Option<Arc<tokio::sync::Mutex<DedupSnapshot>>>>),
    /// Delete: refused while clients are attached unless `force`; otherwise closes producers,
    /// deletes subscriptions and stops the owner.
    Delete {
        force: bool,
        reply: oneshot::Sender<Result<(), BrokerError>>,
    },
    /// Save subscriptions' cursors, settle appends in flight, and stop the owner.
    Stop(oneshot::Sender<()>),
    /// Unload: close producers and consumers (they reconnect and load the topic anew), save
    /// cursors, settle appends in flight, and stop the owner.
    Unload(oneshot::Sender<()>),
    /// Unload (as `Unload`) only if still idle for the idle period; replies whether it did.
    UnloadIfIdle(oneshot::Sender<bool>),
}

// A tag and two pointers: the owner queue's first block is 32 × 24 bytes.
const _: () = assert!(std::mem::size_of::<TopicCommand>() <= 24);

impl BrokerTopic {
    /// The error of a command whose owner has stopped.
    fn gone(&self) -> BrokerError {
        BrokerError::Stopped(format!(
            "topic {} was deleted or unloaded meanwhile; retry",
            self.name
        ))
    }

    /// Whether the broker's pass must hand `policies` to the owner: they differ from those in
    /// force, or they hold backlog limits (quotas and TTL are checked at every pass: they
    /// depend on time and on the consumers, not only on a policy change).
    pub(crate) fn needs_policies(&self, policies: &TopicPolicies) -> bool {
        !policies.backlog.is_empty() || *self.policies_in_force() != Some(*policies)
    }

    /// Whether deduplication may be on (its snapshot may need saving).
    pub(crate) fn may_deduplicate(&self) -> bool {
        self.policies_in_force().is_none_or(|p| p.deduplication)
    }

    fn policies_in_force(&self) -> std::sync::MutexGuard<'_, Option<TopicPolicies>> {
        self.in_force.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends a command built around a reply channel and waits for the answer.
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> TopicCommand,
    ) -> Result<T, BrokerError> {
        let (tx, rx) = oneshot::channel();
        self.owner.send(make(tx)).await.map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())
    }

    /// Queues one SEND; `reply` answers once it is settled (dropped unanswered if the owner
    /// stops before taking it). Waiting for its share of the publish budget, then for room in
    /// the owner's queue, is the backpressure.
    pub(crate) async fn publish(
        &self,
        publisher: Arc<super::publisher::PublisherMeasure>,
        highest: i64,
        publish_time_ms: i64,
        entry: Bytes,
        reply: oneshot::Sender<Published>,
    ) -> Result<(), BrokerError> {
        let cost = entry.len().clamp(1, PUBLISH_BUDGET) as u32;
        let budget = self
            .publish_budget
            .clone()
            .acquire_many_owned(cost)
            .await
            .map_err(|_| self.gone())?;
        let request = PublishRequest {
            publisher,
            highest,
            publish_time_ms,
            entry,
            reply,
            budget,
        };
        self.owner
            .send(TopicCommand::Publish(Box::new(request)))
            .await
            .map_err(|_| self.gone())
    }

    /// Registers the producer `slot` names; returns its `last_sequence_id`. With `queued`
    /// (`WaitForExclusive`), waits its turn while other producers are there, telling `queued`
    /// when it starts waiting.
    pub(crate) async fn add_producer(
        &self,
        slot: ProducerSlot,
        queued: Option<oneshot::Sender<()>>,
    ) -> Result<i64, BrokerError> {
        self.ask(|reply| {
            TopicCommand::AddProducer(Box::new(NewProducer {
                slot,
                reply,
                queued,
            }))
        })
        .await?
    }

    /// Forgets a producer of connection `conn` (nothing if the topic has stopped).
    pub(crate) async fn remove_producer(&self, name: String, conn: u64, producer_id: u64) {
        let cmd = TopicCommand::RemoveProducer(Box::new(GoneProducer {
            name,
            conn,
            producer_id,
        }));
        let _ = self.owner.send(cmd).await;
    }

    /// The subscription `request` names, created when new.
    pub(crate) async fn subscribe(
        &self,
        request: SubscribeRequest,
    ) -> Result<SubscriptionHandle, BrokerError> {
        let request = Box::new(request);
        self.ask(|reply| TopicCommand::Subscribe { request, reply })
            .await?
    }

    /// Forgets `handle`'s subscription (its task ends once its last handle goes).
    pub(crate) async fn forget_subscription(&self, handle: SubscriptionHandle) {
        let _ = self
            .ask(|reply| TopicCommand::ForgetSubscription {
                handle: Box::new(handle),
                reply,
            })
            .await;
    }

    /// The subscriptions now (empty once the topic has stopped).
    pub(crate) async fn subscriptions(&self) -> Vec<SubscriptionHandle> {
        self.ask(TopicCommand::Subscriptions)
            .await
            .unwrap_or_default()
    }

    /// Applies resolved policies; returns when they are in force.
    pub(crate) async fn set_policies(&self, policies: TopicPolicies) {
        self.log.set_replication(policies.replication);
        let _ = self
            .ask(|reply| TopicCommand::SetPolicies {
                policies: Box::new(policies),
                reply,
            })
            .await;
    }

    /// Folds and saves the deduplication snapshot if entries were appended since the last one
    /// (the fold runs here, not in the owner, so SENDs are not held up by it).
    pub(crate) async fn save_dedup_snapshot(&self) {
        let Ok(Some(snapshot)) = self.ask(TopicCommand::DedupSnapshot).await else {
            return;
        };
        let mut snap = snapshot.lock().await;
        match snap.snapshot().await {
            Ok(Some(blob)) => {
                let key = crate::ledger::cursor::DEDUP_SNAPSHOT;
                match self.log.save_cursor(key, &blob).await {
                    Ok(()) => {}
                    Err(e @ crate::ledger::MetadataError::Fenced { .. }) => tracing::warn!(
                        topic = %self.name, error = %e,
                        "dedup snapshot not saved: a later owner fenced the topic"),
                    Err(e) => {
                        tracing::error!(topic = %self.name, error = %e, "saving dedup snapshot failed")
                    }
                }
            }
            Ok(None) => {}
            Err(e) => tracing::error!(topic = %self.name, error = %e, "dedup snapshot failed"),
        }
    }

    /// Deletes the partition's clients and subscriptions and stops its owner (see
    /// [`TopicCommand::Delete`]).
    pub(crate) async fn delete(&self, force: bool) -> Result<(), BrokerError> {
        self.ask(|reply| TopicCommand::Delete { force, reply })
            .await?
    }

    /// Stops the owner after saving cursors and settling appends in flight.
    pub(crate) async fn stop(&self) {
        let _ = self.ask(TopicCommand::Stop).await;
    }

    /// Closes the partition's clients, saves its cursors and stops its owner.
    pub(crate) async fn unload(&self) {
        let _ = self.ask(TopicCommand::Unload).await;
    }

    /// Unloads the topic if it is still idle; whether it did (`false` also when it stopped
    /// already).
    pub(crate) async fn unload_if_idle(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self
            .owner
            .send(TopicCommand::UnloadIfIdle(tx))
            .await
            .is_err()
        {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}
