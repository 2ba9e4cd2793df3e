//! The owner of one loaded topic partition: a task that alone holds the partition's producer
//! registry, subscription registry, deduplication state and policies, and through which every
//! producer's message is appended. Everything else talks to it with [`TopicCommand`]s through
//! the partition's [`BrokerTopic`] handle.
//!
//! A SEND is published in two steps: the owner takes the deduplication verdict and appends
//! (the log assigns the position and queues the write), then keeps the append in a queue of
//! appends in flight and answers the SEND once the log made it durable. Answers leave in append
//! order, and the deduplication state learns of each durable (or failed) append in that order.
//!
//! Invariants:
//! - Commands are handled one at a time: a deduplication verdict and its append are never
//!   separated by another SEND of the topic.
//! - At most one producer is registered when any registered producer is exclusive, and no two
//!   producers share a name; `WaitForExclusive` producers wait only while others are
//!   registered ([`producers`]).
//! - Deduplication state is [`Dedup::On`] exactly while the policies ask for it and its fold
//!   succeeded; while the fold fails it is [`Dedup::Unavailable`] and SENDs are refused (the
//!   client retries), never appended unchecked.
//! - Once the owner stops (delete, stop), every append it had queued has been answered; SENDs
//!   queued behind the stop are dropped unanswered, which their producers see as the topic
//!   having stopped.
//! - A panic in the loop is caught: appends in flight are settled, clients closed and
//!   subscriptions ended as at an unload ([`wind_up_failed`]), and only then is the queue
//!   closed, so a lookup that finds the queue closed may load the topic anew
//!   ([`IdleAsk::Failed`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::dedup::{DedupSnapshot, DedupState, Verdict};
use super::subscription::{self, SubscriptionCommand, SubscriptionHandle};
use super::topic::{
    BrokerTopic, NewProducer, ProducerSlot, PublishRequest, Published, SubscribeRequest,
    TopicCommand, TopicPolicies, OWNER_QUEUE,
};
use super::BrokerError;
use crate::ledger::cursor::{CursorState, DEDUP_SNAPSHOT};
use crate::ledger::{AppendError, AppendReceipt, Position, TopicLog};
use crate::naming::TopicName;
use crate::protocol::inbound::StartAt;
use crate::protocol::proto::command_subscribe::SubType;
use crate::replay::TopicLake;

/// Deduplication state of one topic partition.
#[derive(Debug)]
pub(crate) enum Dedup {
    /// Deduplication is off.
    Off,
    /// On: the live state consulted on every SEND, and the persisted snapshot (folded and
    /// saved outside the owner, so SENDs do not wait for it).
    On {
        live: DedupState,
        snapshot: Arc<tokio::sync::Mutex<DedupSnapshot>>,
    },
    /// On, but its state could not be folded (the reason); SENDs are refused until it is.
    Unavailable(String),
}

impl Dedup {
    /// Folds the state from the snapshot and the entries after it, whichever tier holds them.
    pub(crate) async fn load(
        log: &TopicLog,
        lake: Option<&TopicLake>,
    ) -> Result<Dedup, BrokerError> {
        let snapshot = DedupSnapshot::load(log.clone(), lake.cloned())
            .await
            .map_err(|e| {
                BrokerError::Storage(format!("deduplication state of {}: {e}", log.name()))
            })?;
        Ok(Dedup::On {
            live: DedupState::from_snapshot(&snapshot),
            snapshot: Arc::new(tokio::sync::Mutex::new(snapshot)),
        })
    }
}

