//! Namespace policies: what a namespace sets for itself (Pulsar's `/admin/v2/namespaces/...`
//! policies), stored in the metadata store, cached in memory, and combined with the configured
//! defaults into the [`EffectivePolicies`] the offload engine reads on every pass. A topic may
//! override some of them (today: deduplication) with the same structure at topic scope.
//!
//! Invariants:
//! - A policy a namespace did not set is `None` and follows the configured default, so changing
//!   the config changes every namespace that has not overridden it.
//! - A write forgets the cached value before and after it changes the store, and the next
//!   reader loads what the store holds: a reader never sees a value that a crash could take
//!   back. Changes take effect without restart; another node's changes reach this cache
//!   through the metadata store's policies feed ([`PolicyStore::forget`]), and a load
//!   overtaken by a write or a forgetting is not cached ([`crate::cached`]).
//! - Updates read the store, not the cache, and write with a compare-and-set on what they
//!   read ([`MetadataStore::replace_policies`]): two nodes updating one scope at once do not
//!   undo each other.
//! - The persisted blob is `[version = 1][JSON]`; see `docs/adr/0002-lake-layout.md`.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cached::Cached;
use crate::config::{LakePartitioning, LakeTableLayout, PolicyDefaults};
use crate::ledger::{MetadataError, MetadataStore};
use crate::naming::{NamespaceName, TopicName};

mod backlog;
mod inactive;
mod persistence;
mod reach;
pub use backlog::{BacklogLimits, BacklogPolicy, BacklogQuota, BacklogQuotaMap, BacklogQuotaType};
pub use inactive::{InactiveRule, InactiveTopicPolicies};
pub use persistence::PersistencePolicies;
pub use reach::Reach;

/// Version byte of the persisted policies blob.
pub const POLICIES_FORMAT_VERSION: u8 = 1;

/// What one namespace has set. `None` = follow the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespacePolicies {
    /// `offloadThreshold` (bytes; 0 = as soon as possible; negative = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_threshold_bytes: Option<i64>,
    /// `offloadThresholdInSeconds` (negative = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_threshold_seconds: Option<i64>,
    /// `offloadDeletionLagMs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_deletion_lag_ms: Option<u64>,
    /// Partition granularity of tables created from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lake_partitioning: Option<LakePartitioning>,
    /// How the namespace's topics map to lake tables (`lakeTableLayout`; set only while the
    /// namespace has no topics, so no topic ever has rows in both layouts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lake_table_layout: Option<LakeTableLayout>,
    /// `persistence` (Pulsar's `PersistencePolicies`): how the namespace's new ledgers are
    /// replicated (namespace scope only; ADR 0010).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence: Option<PersistencePolicies>,
    /// Broker deduplication (`/namespaces/{t}/{ns}/deduplication`; at topic scope
    /// `.../{topic}/deduplicationEnabled`, which wins over the namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deduplication_enabled: Option<bool>,
    /// `retention` (Pulsar's `RetentionPolicies`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionPolicy>,
    /// `publishRate`: the most each topic partition accepts (at topic scope, wins over the
    /// namespace's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_rate: Option<PublishRate>,
    /// `maxProducersPerTopic` (at topic scope `maxProducers`, which wins): the most producers
    /// a topic partition accepts at once; 0 = no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_producers: Option<u32>,
    /// `resourcegroup`: the resource group whose quota the namespace's topics share
    /// (namespace scope only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_group_name: Option<String>,
    /// `backlogQuotaMap` (at topic scope each type wins over the namespace's quota of that
    /// type).
    #[serde(default, skip_serializing_if = "BacklogQuotaMap::is_empty")]
    pub backlog_quota_map: BacklogQuotaMap,
    /// `messageTTL` in seconds (0 = messages never expire; at topic scope it wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_ttl_seconds: Option<u32>,
    /// `maxConsumersPerTopic` (topic scope `maxConsumers`); 0 = no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consumers: Option<u32>,
    /// `maxConsumersPerSubscription`; 0 = no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consumers_per_subscription: Option<u32>,
    /// `maxUnackedMessagesPerConsumer` (topic scope `…OnConsumer`); 0 = no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unacked_per_consumer: Option<u32>,
    /// `maxUnackedMessagesPerSubscription` (topic scope `…OnSubscription`); 0 = no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unacked_per_subscription: Option<u32>,
    /// `maxTopicsPerNamespace` (namespace scope only; a partition counts as a topic); 0 = no
    /// limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_topics: Option<u32>,
    /// `dispatchRate`: the most each topic partition dispatches, shared by its subscriptions
    /// (at topic scope, wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_rate: Option<DispatchRate>,
    /// Inactive-topic deletion (`/namespaces/{t}/{ns}/inactiveTopicPolicies`; at topic scope
    /// `.../{topic}/inactiveTopicPolicies`, which wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_topic_policies: Option<InactiveTopicPolicies>,
    /// `subscriptionDispatchRate`: the most each subscription dispatches (at topic scope,
    /// wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_dispatch_rate: Option<DispatchRate>,
    /// `subscribeRate`: SUBSCRIBEs per consumer and period (at topic scope, wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscribe_rate: Option<SubscribeRate>,
}

