//! Tenants, namespaces and clusters, as Pulsar has them: which exist, who administers a tenant,
//! and who may produce to or consume from a namespace or one of its topics. [`Tenancy`] keeps
//! the records ([`records`]) in the metadata store and a cache of the ones the authorizer reads
//! on every PRODUCER, SUBSCRIBE and LOOKUP; [`authorizer::TenancyAuthorizer`] decides with them.
//!
//! What exists:
//! - the local cluster (named by `broker.cluster_name`, `standalone` by default, its URLs
//!   refreshed at every start) and any cluster records added through the admin API;
//! - tenants ([`TenantInfo`]); the embedded defaults create `public`;
//! - namespaces ([`NamespaceRecord`]: grants, clusters, subscription rule); the defaults create
//!   `public/default`. A topic can only be created in a namespace that exists.
//!
//! Invariants:
//! - A write forgets the cached record before and after it changes the store, and the next
//!   reader loads what the store holds: a reader never sees a record a crash could take back,
//!   and a reader that loaded the old record meanwhile cannot cache it (so a revoked grant
//!   cannot come back from a slow reader; [`crate::cached`]). Nothing written is cached as
//!   written: another node may have changed it since (its report could come first).
//! - Read-modify-write updates read the store, not the cache, and write with a compare-and-set
//!   on what they read ([`MetadataStore::replace_policies`]), so of two nodes changing one
//!   namespace at once neither undoes the other.
//! - What another node writes reaches this node's cache through the metadata store's policies
//!   feed ([`Tenancy::forget`], called by the operations layer's follower).
//! - Creations use the store's create-if-absent, so of two concurrent creations one gets
//!   "already exists".
//! - The caches of tenants and namespaces hold only records that exist (a lookup of a missing
//!   name asks the store, so a client naming random namespaces cannot grow them); the tenants'
//!   resource groups are cached for tenants that exist, `None` when one has none.
//! - A tenant is deleted only without namespaces; a namespace only without topics (checked by
//!   the operations layer, which sees the topics).

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::cached::Cached;
use crate::ledger::{MetadataError, MetadataStore};
use crate::naming::{valid_part, NamespaceName};
use crate::policies::Reach;

pub mod authorizer;
pub mod records;

pub use records::{
    AuthAction, AuthPolicies, ClusterData, Grants, NamespaceRecord, ResourceGroup,
    SubscriptionAuthMode, TenantInfo,
};

/// Why a tenancy operation failed. The messages are Pulsar's where Pulsar has one.
#[derive(Debug, thiserror::Error)]
pub enum TenancyError {
    /// The tenant, namespace or cluster does not exist (HTTP 404).
    #[error("{0} does not exist")]
    NotFound(String),
    /// It already exists (HTTP 409).
    #[error("{0} already exists")]
    Exists(String),
    /// It still holds namespaces or topics (HTTP 409).
    #[error("{0}")]
    NotEmpty(String),
    /// The request breaks a rule (bad name, unknown cluster; HTTP 412).
    #[error("{0}")]
    Invalid(String),
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// A stored record is not understood.
    #[error("stored record {scope} is invalid: {reason}")]
    Corrupt {
        /// Where it is stored.
        scope: String,
        /// Why it is refused.
        reason: String,
    },
}

/// Attempts of a read-modify-write update before it gives up; each lost one saw another node's
/// write land between its read and its compare-and-set.
const UPDATE_ATTEMPTS: usize = 16;

/// The record stored at `scope`, parsed.
fn decode_at<T: serde::de::DeserializeOwned>(scope: &str, blob: &[u8]) -> Result<T, TenancyError> {
    records::decode(blob).map_err(|reason| TenancyError::Corrupt {
        scope: scope.to_string(),
        reason,
    })
}

fn tenant_scope(tenant: &str) -> String {
    format!("tenancy/tenant/{tenant}")
}

fn cluster_scope(cluster: &str) -> String {
    format!("tenancy/cluster/{cluster}")
}

