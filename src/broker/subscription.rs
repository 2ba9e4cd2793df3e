//! A subscription: one task owns its cursor and its consumers, reads the topic's log and sends
//! MESSAGE frames within each consumer's permits.
//!
//! Cursor model (Pulsar's managed cursor): `read_position` is the next entry to dispatch;
//! `pending` holds dispatched, unacknowledged entries with the consumer that has them; entries
//! of a consumer that leaves, or that asks for redelivery, go to `redeliver` and are sent again
//! (first) with an incremented redelivery count. The mark-delete position is everything before
//! the oldest unacknowledged entry.
//!
//! Durable subscriptions save their cursor ([`CursorState`]: the oldest unacknowledged entry and
//! the entries acknowledged after it) to the metadata store every `cursor_persist_interval` when
//! it changed, when the task stops and on [`SubscriptionCommand::Flush`]; after a restart they
//! resume there, skipping what was acknowledged (at-least-once for the last interval).
//!
//! Key_Shared (auto-split): the 0..65536 hash space of routing keys is split evenly among the
//! consumers; a key's entries are only ever unacknowledged on one consumer at a time, so when
//! consumers join or leave, entries of a moved key wait until the previous owner acknowledged
//! (or lost) the earlier ones: per-key order holds.
//!
//! Batch-index acknowledgements (`ack_set`) keep a partly acknowledged batch pending with its
//! remaining indices, sent along when it is redelivered so the client skips the acknowledged
//! ones. They are saved with the cursor (version 2), so after a restart only the unacknowledged
//! messages of the batch are delivered again.
//!
//! Limits (in submodules): consumer admission and unacked-message pauses (`unacked`), dispatch
//! rates (`rate`), Key_Shared routing (`key_shared`), acknowledgements and skips (`acks`).
//!
//! Not yet: sticky Key_Shared ranges.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::backlog::{backlog, ClientInfo, LakeWait, SubscriptionStats};
use super::limits::UnackedGate;
use super::measure::SubscriptionMeasures;
use super::outbox::{any_drained, Outbox};
use crate::metrics::meter::Meter;

mod acks;
mod dispatch;
mod key_shared;
mod measured;
mod rate;
#[cfg(test)]
mod tests;
mod unacked;
use super::{BrokerError, BrokerTopic};
use crate::ledger::cursor::CursorState;
use crate::ledger::Position;
use crate::protocol::command;
use crate::protocol::proto::command_subscribe::SubType;
use crate::replay::{EntryReader, ReplayError};

/// Identifies a consumer: (connection id, consumer id on that connection).
pub type ConsumerKey = (u64, u64);

/// A consumer to attach (boxed in [`SubscriptionCommand::AddConsumer`]).
#[derive(Debug)]
pub struct NewConsumer {
    /// Consumer.
    pub key: ConsumerKey,
    /// Its subscription type (must match the subscription's).
    pub sub_type: SubType,
    /// Consumer name (orders Failover consumers).
    pub name: String,
    /// Priority level (lower first, for Failover).
    pub priority: i32,
    /// Where its MESSAGE frames go.
    pub out: Outbox,
    /// Its client (for stats).
    pub client: Arc<ClientInfo>,
    /// Reply.
    pub reply: oneshot::Sender<Result<(), BrokerError>>,
}

/// The answer to a delete the subscription's task could not take: it had stopped (the topic
/// was unloaded, its cursor saved), so the cursor may still be there; the client asks again.
pub(crate) fn stopped_before_delete() -> BrokerError {
    BrokerError::Stopped("the subscription stopped before its cursor could be deleted".into())
}

