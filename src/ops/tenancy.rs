//! Use cases over tenants, namespaces, clusters and permissions (Pulsar's `/admin/v2/tenants`,
//! `/clusters`, `/namespaces` and `…/permissions`), with Pulsar's rules: a namespace is deleted
//! only without topics, forced deletion is not allowed, granting needs authorization on.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;

use super::{Operations, OpsError};
use crate::naming::{NamespaceName, TopicName};
use crate::policies::{NamespacePolicies, Reach, RetentionPolicy};
use crate::tenancy::{
    AuthAction, ClusterData, Grants, NamespaceRecord, ResourceGroup, SubscriptionAuthMode,
    TenancyError, TenantInfo,
};

/// What `PUT /namespaces/{t}/{ns}` may carry besides the record: the policies ledgerlake
/// applies from a Pulsar `Policies` body (other fields of that body are ignored).
#[derive(Debug, Default, Deserialize)]
struct CreationPolicies {
    #[serde(default)]
    retention_policies: Option<RetentionPolicy>,
    #[serde(default, rename = "deduplicationEnabled")]
    deduplication_enabled: Option<bool>,
}

impl Operations {
    fn permissions_enabled(&self) -> Result<(), OpsError> {
        if self.authorization {
            Ok(())
        } else {
            Err(OpsError::NotImplemented(
                "Authorization is not enabled (turn authentication on)".into(),
            ))
        }
    }

    // ---- clusters ----

    /// Every cluster's name.
    pub async fn clusters(&self) -> Result<Vec<String>, OpsError> {
        Ok(self.tenancy.clusters().await?)
    }

    /// Cluster `name`.
    pub async fn cluster(&self, name: &str) -> Result<ClusterData, OpsError> {
        self.tenancy
            .cluster(name)
            .await?
            .ok_or_else(|| OpsError::NotFound("Cluster does not exist".into()))
    }

    /// The live nodes of cluster `name` (this node's cluster), by id: their advertised HTTP
    /// `host:port`, as Pulsar's `/admin/v2/brokers/{cluster}` answers.
    pub async fn brokers(&self, name: &str) -> Result<Vec<String>, OpsError> {
        if name != self.tenancy.local_cluster() {
            return Err(OpsError::NotFound(format!(
                "Cluster {name} is not this node's cluster ({})",
                self.tenancy.local_cluster()
            )));
        }
        let nodes = self
            .membership
            .nodes()
            .await
            .map_err(|e| OpsError::Unavailable(e.to_string()))?;
        Ok(nodes.into_iter().map(|n| n.id).collect())
    }

    /// Adds cluster `name`.
    pub async fn create_cluster(&self, name: &str, data: &ClusterData) -> Result<(), OpsError> {
        Ok(self.tenancy.create_cluster(name, data).await?)
    }

    /// Replaces cluster `name`'s URLs.
    pub async fn update_cluster(&self, name: &str, data: &ClusterData) -> Result<(), OpsError> {
        Ok(self.tenancy.update_cluster(name, data).await?)
    }

    /// Removes cluster `name`.
    pub async fn delete_cluster(&self, name: &str) -> Result<(), OpsError> {
        Ok(self.tenancy.delete_cluster(name).await?)
    }

    // ---- resource groups ----

    /// Every resource group's name.
    pub async fn resource_groups(&self) -> Result<Vec<String>, OpsError> {
        Ok(self.tenancy.resource_groups().await?)
    }

    /// Resource group `name`.
    pub async fn resource_group(&self, name: &str) -> Result<ResourceGroup, OpsError> {
        self.tenancy
            .resource_group(name)
            .await?
            .ok_or_else(|| OpsError::NotFound("ResourceGroup does not exist".into()))
    }

    /// Creates or replaces resource group `name`; topics attached to it follow at once.
    pub async fn put_resource_group(
        &self,
        name: &str,
        group: &ResourceGroup,
    ) -> Result<(), OpsError> {
        self.tenancy.put_resource_group(name, group).await?;
        self.broker.apply_policies(&[Reach::All]).await;
        Ok(())
    }

    /// Removes resource group `name`, which no namespace may use.
    pub async fn delete_resource_group(&self, name: &str) -> Result<(), OpsError> {
        let mut users = self.policies.namespaces_in_group(name).await?;
        users.extend(self.tenancy.tenants_in_group(name).await?);
        if !users.is_empty() {
            return Err(OpsError::Tenancy(TenancyError::Invalid(format!(
                "ResourceGroup {name} is in use by {}",
                users.join(", ")
            ))));
        }
        Ok(self.tenancy.delete_resource_group(name).await?)
    }