/// Pulsar's `PublishRate`: messages and bytes per second (-1 or 0 = unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishRate {
    /// Messages per second.
    #[serde(default = "unlimited", deserialize_with = "null_is_unlimited")]
    pub publish_throttling_rate_in_msg: i64,
    /// Bytes per second.
    #[serde(default = "unlimited", deserialize_with = "null_is_unlimited")]
    pub publish_throttling_rate_in_byte: i64,
}

/// Pulsar's `DispatchRate`: messages and bytes per period (-1 or 0 = unlimited).
/// `relativeToPublishRate` is not supported (refused when set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatchRate {
    /// Messages per period.
    #[serde(default = "unlimited", deserialize_with = "null_is_unlimited")]
    pub dispatch_throttling_rate_in_msg: i64,
    /// Bytes per period.
    #[serde(default = "unlimited", deserialize_with = "null_is_unlimited")]
    pub dispatch_throttling_rate_in_byte: i64,
    /// Pulsar: the rate is added to the publish rate. Not supported.
    #[serde(default)]
    pub relative_to_publish_rate: bool,
    /// Length of the period in seconds (Pulsar's default 1).
    #[serde(default = "one_second")]
    pub rate_period_in_second: u32,
}

fn one_second() -> u32 {
    1
}

/// Pulsar's `SubscribeRate`: SUBSCRIBEs each consumer may make per period (≤ 0 = unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscribeRate {
    /// Subscribes per consumer per period.
    #[serde(default = "unlimited32")]
    pub subscribe_throttling_rate_per_consumer: i32,
    /// Length of the period in seconds (Pulsar's default 30).
    #[serde(default = "thirty_seconds")]
    pub rate_period_in_second: u32,
}

fn unlimited32() -> i32 {
    -1
}

fn thirty_seconds() -> u32 {
    30
}

fn unlimited() -> i64 {
    -1
}

/// A JSON `null` (Java's boxed `Integer`/`Long` unset) means unlimited too.
fn null_is_unlimited<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    Ok(Option::<i64>::deserialize(d)?.unwrap_or(-1))
}

/// Pulsar's `RetentionPolicies`: how long (and how much of) a topic's consumed messages are
/// kept. -1 = no limit in that dimension; both -1 = infinite (the default). A ledger is removed
/// when every durable subscription has consumed it and it is beyond either limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicy {
    /// Minutes (-1 = no time limit).
    pub retention_time_in_minutes: i64,
    /// Megabytes, 2^20 bytes of payload (-1 = no size limit).
    #[serde(rename = "retentionSizeInMB")]
    pub retention_size_in_mb: i64,
}

impl RetentionPolicy {
    /// Keeps everything.
    pub const INFINITE: RetentionPolicy = RetentionPolicy {
        retention_time_in_minutes: -1,
        retention_size_in_mb: -1,
    };

    /// Whether anything can ever be removed.
    pub fn is_infinite(&self) -> bool {
        self.retention_time_in_minutes < 0 && self.retention_size_in_mb < 0
    }
}