/// Requests to a subscription task.
///
/// Large payloads are boxed: the task's queue allocates its first block of 32 slots when the
/// subscription is made, so every subscription holds 32 commands' worth of memory even with no
/// consumer (the assertion below keeps it small).
#[derive(Debug)]
pub enum SubscriptionCommand {
    /// Attach a consumer; replies with an error text if the subscription refuses it.
    AddConsumer(Box<NewConsumer>),
    /// FLOW: more permits.
    Flow(ConsumerKey, u32),
    /// ACK of positions (cumulative: everything up to the position), from any of the
    /// subscription's consumers.
    Ack {
        /// Positions, each with the batch's still-unacknowledged indices when the client
        /// acknowledged only part of a batch (batch-index ack: `ack_set` bit words).
        positions: Vec<(Position, Option<Vec<i64>>)>,
        /// Cumulative ack.
        cumulative: bool,
    },
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES for a consumer.
    Redeliver(ConsumerKey),
    /// Detach a consumer; its unacknowledged entries are redelivered to others.
    RemoveConsumer(ConsumerKey),
    /// The mark-delete position (for GET_LAST_MESSAGE_ID).
    MarkDelete(oneshot::Sender<Option<Position>>),
    /// Reset the cursor (SEEK): every consumer is disconnected (CLOSE_CONSUMER), then the reply.
    Seek {
        /// New read position.
        to: Box<SeekTarget>,
        /// Reply once consumers were told to reconnect.
        reply: oneshot::Sender<Result<(), BrokerError>>,
    },
    /// Save the cursor now (graceful shutdown).
    Flush(oneshot::Sender<()>),
    /// Delete the stored cursor and stop (unsubscribe); whether the cursor is gone from the
    /// store (refused when a later owner fenced the topic: that owner keeps the subscription).
    Delete(oneshot::Sender<Result<(), BrokerError>>),
    /// Disconnect every consumer (CLOSE_CONSUMER), save the cursor and stop: the topic is
    /// being unloaded; consumers reconnect and find it loaded anew.
    Unload(oneshot::Sender<()>),
    /// Backlog and read state, for topic stats.
    Stats(oneshot::Sender<SubscriptionStats>),
    /// Acknowledge every entry before this position (message TTL, backlog eviction, skip);
    /// replies with how many entries that took out of the backlog. Consumers stay attached;
    /// acknowledgements of skipped entries they still hold are no-ops.
    SkipTo(Position, oneshot::Sender<u64>),
    /// Limits changed: try dispatching again.
    Wake,
    /// An admin read or move of the cursor counted in unacknowledged entries.
    Cursor(CursorRequest),
}

// Four words: the subscription queue's first block is 32 × 32 bytes.
const _: () = assert!(std::mem::size_of::<SubscriptionCommand>() <= 32);

/// Admin reads and moves of a cursor that count unacknowledged entries (entries acknowledged
/// individually after the oldest unacknowledged one are not counted), answered by the task
/// itself so acknowledgements cannot slip in between the count and the move.
#[derive(Debug)]
pub enum CursorRequest {
    /// The n-th (0-based) unacknowledged entry (`None`: the backlog is shorter).
    NthUnacked(u64, oneshot::Sender<Option<Position>>),
    /// Skip the next n unacknowledged entries; replies with the entries taken out of the
    /// backlog.
    SkipEntries(u64, oneshot::Sender<u64>),
}

/// Where a SEEK moves a cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekTarget {
    /// To this entry (it is delivered next).
    Position(Position),
    /// To the first entry published at or after this time (ms).
    PublishTime(i64),
}

/// Handle to a subscription task.
#[derive(Debug, Clone)]
pub struct SubscriptionHandle {
    /// Subscription name.
    pub name: String,
    /// Type fixed by the first consumer.
    pub sub_type: SubType,
    /// Whether it survives its consumers (durable) or is a reader's.
    pub durable: bool,
    /// Commands.
    pub tx: mpsc::UnboundedSender<SubscriptionCommand>,
}

impl SubscriptionHandle {
    /// Sends the command `make` builds around a reply channel and waits for the reply; `None`
    /// when the subscription task has ended.
    pub async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> SubscriptionCommand,
    ) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(make(reply)).ok()?;
        answer.await.ok()
    }
}

struct Consumer {
    key: ConsumerKey,
    name: String,
    priority: i32,
    /// Its connection's queue. Invariant: MESSAGE frames go only through `try_deliver`, so
    /// this task never waits on a client that does not read.
    out: Outbox,
    permits: i64,
    /// Unacknowledged messages it holds (Shared and Key_Shared stop at the limit).
    gate: UnackedGate,
    /// Messages sent to it (its stats; Key_Shared hot-consumer detection), sampled at every
    /// persist tick.
    sent: Meter,
    /// Flagged hot (Key_Shared: its hash range carries most of the traffic).
    hot: bool,
    /// Its client and when it attached (for stats).
    client: Arc<ClientInfo>,
    attached: std::time::SystemTime,
}

