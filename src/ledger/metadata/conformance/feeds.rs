//! Conformance checks of the policies feed ([`MetadataStore::policy_changes`], contract in
//! `changes`): run by `run_all` against every store (one without a feed, being its only
//! process's, has nothing to report), across two etcd handles, and each store's own feed
//! behaviour (SQLite has none; an in-memory reader too far behind has its feed ended).

use std::time::Duration;

use super::super::etcd::EtcdMetadataStore;
use super::super::memory::MemoryMetadataStore;
use super::super::sqlite::SqliteMetadataStore;
use super::super::*;
use super::TestResult;
use crate::coord::test_etcd::TestEtcd;

/// How long a report may take to arrive.
const WAIT: Duration = Duration::from_secs(10);

/// The scopes `writer`'s writes below change, in order.
const WRITTEN: [&str; 4] = [
    "namespace:t/a",
    "tenancy/tenant/t",
    "namespace:t/a",
    "topic:persistent://t/a/x",
];

/// Writes of every kind through `writer` (a create refused included) are reported by the feed
/// `watcher` gave before them, in order; `unseen`, written by a store sharing nothing with
/// `watcher` before those, is not.
async fn policy_feed_reports_writes_of(
    watcher: &dyn MetadataStore,
    writer: &dyn MetadataStore,
    unseen: Option<&dyn MetadataStore>,
) -> TestResult {
    let Some(mut feed) = watcher.policy_changes().await? else {
        return Ok(());
    };
    if let Some(other) = unseen {
        other.set_policies("namespace:other/x", Some(b"0")).await?;
    }
    writer.set_policies(WRITTEN[0], Some(b"1")).await?;
    assert!(writer.create_policies(WRITTEN[1], b"2").await?);
    assert!(!writer.create_policies(WRITTEN[1], b"3").await?);
    writer.set_policies(WRITTEN[2], None).await?;
    writer.set_policies(WRITTEN[3], Some(b"4")).await?;
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some(WRITTEN[3]) {
        let change = tokio::time::timeout(WAIT, feed.next())
            .await
            .map_err(|_| format!("no report within {WAIT:?}; seen {seen:?}"))?
            .ok_or("the feed ended")?;
        seen.push(change.scope);
    }
    assert!(
        !seen.iter().any(|s| s == "namespace:other/x"),
        "another store's write was reported: {seen:?}"
    );
    // Extra reports are allowed; every write is reported, in order.
    let mut expected = WRITTEN.iter().peekable();
    for s in &seen {
        if expected.peek().is_some_and(|e| *e == s) {
            expected.next();
        }
    }
    assert!(
        expected.peek().is_none(),
        "not every write was reported in order: {seen:?}"
    );
    Ok(())
}

/// [`policy_feed_reports_writes_of`] with one handle writing and watching.
pub(super) async fn policy_feeds_report_every_write(store: &dyn MetadataStore) -> TestResult {
    policy_feed_reports_writes_of(store, store, None).await
}

#[tokio::test]
async fn sqlite_store_has_no_policies_feed() -> TestResult {
    // Its file is one process's (the data-dir lock): caches written through stay true.
    let dir = tempfile::tempdir()?;
    let s = SqliteMetadataStore::open(&dir.path().join("m.db")).await?;
    assert!(s.policy_changes().await?.is_none());
    Ok(())
}

#[tokio::test]
async fn memory_store_ends_the_feed_of_a_reader_too_far_behind() -> TestResult {
    let s = MemoryMetadataStore::new();
    let mut feed = s
        .policy_changes()
        .await?
        .ok_or("the memory store has a feed")?;
    for i in 0..=changes::FEED_BUFFER {
        s.set_policies(&format!("namespace:t/n{i}"), Some(b"1"))
            .await?;
    }
    let mut reports = 0;
    while feed.next().await.is_some() {
        reports += 1;
    }
    assert_eq!(
        reports,
        changes::FEED_BUFFER,
        "the feed ends rather than skip a write"
    );
    Ok(())
}

#[tokio::test]
async fn etcd_policies_feed_reports_every_handles_writes() -> TestResult {
    let etcd = TestEtcd::start()?;
    let url = etcd.url("/feed");
    let watcher = EtcdMetadataStore::connect(&url).await?;
    let writer = EtcdMetadataStore::connect(&url).await?;
    let other = EtcdMetadataStore::connect(&etcd.url("/feed-other")).await?;
    policy_feed_reports_writes_of(&watcher, &writer, Some(&other)).await
}