/// What a topic needs to start its owner.
pub(crate) struct OwnerSetup {
    /// Full name.
    pub name: TopicName,
    /// Its log.
    pub log: TopicLog,
    /// Its lake side (`None`: lake disabled).
    pub lake: Option<TopicLake>,
    /// Policies in force at load.
    pub policies: TopicPolicies,
    /// Deduplication state folded at load.
    pub dedup: Dedup,
    /// Durable subscriptions to resume: name and saved cursor.
    pub cursors: Vec<(String, CursorState)>,
    /// How often subscriptions save their cursors.
    pub persist_every: Duration,
    /// The broker-wide budget of queued SEND bytes.
    pub publish_budget: Arc<tokio::sync::Semaphore>,
    /// What to measure (`[metrics]`).
    pub measures: super::measure::Settings,
    /// Where the topic says that it changed, for the broker's stats tick.
    pub activity: Arc<super::activity::Activity>,
    /// Unloading once idle (`None`: never).
    pub idle: Option<IdleUnload>,
}

/// How a loaded topic asks the broker to unload it once idle (`broker.unload_idle_after`) or
/// to delete it once inactive (inactive-topic policies).
#[derive(Debug, Clone)]
pub(crate) struct IdleUnload {
    /// Idle this long: no producer, no consumer, nothing in flight, no client command
    /// (`None`: never unloaded for idleness).
    pub after: Option<Duration>,
    /// The broker's queue of topics asking.
    pub ask: mpsc::UnboundedSender<(std::sync::Weak<BrokerTopic>, IdleAsk)>,
}

/// What an owner asks of the broker about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdleAsk {
    /// Unload me (idle for the idle period).
    Unload,
    /// Delete me (inactive per the inactive-topic policy).
    Delete,
    /// Forget me: my loop failed (a panic), my clients are closed, nothing is in flight.
    Failed,
}

/// An append whose SEND waits for durability.
struct InFlight {
    publisher: Arc<super::publisher::PublisherMeasure>,
    highest: i64,
    reply: oneshot::Sender<Published>,
    /// When the owner took the SEND, and its messages and bytes (for the measures).
    started: std::time::Instant,
    messages: u64,
    bytes: u64,
}

/// The owner task's state.
struct Owner {
    /// Its own handle (new subscriptions hold it).
    topic: Arc<BrokerTopic>,
    /// Producers by name. Invariant: at most one entry when any is exclusive.
    producers: HashMap<String, ProducerSlot>,
    /// `WaitForExclusive` producers waiting their turn, oldest first ([`producers`]).
    /// Invariant: empty while `producers` is (the first waiter is registered as soon as the
    /// last producer goes).
    waiting: std::collections::VecDeque<NewProducer>,
    /// Subscriptions by name.
    subscriptions: HashMap<String, SubscriptionHandle>,
    /// Policies in force.
    policies: TopicPolicies,
    /// Invariant: `On` or `Unavailable` exactly while `policies.deduplication`.
    dedup: Dedup,
    persist_every: Duration,
    /// Invariant: `Some` exactly while the last backlog check found a hold or exception quota
    /// exceeded ([`quota`]); producers are refused meanwhile.
    blocked: Option<crate::policies::BacklogPolicy>,
    /// The oldest unacknowledged entry last read for the age checks, and its publish time.
    age_probe: Option<(Position, i64)>,
    /// The backlog check started last (`None`: none since its verdict). Aborted when the
    /// owner stops, so no check outlives the loaded topic.
    check: Option<tokio::task::JoinHandle<()>>,
    /// Producers one of whose appends failed. Invariant: a name is here from that failure
    /// until the producer registers again (its client reconnects and resends everything
    /// unacknowledged, in order); meanwhile its later SENDs are refused unwritten, so a
    /// condition that clears between two SENDs (a full disk) cannot store the later one
    /// without the earlier one (a gap; with deduplication the retried earlier one would be
    /// taken for a duplicate and lost).
    fenced: std::collections::HashSet<Arc<str>>,
    /// Unloading once idle (`None`: never).
    idle: Option<IdleUnload>,
    /// When a client last asked something of the topic (a SEND, a producer or consumer
    /// coming or going) or was last seen attached.
    last_busy: std::time::Instant,
    /// When a message was last published (the load, before the first).
    last_publish: std::time::Instant,
    /// Set when the policies changed: the idle timer is armed again for the new period.
    rearm: bool,
}

