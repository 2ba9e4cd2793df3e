//! The persisted records of tenancy, in Pulsar's JSON shapes (so admin bodies and stored
//! blobs are the same documents): [`TenantInfo`], [`ClusterData`], [`NamespaceRecord`] with its
//! [`AuthPolicies`].
//!
//! Invariant: a stored record is `[version = 1][JSON]` (`docs/adr/0005-tenancy-records.md`);
//! unknown JSON fields are ignored on read, so a newer writer's additions do not break an
//! older reader of the same version.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Version byte of every tenancy record.
pub const TENANCY_FORMAT_VERSION: u8 = 1;

/// Pulsar's `TenantInfo`: who administers a tenant and where its namespaces may live.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantInfo {
    /// Roles that administer the tenant (its namespaces, policies and permissions).
    #[serde(default)]
    pub admin_roles: BTreeSet<String>,
    /// Clusters the tenant's namespaces may be placed on.
    #[serde(default)]
    pub allowed_clusters: BTreeSet<String>,
}

/// Pulsar's `ClusterData`, the fields a single service has: where the cluster is reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterData {
    /// Admin/HTTP URL (`http://host:port`).
    #[serde(default)]
    pub service_url: String,
    /// Admin/HTTP URL over TLS.
    #[serde(default)]
    pub service_url_tls: String,
    /// Binary-protocol URL (`pulsar://host:port`).
    #[serde(default)]
    pub broker_service_url: String,
    /// Binary-protocol URL over TLS.
    #[serde(default)]
    pub broker_service_url_tls: String,
}

/// Pulsar's `ResourceGroup`: quotas shared by every topic of the namespaces attached to it
/// (-1 = unlimited). The publish quota is enforced; the dispatch quota is stored and shown,
/// not enforced yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceGroup {
    /// Messages per second published, across the group.
    #[serde(default = "unlimited", deserialize_with = "null_is_unlimited")]
    pub publish_rate_in_msgs: i64,
    /// Bytes per second published, across the group.
    #[serde(default = "unlimited", deserialize_with = "null_is_unlimited")]
    pub publish_rate_in_bytes: i64,
    /// Messages per second dispatched (stored; not enforced yet).
    #[serde(default = "unlimited", deserialize_with = "null_is_unlimited")]
    pub dispatch_rate_in_msgs: i64,
    /// Bytes per second dispatched (stored; not enforced yet).
    #[serde(default = "unlimited", deserialize_with = "null_is_unlimited")]
    pub dispatch_rate_in_bytes: i64,
}

fn unlimited() -> i64 {
    -1
}

/// A JSON `null` (Java's boxed `Integer`/`Long` unset) means unlimited too.
fn null_is_unlimited<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    Ok(Option::<i64>::deserialize(d)?.unwrap_or(-1))
}

/// Pulsar's `AuthAction`: what a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthAction {
    /// Publish to the topics.
    Produce,
    /// Subscribe to, read and query the topics.
    Consume,
    /// Pulsar Functions (accepted and stored; ledgerlake runs no functions).
    Functions,
    /// Pulsar IO sources (accepted and stored).
    Sources,
    /// Pulsar IO sinks (accepted and stored).
    Sinks,
    /// The package registry (accepted and stored).
    Packages,
}

impl fmt::Display for AuthAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The serde name, which is Pulsar's.
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        f.write_str(&s)
    }
}

/// Pulsar's `SubscriptionAuthMode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubscriptionAuthMode {
    /// Any subscription name.
    #[default]
    None,
    /// A subscription's name must start with the subscriber's role (superusers and tenant
    /// admins excepted).
    Prefix,
}

/// role → granted actions.
pub type Grants = BTreeMap<String, BTreeSet<AuthAction>>;

/// Pulsar's `AuthPolicies` (snake_case keys, as Pulsar serialises them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthPolicies {
    /// Grants on every topic of the namespace.
    #[serde(default)]
    pub namespace_auth: Grants,
    /// Grants on one topic: full topic name (`persistent://t/ns/x`) → grants.
    #[serde(default)]
    pub destination_auth: BTreeMap<String, Grants>,
    /// subscription → the only roles that may use it (absent or empty: any role with consume).
    #[serde(default)]
    pub subscription_auth_roles: BTreeMap<String, BTreeSet<String>>,
}

/// What exists of a namespace besides its offload and retention policies
/// ([`crate::policies`]): its grants, clusters and subscription rules. The record's presence
/// is the namespace's existence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceRecord {
    /// Who may produce and consume.
    #[serde(default)]
    pub auth_policies: AuthPolicies,
    /// Clusters the namespace lives on (the local cluster on a single service).
    #[serde(default)]
    pub replication_clusters: BTreeSet<String>,
    /// Subscription naming rule.
    #[serde(default)]
    pub subscription_auth_mode: SubscriptionAuthMode,
}

