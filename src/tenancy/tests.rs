//! The tenancy store's rules: what exists after bootstrap, Pulsar's 404/409/412 cases, and
//! that a fresh instance over the same store sees what was written.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::ledger::metadata::memory::MemoryMetadataStore;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn info(admins: &[&str], clusters: &[&str]) -> TenantInfo {
    TenantInfo {
        admin_roles: admins.iter().map(|s| s.to_string()).collect(),
        allowed_clusters: clusters.iter().map(|s| s.to_string()).collect(),
    }
}

fn ns(t: &str, n: &str) -> NamespaceName {
    NamespaceName::new(t, n).expect("valid")
}

#[tokio::test]
async fn bootstrap_creates_the_defaults_and_adopts_namespaces_in_use() -> TestResult {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let t = Tenancy::new(meta.clone(), "standalone");
    let url = ClusterData {
        broker_service_url: "pulsar://127.0.0.1:6650".into(),
        ..ClusterData::default()
    };
    t.bootstrap(&url, [ns("old", "stuff")]).await?;
    assert_eq!(t.clusters().await?, ["standalone"]);
    assert_eq!(t.cluster("standalone").await?, Some(url));
    assert_eq!(t.tenants().await?, ["old", "public"]);
    assert_eq!(t.namespaces("public").await?, [ns("public", "default")]);
    assert_eq!(t.namespaces("old").await?, [ns("old", "stuff")]);
    let record = t
        .namespace(&ns("public", "default"))
        .await?
        .ok_or("exists")?;
    assert_eq!(
        record.replication_clusters,
        BTreeSet::from(["standalone".to_string()])
    );
    // A second start changes nothing that exists (admins set meanwhile survive).
    t.update_tenant("public", info(&["ops"], &["standalone"]))
        .await?;
    let again = Tenancy::new(meta, "standalone");
    again.bootstrap(&ClusterData::default(), []).await?;
    let public = again.tenant("public").await?.ok_or("exists")?;
    assert!(public.admin_roles.contains("ops"));
    Ok(())
}

#[tokio::test]
async fn tenants_follow_pulsars_rules() -> TestResult {
    let t = Tenancy::new(Arc::new(MemoryMetadataStore::new()), "standalone");
    t.bootstrap(&ClusterData::default(), []).await?;
    t.create_tenant("acme", info(&["a"], &["standalone"]))
        .await?;
    assert!(matches!(
        t.create_tenant("acme", info(&[], &["standalone"])).await,
        Err(TenancyError::Exists(_))
    ));
    assert!(matches!(
        t.create_tenant("x", info(&[], &[])).await,
        Err(TenancyError::Invalid(m)) if m == "Clusters can not be empty"
    ));
    assert!(matches!(
        t.create_tenant("x", info(&[], &["mars"])).await,
        Err(TenancyError::Invalid(_))
    ));
    assert!(matches!(
        t.create_tenant("bad/name", info(&[], &["standalone"]))
            .await,
        Err(TenancyError::Invalid(_))
    ));
    assert!(matches!(
        t.update_tenant("nope", info(&[], &["standalone"])).await,
        Err(TenancyError::NotFound(_))
    ));
    t.create_namespace(&ns("acme", "orders"), NamespaceRecord::default())
        .await?;
    assert!(matches!(
        t.delete_tenant("acme").await,
        Err(TenancyError::NotEmpty(_))
    ));
    t.delete_namespace(&ns("acme", "orders")).await?;
    t.delete_tenant("acme").await?;
    assert!(t.tenant("acme").await?.is_none());
    assert!(matches!(
        t.delete_tenant("acme").await,
        Err(TenancyError::NotFound(_))
    ));
    Ok(())
}

#[tokio::test]
async fn namespaces_need_their_tenant_and_allowed_clusters() -> TestResult {
    let t = Tenancy::new(Arc::new(MemoryMetadataStore::new()), "standalone");
    t.bootstrap(&ClusterData::default(), []).await?;
    assert!(matches!(
        t.create_namespace(&ns("ghost", "n"), NamespaceRecord::default())
            .await,
        Err(TenancyError::NotFound(_))
    ));
    assert!(matches!(
        t.create_namespace(&ns("public", "default"), NamespaceRecord::default())
            .await,
        Err(TenancyError::Exists(_))
    ));
    t.create_cluster("other", &ClusterData::default()).await?;
    let elsewhere = NamespaceRecord {
        replication_clusters: BTreeSet::from(["other".to_string()]),
        ..NamespaceRecord::default()
    };
    assert!(matches!(
        t.create_namespace(&ns("public", "far"), elsewhere.clone())
            .await,
        Err(TenancyError::Invalid(_))
    ));
    t.update_tenant("public", info(&[], &["standalone", "other"]))
        .await?;
    t.create_namespace(&ns("public", "far"), elsewhere).await?;
    assert!(
        matches!(
            t.delete_cluster("other").await,
            Err(TenancyError::Invalid(_))
        ),
        "a tenant may use it"
    );
    assert!(matches!(
        t.delete_cluster("standalone").await,
        Err(TenancyError::Invalid(_))
    ));
    assert!(matches!(
        t.namespaces("ghost").await,
        Err(TenancyError::NotFound(_))
    ));
    assert!(matches!(
        t.update_namespace(&ns("public", "ghost"), |_| Ok(())).await,
        Err(TenancyError::NotFound(_))
    ));
    Ok(())
}

#[tokio::test]
async fn updates_reach_the_store_and_failed_changes_store_nothing() -> TestResult {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let t = Tenancy::new(meta.clone(), "standalone");
    t.bootstrap(&ClusterData::default(), []).await?;
    let d = ns("public", "default");
    t.update_namespace(&d, |r| {
        r.subscription_auth_mode = SubscriptionAuthMode::Prefix;
        Ok(())
    })
    .await?;
    let refused: Result<(), _> = t
        .update_namespace(&d, |r| {
            r.subscription_auth_mode = SubscriptionAuthMode::None;
            Err(TenancyError::Invalid("no".into()))
        })
        .await;
    assert!(refused.is_err());
    let fresh = Tenancy::new(meta, "standalone");
    for view in [&t, &fresh] {
        let r = view.namespace(&d).await?.ok_or("exists")?;
        assert_eq!(r.subscription_auth_mode, SubscriptionAuthMode::Prefix);
    }
    Ok(())
}