struct State {
    topic: Arc<BrokerTopic>,
    name: String,
    durable: bool,
    sub_type: SubType,
    /// Acknowledged entries after the oldest unacknowledged one.
    /// Invariant: every member is after `first_unacked()`.
    acked: BTreeSet<Position>,
    /// The cursor changed since it was last saved.
    dirty: bool,
    /// Invariant: no position in `pending` or `redeliver` is at or after `read_position`.
    read_position: Position,
    pending: BTreeMap<Position, ConsumerKey>,
    /// Messages in each pending entry (a batch holds several).
    /// Invariant: the same keys as `pending`.
    pending_msgs: HashMap<Position, u32>,
    /// Unacknowledged messages out (Shared and Key_Shared stop at the limit).
    gate: UnackedGate,
    redeliver: BTreeSet<Position>,
    redelivery_count: HashMap<Position, u32>,
    /// Invariant: in attach order; for Exclusive/Failover the first is the active consumer.
    consumers: Vec<Consumer>,
    next_shared: usize,
    /// Batch-index acks: for partly acknowledged batch entries, the indices still
    /// unacknowledged (bit words as the client sends them); sent along on redelivery.
    partial: HashMap<Position, Vec<i64>>,
    /// Key_Shared: key hash of each pending entry.
    pending_hash: HashMap<Position, u16>,
    /// Key_Shared: per key hash, the consumer holding its unacknowledged entries and how many.
    /// Invariant: a hash is in flight on at most one consumer, so each key's entries are
    /// delivered in order.
    in_flight: HashMap<u16, (ConsumerKey, usize)>,
    /// Failover: the consumer that receives messages (first by priority, then name; for a
    /// partition, the partition index picks among them as Pulsar does).
    active: Option<ConsumerKey>,
    /// Reads entries from the local log or the lake.
    reader: EntryReader,
    /// After a failed read: no read before this instant (backoff).
    retry_at: Option<tokio::time::Instant>,
    last_read_error: Option<String>,
    /// How long reads have only returned `Pending` (waiting on the lake).
    lake_wait: LakeWait,
    /// This subscription's own dispatch limiter. Invariant: of the topic's
    /// `subscriptionDispatchRate` as of the last read (`None`: unlimited).
    own_dispatch: Option<Arc<crate::broker::throttle::RateLimiter>>,
    /// The dispatch limiters that applied to the last read (each entry sent is charged).
    rate_limiters: Vec<Arc<crate::broker::throttle::RateLimiter>>,
    /// Rates and the cursor as metrics read them. Invariant: registered with the topic's
    /// measures while this task runs.
    measures: Arc<SubscriptionMeasures>,
}

/// Most bytes a subscription's task future may take (checked in debug builds, where futures
/// are larger than in release): every subscription of a loaded topic holds one.
const TASK_BYTES: usize = 1024;

/// Starts a subscription task positioned at `start` (or at a restored cursor) and returns its
/// handle.
pub fn spawn(
    topic: Arc<BrokerTopic>,
    name: String,
    sub_type: SubType,
    durable: bool,
    start: Position,
    restored: Option<CursorState>,
    persist_every: Duration,
) -> SubscriptionHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let (topic_log, topic_lake) = (topic.log.clone(), topic.lake.clone());
    let (start, acked, partial) = match restored {
        Some(c) => (
            c.first_unacked,
            c.acked_after.into_iter().collect(),
            c.partial.into_iter().collect(),
        ),
        None => (start, BTreeSet::new(), HashMap::new()),
    };
    let measures = Arc::new(SubscriptionMeasures::new(
        name.clone(),
        durable,
        start,
        topic.measures.marker.clone(),
    ));
    topic.measures.add_subscription(measures.clone());
    // Boxed: an async fn keeps its arguments beside its body's copy of them, so a large
    // state passed by value would be held twice in every subscription's task.
    let state = Box::new(State {
        topic,
        name: name.clone(),
        durable,
        acked,
        // A new durable subscription is saved at once so it survives a restart.
        dirty: durable,
        sub_type,
        read_position: start,
        pending: BTreeMap::new(),
        pending_msgs: HashMap::new(),
        gate: UnackedGate::default(),
        redeliver: BTreeSet::new(),
        redelivery_count: HashMap::new(),
        consumers: Vec::new(),
        next_shared: 0,
        active: None,
        pending_hash: HashMap::new(),
        in_flight: HashMap::new(),
        partial,
        reader: EntryReader::new(topic_log, topic_lake),
        retry_at: None,
        last_read_error: None,
        lake_wait: LakeWait::default(),
        own_dispatch: None,
        rate_limiters: Vec::new(),
        measures: measures.clone(),
    });
    let topic = state.topic.clone();
    let registered = measures.clone();
    let task = async move {
        run(state, rx, persist_every).await;
        topic.measures.remove_subscription(&registered);
    };
    debug_assert!(
        std::mem::size_of_val(&task) <= TASK_BYTES,
        "a subscription's task grew to {} bytes: box the step that grew it (see `run`)",
        std::mem::size_of_val(&task)
    );
    tokio::spawn(task);
    SubscriptionHandle {
        name,
        sub_type,
        durable,
        tx,
    }
}