/// The persisted form of a record: version byte, then JSON.
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    crate::versioned::encode(TENANCY_FORMAT_VERSION, record)
}

/// Parses the persisted form of a record.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    crate::versioned::decode(TENANCY_FORMAT_VERSION, "tenancy record", bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn action() -> impl Strategy<Value = AuthAction> {
        prop_oneof![
            Just(AuthAction::Produce),
            Just(AuthAction::Consume),
            Just(AuthAction::Functions),
            Just(AuthAction::Sources),
            Just(AuthAction::Sinks),
            Just(AuthAction::Packages),
        ]
    }

    fn grants() -> impl Strategy<Value = Grants> {
        proptest::collection::btree_map(
            ".{0,8}",
            proptest::collection::btree_set(action(), 0..4),
            0..4,
        )
    }

    proptest! {
        #[test]
        fn namespace_records_round_trip(
            ns in grants(),
            topics in proptest::collection::btree_map(".{0,12}", grants(), 0..3),
            subs in proptest::collection::btree_map(".{0,8}", proptest::collection::btree_set(".{0,8}", 0..3), 0..3),
            clusters in proptest::collection::btree_set("[a-z]{1,6}", 0..3),
            prefix in any::<bool>(),
        ) {
            let r = NamespaceRecord {
                auth_policies: AuthPolicies {
                    namespace_auth: ns,
                    destination_auth: topics,
                    subscription_auth_roles: subs,
                },
                replication_clusters: clusters,
                subscription_auth_mode: if prefix { SubscriptionAuthMode::Prefix } else { SubscriptionAuthMode::None },
            };
            prop_assert_eq!(decode::<NamespaceRecord>(&encode(&r)), Ok(r));
        }

        #[test]
        fn tenants_and_clusters_round_trip(
            admins in proptest::collection::btree_set(".{0,8}", 0..4),
            clusters in proptest::collection::btree_set(".{0,8}", 0..4),
            urls in proptest::collection::vec(".{0,20}", 4),
        ) {
            let t = TenantInfo { admin_roles: admins, allowed_clusters: clusters };
            prop_assert_eq!(decode::<TenantInfo>(&encode(&t)), Ok(t));
            let c = ClusterData {
                service_url: urls[0].clone(),
                service_url_tls: urls[1].clone(),
                broker_service_url: urls[2].clone(),
                broker_service_url_tls: urls[3].clone(),
            };
            prop_assert_eq!(decode::<ClusterData>(&encode(&c)), Ok(c));
            let g = ResourceGroup {
                publish_rate_in_msgs: urls[0].len() as i64 - 3,
                publish_rate_in_bytes: urls[1].len() as i64,
                dispatch_rate_in_msgs: -1,
                dispatch_rate_in_bytes: urls[3].len() as i64 * 1000,
            };
            prop_assert_eq!(decode::<ResourceGroup>(&encode(&g)), Ok(g));
        }
    }

    #[test]
    fn pulsar_shapes_parse() {
        let t: TenantInfo =
            serde_json::from_str(r#"{"adminRoles":["a"],"allowedClusters":["standalone"]}"#)
                .expect("tenant info");
        assert!(t.admin_roles.contains("a"));
        let r: NamespaceRecord = serde_json::from_str(
            r#"{"auth_policies":{"namespace_auth":{"r":["produce","consume"]},
                "destination_auth":{},"subscription_auth_roles":{}},
                "replication_clusters":["standalone"],"subscription_auth_mode":"Prefix",
                "bundles":{"numBundles":4},"deleted":false}"#,
        )
        .expect("a full Pulsar Policies document parses; unknown fields are ignored");
        assert_eq!(r.subscription_auth_mode, SubscriptionAuthMode::Prefix);
        assert_eq!(AuthAction::Consume.to_string(), "consume");
        let g: ResourceGroup =
            serde_json::from_str(r#"{"publishRateInMsgs":null,"publishRateInBytes":5}"#)
                .expect("Java's unset Long is null");
        assert_eq!((g.publish_rate_in_msgs, g.publish_rate_in_bytes), (-1, 5));
        assert_eq!(g.dispatch_rate_in_msgs, -1, "absent is unlimited too");
    }

    #[test]
    fn unknown_versions_are_refused() {
        assert!(decode::<TenantInfo>(&[2, b'{', b'}']).is_err());
        assert!(decode::<TenantInfo>(&[]).is_err());
    }
}