fn group_scope(group: &str) -> String {
    format!("tenancy/resourcegroup/{group}")
}

fn tenant_group_scope(tenant: &str) -> String {
    format!("tenancy/tenant-resourcegroup/{tenant}")
}

fn namespace_prefix(tenant: &str) -> String {
    format!("tenancy/namespace/{tenant}/")
}

fn namespace_scope(ns: &NamespaceName) -> String {
    format!("{}{}", namespace_prefix(&ns.tenant), ns.name)
}

/// The records of tenancy, cached. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Tenancy {
    meta: Arc<dyn MetadataStore>,
    /// Name of the cluster this service is.
    local_cluster: String,
    /// Invariant: every entry equals the stored tenant record.
    tenants: Cached<String, TenantInfo>,
    /// Invariant: every entry equals the stored namespace record.
    namespaces: Cached<NamespaceName, NamespaceRecord>,
    /// Invariant: every entry equals the stored tenant-level resource group, `None` for a
    /// tenant known to have none (the common case: the broker asks for every loaded topic
    /// each tick, and must not go to the store for an answer that is "none").
    tenant_groups: Cached<String, Option<String>>,
    /// Serialises read-modify-write updates (and keeps the cache in step with the store).
    update_lock: tokio::sync::Mutex<()>,
}

