//! The operations layer: every use case the admin API (and, later, the CLI and other nodes)
//! runs on the service, in one place. Surfaces parse, authorize, call one operation and map its
//! error; they never reach into the broker, the log, the offload engine or the metadata store
//! themselves.
//!
//! Invariants:
//! - A topic deletion holds off its table's offload for its whole duration, deletes the topic's
//!   partitions through the broker (so no producer or consumer is left attached), then the base
//!   topic's metadata, then the lake table; repeating a deletion finishes one that crashed.
//! - Policy changes that the broker applies live (deduplication, publish rates) are applied
//!   before the operation returns.

use std::sync::Arc;

use serde_json::json;

use crate::broker::{Broker, BrokerError};
use crate::cluster::ownership::OwnershipError;
use crate::lake::LakeError;
use crate::ledger::{LedgerState, Log, MetadataError};
use crate::naming::{NamespaceName, TopicName};
use crate::offload::{OffloadEngine, OffloadError, OffloadStatus};
use crate::policies::{EffectivePolicies, NamespacePolicies, PoliciesError, PolicyStore, Reach};
use crate::tenancy::{Tenancy, TenancyError};
use crate::verify::VerifyError;

mod follow;
mod tenancy;
mod topics;
mod unload;
pub use topics::Target;

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The request is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The object does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The object exists in another form.
    #[error("{0}")]
    Conflict(String),
    /// Clients are attached and the operation was not forced.
    #[error("{0}")]
    Busy(String),
    /// The feature is switched off in this service's configuration.
    #[error("{0}")]
    Disabled(String),
    /// The broker failed.
    #[error(transparent)]
    Broker(BrokerError),
    /// The offload engine or the lake failed.
    #[error(transparent)]
    Offload(#[from] OffloadError),
    /// Policies could not be read or stored.
    #[error(transparent)]
    Policies(#[from] PoliciesError),
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// Tenants, namespaces, clusters or permissions refused the change.
    #[error(transparent)]
    Tenancy(#[from] TenancyError),
    /// The service does not allow this (forced deletion of tenants and namespaces).
    #[error("{0}")]
    NotAllowed(String),
    /// The service does not implement this in its configuration (granting permissions while
    /// authorization is off).
    #[error("{0}")]
    NotImplemented(String),
    /// The topic was unloaded or is stopping meanwhile: retry.
    #[error("{0}")]
    Unavailable(String),
    /// Another node serves the topic: ask it (`base` is its web service URL).
    #[error("{why}")]
    Redirect {
        /// The owner's `http://host:port`.
        base: String,
        /// The owner's `https://host:port`, when it serves HTTPS.
        base_tls: Option<String>,
        /// The topic (partition) it serves.
        topic: String,
        /// Why (the owner named).
        why: String,
    },
    /// A namespace limit would be exceeded (`maxTopicsPerNamespace`).
    #[error("{0}")]
    LimitReached(String),
    /// Anything else (deleting a topic's log, encoding stats).
    #[error("{0}")]
    Internal(String),
}

impl From<BrokerError> for OpsError {
    fn from(e: BrokerError) -> Self {
        match e {
            BrokerError::TopicBusy(m) => {
                OpsError::Busy(format!("{m} (force=true closes them first)"))
            }
            BrokerError::InvalidTopic(t) => OpsError::Invalid(t.to_string()),
            BrokerError::Metadata(m) => OpsError::Metadata(m),
            BrokerError::TooManyTopics(m) => OpsError::LimitReached(m),
            BrokerError::TopicNotFound(m)
            | BrokerError::NamespaceNotFound(m)
            | BrokerError::SubscriptionNotFound(m) => OpsError::NotFound(m),
            BrokerError::SubscriptionExists(m) | BrokerError::ConsumerBusy(m) => {
                OpsError::Conflict(m)
            }
            BrokerError::Stopped(m) => OpsError::Unavailable(m),
            BrokerError::Ownership(OwnershipError::OwnedElsewhere { topic, owner }) => {
                OpsError::Redirect {
                    why: format!("topic {topic} is served by {}", owner.id),
                    base: owner.web_service_url,
                    base_tls: owner.web_service_url_tls,
                    topic,
                }
            }
            BrokerError::Ownership(OwnershipError::HandedOver { topic, to }) => {
                OpsError::Redirect {
                    why: format!("topic {topic} is being moved to {}", to.id),
                    base: to.web_service_url,
                    base_tls: to.web_service_url_tls,
                    topic,
                }
            }
            BrokerError::Ownership(o @ OwnershipError::UnknownNode(_)) => {
                OpsError::Invalid(o.to_string())
            }
            BrokerError::Ownership(o) => OpsError::Unavailable(o.to_string()),
            other => OpsError::Broker(other),
        }
    }
}

impl From<VerifyError> for OpsError {
    fn from(e: VerifyError) -> Self {
        match e {
            VerifyError::NotFound(t) => OpsError::NotFound(format!("Topic {t} not found")),
            VerifyError::Metadata(m) => OpsError::Metadata(m),
            VerifyError::Lake(LakeError::Stopped) => {
                OpsError::Unavailable("the lake is stopping".into())
            }
            other => OpsError::Internal(other.to_string()),
        }
    }
}

/// The running service as the operations see it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Operations {
    log: Arc<Log>,
    broker: Arc<Broker>,
    /// `None` when `lake.enabled = false`.
    offload: Option<OffloadEngine>,
    policies: Arc<PolicyStore>,
    /// Tenants, namespaces, clusters, permissions.
    tenancy: Arc<Tenancy>,
    /// Whether permissions apply (authentication is on); granting is refused otherwise.
    authorization: bool,
    /// `None` when `sql.enabled = false`.
    sql: Option<crate::sql::SqlEngine>,
    /// This node's registration and the view of the cluster's nodes.
    membership: Arc<crate::cluster::membership::Membership>,
    /// `None` on a node without a bookie listener (not part of a cluster).
    autorecovery: Option<Arc<crate::bookie::autorecovery::AutoRecovery>>,
}

impl Operations {
    /// Operations over the service's parts.
    pub fn new(
        log: Arc<Log>,
        broker: Arc<Broker>,
        offload: Option<OffloadEngine>,
        (policies, tenancy, authorization): (Arc<PolicyStore>, Arc<Tenancy>, bool),
        sql: Option<crate::sql::SqlEngine>,
        (membership, autorecovery): (
            Arc<crate::cluster::membership::Membership>,
            Option<Arc<crate::bookie::autorecovery::AutoRecovery>>,
        ),
    ) -> Self {
        Operations {
            log,
            broker,
            offload,
            policies,
            tenancy,
            authorization,
            sql,
            membership,
            autorecovery,
        }
    }

    /// What autorecovery found at its last audit and what it copied here.
    pub fn autorecovery_status(
        &self,
    ) -> Result<crate::bookie::autorecovery::AutoRecoveryStatus, OpsError> {
        self.autorecovery
            .as_ref()
            .map(|a| a.status())
            .ok_or_else(|| {
                OpsError::NotFound(
                    "autorecovery runs only on nodes of a cluster (started with --bookie-addr)"
                        .into(),
                )
            })
    }

    /// Why the service cannot serve its purpose any more and must be restarted (the journal
    /// failed), if it cannot.
    pub fn fatal_failure(&self) -> Option<String> {
        self.log
            .journal_failure()
            .map(|e| format!("the journal failed: {e}"))
    }

    /// The SQL engine, or why there is none.
    pub fn sql(&self) -> Result<&crate::sql::SqlEngine, OpsError> {
        self.sql.as_ref().ok_or_else(|| {
            OpsError::Disabled("SQL is disabled in this service (sql.enabled = false)".into())
        })
    }

    fn offload(&self) -> Result<&OffloadEngine, OpsError> {
        self.offload.as_ref().ok_or_else(|| {
            OpsError::Disabled("the lake is disabled in this service (lake.enabled = false)".into())
        })
    }

    // ---- topics -------------------------------------------------------------------------

    /// Partitions of `name` (0: not a partitioned topic).
    pub async fn partitions(&self, name: &TopicName) -> Result<u32, OpsError> {
        Ok(self.broker.partitions(name).await?)
    }

    /// Creates the partitioned topic `name` with `n` partitions, or (`grow`) raises its count.
    pub async fn set_partitions(
        &self,
        name: &TopicName,
        n: u32,
        grow: bool,
    ) -> Result<(), OpsError> {
        if name.partition().is_some() {
            return Err(OpsError::Invalid(format!(
                "{name} names a partition, not a topic"
            )));
        }
        if n == 0 {
            return Err(OpsError::Invalid(
                "a partitioned topic has at least 1 partition".into(),
            ));
        }
        self.existing_namespace(&name.namespace).await?;
        if !grow && self.log.topic_exists(&name.to_string()).await? {
            // Pulsar's answer too: a non-partitioned topic of that name exists.
            return Err(OpsError::Conflict(format!(
                "This topic already exists: {name} is a non-partitioned topic"
            )));
        }
        let adding = n.saturating_sub(self.partitions(name).await?);
        self.broker
            .check_topic_quota(&name.namespace, adding)
            .await?;
        self.log
            .metadata()
            .set_partitions(&name.to_string(), n, grow)
            .await
            .map_err(|e| match e {
                MetadataError::Conflict(m) => OpsError::Conflict(m),
                other => OpsError::Metadata(other),
            })?;
        self.broker.partitions_changed(name, n);
        Ok(())
    }

    /// Deletes the non-partitioned topic `name`; refused while clients are attached unless
    /// `force`. A name ending in `-partition-N` is such a topic when no partitioned topic
    /// declares it (a client made it); a declared partition goes only with its partitioned
    /// topic.
    pub async fn delete_topic(&self, name: &TopicName, force: bool) -> Result<(), OpsError> {
        if let Some(i) = name.partition() {
            if self.partitions(&name.base()).await? > 0 {
                // Deleting one partition would take the partitioned topic's metadata and its
                // lake table with it.
                return Err(OpsError::Conflict(format!(
                    "{name} is partition {i} of {}: delete the partitioned topic through \
                     .../partitions",
                    name.base()
                )));
            }
            // Its lake table is the base name's: alone in it, it goes with the table; beside
            // other topics of that name, their rows would be at stake.
            let others: Vec<String> = (self.log.partition_names(&name.base()).await)
                .map_err(OpsError::Metadata)?
                .into_iter()
                .map(|(_, n)| n)
                .filter(|n| *n != name.to_string())
                .collect();
            if !others.is_empty() {
                return Err(OpsError::Conflict(format!(
                    "{name} shares the lake table of {} with {}: delete those first",
                    name.base(),
                    others.join(", ")
                )));
            }
        }
        if self.partitions(name).await? > 0 {
            return Err(OpsError::Conflict(format!(
                "{name} is a partitioned topic: delete it through .../partitions"
            )));
        }
        self.delete_all(&name.base(), vec![name.clone()], false, force)
            .await
    }

    /// Deletes the partitioned topic `name` and every partition.
    pub async fn delete_partitioned_topic(
        &self,
        name: &TopicName,
        force: bool,
    ) -> Result<(), OpsError> {
        let partitions = self.partitions(name).await?;
        if partitions == 0 {
            return Err(OpsError::NotFound(format!(
                "Partitioned topic {name} not found"
            )));
        }
        let names = (0..partitions).map(|i| name.partition_name(i)).collect();
        self.delete_all(name, names, true, force).await
    }

    /// Deletes the topics `names` of the table of `base`, then (when `partitioned`: they are
    /// its partitions) `base`'s own metadata (partition count, schemas), and its lake table,
    /// with offload of that table held off throughout.
    async fn delete_all(
        &self,
        base: &TopicName,
        names: Vec<TopicName>,
        partitioned: bool,
        force: bool,
    ) -> Result<(), OpsError> {
        // The table paused and the bound read before anything is deleted: every ledger the
        // topics had so far is at or below it (also those of partitions deleted by an earlier,
        // interrupted deletion on their owners), and the lake removes rows of those ledgers
        // only. A topic of the same name created later (a client may re-create a deleted
        // partition on another node while the next ones are being deleted) gets higher ids
        // and keeps its rows. A ledger made for these topics after this read is above it and
        // never reaches the lake from this node (its offload of the table is paused); one
        // another node made and offloaded in between stays in the table (left behind, never
        // another topic's rows removed). The removal is recorded first too: a crash (or a
        // failed removal) after the log is gone leaves the record, and the engine removes the
        // lake data later.
        let deletion = match &self.offload {
            Some(o) => Some(o.begin_deletion(base).await?),
            None => None,
        };
        let mut existed = false;
        for (i, name) in names.iter().enumerate() {
            match self.broker.delete_topic(name, force).await {
                Ok(e) => existed |= e,
                Err(e) => {
                    // Refused with the first topic still in place (clients attached, owned
                    // elsewhere; a forced deletion may have closed clients or local copies, but
                    // the topic and its lake data stay): nothing to remove later. Otherwise
                    // the record stays (the engine waits until no topic of the name is left).
                    let untouched = i == 0
                        && self
                            .log
                            .topic_exists(&name.to_string())
                            .await
                            .unwrap_or(false);
                    if untouched {
                        if let (Some(o), Some(d)) = (&self.offload, deletion) {
                            o.deletion_refused(d).await;
                        }
                    }
                    return Err(e.into());
                }
            }
        }
        crate::failpoint::pause("ops.after_topics_deleted", &base.to_string()).await;
        // A non-partitioned topic's records went with it, above, under its slot. That slot is
        // free again, and a client that reconnected at once (a forced deletion closes them)
        // may have made the topic anew: deleting the name again would take the new topic.
        if partitioned {
            existed |= self.delete_partitioned_records(base, &names).await?;
        }
        crate::failpoint::hit("ops.before_lake_removal");
        // Also when the log part was gone already: a crash between the log deletion and the
        // table drop is finished by repeating the deletion, or by the engine on its own.
        let last_ledger = deletion.as_ref().map(|d| d.last_ledger());
        let dropped = match (&self.offload, deletion) {
            (Some(o), Some(d)) => o.finish_deletion(base, d).await?,
            _ => false,
        };
        if !existed && !dropped {
            let what = match names.as_slice() {
                [one] if !partitioned => one,
                _ => base,
            };
            return Err(OpsError::NotFound(format!("Topic {what} not found")));
        }
        tracing::info!(topic = %base, partitions = names.len(), last_ledger, "topic deleted");
        Ok(())
    }

    /// Deletes partitioned topic `base`'s own records (partition count, schemas) once its
    /// partitions `names` are gone; whether it had any. Kept when a partition was made anew
    /// meanwhile on any node (its clients reconnect at once after a forced deletion): the
    /// partitioned topic then stays whole, with the new partitions, and a repeated DELETE
    /// deletes it. A window is left: a partition whose load had checked the count before this
    /// check and records its topic after it, or one made between this check and the
    /// deletion, is left without its partitioned topic (served, but deleted only by making
    /// the partitioned topic again). A partition a client makes once the count is gone is a
    /// topic of its own, as any name ending in `-partition-N` without a partitioned topic.
    async fn delete_partitioned_records(
        &self,
        base: &TopicName,
        names: &[TopicName],
    ) -> Result<bool, OpsError> {
        for name in names {
            if self.log.topic_exists(&name.to_string()).await? {
                tracing::warn!(topic = %base, partition = %name,
                    "a partition was made anew during the deletion: the partitioned topic stays");
                return Ok(false);
            }
        }
        self.log
            .delete_topic(&base.to_string())
            .await
            .map_err(|e| OpsError::Internal(format!("deleting {base}: {e}")))
    }

    /// Deletes the topics the broker finds inactive
    /// ([`crate::broker::Broker::take_inactive_topics`]) until
    /// the broker is gone. A topic a client attached to meanwhile is refused and kept.
    pub async fn delete_inactive_topics(
        &self,
        mut found: tokio::sync::mpsc::UnboundedReceiver<TopicName>,
    ) {
        while let Some(name) = found.recv().await {
            match self.delete_topic(&name, false).await {
                Ok(()) => tracing::info!(topic = %name, "deleted an inactive topic"),
                Err(OpsError::NotFound(_)) => {}
                Err(e) => tracing::info!(topic = %name, error = %e,
                    "an inactive topic was not deleted"),
            }
        }
    }

    /// Asks for everything written to `name` so far to be offloaded; returns the ticket.
    pub async fn request_offload(&self, name: &TopicName) -> Result<u64, OpsError> {
        Ok(self.offload()?.request(name).await?)
    }

    /// The offload status of `name`.
    pub async fn offload_status(&self, name: &TopicName) -> Result<OffloadStatus, OpsError> {
        Ok(self.offload()?.status(name).await?)
    }

    /// Verifies `name` (every partition of its topic): every id of the log and of the lake
    /// read and checked against each other and the records (see [`crate::verify`]), with
    /// payload checksums when `deep`. The table's offload is held off meanwhile.
    pub async fn verify(
        &self,
        name: &TopicName,
        deep: bool,
    ) -> Result<crate::verify::TopicReport, OpsError> {
        let _paused = match &self.offload {
            Some(e) => Some(e.pause_table(name).await?),
            None => None,
        };
        let lake = self.offload.as_ref().map(OffloadEngine::lake_handle);
        Ok(crate::verify::verify_topic(&self.log, lake.as_ref(), name, deep).await?)
    }

    /// Stats of `name` (a topic, a partitioned topic or one partition): storage, ledgers with
    /// their tier, the lake table, loaded subscriptions, connected producers (`publishers`) and
    /// the broker's replay counters.
    pub async fn topic_stats(&self, name: &TopicName) -> Result<serde_json::Value, OpsError> {
        if self.partitions(name).await? == 0 {
            self.broker.check_served_here(name).await?;
        }
        let mut ledgers = Vec::new();
        let mut storage = 0u64;
        let mut entries = 0u64;
        let wanted_partition = name.partition().map(|p| p as i32);
        let mut subscriptions = serde_json::Map::new();
        let mut publishers = Vec::new();
        let mut rate_limited = 0u64;
        // Per partition, the slowest durable subscription's backlog (Pulsar's `backlogSize`).
        let mut backlog_size = 0u64;
        let mut traffic = Traffic::default();
        let mut partitions = serde_json::Map::new();
        for (partition, log) in self.log.partitions_of(&name.base()).await? {
            if wanted_partition.is_some_and(|w| w != partition) {
                continue;
            }
            // As Pulsar does, stats load a topic that is not loaded (unloaded when idle), so
            // that its subscriptions are shown; one owned by another node is not taken.
            if self.broker.topic_row(log.name()).await.is_none() {
                if let Ok(partition_name) = log.name().parse::<TopicName>() {
                    if self.broker.check_served_here(&partition_name).await.is_ok() {
                        if let Err(e) = self.broker.topic(&partition_name).await {
                            tracing::debug!(topic = %log.name(), error = %e,
                                "loading for stats failed");
                        }
                    }
                }
            }
            rate_limited += self.broker.publish_throttled(log.name()).await;
            let row = self.broker.topic_row(log.name()).await;
            if let Some(r) = &row {
                traffic.add(r);
                if partition >= 0 {
                    partitions.insert(log.name().to_string(), partition_json(r));
                }
            }
            for p in self.broker.publisher_stats(log.name()).await {
                publishers.push(to_json(&p)?);
            }
            let subs = self.broker.subscription_stats(log.name()).await;
            backlog_size += subs
                .iter()
                .filter(|(_, s)| s.is_durable)
                .map(|(_, s)| s.backlog_size)
                .max()
                .unwrap_or(0);
            for (sub, s) in subs {
                let mut json = to_json(&s)?;
                if let Some(measured) = row
                    .as_ref()
                    .and_then(|r| r.subscriptions_rows.iter().find(|m| m.name == sub))
                {
                    add_subscription_rates(&mut json, measured);
                }
                let key = if partition >= 0 && wanted_partition.is_none() {
                    format!("{sub} (partition {partition})")
                } else {
                    sub
                };
                subscriptions.insert(key, json);
            }
            for l in log.ledgers() {
                if matches!(
                    l.state,
                    LedgerState::Open | LedgerState::Sealed | LedgerState::Offloaded
                ) {
                    storage += l.size_bytes;
                }
                entries += l.entry_count;
                ledgers.push(json!({ "topic": log.name(), "ledger": l }));
            }
        }
        if ledgers.is_empty()
            && self.partitions(name).await? == 0
            && !self.log.topic_exists(&name.to_string()).await?
        {
            return Err(OpsError::NotFound(format!("Topic {name} not found")));
        }
        let lake = match &self.offload {
            Some(e) => match e.lake_stats(name).await {
                Ok(s) => to_json(&s)?,
                // A partitioned topic none of whose partitions was used yet.
                Err(OffloadError::TopicNotFound(_)) => serde_json::Value::Null,
                Err(other) => return Err(other.into()),
            },
            None => serde_json::Value::Null,
        };
        let quotas = self.policies.backlog_limits(name).await?;
        let mut stats = json!({
            "storageSize": storage,
            "backlogSize": backlog_size,
            "backlogQuotaLimitSize": quotas.storage.map_or(-1, |q| q.limit_size),
            "backlogQuotaLimitTime": quotas.age.map_or(-1, |q| i64::from(q.limit_time)),
            "entries": entries,
            "ledgers": ledgers,
            "lake": lake,
            "publishers": publishers,
            "subscriptions": subscriptions,
            "publishRateLimitedTimes": rate_limited,
            "replay": self.broker.replay_stats(),
        });
        traffic.write(&mut stats, partitions);
        Ok(stats)
    }

    /// The Prometheus text of one scrape: node families and every loaded topic's Pulsar
    /// families. Encoding runs on a blocking thread (10,000 topics are megabytes of text).
    pub async fn metrics_text(&self) -> Result<String, OpsError> {
        let families = self.broker.metric_families().ok_or_else(|| {
            OpsError::Disabled("metrics are disabled (metrics.enabled = false)".into())
        })?;
        let dir = self.log.dir().to_path_buf();
        tokio::task::spawn_blocking(move || {
            let data_dir = match rustix::fs::statvfs(&dir) {
                Ok(s) => Some(crate::metrics::node::DataDir {
                    available_bytes: s.f_bavail.saturating_mul(s.f_frsize),
                    size_bytes: s.f_blocks.saturating_mul(s.f_frsize),
                }),
                Err(e) => {
                    tracing::debug!(dir = %dir.display(), error = %e, "statvfs failed");
                    None
                }
            };
            crate::metrics::encode(families, data_dir)
        })
        .await
        .map_err(|e| OpsError::Internal(format!("encoding metrics failed: {e}")))?
        .map_err(|e| OpsError::Internal(format!("encoding metrics failed: {e}")))
    }

    // ---- policies -----------------------------------------------------------------------

    /// What `namespace` has set.
    pub async fn namespace_policies(
        &self,
        namespace: &NamespaceName,
    ) -> Result<NamespacePolicies, OpsError> {
        self.existing_namespace(namespace).await?;
        Ok(self.policies.namespace(namespace).await?)
    }

    /// What topic `topic` (its base topic) has set for itself.
    pub async fn topic_policies(&self, topic: &TopicName) -> Result<NamespacePolicies, OpsError> {
        self.existing_namespace(&topic.namespace).await?;
        Ok(self.policies.topic(topic).await?)
    }

    /// The policies in force for `namespace` (set values, else the configured defaults).
    pub async fn effective_policies(
        &self,
        namespace: &NamespaceName,
    ) -> Result<EffectivePolicies, OpsError> {
        self.existing_namespace(namespace).await?;
        Ok(self.policies.effective(namespace).await?)
    }

    /// Changes `namespace`'s policies; the broker applies deduplication changes at once.
    pub async fn update_namespace_policies(
        &self,
        namespace: &NamespaceName,
        change: impl FnMut(&mut NamespacePolicies),
    ) -> Result<(), OpsError> {
        self.existing_namespace(namespace).await?;
        // Applied here also when nothing changed in the store: a stale cache of this node
        // (its feed of other nodes' changes down) is put right by repeating the change.
        self.policies.update(namespace, change).await?;
        self.broker
            .apply_policies(&[Reach::Namespace(namespace.clone())])
            .await;
        Ok(())
    }

    /// Sets how `namespace`'s topics map to lake tables. Refused (conflict) while the
    /// namespace has topics and the layout would change: no topic ever has rows in both.
    pub async fn set_lake_table_layout(
        &self,
        namespace: &NamespaceName,
        layout: crate::config::LakeTableLayout,
    ) -> Result<(), OpsError> {
        self.existing_namespace(namespace).await?;
        let current = self.policies.effective(namespace).await?.lake_table_layout;
        if current != layout {
            let (topics, partitioned) = (
                self.topics(namespace).await?,
                self.partitioned_topics(namespace).await?,
            );
            if !topics.is_empty() || !partitioned.is_empty() {
                return Err(OpsError::Conflict(format!(
                    "namespace {namespace} has topics: its lake table layout ({}) can only change while it has none",
                    current.as_str()
                )));
            }
        }
        self.policies
            .update(namespace, |p| p.lake_table_layout = Some(layout))
            .await?;
        Ok(())
    }

    /// Changes `topic`'s own policies; the broker applies deduplication changes at once.
    pub async fn update_topic_policies(
        &self,
        topic: &TopicName,
        change: impl FnMut(&mut NamespacePolicies),
    ) -> Result<(), OpsError> {
        self.existing_namespace(&topic.namespace).await?;
        self.policies.update_topic(topic, change).await?;
        self.broker
            .apply_policies(&[Reach::Topic(topic.base())])
            .await;
        Ok(())
    }

    /// Whether deduplication is on for `topic` (its own setting, its namespace's, the broker's).
    pub async fn deduplication(&self, topic: &TopicName) -> Result<bool, OpsError> {
        Ok(self
            .policies
            .deduplication(topic, self.broker.dedup_default())
            .await?)
    }

    /// The namespace's deduplication setting, or the broker's when unset.
    pub async fn namespace_deduplication(
        &self,
        namespace: &NamespaceName,
    ) -> Result<bool, OpsError> {
        self.existing_namespace(namespace).await?;
        Ok(self
            .policies
            .namespace(namespace)
            .await?
            .deduplication_enabled
            .unwrap_or(self.broker.dedup_default()))
    }
}

/// Rates and counters of the loaded partitions of a topic, summed (Pulsar's stats fields).
#[derive(Debug, Default)]
struct Traffic(crate::metrics::pulsar::TopicRow);

impl Traffic {
    fn add(&mut self, r: &crate::metrics::pulsar::TopicRow) {
        self.0.add(r);
    }

    /// Writes the fields into `stats`, with the per-partition shares and hot flags.
    fn write(
        &self,
        stats: &mut serde_json::Value,
        partitions: serde_json::Map<String, serde_json::Value>,
    ) {
        let t = &self.0;
        let average = if t.in_messages > 0 {
            t.in_bytes as f64 / t.in_messages as f64
        } else {
            0.0
        };
        let fields = json!({
            "msgRateIn": t.rate_in,
            "msgThroughputIn": t.throughput_in,
            "msgRateOut": t.rate_out,
            "msgThroughputOut": t.throughput_out,
            "msgInCounter": t.in_messages,
            "bytesInCounter": t.in_bytes,
            "msgOutCounter": t.out_messages,
            "bytesOutCounter": t.out_bytes,
            "averageMsgSize": average,
            "offloadedStorageSize": t.offloaded_size,
            "offloadLagBytes": t.offload_lag_bytes,
            "offloadLagSeconds": t.offload_lag_seconds,
            "producerCount": t.producers,
            "hotPartitions": partitions
                .iter()
                .filter(|(_, p)| p["hot"] == json!(true))
                .map(|(n, _)| n.clone())
                .collect::<Vec<_>>(),
            "partitionShares": partitions,
        });
        if let (Some(out), serde_json::Value::Object(add)) = (stats.as_object_mut(), fields) {
            out.extend(add);
        }
    }
}

/// One partition's traffic and hot flag in topic stats.
fn partition_json(r: &crate::metrics::pulsar::TopicRow) -> serde_json::Value {
    json!({
        "msgRateIn": r.rate_in,
        "msgThroughputIn": r.throughput_in,
        "msgInCounter": r.in_messages,
        "inRateShare": r.in_rate_share,
        "hot": r.hot,
    })
}

/// Adds a subscription's measured rates and lag flag to its stats.
fn add_subscription_rates(
    json: &mut serde_json::Value,
    m: &crate::metrics::pulsar::SubscriptionRow,
) {
    if let Some(o) = json.as_object_mut() {
        o.insert("msgRateOut".into(), json!(m.rate_out));
        o.insert("msgThroughputOut".into(), json!(m.throughput_out));
        o.insert("messageAckRate".into(), json!(m.ack_rate));
        o.insert("msgRateExpired".into(), json!(m.rate_expired));
        o.insert("lagGrowing".into(), json!(m.lag_growing));
        o.insert("hotConsumers".into(), json!(m.hot_consumers));
    }
}

fn to_json(v: &impl serde::Serialize) -> Result<serde_json::Value, OpsError> {
    serde_json::to_value(v).map_err(|e| OpsError::Internal(format!("encoding stats: {e}")))
}