/// Most bytes the owner's task future may take (checked in debug builds, where futures are
/// larger than in release): every loaded topic holds one, idle or not.
const TASK_BYTES: usize = 512;

/// Starts the owner of a loaded topic partition and returns its handle.
pub(crate) fn spawn(setup: OwnerSetup) -> Arc<BrokerTopic> {
    let (tx, rx) = mpsc::channel(OWNER_QUEUE);
    let marker = super::activity::Marker::new(&setup.name.to_string(), &setup.activity);
    let topic = Arc::new(BrokerTopic {
        partition: setup.name.partition().map_or(-1, |p| p as i32),
        name: setup.name,
        log: setup.log,
        lake: setup.lake,
        owner: tx,
        publish_budget: setup.publish_budget,
        throttle: Default::default(),
        dispatch: Default::default(),
        subscribe_gate: Default::default(),
        in_force: Default::default(),
        limits: Default::default(),
        measures: super::measure::TopicMeasures::new(setup.measures, marker),
    });
    topic.limits.set(setup.policies.consumers);
    topic.measures.set_quotas(&setup.policies.backlog);
    if topic.partition >= 0 {
        // A partition's share is set by the stats tick once it takes traffic; until then it
        // takes none of its topic's.
        topic.measures.set_share(0.0);
    }
    let mut subscriptions = HashMap::new();
    for (name, state) in setup.cursors {
        let sub_type = SubType::try_from(state.sub_type).unwrap_or(SubType::Exclusive);
        let handle = subscription::spawn(
            topic.clone(),
            name.clone(),
            sub_type,
            true,
            state.first_unacked,
            Some(state),
            setup.persist_every,
        );
        subscriptions.insert(name, handle);
    }
    // Boxed: an async fn keeps its arguments beside its body's copy of them, so the state
    // passed by value would be held twice in every loaded topic's task.
    let owner = Box::new(Owner {
        topic: topic.clone(),
        producers: HashMap::new(),
        waiting: Default::default(),
        subscriptions,
        policies: setup.policies,
        dedup: setup.dedup,
        persist_every: setup.persist_every,
        blocked: None,
        fenced: Default::default(),
        age_probe: None,
        check: None,
        idle: setup.idle,
        last_busy: std::time::Instant::now(),
        last_publish: std::time::Instant::now(),
        rearm: false,
    });
    owner.record_policies();
    let task = run(owner, rx);
    debug_assert!(
        std::mem::size_of_val(&task) <= TASK_BYTES,
        "the owner's task grew to {} bytes: box the step that grew it (see `run`)",
        std::mem::size_of_val(&task)
    );
    tokio::spawn(task);
    topic
}

/// Waits until an append is durable.
async fn settle(f: InFlight, receipt: AppendReceipt) -> (InFlight, Result<Position, AppendError>) {
    let result = receipt.durable().await;
    (f, result)
}

/// How the owner's loop ended.
enum Exit {
    /// Deleted: answer once appends in flight are settled.
    Deleted(oneshot::Sender<Result<(), BrokerError>>),
    /// Stopped.
    Stopped(oneshot::Sender<()>),
    /// Unloaded because idle.
    Idle(oneshot::Sender<bool>),
}