async fn run(
    mut st: Box<State>,
    mut rx: mpsc::UnboundedReceiver<SubscriptionCommand>,
    persist_every: Duration,
) {
    let mut confirmed = st.topic.log.watch_confirmed();
    let mut persist = tokio::time::interval(persist_every);
    persist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Every subscription's task holds its largest inline step whether it is idle or not, so
    // the steps that read, deliver or write are boxed and run only when they have work.
    loop {
        // Without consumers nothing can be sent (dispatch would return at once).
        let waiting = !st.consumers.is_empty() && Box::pin(st.dispatch()).await;
        st.publish_cursor();
        let stalled = st.stalled_outboxes();
        let any_stalled = !stalled.is_empty();
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(SubscriptionCommand::Seek { to, reply }) => {
                    let result = Box::pin(st.seek(*to)).await;
                    let _ = reply.send(result);
                }
                Some(SubscriptionCommand::Flush(done)) => {
                    Box::pin(st.persist()).await;
                    let _ = done.send(());
                }
                Some(SubscriptionCommand::Unload(done)) => {
                    st.topic.limits.release(st.consumers.len());
                    for c in st.consumers.drain(..) {
                        c.out.send_detached(command::close_consumer(c.key.1));
                    }
                    Box::pin(st.persist()).await;
                    let _ = done.send(());
                    return;
                }
                Some(SubscriptionCommand::Delete(done)) => {
                    // Consumers still attached (a forced topic deletion) are told to go.
                    st.topic.limits.release(st.consumers.len());
                    for c in st.consumers.drain(..) {
                        c.out.send_detached(command::close_consumer(c.key.1));
                    }
                    let deleted = Box::pin(st.topic.log.delete_cursor(&st.name)).await;
                    if let Err(e) = &deleted {
                        tracing::error!(topic = %st.topic.name, subscription = %st.name,
                            error = %e, "deleting cursor failed");
                    }
                    let _ = done.send(deleted.map_err(BrokerError::from));
                    return;
                }
                Some(cmd) => {
                    if st.handle(cmd) {
                        st.notify_active();
                    }
                }
                None => break,
            },
            _ = persist.tick(), if st.needs_tick() => {
                st.check_hot_consumers();
                st.reader.release_idle();
                st.reader.forget_before(st.first_unacked());
                Box::pin(st.persist()).await;
            }
            _ = sleep_until(st.retry_at), if st.retry_at.is_some() => {
                st.retry_at = None;
            }
            changed = confirmed.changed(), if waiting => {
                if changed.is_err() {
                    break;
                }
            }
            _ = any_drained(stalled), if any_stalled => {}
        }
    }
    st.topic.limits.release(st.consumers.len());
    Box::pin(st.persist()).await;
}

