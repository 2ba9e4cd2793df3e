//! The Pulsar-protocol broker: accepts connections, answers lookups as a single broker, appends
//! producers' messages to the log and dispatches them to subscriptions.
//!
//! Structure:
//! - [`connection`]: one task per client connection; it owns the socket, turns typed inbound
//!   commands into calls on topics and subscriptions, and writes responses through one outbound
//!   queue (so frames never interleave).
//! - `owner`: one task per loaded topic partition, the only owner of its producers,
//!   subscriptions, deduplication state and policies and the path of every append; the rest
//!   holds its handle, [`BrokerTopic`].
//! - [`subscription`]: one task per subscription, the only owner of its cursor and consumers;
//!   it reads the log and sends MESSAGE frames within the consumers' permits.
//! - [`dedup`]: deduplication state (Pulsar semantics), folded through replay.
//! - [`throttle`]: publish rate limits (topic or namespace `publishRate`, resource-group
//!   quotas), token buckets that stop a producer's connection from being read while in debt.
//! - [`tick`]: the periodic work (backlog quota and TTL checks, dedup snapshots, rates and
//!   early warnings), driven by the topics that changed ([`activity`]), never a walk over
//!   every loaded topic.
//!
//! Invariants:
//! - SEND_RECEIPTs of a producer leave in the order of its SENDs and only after the append is
//!   durable; a failed append gets a SEND_ERROR, never a receipt.
//! - A connection whose appends cannot keep up stops being read (the log's backpressure), so
//!   memory stays bounded whatever clients send.
//! - Malformed input closes only the connection that sent it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::BrokerConfig;
use crate::ledger::Log;
use crate::policies::PolicyStore;

mod activity;
pub mod backlog;
mod balance;
pub mod connection;

pub mod dedup;
pub mod error;
mod idle;
pub mod limits;
pub mod manage;
pub(crate) mod measure;
mod orphans;
pub mod outbox;
mod owner;
pub mod publisher;
mod rates;
mod slots;

pub mod subscription;
pub mod throttle;
mod tick;
pub mod topic;

use crate::cluster::ownership::{Ownership, OwnershipError, Placement};
use crate::naming::TopicName;
pub use error::BrokerError;
use throttle::RateLimiter;
pub use topic::{BrokerTopic, TopicPolicies};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Version string sent in CONNECTED.
pub const SERVER_VERSION: &str = concat!("ledgerlake-", env!("CARGO_PKG_VERSION"));
/// Highest protocol version this broker speaks.
pub const PROTOCOL_VERSION: i32 = 21;

/// Topics handed over at once at shutdown: each seal writes an index file (on a blocking
/// thread) and records, and the metadata store's group commit gathers the records of those
/// under way (it was 16; the stop time with 10,000 loaded partitions was ~20 s).
const HANDOVER_CONCURRENCY: usize = 128;

