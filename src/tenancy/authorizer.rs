//! The authorizer used while authentication is on: Pulsar's rules over the tenancy records.
//!
//! | who | may |
//! |---|---|
//! | a superuser (`superuser_roles`) | everything |
//! | an admin role of tenant T | every admin read and write of T's namespaces and topics, and produce, consume and query on them |
//! | a role granted `produce` on a namespace or topic | produce, look up |
//! | a role granted `consume` on a namespace or topic | subscribe (subject to the subscription rules), look up, query with SQL |
//! | any authenticated role | start a SQL session (it then sees only what it may consume) |
//!
//! Cluster-wide admin (tenants, clusters) is for superusers only. Subscription rules, for a
//! role that is neither superuser nor tenant admin: when the namespace lists roles for a
//! subscription, the role must be one of them; in `Prefix` mode the subscription's name must
//! start with the role.
//!
//! Invariant: a decision reads only cached records (or the store once per record), never
//! scans. ([`crate::auth::Access::authorize`] logs refusals.)

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{AuthAction, NamespaceRecord, SubscriptionAuthMode, Tenancy};
use crate::auth::{Action, Authorizer, Denied, Principal, Resource};
use crate::naming::TopicName;

/// Pulsar's authorization over [`Tenancy`].
#[derive(Debug)]
pub struct TenancyAuthorizer {
    tenancy: Arc<Tenancy>,
    /// Invariant: roles allowed everything.
    superusers: BTreeSet<String>,
}

impl TenancyAuthorizer {
    /// Rules over `tenancy` with these superuser roles.
    pub fn new(tenancy: Arc<Tenancy>, superusers: impl IntoIterator<Item = String>) -> Self {
        TenancyAuthorizer {
            tenancy,
            superusers: superusers.into_iter().collect(),
        }
    }

    async fn is_tenant_admin(&self, role: &str, tenant: &str) -> bool {
        match self.tenancy.tenant(tenant).await {
            Ok(Some(info)) => info.admin_roles.contains(role),
            Ok(None) => false,
            Err(e) => {
                tracing::error!(tenant, error = %e, "reading tenant for authorization");
                false
            }
        }
    }

    async fn namespace_of(&self, topic: &TopicName) -> Option<Arc<NamespaceRecord>> {
        match self.tenancy.namespace(&topic.namespace).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(%topic, error = %e, "reading namespace for authorization");
                None
            }
        }
    }

    /// Whether the decision allows `action` on `resource`, given the role is no superuser.
    async fn allows(&self, role: &str, action: Action, resource: &Resource) -> bool {
        match resource {
            Resource::Cluster => action == Action::Query,
            Resource::Tenant(t) => is_admin_action(action) && self.is_tenant_admin(role, t).await,
            Resource::Namespace(ns) => {
                is_admin_action(action) && self.is_tenant_admin(role, &ns.tenant).await
            }
            Resource::Topic(topic) => {
                if self.is_tenant_admin(role, &topic.namespace.tenant).await {
                    return true;
                }
                let Some(ns) = self.namespace_of(topic).await else {
                    return false;
                };
                let has = |a| granted(&ns, topic, role, a);
                match action {
                    Action::Produce => has(AuthAction::Produce),
                    Action::Consume | Action::Query => has(AuthAction::Consume),
                    Action::Lookup => has(AuthAction::Produce) || has(AuthAction::Consume),
                    Action::AdminRead | Action::AdminWrite => false,
                }
            }
            Resource::Subscription { topic, name } => {
                if self.is_tenant_admin(role, &topic.namespace.tenant).await {
                    return true;
                }
                let Some(ns) = self.namespace_of(topic).await else {
                    return false;
                };
                action == Action::Consume
                    && granted(&ns, topic, role, AuthAction::Consume)
                    && subscription_allows(&ns, role, name)
            }
        }
    }
}

fn is_admin_action(action: Action) -> bool {
    matches!(action, Action::AdminRead | Action::AdminWrite)
}

/// Whether `role` holds `action` on `topic`, at namespace or topic level.
fn granted(ns: &NamespaceRecord, topic: &TopicName, role: &str, action: AuthAction) -> bool {
    let auth = &ns.auth_policies;
    let on_namespace = auth
        .namespace_auth
        .get(role)
        .is_some_and(|a| a.contains(&action));
    on_namespace
        || auth
            .destination_auth
            .get(&topic.to_string())
            .and_then(|g| g.get(role))
            .is_some_and(|a| a.contains(&action))
}

/// The namespace's subscription rules, for a role that is neither superuser nor tenant admin.
fn subscription_allows(ns: &NamespaceRecord, role: &str, subscription: &str) -> bool {
    let listed = ns
        .auth_policies
        .subscription_auth_roles
        .get(subscription)
        .filter(|roles| !roles.is_empty());
    if listed.is_some_and(|roles| !roles.contains(role)) {
        return false;
    }
    match ns.subscription_auth_mode {
        SubscriptionAuthMode::None => true,
        SubscriptionAuthMode::Prefix => subscription.starts_with(role),
    }
}