/// The owner's loop. Every loaded topic holds this future, and a future is as large as the
/// largest step it awaits inline, so every step but the select itself is boxed: a SEND's
/// publish (an allocation per SEND buys ~500 bytes less per loaded topic) and the rare ones.
async fn run(mut owner: Box<Owner>, mut rx: mpsc::Receiver<TopicCommand>) {
    // A quota exceeded before a restart holds from the start, not from the first tick.
    owner.start_backlog_check();
    let mut appends = FuturesOrdered::new();
    // A defect that panics here would otherwise end the task with the topic still in the
    // broker's slot, every command to it failing until a restart: it is caught, and the
    // topic's clients are closed below so that they reconnect to a topic loaded anew.
    let served = std::panic::AssertUnwindSafe(async {
        // One timer while loaded, reset only when it fires (or the policies change):
        // commands just note the time.
        let idle_timer = tokio::time::sleep(owner.idle_period());
        tokio::pin!(idle_timer);
        loop {
            tokio::select! {
                biased;
                Some((f, result)) = appends.next(), if !appends.is_empty() => owner.settled(f, result),
                cmd = rx.recv() => match cmd {
                    None => break None,
                    Some(TopicCommand::Publish(request)) => {
                        owner.last_busy = std::time::Instant::now();
                        owner.last_publish = owner.last_busy;
                        if let Some((f, receipt)) = Box::pin(owner.publish(*request)).await {
                            appends.push_back(settle(f, receipt));
                        }
                    }
                    Some(TopicCommand::UnloadIfIdle(reply)) => {
                        if appends.is_empty() && owner.idle_enough() {
                            Box::pin(owner.unload()).await;
                            break Some(Exit::Idle(reply));
                        }
                        let _ = reply.send(false);
                    }
                    Some(TopicCommand::Delete { force, reply }) => match Box::pin(owner.delete(force)).await {
                        Ok(()) => break Some(Exit::Deleted(reply)),
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    },
                    Some(TopicCommand::Stop(reply)) => {
                        Box::pin(owner.flush_subscriptions()).await;
                        break Some(Exit::Stopped(reply));
                    }
                    Some(TopicCommand::Unload(reply)) => {
                        // As Pulsar closes a topic: appends in flight settle (their receipts
                        // leave) before the producers are told to go, so a client does not
                        // resend what was stored (a duplicate without deduplication).
                        while let Some((f, result)) = appends.next().await {
                            owner.settled(f, result);
                        }
                        Box::pin(owner.unload()).await;
                        break Some(Exit::Stopped(reply));
                    }
                    Some(cmd) => Box::pin(owner.handle(cmd)).await,
                },
                () = &mut idle_timer => {
                    let next = Box::pin(owner.idle_tick(appends.is_empty())).await;
                    idle_timer.as_mut().reset(next.into());
                }
            }
            if std::mem::take(&mut owner.rearm) {
                let next = std::time::Instant::now() + owner.idle_period();
                idle_timer.as_mut().reset(next.into());
            }
        }
    })
    .catch_unwind()
    .await;
    if let Some(check) = owner.check.take() {
        check.abort();
    }
    match served {
        Ok(exit) => {
            while let Some((f, result)) = appends.next().await {
                owner.settled(f, result);
            }
            answer(exit);
        }
        Err(panic) => {
            crate::metrics::node().topic_owner_failures.inc();
            tracing::error!(topic = %owner.topic.name, panic = panic_text(&*panic),
                "the topic's owner failed: its clients are closed and it loads anew on their next lookup");
            Box::pin(wind_up_failed(&mut owner, &mut appends)).await;
            // The queue closes only now: until then a lookup still finds this topic (its
            // commands go unanswered), so a topic loaded anew never meets these
            // subscriptions.
            drop(rx);
            owner.ask(IdleAsk::Failed);
        }
    }
}

/// Answers whoever ended the loop.
fn answer(exit: Option<Exit>) {
    match exit {
        Some(Exit::Deleted(reply)) => {
            let _ = reply.send(Ok(()));
        }
        Some(Exit::Stopped(reply)) => {
            let _ = reply.send(());
        }
        Some(Exit::Idle(reply)) => {
            let _ = reply.send(true);
        }
        None => {}
    }
}