/// Shared broker state.
#[derive(Debug)]
pub struct Broker {
    config: BrokerConfig,
    log: Arc<Log>,
    /// Which topics this node serves; its record gives the URLs LOOKUP answers name.
    /// Invariant: a topic is loaded only while this node owns it.
    ownership: Arc<Ownership>,
    /// Topic partitions by full name, each behind a slot of its own: loading, unloading or
    /// deleting one topic holds only its slot, never the map, so a slow topic cannot delay
    /// another. Invariant: the map's lock is never held across an `.await`.
    /// A slot leaves the map once nobody holds it and it is empty ([`slots`]).
    topics: slots::Slots,
    /// The loaded topic partitions by full name, for readers that must not wait on a slot
    /// (metrics, stats ticks). Invariant: holds exactly the topics whose slot holds one; it is
    /// changed only while that slot's lock is held.
    loaded_index: Mutex<HashMap<String, Arc<BrokerTopic>>>,
    next_id: AtomicU64,
    boot_id: u32,
    stop: CancellationToken,
    tasks: TaskTracker,
    /// Authentication (CONNECT) and authorization (every command on a topic).
    access: crate::auth::Access,
    /// Namespace and topic policies (deduplication).
    policies: Arc<PolicyStore>,
    /// Which namespaces exist (a topic is only created in one).
    tenancy: Arc<crate::tenancy::Tenancy>,
    /// Lake access for ranges deleted locally (`None` when the lake is disabled).
    replay: Option<crate::replay::Replay>,
    /// Limiters of resource groups, by group name and what they limit. Invariant: each has
    /// the group's current quota (replaced when it changes).
    group_limiters: Mutex<HashMap<(String, rates::Kind), Arc<RateLimiter>>>,
    /// Bytes of SENDs queued to topic owners, shared by every topic.
    publish_budget: Arc<tokio::sync::Semaphore>,
    /// What topics measure (`[metrics]`).
    measures: measure::Settings,
    /// Idle topics asking to be unloaded ([`idle`]).
    idle: idle::IdleQueue,
    /// Topics that changed since the stats tick last looked ([`activity`]).
    activity: Arc<activity::Activity>,
    /// Topics the tick checks the policies of again, by full name ([`tick`]). Invariant:
    /// every loaded topic with a backlog limit in force or whose last policy read failed.
    policy_checks: Mutex<HashMap<Arc<str>, Arc<BrokerTopic>>>,
    /// Held by each pass that puts policies in force ([`tick`]). Invariant: passes run one at
    /// a time, so a pass that read the policies later is the one whose values stay.
    apply_lock: tokio::sync::Mutex<()>,
    /// Passes over every loaded topic started so far ([`Broker::apply_policies`]). Invariant:
    /// a topic whose load read its policies before a pass started that did not see it loaded
    /// gets that pass's policies once it is loaded (the load compares this count).
    policy_passes: std::sync::atomic::AtomicU64,
}

impl Broker {
    /// Creates the broker state; `ownership` decides which topics it serves.
    pub fn new(
        config: BrokerConfig,
        log: Arc<Log>,
        (policies, tenancy): (Arc<PolicyStore>, Arc<crate::tenancy::Tenancy>),
        replay: Option<crate::replay::Replay>,
        access: crate::auth::Access,
        ownership: Arc<Ownership>,
        metrics: &crate::config::MetricsConfig,
    ) -> Arc<Broker> {
        Arc::new(Broker {
            access,
            config,
            log,
            ownership,
            topics: Mutex::new(HashMap::new()),
            loaded_index: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            boot_id: rand::random::<u32>() % 100_000,
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            policies,
            tenancy,
            replay,
            group_limiters: Default::default(),
            publish_budget: Arc::new(tokio::sync::Semaphore::new(topic::PUBLISH_BUDGET)),
            measures: metrics.into(),
            idle: idle::IdleQueue::new(),
            activity: Default::default(),
            policy_checks: Default::default(),
            apply_lock: Default::default(),
            policy_passes: Default::default(),
        })
    }

    /// The broker-wide deduplication default (`broker.deduplication`).
    pub fn dedup_default(&self) -> bool {
        self.config.deduplication
    }

    /// The policies in force for `name`: each the topic's own setting, else its namespace's,
    /// else the broker's.
    async fn policies_of(
        &self,
        name: &TopicName,
    ) -> Result<TopicPolicies, crate::policies::PoliciesError> {
        let (own, ns) = self.policies.topic_and_namespace(name).await?;
        let pick = |f: fn(&crate::policies::NamespacePolicies) -> Option<u32>| f(&own).or(f(&ns));
        let c = &self.config;
        Ok(TopicPolicies {
            deduplication: own
                .deduplication_enabled
                .or(ns.deduplication_enabled)
                .unwrap_or(c.deduplication),
            max_producers: pick(|p| p.max_producers).filter(|m| *m > 0),
            consumers: limits::ConsumerLimitValues {
                per_topic: pick(|p| p.max_consumers).unwrap_or(0),
                per_subscription: pick(|p| p.max_consumers_per_subscription).unwrap_or(0),
                unacked_per_consumer: pick(|p| p.max_unacked_per_consumer)
                    .unwrap_or(c.max_unacked_messages_per_consumer),
                unacked_per_subscription: pick(|p| p.max_unacked_per_subscription)
                    .unwrap_or(c.max_unacked_messages_per_subscription),
            },
            backlog: crate::policies::BacklogLimits::resolve(
                &own.backlog_quota_map,
                &ns.backlog_quota_map,
                own.message_ttl_seconds.or(ns.message_ttl_seconds),
            ),
            // Partitions are not deleted one by one (their table is shared).
            inactive: name
                .partition()
                .is_none()
                .then(|| {
                    own.inactive_topic_policies
                        .or(ns.inactive_topic_policies)
                        .unwrap_or_else(|| {
                            crate::policies::InactiveTopicPolicies::from_config(
                                &c.delete_inactive_topics,
                            )
                        })
                        .rule()
                })
                .flatten(),
            replication: ns.persistence.map(|p| p.replication()).unwrap_or_default(),
        })
    }