    /// Attaches namespace `ns` to resource group `group` (`None`: detaches it).
    pub async fn set_namespace_resource_group(
        &self,
        ns: &NamespaceName,
        group: Option<&str>,
    ) -> Result<(), OpsError> {
        if let Some(g) = group {
            self.resource_group(g).await?;
        }
        let group = group.map(str::to_string);
        self.update_namespace_policies(ns, |p| p.resource_group_name = group.clone())
            .await
    }

    /// Tenant `tenant`'s resource group.
    pub async fn tenant_resource_group(&self, tenant: &str) -> Result<Option<String>, OpsError> {
        if self.tenancy.tenant(tenant).await?.is_none() {
            return Err(OpsError::NotFound("Tenant does not exist".into()));
        }
        Ok(self.tenancy.tenant_resource_group(tenant).await?)
    }

    /// Attaches tenant `tenant` (every namespace without a group of its own, now and later) to
    /// resource group `group` (`None`: detaches it); topics follow at once.
    pub async fn set_tenant_resource_group(
        &self,
        tenant: &str,
        group: Option<&str>,
    ) -> Result<(), OpsError> {
        self.tenancy
            .set_tenant_resource_group(tenant, group)
            .await?;
        self.broker
            .apply_policies(&[Reach::Tenant(tenant.to_string())])
            .await;
        Ok(())
    }

    // ---- tenants ----

    /// Every tenant's name.
    pub async fn tenants(&self) -> Result<Vec<String>, OpsError> {
        Ok(self.tenancy.tenants().await?)
    }

    /// Tenant `name`'s admins and clusters.
    pub async fn tenant(&self, name: &str) -> Result<TenantInfo, OpsError> {
        self.tenancy
            .tenant(name)
            .await?
            .map(|t| TenantInfo::clone(&t))
            .ok_or_else(|| OpsError::NotFound("Tenant does not exist".into()))
    }

    /// Creates tenant `name`.
    pub async fn create_tenant(&self, name: &str, info: TenantInfo) -> Result<(), OpsError> {
        self.tenancy.create_tenant(name, info).await?;
        tracing::info!(tenant = name, "tenant created");
        Ok(())
    }

    /// Replaces tenant `name`'s admins and clusters.
    pub async fn update_tenant(&self, name: &str, info: TenantInfo) -> Result<(), OpsError> {
        Ok(self.tenancy.update_tenant(name, info).await?)
    }

    /// Deletes tenant `name`, which must hold no namespace (forced deletion is not allowed).
    pub async fn delete_tenant(&self, name: &str, force: bool) -> Result<(), OpsError> {
        if force {
            return Err(OpsError::NotAllowed(
                "Broker doesn't allow forced deletion of tenants".into(),
            ));
        }
        self.tenancy.delete_tenant(name).await?;
        tracing::info!(tenant = name, "tenant deleted");
        Ok(())
    }

    // ---- namespaces ----

    /// The namespaces of `tenant` (`"t/ns"`).
    pub async fn namespaces(&self, tenant: &str) -> Result<Vec<String>, OpsError> {
        Ok(self
            .tenancy
            .namespaces(tenant)
            .await?
            .iter()
            .map(ToString::to_string)
            .collect())
    }

    /// Namespace `ns`'s record, or 404.
    pub(crate) async fn existing_namespace(
        &self,
        ns: &NamespaceName,
    ) -> Result<Arc<NamespaceRecord>, OpsError> {
        self.tenancy
            .namespace(ns)
            .await?
            .ok_or_else(|| OpsError::NotFound("Namespace does not exist".into()))
    }

    /// Creates namespace `ns`, from a Pulsar `Policies` body when one is given (its auth
    /// policies, clusters, subscription mode, retention and deduplication).
    pub async fn create_namespace(
        &self,
        ns: &NamespaceName,
        body: Option<&str>,
    ) -> Result<(), OpsError> {
        let (record, extra) = match body.map(str::trim).filter(|b| !b.is_empty()) {
            None => (NamespaceRecord::default(), CreationPolicies::default()),
            Some(b) => (
                serde_json::from_str(b).map_err(|e| OpsError::Invalid(format!("policies: {e}")))?,
                serde_json::from_str(b).map_err(|e| OpsError::Invalid(format!("policies: {e}")))?,
            ),
        };
        self.tenancy.create_namespace(ns, record).await?;
        if extra.retention_policies.is_some() || extra.deduplication_enabled.is_some() {
            self.policies
                .update(ns, |p| {
                    p.retention = extra.retention_policies;
                    p.deduplication_enabled = extra.deduplication_enabled;
                })
                .await?;
        }
        tracing::info!(namespace = %ns, "namespace created");
        Ok(())
    }