/// After a panic in the loop: what a restart would do for the topic, sooner. Appends in
/// flight settle (their producers get their answers), then the clients are closed and the
/// subscriptions end with their cursors saved, as at an unload. The state may be half
/// changed: deduplication is dropped first (the topic loaded anew folds its own from the
/// log). Should this panic too, everyone is told to go without waiting (a subscription may
/// then still be saving its cursor when the topic loads anew).
async fn wind_up_failed<F>(owner: &mut Owner, appends: &mut FuturesOrdered<F>)
where
    F: std::future::Future<Output = (InFlight, Result<Position, AppendError>)>,
{
    owner.dedup = Dedup::Off;
    let orderly = std::panic::AssertUnwindSafe(async {
        while let Some((f, result)) = appends.next().await {
            owner.settled(f, result);
        }
        owner.unload().await;
    })
    .catch_unwind()
    .await;
    if orderly.is_err() {
        tracing::error!(topic = %owner.topic.name,
            "winding up the failed owner failed too: its clients are told to go without waiting");
        for (_, p) in owner.producers.drain() {
            p.close.cancel();
        }
        owner.producers_changed();
        for (_, s) in owner.subscriptions.drain() {
            let _ = s.tx.send(SubscriptionCommand::Unload(oneshot::channel().0));
        }
    }
}

/// What a caught panic says (its message when it has one).
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

impl Owner {
    /// The deduplication verdict, then the append. `None` when the SEND is answered already.
    async fn publish(&mut self, r: PublishRequest) -> Option<(InFlight, AppendReceipt)> {
        #[cfg(debug_assertions)]
        crate::failpoint::panic_at("broker.owner.publish", &self.topic.name.to_string());
        if let Some(e) = self.blocked_error() {
            // A backlog quota holds the producers: a client that kept sending after
            // CLOSE_PRODUCER (or whose SENDs were in flight) is refused too.
            let _ = r.reply.send(Published::Refused(e));
            return None;
        }
        if self.fenced.contains(&r.publisher.name) {
            let _ = r
                .reply
                .send(Published::Refused(BrokerError::Storage(format!(
                    "an earlier send of producer {} failed: reconnect and resend from it",
                    r.publisher.name
                ))));
            return None;
        }
        match &mut self.dedup {
            Dedup::Off => {}
            Dedup::On { live, .. } => match live.check(&r.publisher.name, r.highest) {
                Verdict::New => {}
                Verdict::Duplicate => {
                    let _ = r.reply.send(Published::Duplicate);
                    return None;
                }
                Verdict::Unknown => {
                    let _ = r.reply.send(Published::InFlight);
                    return None;
                }
            },
            Dedup::Unavailable(reason) => {
                let _ = r.reply.send(Published::DedupUnavailable(reason.clone()));
                return None;
            }
        }
        let f = InFlight {
            publisher: r.publisher,
            highest: r.highest,
            reply: r.reply,
            started: std::time::Instant::now(),
            // Reading the count decodes the entry's metadata: only when it is recorded.
            messages: if self.topic.measures.settings.enabled {
                u64::from(crate::protocol::frame::entry_message_count(&r.entry))
            } else {
                0
            },
            bytes: r.entry.len() as u64,
        };
        let appended = self.topic.log.append(r.publish_time_ms, r.entry).await;
        // Appended (or refused): the log's own budget holds the bytes from here.
        drop(r.budget);
        match appended {
            Ok(receipt) => Some((f, receipt)),
            Err(e) => {
                self.settled(f, Err(e));
                None
            }
        }
    }

    /// Records how an append ended and answers its SEND.
    fn settled(&mut self, f: InFlight, result: Result<Position, AppendError>) {
        if result.is_ok() {
            let took = f.started.elapsed().as_micros() as u64;
            let m = &self.topic.measures;
            m.appended(&f.publisher, f.messages, f.bytes, took);
        } else {
            self.fenced.insert(f.publisher.name.clone());
        }
        if let Dedup::On { live, .. } = &mut self.dedup {
            if result.is_ok() {
                live.persisted(&f.publisher.name, f.highest);
            } else {
                live.failed(&f.publisher.name);
            }
        }
        let _ = f.reply.send(Published::Persisted(result));
    }