#[async_trait::async_trait]
impl Authorizer for TenancyAuthorizer {
    async fn authorize(
        &self,
        principal: &Principal,
        action: Action,
        resource: &Resource,
    ) -> Result<(), Denied> {
        let role = principal.role.as_str();
        if self.superusers.contains(role) || self.allows(role, action, resource).await {
            return Ok(());
        }
        Err(Denied {
            principal: principal.to_string(),
            action,
            resource: resource.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::metadata::memory::MemoryMetadataStore;
    use crate::naming::NamespaceName;
    use crate::tenancy::{ClusterData, TenantInfo};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    async fn setup() -> Result<(Arc<Tenancy>, TenancyAuthorizer), Box<dyn std::error::Error>> {
        let tenancy = Arc::new(Tenancy::new(
            Arc::new(MemoryMetadataStore::new()),
            "standalone",
        ));
        tenancy.bootstrap(&ClusterData::default(), []).await?;
        for (t, admin) in [("a", "a-admin"), ("b", "b-admin")] {
            tenancy
                .create_tenant(
                    t,
                    TenantInfo {
                        admin_roles: BTreeSet::from([admin.to_string()]),
                        allowed_clusters: BTreeSet::from(["standalone".to_string()]),
                    },
                )
                .await?;
            tenancy
                .create_namespace(&NamespaceName::new(t, "ns")?, NamespaceRecord::default())
                .await?;
        }
        let authz = TenancyAuthorizer::new(tenancy.clone(), ["root".to_string()]);
        Ok((tenancy, authz))
    }

    fn topic(t: &str) -> Resource {
        Resource::Topic(format!("persistent://{t}/ns/x").parse().expect("valid"))
    }

    fn sub(t: &str, name: &str) -> Resource {
        Resource::Subscription {
            topic: format!("persistent://{t}/ns/x").parse().expect("valid"),
            name: name.to_string(),
        }
    }

    async fn ok(a: &TenancyAuthorizer, role: &str, action: Action, on: &Resource) -> bool {
        a.authorize(&Principal::role(role), action, on)
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn superusers_and_tenant_admins() -> TestResult {
        let (_, a) = setup().await?;
        for action in [Action::Produce, Action::Consume, Action::AdminWrite] {
            assert!(ok(&a, "root", action, &topic("a")).await);
            assert!(ok(&a, "a-admin", action, &topic("a")).await);
            assert!(!ok(&a, "a-admin", action, &topic("b")).await, "{action}");
            assert!(!ok(&a, "nobody", action, &topic("a")).await);
        }
        assert!(ok(&a, "root", Action::AdminWrite, &Resource::Cluster).await);
        assert!(!ok(&a, "a-admin", Action::AdminRead, &Resource::Cluster).await);
        assert!(
            ok(
                &a,
                "a-admin",
                Action::AdminWrite,
                &Resource::Tenant("a".into())
            )
            .await
        );
        assert!(
            !ok(
                &a,
                "a-admin",
                Action::AdminRead,
                &Resource::Tenant("b".into())
            )
            .await
        );
        let ns_b = Resource::Namespace(NamespaceName::new("b", "ns")?);
        assert!(!ok(&a, "a-admin", Action::AdminRead, &ns_b).await);
        assert!(ok(&a, "b-admin", Action::AdminRead, &ns_b).await);
        assert!(ok(&a, "nobody", Action::Query, &Resource::Cluster).await);
        assert!(!ok(&a, "nobody", Action::Query, &topic("a")).await);
        Ok(())
    }

    #[tokio::test]
    async fn grants_on_namespaces_and_topics() -> TestResult {
        let (tenancy, a) = setup().await?;
        let ns = NamespaceName::new("a", "ns")?;
        tenancy
            .update_namespace(&ns, |r| {
                let auth = &mut r.auth_policies;
                auth.namespace_auth
                    .insert("writer".into(), BTreeSet::from([AuthAction::Produce]));
                auth.destination_auth
                    .entry("persistent://a/ns/x".into())
                    .or_default()
                    .insert("reader".into(), BTreeSet::from([AuthAction::Consume]));
                Ok(())
            })
            .await?;
        assert!(ok(&a, "writer", Action::Produce, &topic("a")).await);
        assert!(ok(&a, "writer", Action::Lookup, &topic("a")).await);
        assert!(!ok(&a, "writer", Action::Consume, &sub("a", "s")).await);
        assert!(!ok(&a, "writer", Action::Produce, &topic("b")).await);
        assert!(ok(&a, "reader", Action::Consume, &sub("a", "s")).await);
        assert!(ok(&a, "reader", Action::Query, &topic("a")).await);
        assert!(ok(&a, "reader", Action::Lookup, &topic("a")).await);
        assert!(!ok(&a, "reader", Action::Produce, &topic("a")).await);
        assert!(!ok(&a, "reader", Action::AdminRead, &topic("a")).await);
        let other: Resource = Resource::Topic("persistent://a/ns/y".parse()?);
        assert!(
            !ok(&a, "reader", Action::Query, &other).await,
            "topic grant is one topic"
        );
        Ok(())
    }

    #[tokio::test]
    async fn subscription_rules() -> TestResult {
        let (tenancy, a) = setup().await?;
        let ns = NamespaceName::new("a", "ns")?;
        tenancy
            .update_namespace(&ns, |r| {
                r.auth_policies
                    .namespace_auth
                    .insert("reader".into(), BTreeSet::from([AuthAction::Consume]));
                r.auth_policies.subscription_auth_roles.insert(
                    "reader-locked".into(),
                    BTreeSet::from(["other".to_string()]),
                );
                r.subscription_auth_mode = SubscriptionAuthMode::Prefix;
                Ok(())
            })
            .await?;
        assert!(ok(&a, "reader", Action::Consume, &sub("a", "reader-1")).await);
        assert!(
            !ok(&a, "reader", Action::Consume, &sub("a", "mine")).await,
            "prefix"
        );
        assert!(
            !ok(&a, "reader", Action::Consume, &sub("a", "reader-locked")).await,
            "listed roles"
        );
        assert!(ok(&a, "a-admin", Action::Consume, &sub("a", "anything")).await);
        assert!(ok(&a, "root", Action::Consume, &sub("a", "reader-locked")).await);
        Ok(())
    }
}