/// Why a policies blob could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PoliciesError {
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The stored blob is not understood.
    #[error("{owner}: stored policies are invalid: {reason}")]
    Corrupt {
        /// Namespace (`tenant/namespace`) or topic the policies belong to.
        owner: String,
        /// Why.
        reason: String,
    },
}

impl NamespacePolicies {
    /// The persisted form: version byte, then JSON.
    pub fn encode(&self) -> Vec<u8> {
        crate::versioned::encode(POLICIES_FORMAT_VERSION, self)
    }

    /// Parses the persisted form.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        crate::versioned::decode(POLICIES_FORMAT_VERSION, "namespace policies", bytes)
    }
}

/// The policies in force for one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectivePolicies {
    /// See [`NamespacePolicies::offload_threshold_bytes`].
    pub offload_threshold_bytes: i64,
    /// See [`NamespacePolicies::offload_threshold_seconds`].
    pub offload_threshold_seconds: i64,
    /// See [`NamespacePolicies::offload_deletion_lag_ms`].
    pub offload_deletion_lag: Duration,
    /// Partition granularity for new tables.
    pub lake_partitioning: LakePartitioning,
    /// How topics map to lake tables.
    pub lake_table_layout: LakeTableLayout,
    /// Retention of consumed messages.
    pub retention: RetentionPolicy,
}

/// The rate policies in force for one topic.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicRates {
    /// `publishRate`.
    pub publish: Option<PublishRate>,
    /// `dispatchRate`.
    pub dispatch: Option<DispatchRate>,
    /// `subscriptionDispatchRate`.
    pub subscription_dispatch: Option<DispatchRate>,
    /// `subscribeRate`.
    pub subscribe: Option<SubscribeRate>,
    /// The namespace's resource group.
    pub resource_group: Option<String>,
}

/// Where a retention policy can remove data ([`PolicyStore::finite_retention`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FiniteRetention {
    /// The broker default is finite: every namespace that does not set its own.
    Everywhere,
    /// Only these namespaces (`tenant/namespace`), whose own policy is finite.
    In(Vec<String>),
}

impl FiniteRetention {
    /// Whether retention can remove anything anywhere.
    pub fn anywhere(&self) -> bool {
        match self {
            FiniteRetention::Everywhere => true,
            FiniteRetention::In(namespaces) => !namespaces.is_empty(),
        }
    }

    /// Whether namespace `ns` (`tenant/namespace`) may have a finite retention.
    pub fn may_cover(&self, ns: &str) -> bool {
        match self {
            FiniteRetention::Everywhere => true,
            FiniteRetention::In(namespaces) => namespaces.iter().any(|n| n == ns),
        }
    }
}

/// Cached access to namespace policies.
#[derive(Debug)]
pub struct PolicyStore {
    meta: Arc<dyn MetadataStore>,
    defaults: PolicyDefaults,
    /// Invariant: equal to what the metadata store held for every scope present (the default
    /// for a scope with nothing stored) when it was loaded, after the last change of it this
    /// node made or the store's policies feed reported ([`PolicyStore::forget`]).
    cache: Cached<String, NamespacePolicies>,
    /// Serialises read-modify-write updates.
    update_lock: tokio::sync::Mutex<()>,
}

/// Prefix of a namespace's scope in the store (and key in the cache).
const NAMESPACE_SCOPE: &str = "namespace:";
/// Prefix of a topic's scope in the store (and key in the cache).
const TOPIC_SCOPE: &str = "topic:";

fn scope(namespace: &NamespaceName) -> String {
    format!("{NAMESPACE_SCOPE}{namespace}")
}

/// Cache key and store scope of a topic's own policies: those of its base topic (keys never
/// collide with namespaces, which contain no `://`).
fn topic_scope(topic: &TopicName) -> String {
    format!("{TOPIC_SCOPE}{}", topic.base())
}