    /// Deletes namespace `ns`, which must hold no topic, with its policies.
    pub async fn delete_namespace(&self, ns: &NamespaceName, force: bool) -> Result<(), OpsError> {
        if force {
            return Err(OpsError::NotAllowed(
                "Broker doesn't allow forced deletion of namespaces".into(),
            ));
        }
        let (topics, partitioned) = (self.topics(ns).await?, self.partitioned_topics(ns).await?);
        if !topics.is_empty() || !partitioned.is_empty() {
            return Err(OpsError::Conflict(
                "Cannot delete non empty namespace".into(),
            ));
        }
        self.tenancy.delete_namespace(ns).await?;
        self.policies
            .update(ns, |p| *p = NamespacePolicies::default())
            .await?;
        tracing::info!(namespace = %ns, "namespace deleted");
        Ok(())
    }

    /// The topics stored in namespace `ns` (non-partitioned topics and partitions), ascending.
    pub async fn topics(&self, ns: &NamespaceName) -> Result<Vec<String>, OpsError> {
        self.existing_namespace(ns).await?;
        let prefix = format!("persistent://{ns}/");
        let listed = self.log.metadata().list_topics_under(&prefix).await?;
        Ok(listed.into_iter().map(|t| t.name).collect())
    }

    /// The partitioned topics of namespace `ns`, ascending.
    pub async fn partitioned_topics(&self, ns: &NamespaceName) -> Result<Vec<String>, OpsError> {
        self.existing_namespace(ns).await?;
        let prefix = format!("persistent://{ns}/");
        let listed = self.log.metadata().list_partitioned_topics(&prefix).await?;
        Ok(listed.into_iter().map(|(name, _)| name).collect())
    }