/// Resolves at `at` (never when `None`).
pub(crate) async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl State {
    /// Whether the periodic tick has work: a cursor to save, consumers to measure, lake data
    /// to release. A subscription with none of these sleeps until a command or a new entry
    /// wakes it (thousands of idle subscriptions cost no timer wake-ups).
    fn needs_tick(&self) -> bool {
        self.dirty
            || !self.consumers.is_empty()
            || !self.reader.is_idle()
            || self
                .measures
                .hot_consumers
                .load(std::sync::atomic::Ordering::Relaxed)
                != 0
    }

    /// Notes a failed read: the next read waits for the reader's backoff.
    fn read_failed(&mut self, e: &ReplayError) {
        if let ReplayError::Pending = e {
            // The lake stream is still filling: ask again soon, without counting a failure.
            self.retry_at = Some(tokio::time::Instant::now() + Duration::from_millis(20));
            return;
        }
        let delay = self.reader.retry_delay();
        tracing::warn!(topic = %self.topic.name, subscription = %self.name, error = %e,
            retry_in = ?delay, "subscription read failed");
        self.retry_at = Some(tokio::time::Instant::now() + delay);
        self.last_read_error = Some(e.to_string());
    }

    fn stats(&self) -> SubscriptionStats {
        let first = self.first_unacked();
        let (msg_backlog, backlog_size, backlog_age_seconds, next_read_tier) = backlog(
            &self.topic.log.ledgers(),
            first,
            self.acked.len() as u64,
            self.read_position,
        );
        SubscriptionStats {
            sub_type: format!("{:?}", self.sub_type),
            is_durable: self.durable,
            consumers: self.consumer_stats(),
            msg_backlog,
            backlog_size,
            backlog_age_seconds,
            unacked_entries: self.pending.len(),
            unacked_messages: self.gate.unacked,
            blocked_subscription_on_unacked_msgs: self.gate.blocked(self.unacked_limits().1),
            blocked_consumers_on_unacked_msgs: self.blocked_consumers(),
            mark_delete_next: first.to_string(),
            first_unacked: first,
            read_position: self.read_position.to_string(),
            next_read_tier,
            last_read_tier: self.reader.tier(),
            read_failures: self.reader.failures(),
            last_read_error: self.last_read_error.clone(),
            lake_wait_seconds: self.lake_wait.seconds(),
        }
    }

    /// Whether a read backoff is still running.
    fn backing_off(&self) -> bool {
        self.retry_at
            .is_some_and(|at| at > tokio::time::Instant::now())
    }

    /// Saves the cursor if it changed (durable subscriptions only).
    async fn persist(&mut self) {
        if !self.durable || !self.dirty {
            return;
        }
        let first_unacked = self.first_unacked();
        let mut partial: Vec<(Position, Vec<i64>)> = self
            .partial
            .iter()
            .filter(|(p, _)| **p >= first_unacked)
            .map(|(p, w)| (*p, w.clone()))
            .collect();
        partial.sort_by_key(|(p, _)| *p);
        let state = CursorState {
            sub_type: self.sub_type as i32,
            first_unacked,
            acked_after: self.acked.iter().copied().collect(),
            partial,
        };
        match self
            .topic
            .log
            .save_cursor(&self.name, &state.encode())
            .await
        {
            Ok(()) => self.dirty = false,
            // Another node owns the topic now (its load read the stored state): this node's
            // acknowledgements since the last save are redelivered there. Not retried: no
            // later save of this node's can succeed.
            Err(e @ crate::ledger::MetadataError::Fenced { .. }) => {
                self.dirty = false;
                tracing::warn!(topic = %self.topic.name, subscription = %self.name, error = %e,
                    "cursor not saved: a later owner fenced the topic")
            }
            Err(e) => tracing::error!(topic = %self.topic.name, subscription = %self.name,
                error = %e, "saving cursor failed; will retry"),
        }
    }

    /// Recomputes the Failover active consumer; true when it changed. The previous active
    /// consumer's unacknowledged entries go to the new one (the cursor rewinds, as in Pulsar).
    fn recompute_active(&mut self) -> bool {
        if self.sub_type != SubType::Failover {
            return false;
        }
        let mut order: Vec<&Consumer> = self.consumers.iter().collect();
        order.sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
        let chosen = if order.is_empty() {
            None
        } else {
            let i = usize::try_from(self.topic.partition).map_or(0, |p| p % order.len());
            Some(order[i].key)
        };
        if chosen == self.active {
            return false;
        }
        if let Some(previous) = self.active {
            self.requeue(|owner| owner == previous);
        }
        self.active = chosen;
        true
    }

    /// Tells every consumer whether it is the active one (ACTIVE_CONSUMER_CHANGE).
    fn notify_active(&self) {
        for c in &self.consumers {
            let is_active = Some(c.key) == self.active;
            c.out
                .send_detached(command::active_consumer_change(c.key.1, is_active));
        }
    }

    /// Applies a command; returns true when the Failover active consumer changed.
    fn handle(&mut self, cmd: SubscriptionCommand) -> bool {
        let mut changed = false;
        match cmd {
            SubscriptionCommand::AddConsumer(consumer) => {
                let NewConsumer {
                    key,
                    sub_type,
                    name,
                    priority,
                    out,
                    client,
                    reply,
                } = *consumer;
                if self.consumers.is_empty() && sub_type != self.sub_type {
                    // As in Pulsar, a subscription without consumers (created by the admin
                    // API, or whose consumers all left) takes the next consumer's type.
                    self.sub_type = sub_type;
                    self.dirty = self.durable;
                }
                let result = if sub_type != self.sub_type {
                    Err(BrokerError::ConsumerBusy(format!(
                        "subscription is {:?}; a {:?} consumer cannot join",
                        self.sub_type, sub_type
                    )))
                } else if self.sub_type == SubType::Exclusive && !self.consumers.is_empty() {
                    Err(BrokerError::ConsumerBusy(
                        "exclusive subscription already has a consumer".to_string(),
                    ))
                } else {
                    self.admit(Consumer {
                        key,
                        name,
                        priority,
                        out,
                        permits: 0,
                        gate: UnackedGate::default(),
                        sent: Meter::default(),
                        hot: false,
                        client,
                        attached: std::time::SystemTime::now(),
                    })
                };
                let joined = result.is_ok();
                if reply.send(result).is_err() && joined {
                    // Whoever asked is gone (its connection closed meanwhile): undo.
                    let before = self.consumers.len();
                    self.consumers.retain(|c| c.key != key);
                    self.topic.limits.release(before - self.consumers.len());
                }
                changed = self.recompute_active();
            }
            SubscriptionCommand::Flow(key, permits) => {
                if let Some(c) = self.consumers.iter_mut().find(|c| c.key == key) {
                    c.permits += i64::from(permits);
                    tracing::debug!(topic = %self.topic.name, ?key, permits = c.permits, "flow");
                }
            }
            SubscriptionCommand::Ack {
                positions,
                cumulative,
            } => self.acknowledge(positions, cumulative),
            SubscriptionCommand::Redeliver(key) => self.requeue(|owner| owner == key),
            SubscriptionCommand::RemoveConsumer(key) => {
                let before = self.consumers.len();
                self.consumers.retain(|c| c.key != key);
                self.topic.limits.release(before - self.consumers.len());
                if self.consumers.is_empty() {
                    // A subscription left without consumers keeps no room for them.
                    self.consumers = Vec::new();
                }
                self.requeue(|owner| owner == key);
                if self.active == Some(key) {
                    self.active = None;
                }
                changed = self.recompute_active();
            }
            SubscriptionCommand::Stats(reply) => {
                let _ = reply.send(self.stats());
            }
            SubscriptionCommand::SkipTo(to, reply) => {
                let _ = reply.send(self.skip_counted(to));
            }
            SubscriptionCommand::Cursor(request) => self.cursor_request(request),
            // The task loop dispatches after every command.
            SubscriptionCommand::Wake => {}
            SubscriptionCommand::MarkDelete(reply) => {
                // Everything before the oldest unacknowledged entry is acknowledged.
                let _ = reply.send(self.topic.log.position_before(self.first_unacked()));
            }
            // Handled by the task loop.
            SubscriptionCommand::Flush(done) | SubscriptionCommand::Unload(done) => {
                let _ = done.send(());
            }
            SubscriptionCommand::Delete(done) => {
                let _ = done.send(Err(BrokerError::Stopped("subscription deleted".into())));
            }
            SubscriptionCommand::Seek { reply, .. } => {
                let _ = reply.send(Err(BrokerError::NotSupported(
                    "seek handled by the task loop".into(),
                )));
            }
        }
        changed
    }

    /// Resets the cursor to `to` and disconnects every consumer, as Pulsar does: clients then
    /// re-subscribe and read from the new position.
    async fn seek(&mut self, to: SeekTarget) -> Result<(), BrokerError> {
        let position = match to {
            SeekTarget::Position(p) => p,
            SeekTarget::PublishTime(t) => self
                .reader
                .find_by_publish_time(t)
                .await
                .map_err(|e| BrokerError::Storage(format!("seek by publish time: {e}")))?,
        };
        self.read_position = position;
        self.pending.clear();
        self.pending_msgs.clear();
        self.gate = UnackedGate::default();
        self.pending_hash.clear();
        self.in_flight.clear();
        self.partial.clear();
        self.redeliver.clear();
        self.redelivery_count.clear();
        self.acked.clear();
        self.dirty = true;
        // Every consumer goes; the next to join becomes active (and is told so).
        self.active = None;
        self.topic.limits.release(self.consumers.len());
        for c in self.consumers.drain(..) {
            c.out.send_detached(command::close_consumer(c.key.1));
        }
        self.persist().await;
        Ok(())
    }

    /// Moves the unacknowledged entries of matching consumers to the redelivery queue.
    fn requeue(&mut self, owned: impl Fn(ConsumerKey) -> bool) {
        let moved: Vec<Position> = self
            .pending
            .iter()
            .filter(|(_, owner)| owned(**owner))
            .map(|(p, _)| *p)
            .collect();
        for p in moved {
            self.take_pending(p);
            *self.redelivery_count.entry(p).or_insert(0) += 1;
            self.redeliver.insert(p);
        }
    }
}
