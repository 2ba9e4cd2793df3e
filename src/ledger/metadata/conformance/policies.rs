//! Conformance checks of the stored policies blobs (`get_policies`, `set_policies`,
//! `create_policies`, `replace_policies`, `list_policies`): run by `run_all` against every
//! store. The feed of their changes is checked in `feeds`.

use super::super::*;
use super::TestResult;

pub(super) async fn policies_are_replaced_and_removed(store: &dyn MetadataStore) -> TestResult {
    assert_eq!(store.get_policies("namespace:a/b").await?, None);
    store.set_policies("namespace:a/b", Some(b"one")).await?;
    store.set_policies("namespace:a/b", Some(b"two")).await?;
    store.set_policies("namespace:a/c", Some(b"other")).await?;
    assert_eq!(
        store.get_policies("namespace:a/b").await?.as_deref(),
        Some(&b"two"[..])
    );
    store.set_policies("namespace:a/b", None).await?;
    store.set_policies("namespace:a/b", None).await?;
    assert_eq!(store.get_policies("namespace:a/b").await?, None);
    assert_eq!(
        store.get_policies("namespace:a/c").await?.as_deref(),
        Some(&b"other"[..])
    );
    // Compare-and-set: each case applies only when the store holds what it expects.
    let s = "namespace:a/d";
    assert!(
        !store.replace_policies(s, Some(b"x"), Some(b"y")).await?,
        "absent, not x"
    );
    assert!(!store.replace_policies(s, Some(b"x"), None).await?);
    assert!(
        store.replace_policies(s, None, None).await?,
        "absent as expected"
    );
    assert!(store.replace_policies(s, None, Some(b"one")).await?);
    assert!(
        !store.replace_policies(s, None, Some(b"two")).await?,
        "not absent any more"
    );
    assert!(!store.replace_policies(s, None, None).await?);
    assert!(
        !store.replace_policies(s, Some(b"on"), Some(b"two")).await?,
        "a prefix is not equal"
    );
    assert!(
        store
            .replace_policies(s, Some(b"one"), Some(b"one"))
            .await?,
        "the same bytes again"
    );
    assert!(
        store
            .replace_policies(s, Some(b"one"), Some(b"two"))
            .await?
    );
    assert_eq!(store.get_policies(s).await?.as_deref(), Some(&b"two"[..]));
    assert!(
        !store.replace_policies(s, Some(b"one"), None).await?,
        "an old read loses"
    );
    assert!(store.replace_policies(s, Some(b"two"), None).await?);
    assert_eq!(store.get_policies(s).await?, None);
    Ok(())
}

pub(super) async fn policies_are_created_once_and_listed_by_prefix(
    store: &dyn MetadataStore,
) -> TestResult {
    assert!(store.create_policies("tenant:a", b"1").await?);
    assert!(!store.create_policies("tenant:a", b"2").await?, "exists");
    assert_eq!(
        store.get_policies("tenant:a").await?.as_deref(),
        Some(&b"1"[..])
    );
    store.create_policies("tenant:b_%", b"3").await?;
    store.create_policies("tenantx", b"4").await?;
    store.create_policies("ns:a/x", b"5").await?;
    store.create_policies("tenant:", b"6").await?;
    let listed = store.list_policies("tenant:").await?;
    let scopes: Vec<&str> = listed.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(scopes, ["tenant:", "tenant:a", "tenant:b_%"]);
    assert_eq!(listed[2].1, b"3");
    assert_eq!(store.list_policies("tenant:b_").await?.len(), 1);
    assert!(store.list_policies("nothing").await?.is_empty());
    store.set_policies("tenant:a", None).await?;
    assert!(
        store.create_policies("tenant:a", b"7").await?,
        "removed, so free again"
    );
    Ok(())
}