    /// Accepts connections on `listener` until [`Broker::shutdown`]; also runs the periodic
    /// work ([`tick`]).
    pub fn serve(self: &Arc<Self>, listener: TcpListener) {
        self.spawn_tick();
        let broker = self.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = broker.stop.cancelled() => {}
                _ = broker.stop_serving_when_session_ends() => {}
            }
        });
        self.spawn_load_manager(self.ownership.load_board());
        self.spawn_idle_unloader();
        self.spawn_orphan_takeover();
        let broker = self.clone();
        self.tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = broker.stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, peer)) => {
                            let _ = stream.set_nodelay(true);
                            let b = broker.clone();
                            broker.tasks.spawn(async move {
                                connection::Connection::run(b, stream, peer).await;
                            });
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                    },
                }
            }
        });
    }

    /// Serves `pulsar+ssl://` connections from `incoming` (handshaken already) until
    /// [`Broker::shutdown`].
    pub fn serve_tls(self: &Arc<Self>, mut incoming: crate::tls::TlsIncoming) {
        self.spawn_idle_unloader();
        let broker = self.clone();
        self.tasks.spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    _ = broker.stop.cancelled() => return,
                    next = incoming.next() => match next {
                        Some(c) => c,
                        None => return,
                    },
                };
                let b = broker.clone();
                broker.tasks.spawn(async move {
                    connection::Connection::run(b, stream, peer).await;
                });
            }
        });
    }

    /// Stops accepting, closes connections, waits for their tasks, then saves every loaded
    /// topic's deduplication snapshot and durable cursors and stops its owner.
    pub async fn shutdown(&self) {
        // Others place no topic here from now on; clients that reconnect go elsewhere.
        if let Err(e) = self.ownership.drain().await {
            tracing::warn!(error = %e, "marking this node as stopping failed");
        }
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        // Every loaded topic, waiting for a slot held by a load or a deletion to be released;
        // each is handed over: stopped, its open ledger sealed (so any node may serve it next,
        // reading the ledger from this node's bookie while it runs), then released.
        let slots: Vec<Arc<slots::TopicSlot>> = lock(&self.topics).values().cloned().collect();
        futures::stream::iter(slots)
            .for_each_concurrent(HANDOVER_CONCURRENCY, |slot| async move {
                let mut loaded = slot.0.lock().await;
                if let Some(t) = loaded.take() {
                    self.forget_loaded(&t);
                    t.save_dedup_snapshot().await;
                    t.stop().await;
                    self.hand_over(&t).await;
                }
            })
            .await;
    }

    /// Seals a stopped topic's open ledger and releases the topic (at shutdown).
    async fn hand_over(&self, t: &BrokerTopic) {
        let key = t.name.to_string();
        if let Err(e) = t.log.seal_current().await {
            tracing::warn!(topic = %key, error = %e,
                "sealing at shutdown failed: the topic waits for this node to return");
        }
        if let Err(e) = self.ownership.release(&key).await {
            tracing::warn!(topic = %key, error = %e, "releasing at shutdown failed");
        }
    }

    /// Names of the topic partitions of `namespace` loaded here now.
    pub fn loaded_in(&self, namespace: &crate::naming::NamespaceName) -> Vec<TopicName> {
        self.loaded_topics()
            .into_iter()
            .filter(|t| &t.name.namespace == namespace)
            .map(|t| t.name.clone())
            .collect()
    }

    /// The topics loaded now (never waits on a slot).
    fn loaded_topics(&self) -> Vec<Arc<BrokerTopic>> {
        lock(&self.loaded_index).values().cloned().collect()
    }

    /// Takes `topic` out of the loaded index (its slot's lock is held by the caller).
    fn forget_loaded(&self, topic: &Arc<BrokerTopic>) {
        let mut index = lock(&self.loaded_index);
        let key = topic.name.to_string();
        if index.get(&key).is_some_and(|t| Arc::ptr_eq(t, topic)) {
            index.remove(&key);
            crate::memory::shrink_sparse(&mut index);
        }
        crate::metrics::node().topics_loaded.set(index.len() as i64);
        drop(index);
        self.note_policy_check(topic, false);
        self.policies.evict_topic(&topic.name);
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A producer name unique across this service's lifetime.
    fn generate_producer_name(&self) -> String {
        format!("ledgerlake-{}-{}", self.boot_id, self.next_id())
    }

    /// Partitions of `name` as PARTITIONED_METADATA reports them: the count of a partitioned
    /// topic, 0 for a non-partitioned topic or a single partition.
    pub async fn partitions(&self, name: &TopicName) -> Result<u32, BrokerError> {
        if name.partition().is_some() {
            return Ok(0);
        }
        Ok(self
            .log
            .metadata()
            .get_partitions(&name.to_string())
            .await?
            .unwrap_or(0))
    }

    /// The metadata store (schemas, partitions, cursors).
    pub fn metadata(&self) -> Arc<dyn crate::ledger::MetadataStore> {
        self.log.metadata()
    }

    /// Topic partition `name` if it is loaded (never loads it).
    async fn loaded(&self, name: &str) -> Option<Arc<BrokerTopic>> {
        let slot = self.existing_slot(name)?;
        let topic = slot.0.lock().await.clone();
        topic
    }

    /// SENDs of loaded topic partition `name` its own publish rate throttled (0 when it is not
    /// loaded).
    pub async fn publish_throttled(&self, name: &str) -> u64 {
        self.loaded(name)
            .await
            .map_or(0, |t| t.throttle.throttled())
    }

    /// Stats of the producers of topic partition `name` if it is loaded (else empty).
    pub async fn publisher_stats(&self, name: &str) -> Vec<publisher::PublisherStats> {
        let Some(topic) = self.loaded(name).await else {
            return Vec::new();
        };
        let window = topic.measures.settings.rate_window_ms;
        let all = topic.measures.publishers();
        all.iter().map(|p| p.stats(window)).collect()
    }

    /// Stats of the subscriptions of topic partition `name` if it is loaded (else empty).
    pub async fn subscription_stats(
        &self,
        name: &str,
    ) -> Vec<(String, backlog::SubscriptionStats)> {
        let Some(topic) = self.loaded(name).await else {
            return Vec::new();
        };
        let subs = topic.subscriptions().await;
        let mut out = Vec::new();
        for h in subs {
            if let Some(stats) = h.ask(subscription::SubscriptionCommand::Stats).await {
                out.push((h.name.clone(), stats));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Every loaded topic partition read into Pulsar's families (`None` when metrics are
    /// off).
    pub fn metric_families(&self) -> Option<crate::metrics::pulsar::PulsarFamilies> {
        if !self.measures.enabled {
            return None;
        }
        let mut rows: Vec<_> = self
            .loaded_topics()
            .iter()
            .map(|t| measure::topic_row(t))
            .collect();
        rows.sort_by(|a, b| a.topic.cmp(&b.topic));
        Some(crate::metrics::pulsar::PulsarFamilies {
            cluster: self.config.cluster_name.clone(),
            rows,
            topic_level: self.measures.topic_level,
        })
    }

    /// Partitioned topic `base` now has `n` partitions: its loaded partitions' measures learn
    /// it (hot-partition shares count the new, still idle, partitions).
    pub fn partitions_changed(&self, base: &TopicName, n: u32) {
        for t in self.loaded_topics() {
            if t.partition >= 0 && t.name.base() == *base {
                t.measures
                    .partitions
                    .store(n, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// The metrics row of loaded topic partition `name` (`None`: not loaded).
    pub async fn topic_row(&self, name: &str) -> Option<crate::metrics::pulsar::TopicRow> {
        self.loaded(name).await.map(|t| measure::topic_row(&t))
    }

    /// Broker-wide replay statistics (`None` when the lake is disabled).
    pub fn replay_stats(&self) -> Option<crate::replay::ReplayStats> {
        self.replay.as_ref().map(crate::replay::Replay::stats)
    }

    /// Deletes the topic partition (or non-partitioned topic) `name`: refused with `Busy` while
    /// producers or consumers are connected to it, unless `force`, which sends them
    /// CLOSE_PRODUCER / CLOSE_CONSUMER first (clients reconnect, as with Pulsar; with
    /// auto-creation on they find a new, empty topic). Then its subscriptions end, it is
    /// unloaded and deleted from the log (local data, ledgers, cursors, schemas). The topic's
    /// slot stays locked meanwhile, so no connection loads the topic while it is being
    /// deleted (other topics are not held up; after a failed deletion it loads again); a
    /// producer that connects afterwards creates a new, empty topic (with auto-creation on).
    /// Returns whether the topic existed.
    pub async fn delete_topic(
        self: &Arc<Self>,
        name: &TopicName,
        force: bool,
    ) -> Result<bool, BrokerError> {
        let key = name.to_string();
        let slot = self.slot(&key);
        let mut loaded = slot.0.lock().await;
        if loaded.is_none() {
            // Only the owner deletes a topic: claim it first (refused if another node owns it).
            let holder = self.log.pinning_holder(&key).await?;
            self.ownership.acquire(&key, holder.as_deref()).await?;
        }
        if let Some(t) = loaded.clone() {
            // The owner refuses while clients are attached (unless forced), else closes them,
            // deletes the subscriptions and stops; later commands on the old handle fail and
            // their clients load the topic anew, after this deletion.
            t.delete(force).await?;
            *loaded = None;
            self.forget_loaded(&t);
        }
        let existed = match self.log.delete_topic(&key).await {
            Ok(existed) => existed,
            Err(e) => {
                // The topic stays, unloaded but owned here: let go of it as a failed unload
                // does, once no seal of it is being tried again; with nothing of it in
                // memory, at once.
                match self.log.cached(&key).await {
                    Some(log) => self.let_go_once_sealed(key.clone(), log, false),
                    None => {
                        if let Err(e) = self.ownership.release(&key).await {
                            tracing::warn!(topic = %key, error = %e,
                                "releasing a topic whose deletion failed failed");
                        }
                    }
                }
                return Err(BrokerError::Storage(format!("deleting {key}: {e}")));
            }
        };
        self.ownership.release(&key).await?;
        drop(loaded);
        Ok(existed)
    }

    /// Where topic partition `name` is served (claimed here when it is to be served here);
    /// `authoritative`: another node placed it here.
    pub async fn placement(
        &self,
        name: &TopicName,
        authoritative: bool,
    ) -> Result<Placement, BrokerError> {
        let key = name.to_string();
        // An owned topic is served by its owner, whoever holds its ledgers: the holder is
        // looked for (a read of the topic's ledgers) only for an unowned one.
        if let Some(owned) = self.ownership.place_owned(&key).await? {
            return Ok(owned);
        }
        let holder = self.log.pinning_holder(&key).await?;
        Ok(self
            .ownership
            .place_unowned(&key, holder.as_deref(), authoritative)
            .await?)
    }

    /// The topic partition named `name`, loading or (if allowed) creating it. Loading claims
    /// it for this node first; a topic another node owns is refused.
    pub async fn topic(&self, name: &TopicName) -> Result<Arc<BrokerTopic>, BrokerError> {
        let key = name.to_string();
        let slot = self.slot(&key);
        let mut loaded = slot.0.lock().await;
        if let Some(t) = &*loaded {
            if !t.owner.is_closed() {
                return Ok(t.clone());
            }
            // Only a failed owner closes its queue with its topic still here (every other
            // stop takes the topic out under this lock before letting it go). It wound up
            // its clients and subscriptions; the topic loads anew from the log it left,
            // whose open ledger is sealed first, as an unload would.
            tracing::warn!(topic = %key, "a failed owner's topic is loaded anew");
            if let Some(failed) = loaded.take() {
                self.forget_loaded(&failed);
                if let Err(e) = failed.log.seal_current().await {
                    tracing::warn!(topic = %key, error = %e, "sealing a failed owner's ledger failed");
                }
            }
        }
        let started = std::time::Instant::now();
        let holder = self.log.pinning_holder(&key).await?;
        let epoch = self.ownership.acquire(&key, holder.as_deref()).await?;
        let passes = self.policy_passes.load(std::sync::atomic::Ordering::SeqCst);
        let t = match self.load_topic(name, &key, epoch).await {
            Ok(t) => t,
            Err(e) => {
                // Not served here after all: another node may take it. What the load cached
                // of it goes too.
                self.policies.evict_topic(name);
                if let Err(r) = self.ownership.release(&key).await {
                    tracing::warn!(topic = %key, error = %r, "releasing a topic that failed to load");
                }
                return Err(e);
            }
        };
        *loaded = Some(t.clone());
        let n = {
            let mut index = lock(&self.loaded_index);
            index.insert(key, t.clone());
            index.len()
        };
        if self.policy_passes.load(std::sync::atomic::Ordering::SeqCst) != passes {
            // A pass over the loaded topics started after this load read the policies, and
            // may have missed it.
            self.apply_policies_to(&t).await;
        }
        let metrics = crate::metrics::node();
        metrics.topics_loaded.set(n as i64);
        metrics
            .topic_load_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(t)
    }

    /// The log of topic `key` for this node, its owner at `epoch`. Where epochs fence, the
    /// fence comes first and the store is read after it: an earlier owner may have created a
    /// ledger between the holder check and the claim, but none after the fence; if it did, its
    /// open ledger pins the topic to its bookie and the load is refused.
    async fn own_log(&self, key: &str, epoch: u64) -> Result<crate::ledger::TopicLog, BrokerError> {
        let log = self.log.topic_to_own(key).await?;
        if !self.ownership.fences() {
            return Ok(log);
        }
        log.fence(epoch).await?;
        // Read once after the fence: the takeover, the holder and the view are judged against
        // it (read again only when the takeover sealed something).
        let mut state = self.log.topic_state(key).await?;
        // Open ledgers of a writer that is gone: fenced on their replicas and sealed where
        // their ack quorum guarantees every acknowledged entry.
        let taken = self
            .log
            .take_over_open_ledgers_in(key, &state)
            .await
            .map_err(|e| BrokerError::Stopped(format!("taking over {key}: {e}")))?;
        if !taken.is_empty() {
            crate::metrics::node()
                .ledgers_taken_over
                .inc_by(taken.len() as u64);
            state = self.log.topic_state(key).await?;
        }
        let holder = state
            .as_ref()
            .and_then(|(_, ledgers)| self.log.holder_in(ledgers));
        if let Some(bookie) = holder {
            if bookie != self.log.bookie_id() {
                return Err(OwnershipError::HeldElsewhere {
                    topic: key.to_string(),
                    bookie,
                }
                .into());
            }
        }
        // A view made before the fence may miss a ledger created just before it.
        let fresh = self.log.topic_to_own_in(key, &state).await?;
        if !Arc::ptr_eq(&fresh.inner, &log.inner) {
            fresh.fence(epoch).await?;
        }
        Ok(fresh)
    }

    /// Loads topic partition `name` (`key` is its full name), owned here at `epoch`: its log
    /// (fencing earlier owners' writers where epochs can), deduplication state and durable
    /// subscriptions. Runs under the topic's slot lock only.
    async fn load_topic(
        &self,
        name: &TopicName,
        key: &str,
        epoch: u64,
    ) -> Result<Arc<BrokerTopic>, BrokerError> {
        crate::failpoint::pause("broker.load_topic", key).await;
        let key = key.to_string();
        if !self.log.topic_exists(&key).await? {
            if !self.config.allow_auto_topic_creation {
                return Err(BrokerError::TopicNotFound(key));
            }
            // Auto-creation only inside a namespace that exists.
            let exists = self
                .tenancy
                .namespace(&name.namespace)
                .await
                .map_err(|e| match e {
                    crate::tenancy::TenancyError::Metadata(m) => BrokerError::Metadata(m),
                    other => BrokerError::Stopped(other.to_string()),
                })?;
            if exists.is_none() {
                return Err(BrokerError::NamespaceNotFound(name.namespace.to_string()));
            }
            if !self.is_declared_partition(name).await? {
                // A declared partition was counted with its partitioned topic.
                self.check_topic_quota(&name.namespace, 1).await?;
            }
        }
        let log = self.own_log(&key, epoch).await?;
        let lake = self.replay.as_ref().map(|r| r.topic(name));
        let policies = self
            .policies_of(name)
            .await
            .map_err(|e| BrokerError::Stopped(format!("reading the policies of {key}: {e}")))?;
        log.set_replication(policies.replication);
        // Backlog quotas and TTL are checked again by the tick.
        let timed = !policies.backlog.is_empty();
        let dedup = if policies.deduplication {
            owner::Dedup::load(&log, lake.as_ref()).await?
        } else {
            owner::Dedup::Off
        };
        // Durable subscriptions resume where they were.
        let mut cursors = Vec::new();
        for (sub, blob) in log.cursors().await? {
            if sub == crate::ledger::cursor::DEDUP_SNAPSHOT {
                continue;
            }
            match crate::ledger::cursor::CursorState::decode(&blob) {
                Ok(state) => cursors.push((sub, state)),
                Err(e) => tracing::error!(topic = %key, subscription = %sub, error = %e,
                    "ignoring unreadable cursor"),
            }
        }
        let topic = owner::spawn(owner::OwnerSetup {
            name: name.clone(),
            log,
            lake,
            policies,
            dedup,
            cursors,
            persist_every: self.config.cursor_persist_interval,
            publish_budget: self.publish_budget.clone(),
            measures: self.measures,
            activity: self.activity.clone(),
            idle: self.idle_unload(),
        });
        self.apply_throttle(&topic).await;
        self.note_policy_check(&topic, timed);
        if name.partition().is_some() {
            let declared = self.partitions(&name.base()).await?;
            topic
                .measures
                .partitions
                .store(declared, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(topic)
    }

    /// Whether `name` is a partition of a partitioned topic that declares it.
    async fn is_declared_partition(&self, name: &TopicName) -> Result<bool, BrokerError> {
        let Some(i) = name.partition() else {
            return Ok(false);
        };
        let declared = self
            .log
            .metadata()
            .get_partitions(&name.base().to_string())
            .await?;
        Ok(declared.is_some_and(|n| i < n))
    }

    /// Refuses creating `adding` more topics in `ns` beyond its `maxTopicsPerNamespace` (a
    /// partitioned topic counts as its partitions, as Pulsar counts them). Lists the
    /// namespace's topics only when a limit is set.
    pub async fn check_topic_quota(
        &self,
        ns: &crate::naming::NamespaceName,
        adding: u32,
    ) -> Result<(), BrokerError> {
        let max = match self.policies.namespace(ns).await {
            Ok(p) => p.max_topics.unwrap_or(0),
            Err(e) => {
                return Err(BrokerError::Stopped(format!(
                    "reading {ns}'s policies: {e}"
                )))
            }
        };
        if max == 0 {
            return Ok(());
        }
        let meta = self.log.metadata();
        let prefix = format!("persistent://{ns}/");
        let partitioned: HashMap<String, u32> = meta
            .list_partitioned_topics(&prefix)
            .await?
            .into_iter()
            .collect();
        let mut count: u64 = partitioned.values().map(|n| u64::from(*n)).sum();
        for t in meta.list_topics_under(&prefix).await? {
            // A partition of a partitioned topic was counted above; a topic merely named like
            // one counts by itself.
            let declared = t.name.parse::<TopicName>().is_ok_and(|n| {
                n.partition().is_some_and(|i| {
                    partitioned
                        .get(&n.base().to_string())
                        .is_some_and(|count| i < *count)
                })
            });
            if !declared {
                count += 1;
            }
        }
        if count + u64::from(adding) > u64::from(max) {
            return Err(BrokerError::TooManyTopics(format!(
                "Exceed maximum number of topics in namespace {ns} ({count} of {max})"
            )));
        }
        Ok(())
    }
}