    /// Namespace `ns`'s policies in Pulsar's `Policies` shape (what is set; offload and
    /// retention values are the namespace's own, `null` when it follows the default).
    pub async fn namespace_document(
        &self,
        ns: &NamespaceName,
    ) -> Result<serde_json::Value, OpsError> {
        let record = self.existing_namespace(ns).await?;
        let p = self.policies.namespace(ns).await?;
        Ok(json!({
            "auth_policies": record.auth_policies,
            "replication_clusters": record.replication_clusters,
            "bundles": { "boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1 },
            "subscription_auth_mode": record.subscription_auth_mode,
            "deleted": false,
            "deduplicationEnabled": p.deduplication_enabled,
            "retention_policies": p.retention,
            "offload_threshold": p.offload_threshold_bytes,
            "offload_threshold_in_seconds": p.offload_threshold_seconds,
            "offload_deletion_lag_ms": p.offload_deletion_lag_ms,
            "publishMaxMessageRate": p.publish_rate.map(|r| json!({ self.tenancy.local_cluster(): r })),
            "resource_group_name": p.resource_group_name,
            "backlog_quota_map": p.backlog_quota_map,
            "message_ttl_in_seconds": p.message_ttl_seconds,
            "max_producers_per_topic": p.max_producers,
            "max_consumers_per_topic": p.max_consumers,
            "max_consumers_per_subscription": p.max_consumers_per_subscription,
            "max_unacked_messages_per_consumer": p.max_unacked_per_consumer,
            "max_unacked_messages_per_subscription": p.max_unacked_per_subscription,
            "max_topics_per_namespace": p.max_topics,
        }))
    }

    // ---- permissions ----

    /// `role → actions` granted on namespace `ns`.
    pub async fn namespace_permissions(&self, ns: &NamespaceName) -> Result<Grants, OpsError> {
        Ok(self
            .existing_namespace(ns)
            .await?
            .auth_policies
            .namespace_auth
            .clone())
    }

    /// Grants `actions` on namespace `ns` to `role` (replacing what it had there).
    pub async fn grant_namespace(
        &self,
        ns: &NamespaceName,
        role: &str,
        actions: BTreeSet<AuthAction>,
    ) -> Result<(), OpsError> {
        self.permissions_enabled()?;
        self.tenancy
            .update_namespace(ns, |r| {
                r.auth_policies
                    .namespace_auth
                    .insert(role.to_string(), actions.clone());
                Ok(())
            })
            .await?;
        tracing::info!(namespace = %ns, role, "permissions granted");
        Ok(())
    }

    /// Takes `role`'s grants on namespace `ns` away.
    pub async fn revoke_namespace(&self, ns: &NamespaceName, role: &str) -> Result<(), OpsError> {
        self.permissions_enabled()?;
        self.tenancy
            .update_namespace(ns, |r| {
                r.auth_policies.namespace_auth.remove(role);
                Ok(())
            })
            .await?;
        tracing::info!(namespace = %ns, role, "permissions revoked");
        Ok(())
    }

    /// `role → actions` on topic `topic`: its namespace's grants and its own together.
    pub async fn topic_permissions(&self, topic: &TopicName) -> Result<Grants, OpsError> {
        let record = self.existing_namespace(&topic.namespace).await?;
        let mut all = record.auth_policies.namespace_auth.clone();
        if let Some(own) = record
            .auth_policies
            .destination_auth
            .get(&topic.base().to_string())
        {
            for (role, actions) in own {
                all.entry(role.clone()).or_default().extend(actions);
            }
        }
        Ok(all)
    }

    /// Grants `actions` on topic `topic` (its base topic) to `role`.
    pub async fn grant_topic(
        &self,
        topic: &TopicName,
        role: &str,
        actions: BTreeSet<AuthAction>,
    ) -> Result<(), OpsError> {
        self.permissions_enabled()?;
        let key = topic.base().to_string();
        self.tenancy
            .update_namespace(&topic.namespace, |r| {
                r.auth_policies
                    .destination_auth
                    .entry(key.clone())
                    .or_default()
                    .insert(role.to_string(), actions.clone());
                Ok(())
            })
            .await?;
        tracing::info!(%topic, role, "permissions granted");
        Ok(())
    }

    /// Takes `role`'s grants on topic `topic` away; 412 when it has none at topic level.
    pub async fn revoke_topic(&self, topic: &TopicName, role: &str) -> Result<(), OpsError> {
        self.permissions_enabled()?;
        let key = topic.base().to_string();
        self.tenancy
            .update_namespace(&topic.namespace, |r| {
                let grants = r.auth_policies.destination_auth.get_mut(&key);
                if grants.and_then(|g| g.remove(role)).is_none() {
                    return Err(TenancyError::Invalid(format!(
                        "Permissions are not set at the topic level: {role}"
                    )));
                }
                if r.auth_policies
                    .destination_auth
                    .get(&key)
                    .is_some_and(|g| g.is_empty())
                {
                    r.auth_policies.destination_auth.remove(&key);
                }
                Ok(())
            })
            .await?;
        tracing::info!(%topic, role, "permissions revoked");
        Ok(())
    }

    /// Restricts subscription `sub` of namespace `ns` to `roles` (added to those it has).
    pub async fn grant_subscription(
        &self,
        ns: &NamespaceName,
        sub: &str,
        roles: BTreeSet<String>,
    ) -> Result<(), OpsError> {
        self.permissions_enabled()?;
        self.tenancy
            .update_namespace(ns, |r| {
                let listed = r
                    .auth_policies
                    .subscription_auth_roles
                    .entry(sub.to_string());
                listed.or_default().extend(roles.iter().cloned());
                Ok(())
            })
            .await?;
        Ok(())
    }

    /// Removes `role` from subscription `sub`'s roles.
    pub async fn revoke_subscription(
        &self,
        ns: &NamespaceName,
        sub: &str,
        role: &str,
    ) -> Result<(), OpsError> {
        self.permissions_enabled()?;
        self.tenancy
            .update_namespace(ns, |r| {
                let roles = &mut r.auth_policies.subscription_auth_roles;
                if let Some(listed) = roles.get_mut(sub) {
                    listed.remove(role);
                    if listed.is_empty() {
                        roles.remove(sub);
                    }
                }
                Ok(())
            })
            .await?;
        Ok(())
    }

    /// Sets namespace `ns`'s subscription naming rule.
    pub async fn set_subscription_auth_mode(
        &self,
        ns: &NamespaceName,
        mode: SubscriptionAuthMode,
    ) -> Result<(), OpsError> {
        self.tenancy
            .update_namespace(ns, |r| {
                r.subscription_auth_mode = mode;
                Ok(())
            })
            .await?;
        Ok(())
    }

    /// Namespace `ns`'s subscription naming rule.
    pub async fn subscription_auth_mode(
        &self,
        ns: &NamespaceName,
    ) -> Result<SubscriptionAuthMode, OpsError> {
        Ok(self.existing_namespace(ns).await?.subscription_auth_mode)
    }
}