    async fn handle(&mut self, cmd: TopicCommand) {
        match cmd {
            TopicCommand::AddProducer(producer) => self.on_add_producer(*producer),
            TopicCommand::RemoveProducer(producer) => self.on_remove_producer(*producer),
            TopicCommand::Subscribe { request, reply } => {
                self.last_busy = std::time::Instant::now();
                let _ = reply.send(self.subscribe(*request));
            }
            TopicCommand::ForgetSubscription { handle, reply } => {
                let same = |h: &SubscriptionHandle| h.tx.same_channel(&handle.tx);
                if self.subscriptions.get(&handle.name).is_some_and(same) {
                    self.subscriptions.remove(&handle.name);
                }
                let _ = reply.send(());
            }
            TopicCommand::Subscriptions(reply) => {
                let _ = reply.send(self.subscriptions.values().cloned().collect());
            }
            TopicCommand::SetPolicies { policies, reply } => {
                self.set_policies(*policies).await;
                self.record_policies();
                self.start_backlog_check();
                let _ = reply.send(());
            }
            TopicCommand::BacklogChecked(verdict) => {
                self.backlog_checked(*verdict).await;
            }
            TopicCommand::DedupSnapshot(reply) => {
                let snapshot = match &self.dedup {
                    Dedup::On { snapshot, .. } => Some(snapshot.clone()),
                    Dedup::Off | Dedup::Unavailable(_) => None,
                };
                let _ = reply.send(snapshot);
            }
            // The loop handles these itself.
            TopicCommand::Publish(_)
            | TopicCommand::Delete { .. }
            | TopicCommand::Stop(_)
            | TopicCommand::Unload(_)
            | TopicCommand::UnloadIfIdle(_) => {}
        }
    }

    /// Publishes the producers to the measures (their count and stats).
    fn producers_changed(&self) {
        let all = self.producers.values().map(|p| p.publisher.clone());
        self.topic.measures.set_publishers(all.collect());
    }

    /// The subscription of the requested name, created (at its start position) when new;
    /// none is created while the topic has its most consumers (the consumer would be refused
    /// and leave a subscription behind).
    fn subscribe(&mut self, r: SubscribeRequest) -> Result<SubscriptionHandle, BrokerError> {
        if let Some(h) = self.subscriptions.get(&r.name) {
            return Ok(h.clone());
        }
        self.topic.limits.room_for_consumer()?;
        let start = start_position(&self.topic.log, r.start);
        let h = subscription::spawn(
            self.topic.clone(),
            r.name.clone(),
            r.sub_type,
            r.durable,
            start,
            None,
            self.persist_every,
        );
        self.subscriptions.insert(r.name, h.clone());
        Ok(h)
    }

    /// Puts `p` in force. Enabling deduplication folds its state here, so no SEND of this
    /// topic is appended between the policy change and the state being ready.
    async fn set_policies(&mut self, p: TopicPolicies) {
        if p == self.policies && !matches!(self.dedup, Dedup::Unavailable(_)) {
            return;
        }
        // Limits apply to the next registration or check; the dedup state follows below.
        self.policies.max_producers = p.max_producers;
        self.policies.backlog = p.backlog;
        self.topic.measures.set_quotas(&p.backlog);
        if self.policies.consumers != p.consumers {
            self.policies.consumers = p.consumers;
            self.topic.limits.set(p.consumers);
            // A raised unacked limit lets paused subscriptions dispatch now, not at their
            // next acknowledgement.
            for s in self.subscriptions.values() {
                let _ = s.tx.send(SubscriptionCommand::Wake);
            }
        }
        let on = !matches!(self.dedup, Dedup::Off);
        let ready = matches!(self.dedup, Dedup::On { .. });
        if p.deduplication && !ready {
            self.dedup = match Dedup::load(&self.topic.log, self.topic.lake.as_ref()).await {
                Ok(d) => {
                    tracing::info!(topic = %self.topic.name, "deduplication enabled");
                    d
                }
                Err(e) => {
                    tracing::error!(topic = %self.topic.name, error = %e,
                        "enabling deduplication failed; SENDs are refused until it succeeds");
                    Dedup::Unavailable(e.to_string())
                }
            };
        } else if !p.deduplication && on {
            self.dedup = Dedup::Off;
            if let Err(e) = self.topic.log.delete_cursor(DEDUP_SNAPSHOT).await {
                tracing::warn!(topic = %self.topic.name, error = %e, "deleting dedup snapshot failed");
            }
            tracing::info!(topic = %self.topic.name, "deduplication disabled");
        }
        self.policies = p;
        self.rearm = true;
    }