impl Tenancy {
    /// Tenancy over `meta`, for the cluster named `local_cluster`.
    pub fn new(meta: Arc<dyn MetadataStore>, local_cluster: &str) -> Self {
        Tenancy {
            meta,
            local_cluster: local_cluster.to_string(),
            tenants: Cached::new(),
            namespaces: Cached::new(),
            tenant_groups: Cached::new(),
            update_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// The name of the cluster this service is.
    pub fn local_cluster(&self) -> &str {
        &self.local_cluster
    }

    /// Forgets what is cached of the record stored at `scope`, which another node changed
    /// (reported by the metadata store's policies feed); any other scope is ignored.
    /// Returns which topics' limits in force may have changed: all for a resource group, a
    /// tenant's for its attachment to one, none for the other records (read on each use).
    pub fn forget(&self, scope: &str) -> Option<Reach> {
        let rest = scope.strip_prefix("tenancy/")?;
        if let Some(tenant) = rest.strip_prefix("tenant/") {
            self.tenants.invalidate(&tenant.to_string());
        } else if let Some(tenant) = rest.strip_prefix("tenant-resourcegroup/") {
            self.tenant_groups.invalidate(&tenant.to_string());
            return Some(Reach::Tenant(tenant.to_string()));
        } else if let Some(ns) = rest.strip_prefix("namespace/") {
            match ns.parse::<NamespaceName>() {
                Ok(ns) => self.namespaces.invalidate(&ns),
                // Not a name this node could have cached; forgetting all is always safe.
                Err(_) => self.namespaces.invalidate_all(),
            }
        }
        rest.starts_with("resourcegroup/").then_some(Reach::All)
    }

    /// Forgets every cached record (the feed of changes ended: some may have been missed).
    pub fn forget_all(&self) {
        self.tenants.invalidate_all();
        self.tenant_groups.invalidate_all();
        self.namespaces.invalidate_all();
    }

    /// The record stored at `scope`, if any.
    async fn load<T: serde::de::DeserializeOwned>(
        &self,
        scope: &str,
    ) -> Result<Option<T>, TenancyError> {
        let Some(blob) = self.meta.get_policies(scope).await? else {
            return Ok(None);
        };
        decode_at(scope, &blob).map(Some)
    }

    /// At start: records the local cluster at `local`'s URLs, then makes sure `public` and
    /// `public/default` exist, and that every namespace in `in_use` (the namespaces of topics
    /// already stored, e.g. by a version without tenancy) exists, so no stored topic is left
    /// outside a namespace.
    pub async fn bootstrap(
        &self,
        local: &ClusterData,
        in_use: impl IntoIterator<Item = NamespaceName>,
    ) -> Result<(), TenancyError> {
        self.meta
            .set_policies(
                &cluster_scope(&self.local_cluster),
                Some(&records::encode(local)),
            )
            .await?;
        let mut wanted: BTreeSet<NamespaceName> = in_use.into_iter().collect();
        wanted.insert(NamespaceName::new("public", "default").map_err(invalid)?);
        for ns in wanted {
            if self.tenant(&ns.tenant).await?.is_none() {
                let info = TenantInfo {
                    admin_roles: BTreeSet::new(),
                    allowed_clusters: BTreeSet::from([self.local_cluster.clone()]),
                };
                if self
                    .meta
                    .create_policies(&tenant_scope(&ns.tenant), &records::encode(&info))
                    .await?
                {
                    tracing::info!(tenant = %ns.tenant, "created tenant");
                }
            }
            if self.namespace(&ns).await?.is_none() {
                let record = self.new_namespace_record();
                if self
                    .meta
                    .create_policies(&namespace_scope(&ns), &records::encode(&record))
                    .await?
                {
                    tracing::info!(namespace = %ns, "created namespace");
                }
            }
        }
        Ok(())
    }

    fn new_namespace_record(&self) -> NamespaceRecord {
        NamespaceRecord {
            replication_clusters: BTreeSet::from([self.local_cluster.clone()]),
            ..NamespaceRecord::default()
        }
    }

    // ---- clusters ----

    /// Every cluster's name.
    pub async fn clusters(&self) -> Result<Vec<String>, TenancyError> {
        self.names(&cluster_scope("")).await
    }

    /// Cluster `name`'s record.
    pub async fn cluster(&self, name: &str) -> Result<Option<ClusterData>, TenancyError> {
        self.load(&cluster_scope(name)).await
    }

    /// Adds cluster `name` (a record other services and tenants can refer to).
    pub async fn create_cluster(&self, name: &str, data: &ClusterData) -> Result<(), TenancyError> {
        if !valid_part(name) {
            return Err(TenancyError::Invalid(format!(
                "Invalid cluster name '{name}'"
            )));
        }
        if !self
            .meta
            .create_policies(&cluster_scope(name), &records::encode(data))
            .await?
        {
            return Err(TenancyError::Exists(format!("Cluster {name}")));
        }
        Ok(())
    }

    /// Replaces cluster `name`'s URLs.
    pub async fn update_cluster(&self, name: &str, data: &ClusterData) -> Result<(), TenancyError> {
        let _g = self.update_lock.lock().await;
        if self.cluster(name).await?.is_none() {
            return Err(TenancyError::NotFound(format!("Cluster {name}")));
        }
        self.meta
            .set_policies(&cluster_scope(name), Some(&records::encode(data)))
            .await?;
        Ok(())
    }

    /// Removes cluster `name`: never the local one, nor one a tenant may use.
    pub async fn delete_cluster(&self, name: &str) -> Result<(), TenancyError> {
        let _g = self.update_lock.lock().await;
        if self.cluster(name).await?.is_none() {
            return Err(TenancyError::NotFound(format!("Cluster {name}")));
        }
        if name == self.local_cluster {
            return Err(TenancyError::Invalid(format!(
                "Cluster {name} is this service's own cluster"
            )));
        }
        for tenant in self.tenants().await? {
            if let Some(info) = self.tenant(&tenant).await? {
                if info.allowed_clusters.contains(name) {
                    return Err(TenancyError::Invalid(format!(
                        "Cluster {name} is in use by tenant {tenant}"
                    )));
                }
            }
        }
        self.meta.set_policies(&cluster_scope(name), None).await?;
        Ok(())
    }

    /// The names stored under `prefix` (the rest of each scope), ascending.
    async fn names(&self, prefix: &str) -> Result<Vec<String>, TenancyError> {
        Ok(self
            .meta
            .list_policies(prefix)
            .await?
            .into_iter()
            .filter_map(|(scope, _)| scope.strip_prefix(prefix).map(str::to_string))
            .collect())
    }

    // ---- resource groups ----

    /// Every resource group's name.
    pub async fn resource_groups(&self) -> Result<Vec<String>, TenancyError> {
        self.names(&group_scope("")).await
    }

    /// Resource group `name`.
    pub async fn resource_group(&self, name: &str) -> Result<Option<ResourceGroup>, TenancyError> {
        self.load(&group_scope(name)).await
    }

    /// Creates or replaces resource group `name`.
    pub async fn put_resource_group(
        &self,
        name: &str,
        group: &ResourceGroup,
    ) -> Result<(), TenancyError> {
        if !valid_part(name) {
            return Err(TenancyError::Invalid(format!(
                "Invalid resource group name '{name}'"
            )));
        }
        self.meta
            .set_policies(&group_scope(name), Some(&records::encode(group)))
            .await?;
        Ok(())
    }

    /// Removes resource group `name` (the caller has checked no namespace uses it).
    pub async fn delete_resource_group(&self, name: &str) -> Result<(), TenancyError> {
        if self.resource_group(name).await?.is_none() {
            return Err(TenancyError::NotFound(format!("ResourceGroup {name}")));
        }
        self.meta.set_policies(&group_scope(name), None).await?;
        Ok(())
    }

    /// The resource group tenant `tenant` is attached to: the quota of every namespace of the
    /// tenant that has no group of its own, including namespaces created later.
    pub async fn tenant_resource_group(
        &self,
        tenant: &str,
    ) -> Result<Option<String>, TenancyError> {
        let seen = match self.tenant_groups.get(&tenant.to_string()) {
            Ok(g) => return Ok(Option::clone(&g)),
            Err(generation) => generation,
        };
        let group = self.load::<String>(&tenant_group_scope(tenant)).await?;
        Ok(Option::clone(&self.tenant_groups.fill(
            tenant.to_string(),
            group,
            seen,
        )))
    }

    /// Attaches tenant `tenant` to resource group `group` (`None`: detaches it).
    pub async fn set_tenant_resource_group(
        &self,
        tenant: &str,
        group: Option<&str>,
    ) -> Result<(), TenancyError> {
        let _g = self.update_lock.lock().await;
        if self.tenant(tenant).await?.is_none() {
            return Err(TenancyError::NotFound(format!("Tenant {tenant}")));
        }
        if let Some(g) = group {
            if self.resource_group(g).await?.is_none() {
                return Err(TenancyError::NotFound(format!("ResourceGroup {g}")));
            }
        }
        let key = tenant.to_string();
        self.tenant_groups.invalidate(&key);
        let blob = group.map(|g| records::encode(&g));
        self.meta
            .set_policies(&tenant_group_scope(tenant), blob.as_deref())
            .await?;
        self.tenant_groups.invalidate(&key);
        Ok(())
    }

    /// The tenants attached to resource group `group`.
    pub async fn tenants_in_group(&self, group: &str) -> Result<Vec<String>, TenancyError> {
        let prefix = tenant_group_scope("");
        let mut out = Vec::new();
        for (scope, blob) in self.meta.list_policies(&prefix).await? {
            let attached: String =
                records::decode(&blob).map_err(|reason| TenancyError::Corrupt {
                    scope: scope.clone(),
                    reason,
                })?;
            if attached == group {
                out.push(scope.trim_start_matches(&prefix).to_string());
            }
        }
        Ok(out)
    }

    // ---- tenants ----

    /// Every tenant's name, ascending.
    pub async fn tenants(&self) -> Result<Vec<String>, TenancyError> {
        self.names(&tenant_scope("")).await
    }

    /// Tenant `name`'s record, `None` when it does not exist.
    pub async fn tenant(&self, name: &str) -> Result<Option<Arc<TenantInfo>>, TenancyError> {
        let seen = match self.tenants.get(&name.to_string()) {
            Ok(t) => return Ok(Some(t)),
            Err(generation) => generation,
        };
        let info = self.load::<TenantInfo>(&tenant_scope(name)).await?;
        Ok(info.map(|i| self.tenants.fill(name.to_string(), i, seen)))
    }

    async fn check_tenant_info(&self, name: &str, info: &TenantInfo) -> Result<(), TenancyError> {
        if !valid_part(name) {
            return Err(TenancyError::Invalid(format!(
                "Invalid tenant name '{name}'"
            )));
        }
        if info.allowed_clusters.is_empty() {
            return Err(TenancyError::Invalid("Clusters can not be empty".into()));
        }
        let known: BTreeSet<String> = self.clusters().await?.into_iter().collect();
        let unknown: Vec<&String> = info.allowed_clusters.difference(&known).collect();
        if !unknown.is_empty() {
            return Err(TenancyError::Invalid(format!(
                "Clusters {unknown:?} do not exist"
            )));
        }
        Ok(())
    }

    /// Creates tenant `name`.
    pub async fn create_tenant(&self, name: &str, info: TenantInfo) -> Result<(), TenancyError> {
        let _g = self.update_lock.lock().await;
        self.check_tenant_info(name, &info).await?;
        if !self
            .meta
            .create_policies(&tenant_scope(name), &records::encode(&info))
            .await?
        {
            return Err(TenancyError::Exists(format!("Tenant {name}")));
        }
        self.tenants.invalidate(&name.to_string());
        Ok(())
    }

    /// Replaces tenant `name`'s admins and clusters.
    pub async fn update_tenant(&self, name: &str, info: TenantInfo) -> Result<(), TenancyError> {
        let _g = self.update_lock.lock().await;
        self.check_tenant_info(name, &info).await?;
        if self.tenant(name).await?.is_none() {
            return Err(TenancyError::NotFound(format!("Tenant {name}")));
        }
        self.tenants.invalidate(&name.to_string());
        self.meta
            .set_policies(&tenant_scope(name), Some(&records::encode(&info)))
            .await?;
        self.tenants.invalidate(&name.to_string());
        Ok(())
    }

    /// Deletes tenant `name`, which must hold no namespace.
    pub async fn delete_tenant(&self, name: &str) -> Result<(), TenancyError> {
        let _g = self.update_lock.lock().await;
        if self.tenant(name).await?.is_none() {
            return Err(TenancyError::NotFound(format!("Tenant {name}")));
        }
        if !self
            .meta
            .list_policies(&namespace_prefix(name))
            .await?
            .is_empty()
        {
            return Err(TenancyError::NotEmpty(
                "The tenant still has active namespaces".into(),
            ));
        }
        self.tenants.invalidate(&name.to_string());
        self.tenant_groups.invalidate(&name.to_string());
        self.meta
            .set_policies(&tenant_group_scope(name), None)
            .await?;
        self.tenant_groups.invalidate(&name.to_string());
        self.meta.set_policies(&tenant_scope(name), None).await?;
        self.tenants.invalidate(&name.to_string());
        Ok(())
    }

    // ---- namespaces ----

    /// The namespaces of tenant `tenant`, ascending.
    pub async fn namespaces(&self, tenant: &str) -> Result<Vec<NamespaceName>, TenancyError> {
        if self.tenant(tenant).await?.is_none() {
            return Err(TenancyError::NotFound(format!("Tenant {tenant}")));
        }
        let prefix = namespace_prefix(tenant);
        Ok(self
            .meta
            .list_policies(&prefix)
            .await?
            .into_iter()
            .filter_map(|(scope, _)| {
                let name = scope.strip_prefix(&prefix)?;
                NamespaceName::new(tenant, name).ok()
            })
            .collect())
    }

    /// Namespace `ns`'s record, `None` when it does not exist.
    pub async fn namespace(
        &self,
        ns: &NamespaceName,
    ) -> Result<Option<Arc<NamespaceRecord>>, TenancyError> {
        let seen = match self.namespaces.get(ns) {
            Ok(r) => return Ok(Some(r)),
            Err(generation) => generation,
        };
        let record = self.load::<NamespaceRecord>(&namespace_scope(ns)).await?;
        Ok(record.map(|r| self.namespaces.fill(ns.clone(), r, seen)))
    }

    /// Creates namespace `ns` in an existing tenant, on the clusters `record` names (the local
    /// cluster when none), which the tenant must allow.
    pub async fn create_namespace(
        &self,
        ns: &NamespaceName,
        mut record: NamespaceRecord,
    ) -> Result<(), TenancyError> {
        let _g = self.update_lock.lock().await;
        let tenant = self
            .tenant(&ns.tenant)
            .await?
            .ok_or_else(|| TenancyError::NotFound(format!("Tenant {}", ns.tenant)))?;
        if record.replication_clusters.is_empty() {
            record.replication_clusters = BTreeSet::from([self.local_cluster.clone()]);
        }
        for c in &record.replication_clusters {
            if !tenant.allowed_clusters.contains(c) {
                return Err(TenancyError::Invalid(format!(
                    "Cluster [{c}] is not in the list of allowed clusters list for tenant [{}]",
                    ns.tenant
                )));
            }
        }
        if !self
            .meta
            .create_policies(&namespace_scope(ns), &records::encode(&record))
            .await?
        {
            return Err(TenancyError::Exists(format!("Namespace {ns}")));
        }
        self.namespaces.invalidate(ns);
        Ok(())
    }

    /// Applies `change` to namespace `ns`'s record and stores the result, with a
    /// compare-and-set on the record read from the store (retried when another node's write
    /// lands between; `change` may run more than once).
    pub async fn update_namespace<R>(
        &self,
        ns: &NamespaceName,
        mut change: impl FnMut(&mut NamespaceRecord) -> Result<R, TenancyError>,
    ) -> Result<R, TenancyError> {
        let _g = self.update_lock.lock().await;
        let scope = namespace_scope(ns);
        for _ in 0..UPDATE_ATTEMPTS {
            // The store, not the cache: this node may not have heard of another's write yet.
            let Some(stored) = self.meta.get_policies(&scope).await? else {
                return Err(TenancyError::NotFound(format!("Namespace {ns}")));
            };
            let mut record: NamespaceRecord = decode_at(&scope, &stored)?;
            let out = change(&mut record)?;
            let blob = records::encode(&record);
            if blob == stored {
                // Nothing to write: no other node is told of a change that is none. This
                // node's copy is forgotten all the same (it may be stale).
                self.namespaces.invalidate(ns);
                return Ok(out);
            }
            self.namespaces.invalidate(ns);
            let done = self
                .meta
                .replace_policies(&scope, Some(&stored), Some(&blob))
                .await;
            self.namespaces.invalidate(ns);
            if done? {
                return Ok(out);
            }
        }
        Err(MetadataError::Conflict(format!(
            "namespace {ns} kept changing during {UPDATE_ATTEMPTS} attempts to update it"
        ))
        .into())
    }

    /// Removes namespace `ns`'s record (the caller has checked it holds no topic).
    pub async fn delete_namespace(&self, ns: &NamespaceName) -> Result<(), TenancyError> {
        let _g = self.update_lock.lock().await;
        if self.namespace(ns).await?.is_none() {
            return Err(TenancyError::NotFound(format!("Namespace {ns}")));
        }
        self.namespaces.invalidate(ns);
        self.meta.set_policies(&namespace_scope(ns), None).await?;
        self.namespaces.invalidate(ns);
        Ok(())
    }
}

fn invalid(e: impl std::fmt::Display) -> TenancyError {
    TenancyError::Invalid(e.to_string())
}

#[cfg(test)]
mod tests;