impl PolicyStore {
    /// A store over `meta` with the configured defaults.
    pub fn new(meta: Arc<dyn MetadataStore>, defaults: PolicyDefaults) -> Self {
        Self {
            meta,
            defaults,
            cache: Cached::new(),
            update_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// What `namespace` has set.
    pub async fn namespace(
        &self,
        namespace: &NamespaceName,
    ) -> Result<NamespacePolicies, PoliciesError> {
        self.scoped(&scope(namespace), &namespace.to_string()).await
    }

    /// What topic `topic` (its base topic, for a partition) has set for itself.
    pub async fn topic(&self, topic: &TopicName) -> Result<NamespacePolicies, PoliciesError> {
        self.scoped(&topic_scope(topic), &topic.base().to_string())
            .await
    }

    /// Whether broker deduplication is on for `topic` (a partition follows its base topic): the
    /// topic's own setting, else its namespace's, else `default`.
    pub async fn deduplication(
        &self,
        topic: &TopicName,
        default: bool,
    ) -> Result<bool, PoliciesError> {
        if let Some(v) = self.topic(topic).await?.deduplication_enabled {
            return Ok(v);
        }
        Ok(self
            .namespace(&topic.namespace)
            .await?
            .deduplication_enabled
            .unwrap_or(default))
    }

    /// What `topic` set for itself and what its namespace set, read together (the broker
    /// resolves a topic's policies from both).
    pub async fn topic_and_namespace(
        &self,
        topic: &TopicName,
    ) -> Result<(NamespacePolicies, NamespacePolicies), PoliciesError> {
        Ok((
            self.topic(topic).await?,
            self.namespace(&topic.namespace).await?,
        ))
    }

    /// The rates in force for `topic` (each its own, else its namespace's) and the resource
    /// group its namespace is attached to.
    pub async fn rate_limits(&self, topic: &TopicName) -> Result<TopicRates, PoliciesError> {
        let ns = self.namespace(&topic.namespace).await?;
        let own = self.topic(topic).await?;
        Ok(TopicRates {
            publish: own.publish_rate.or(ns.publish_rate),
            dispatch: own.dispatch_rate.or(ns.dispatch_rate),
            subscription_dispatch: own
                .subscription_dispatch_rate
                .or(ns.subscription_dispatch_rate),
            subscribe: own.subscribe_rate.or(ns.subscribe_rate),
            resource_group: ns.resource_group_name,
        })
    }

    /// The backlog quotas and message TTL in force for `topic`: its own, else its
    /// namespace's, quota type by quota type.
    pub async fn backlog_limits(&self, topic: &TopicName) -> Result<BacklogLimits, PoliciesError> {
        let own = self.topic(topic).await?;
        let ns = self.namespace(&topic.namespace).await?;
        Ok(BacklogLimits::resolve(
            &own.backlog_quota_map,
            &ns.backlog_quota_map,
            own.message_ttl_seconds.or(ns.message_ttl_seconds),
        ))
    }

    /// The namespaces attached to resource group `group`.
    pub async fn namespaces_in_group(&self, group: &str) -> Result<Vec<String>, PoliciesError> {
        let prefix = NAMESPACE_SCOPE;
        let mut out = Vec::new();
        for (scope, blob) in self.meta.list_policies(prefix).await? {
            let owner = scope.trim_start_matches(prefix).to_string();
            let p = decode(&blob, &owner)?;
            if p.resource_group_name.as_deref() == Some(group) {
                out.push(owner);
            }
        }
        Ok(out)
    }

    /// Where retention is finite: everywhere when the broker default is (a namespace may still
    /// set its own infinite retention), else in the namespaces that set a finite one of their
    /// own (one listing of the namespaces' policies, never of the topics).
    pub async fn finite_retention(&self) -> Result<FiniteRetention, PoliciesError> {
        let d = &self.defaults;
        let default = RetentionPolicy {
            retention_time_in_minutes: d.retention_time_minutes,
            retention_size_in_mb: d.retention_size_mb,
        };
        if !default.is_infinite() {
            return Ok(FiniteRetention::Everywhere);
        }
        let prefix = NAMESPACE_SCOPE;
        let mut out = Vec::new();
        for (scope, blob) in self.meta.list_policies(prefix).await? {
            let owner = scope.trim_start_matches(prefix).to_string();
            let p = decode(&blob, &owner)?;
            if p.retention.is_some_and(|r| !r.is_infinite()) {
                out.push(owner);
            }
        }
        Ok(FiniteRetention::In(out))
    }

    async fn scoped(&self, key: &str, owner: &str) -> Result<NamespacePolicies, PoliciesError> {
        let seen = match self.cache.get(&key.to_string()) {
            Ok(p) => return Ok(NamespacePolicies::clone(&p)),
            Err(seen) => seen,
        };
        let policies = match self.meta.get_policies(key).await? {
            Some(blob) => decode(&blob, owner)?,
            None => NamespacePolicies::default(),
        };
        let p = self.cache.fill(key.to_string(), policies, seen);
        Ok(NamespacePolicies::clone(&p))
    }

    /// Forgets what is cached of `scope` (a namespace's or a topic's policies), which another
    /// node changed (reported by the metadata store's policies feed); any other scope is
    /// ignored. Returns which topics' policies in force may have changed (`None`: not a scope
    /// of policies).
    pub fn forget(&self, scope: &str) -> Option<Reach> {
        let reach = if let Some(ns) = scope.strip_prefix(NAMESPACE_SCOPE) {
            ns.parse().map_or(Reach::All, Reach::Namespace)
        } else if let Some(topic) = scope.strip_prefix(TOPIC_SCOPE) {
            topic
                .parse::<TopicName>()
                .map_or(Reach::All, |t| Reach::Topic(t.base()))
        } else {
            return None;
        };
        self.cache.invalidate(&scope.to_string());
        Some(reach)
    }

    /// Drops the cached own policies of `topic`'s base topic, which unloaded here: memory for
    /// topics not loaded stays flat however many topics were ever loaded. Its next load reads
    /// them from the store again.
    pub fn evict_topic(&self, topic: &TopicName) {
        self.cache.evict(&topic_scope(topic));
    }

    /// Forgets every cached policy (the feed of changes ended: some may have been missed).
    pub fn forget_all(&self) {
        self.cache.invalidate_all();
    }

    /// The policies in force for `namespace`.
    pub async fn effective(
        &self,
        namespace: &NamespaceName,
    ) -> Result<EffectivePolicies, PoliciesError> {
        let p = self.namespace(namespace).await?;
        let d = &self.defaults;
        Ok(EffectivePolicies {
            offload_threshold_bytes: p
                .offload_threshold_bytes
                .unwrap_or(d.offload_threshold_bytes),
            offload_threshold_seconds: p
                .offload_threshold_seconds
                .unwrap_or(d.offload_threshold_seconds),
            offload_deletion_lag: p
                .offload_deletion_lag_ms
                .map_or(d.offload_deletion_lag, Duration::from_millis),
            lake_partitioning: p.lake_partitioning.unwrap_or(d.lake_partitioning),
            lake_table_layout: p.lake_table_layout.unwrap_or_default(),
            retention: p.retention.unwrap_or(RetentionPolicy {
                retention_time_in_minutes: d.retention_time_minutes,
                retention_size_in_mb: d.retention_size_mb,
            }),
        })
    }

    /// Applies `change` to the namespace's policies and stores the result; returns whether
    /// they changed (an unchanged result is not written).
    pub async fn update(
        &self,
        namespace: &NamespaceName,
        change: impl FnMut(&mut NamespacePolicies),
    ) -> Result<bool, PoliciesError> {
        self.update_scoped(&scope(namespace), &namespace.to_string(), change)
            .await
    }

    /// Applies `change` to a topic's own policies and stores the result; returns whether they
    /// changed (an unchanged result is not written).
    pub async fn update_topic(
        &self,
        topic: &TopicName,
        change: impl FnMut(&mut NamespacePolicies),
    ) -> Result<bool, PoliciesError> {
        self.update_scoped(&topic_scope(topic), &topic.base().to_string(), change)
            .await
    }

    async fn update_scoped(
        &self,
        key: &str,
        owner: &str,
        mut change: impl FnMut(&mut NamespacePolicies),
    ) -> Result<bool, PoliciesError> {
        let _guard = self.update_lock.lock().await;
        let cache_key = key.to_string();
        for _ in 0..UPDATE_ATTEMPTS {
            // The store, not the cache: this node may not have heard of another's write yet.
            let stored = self.meta.get_policies(key).await?;
            let mut p = match &stored {
                Some(blob) => decode(blob, owner)?,
                None => NamespacePolicies::default(),
            };
            change(&mut p);
            let blob = (p != NamespacePolicies::default()).then(|| p.encode());
            if blob == stored {
                // Nothing to write: no other node is told of a change that is none. This
                // node's copy is forgotten all the same (it may be stale).
                self.cache.invalidate(&cache_key);
                return Ok(false);
            }
            // Forgotten before and after: a write that fails after the store changed leaves
            // nothing stale, and neither does a reader that loaded the old value meanwhile.
            self.cache.invalidate(&cache_key);
            let done = self
                .meta
                .replace_policies(key, stored.as_deref(), blob.as_deref())
                .await;
            self.cache.invalidate(&cache_key);
            if done? {
                return Ok(true);
            }
        }
        Err(MetadataError::Conflict(format!(
            "{owner}: its policies kept changing during {UPDATE_ATTEMPTS} attempts to update them"
        ))
        .into())
    }
}

/// Attempts of a read-modify-write update of policies before it gives up; each lost one saw
/// another node's write land between its read and its compare-and-set.
const UPDATE_ATTEMPTS: usize = 16;

/// A stored policies blob of `owner`, parsed.
fn decode(blob: &[u8], owner: &str) -> Result<NamespacePolicies, PoliciesError> {
    NamespacePolicies::decode(blob).map_err(|reason| PoliciesError::Corrupt {
        owner: owner.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::metadata::memory::MemoryMetadataStore;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn policies_round_trip(
            a in proptest::option::of(any::<i64>()),
            b in proptest::option::of(any::<i64>()),
            c in proptest::option::of(any::<u64>()),
            hour in proptest::option::of(any::<bool>()),
            dedup in proptest::option::of(any::<bool>()),
            retention in proptest::option::of((any::<i64>(), any::<i64>())),
            rate in proptest::option::of((any::<i64>(), any::<i64>())),
            group in proptest::option::of(".{0,10}"),
            max_producers in proptest::option::of(any::<u32>()),
            quotas in proptest::collection::btree_map(any::<bool>(), (any::<i64>(), any::<i32>(), 0u8..3), 0..3),
            ttl in proptest::option::of(any::<u32>()),
            limits in proptest::array::uniform5(proptest::option::of(any::<u32>())),
            dispatch in proptest::option::of((any::<i64>(), any::<i64>(), any::<bool>(), any::<u32>())),
            inactive in proptest::option::of((any::<bool>(), any::<i32>(), any::<bool>())),
            shared in proptest::option::of(any::<bool>()),
            persistence in proptest::option::of((1i32..17, 1i32..17, 0u32..1000)),
        ) {
            let p = NamespacePolicies {
                offload_threshold_bytes: a,
                offload_threshold_seconds: b,
                offload_deletion_lag_ms: c,
                lake_partitioning: hour.map(|h| if h { LakePartitioning::Hour } else { LakePartitioning::Day }),
                lake_table_layout: shared.map(|s| if s { LakeTableLayout::Shared } else { LakeTableLayout::PerTopic }),
                persistence: persistence.map(|(e, a, rate)| PersistencePolicies {
                    bookkeeper_ensemble: e,
                    bookkeeper_write_quorum: e,
                    bookkeeper_ack_quorum: a,
                    managed_ledger_max_mark_delete_rate: f64::from(rate) / 8.0,
                }),
                deduplication_enabled: dedup,
                retention: retention.map(|(t, s)| RetentionPolicy {
                    retention_time_in_minutes: t,
                    retention_size_in_mb: s,
                }),
                publish_rate: rate.map(|(m, b)| PublishRate {
                    publish_throttling_rate_in_msg: m,
                    publish_throttling_rate_in_byte: b,
                }),
                resource_group_name: group,
                max_producers,
                backlog_quota_map: quotas
                    .into_iter()
                    .map(|(age, (size, time, policy))| {
                        let kind = if age { BacklogQuotaType::MessageAge } else { BacklogQuotaType::DestinationStorage };
                        let policy = match policy {
                            0 => BacklogPolicy::ProducerRequestHold,
                            1 => BacklogPolicy::ProducerException,
                            _ => BacklogPolicy::ConsumerBacklogEviction,
                        };
                        (kind, BacklogQuota { limit_size: size, limit_time: time, policy })
                    })
                    .collect(),
                message_ttl_seconds: ttl,
                max_consumers: limits[0],
                max_consumers_per_subscription: limits[1],
                max_unacked_per_consumer: limits[2],
                max_unacked_per_subscription: limits[3],
                max_topics: limits[4],
                inactive_topic_policies: inactive.map(|(caught_up, secs, on)| InactiveTopicPolicies {
                    inactive_topic_delete_mode: if caught_up {
                        crate::config::InactiveTopicDeleteMode::SubscriptionsCaughtUp
                    } else {
                        crate::config::InactiveTopicDeleteMode::NoSubscriptions
                    },
                    max_inactive_duration_seconds: secs,
                    delete_while_inactive: on,
                }),
                dispatch_rate: dispatch.map(|(m, b, r, p)| DispatchRate {
                    dispatch_throttling_rate_in_msg: m,
                    dispatch_throttling_rate_in_byte: b,
                    relative_to_publish_rate: r,
                    rate_period_in_second: p,
                }),
                subscription_dispatch_rate: None,
                subscribe_rate: max_producers.map(|m| SubscribeRate {
                    subscribe_throttling_rate_per_consumer: m as i32,
                    rate_period_in_second: m,
                }),
            };
            prop_assert_eq!(NamespacePolicies::decode(&p.encode()), Ok(p));
        }
    }

    #[test]
    fn unknown_version_is_refused() {
        assert!(NamespacePolicies::decode(&[9, b'{', b'}']).is_err());
        assert!(NamespacePolicies::decode(&[]).is_err());
    }

    #[test]
    fn a_forgotten_scope_reaches_only_its_own_topics() {
        let store = PolicyStore::new(
            Arc::new(MemoryMetadataStore::new()),
            PolicyDefaults::default(),
        );
        let topic = |s: &str| s.parse::<TopicName>().expect("valid");
        let part = topic("persistent://t/ns/a-partition-1");
        let ns = store.forget("namespace:t/ns").expect("a namespace scope");
        assert!(ns.covers(&part) && !ns.covers(&topic("persistent://t/other/a")));
        let own = store.forget(&topic_scope(&part)).expect("a topic scope");
        assert_eq!(own, Reach::Topic(topic("persistent://t/ns/a")));
        assert!(own.covers(&part) && !own.covers(&topic("persistent://t/ns/b")));
        assert!(Reach::Tenant("t".into()).covers(&part));
        assert!(!Reach::Tenant("u".into()).covers(&part));
        // A scope naming nothing valid reaches everything; other scopes are not policies.
        assert_eq!(store.forget("namespace:not a name"), Some(Reach::All));
        assert_eq!(store.forget("tenancy/tenant/t"), None);
    }

    #[tokio::test]
    async fn updates_override_defaults_and_persist() -> Result<(), PoliciesError> {
        let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
        let store = PolicyStore::new(meta.clone(), PolicyDefaults::default());
        let ns = NamespaceName::new("public", "default").expect("valid");
        let e = store.effective(&ns).await?;
        assert_eq!(e.offload_threshold_bytes, 0);
        assert_eq!(e.offload_deletion_lag, Duration::from_secs(3600));
        assert!(
            store
                .update(&ns, |p| p.offload_deletion_lag_ms = Some(5))
                .await?
        );
        // The same value again changes nothing and writes nothing.
        let before = meta.get_policies(&scope(&ns)).await?;
        let feed = meta.policy_changes().await?;
        assert!(
            !store
                .update(&ns, |p| p.offload_deletion_lag_ms = Some(5))
                .await?
        );
        assert_eq!(meta.get_policies(&scope(&ns)).await?, before);
        let mut feed = feed.expect("the memory store has a feed");
        assert!(feed.try_next().is_err(), "an unchanged update was written");
        let fresh = PolicyStore::new(meta, PolicyDefaults::default());
        let e = fresh.effective(&ns).await?;
        assert_eq!(e.offload_deletion_lag, Duration::from_millis(5));
        assert_eq!(
            fresh
                .effective(&NamespaceName::new("other", "ns").expect("valid"))
                .await?
                .offload_threshold_bytes,
            0
        );
        Ok(())
    }
}