    /// Publishes the policies in force for the broker's periodic pass (none while
    /// deduplication could not be enabled: the pass hands them over again, to retry).
    fn record_policies(&self) {
        let applied = (!matches!(self.dedup, Dedup::Unavailable(_))).then_some(self.policies);
        *self
            .topic
            .in_force
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = applied;
    }

    /// Refuses while clients are attached unless `force`; then closes every producer and
    /// deletes every subscription.
    async fn delete(&mut self, force: bool) -> Result<(), BrokerError> {
        let name = &self.topic.name;
        if !force && !self.producers.is_empty() {
            return Err(BrokerError::TopicBusy(format!(
                "topic {name} has {} connected producers",
                self.producers.len()
            )));
        }
        if !force {
            for s in self.subscriptions.values() {
                let stats = s.ask(SubscriptionCommand::Stats).await;
                if stats.is_some_and(|st| !st.consumers.is_empty()) {
                    return Err(BrokerError::TopicBusy(format!(
                        "topic {name} has consumers connected to subscription {}",
                        s.name
                    )));
                }
            }
        }
        for (_, p) in self.producers.drain() {
            p.close.cancel();
        }
        self.producers_changed();
        for (_, s) in self.subscriptions.drain() {
            // A cursor left by a fenced delete is the later owner's (logged by the task).
            let _ = s.ask(SubscriptionCommand::Delete).await;
        }
        self.dedup = Dedup::Off;
        Ok(())
    }

    /// Closes every producer and consumer (they reconnect and load the topic anew) and ends
    /// the subscriptions, their cursors saved.
    async fn unload(&mut self) {
        for (_, p) in self.producers.drain() {
            p.close.cancel();
        }
        self.producers_changed();
        for (_, s) in self.subscriptions.drain() {
            s.ask(SubscriptionCommand::Unload).await;
        }
    }

    /// Saves every durable subscription's cursor.
    async fn flush_subscriptions(&mut self) {
        for s in self.subscriptions.values() {
            s.ask(SubscriptionCommand::Flush).await;
        }
    }
}

/// The position a new subscription starts at.
fn start_position(log: &TopicLog, start: StartAt) -> Position {
    match start {
        StartAt::Earliest => log.first_position(),
        StartAt::Latest => log.last_confirmed().map_or(Position::new(0, 0), |p| {
            Position::new(p.ledger, p.entry + 1)
        }),
        // The broker redelivers the whole start entry; the client filters by batch index.
        StartAt::Message { ledger, entry } => Position::new(ledger, entry),
    }
}

mod idle;
mod producers;
mod quota;
#[cfg(test)]
mod tests;

/// A log in a temporary directory over the memory metadata store, for the broker's unit tests.
#[cfg(test)]
pub(crate) async fn test_log(
) -> Result<(tempfile::TempDir, Arc<crate::ledger::Log>), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let log = crate::ledger::Log::open(
        dir.path(),
        crate::config::LedgerConfig::default(),
        Arc::new(crate::ledger::metadata::memory::MemoryMetadataStore::new()),
    )
    .await?;
    Ok((dir, Arc::new(log)))
}

/// A publish budget of the broker's size, for the broker's unit tests.
#[cfg(test)]
pub(crate) fn test_budget() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(super::topic::PUBLISH_BUDGET))
}
