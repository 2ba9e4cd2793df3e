//! One conformance suite for every [`MetadataStore`] implementation (the contract in `mod.rs`).

use super::etcd::EtcdMetadataStore;
use super::memory::MemoryMetadataStore;
use super::sqlite::SqliteMetadataStore;
use super::*;
use crate::coord::test_etcd::TestEtcd;

mod feeds;
mod policies;
mod replicated;

use feeds::policy_feeds_report_every_write;
use policies::{policies_are_created_once_and_listed_by_prefix, policies_are_replaced_and_removed};
use replicated::{
    open_ledgers_change_ensemble_until_fenced, replicated_ledgers_keep_their_ensemble,
    sealed_ledgers_copies_move_by_compare_and_set,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(super) fn seal(n: u64) -> SealInfo {
    SealInfo {
        entry_count: n,
        size_bytes: n * 10,
        min_publish_ms: Some(1),
        max_publish_ms: Some(2),
        last_segment: 3,
        checksum: 0xdead_beef,
    }
}

async fn topics_are_idempotent_and_increasing(store: &dyn MetadataStore) -> TestResult {
    let a = store.get_or_create_topic("persistent://t/n/a", 5).await?;
    let b = store.get_or_create_topic("persistent://t/n/b", 6).await?;
    let a2 = store.get_or_create_topic("persistent://t/n/a", 7).await?;
    assert_eq!(a, a2, "get_or_create must return the existing topic");
    assert_eq!(
        store.get_topic("persistent://t/n/a").await?,
        Some(a.clone())
    );
    assert_eq!(store.get_topic("persistent://t/n/none").await?, None);
    assert_eq!(store.get_topic_by_id(b.id).await?, Some(b.clone()));
    assert_eq!(store.get_topic_by_id(b.id + 1000).await?, None);
    assert!(b.id > a.id);
    let names: Vec<_> = store
        .list_topics()
        .await?
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, vec!["persistent://t/n/a", "persistent://t/n/b"]);
    Ok(())
}

async fn ledger_ids_increase_and_lifecycle_is_enforced(store: &dyn MetadataStore) -> TestResult {
    assert_eq!(store.last_ledger_id().await?, 0, "no ledger yet");
    let t = store.get_or_create_topic("x", 0).await?;
    let l1 = store.create_ledger(t.id, 4, "b1", 10, None).await?;
    assert_eq!(store.last_ledger_id().await?, l1.id);
    let l2 = store.create_ledger(t.id, 4, "b2", 11, None).await?;
    assert!(l2.id > l1.id);
    assert_eq!(store.last_ledger_id().await?, l2.id);
    // Several records at once: those that exist, by id, as one by one.
    let both = store.get_ledgers(&[l2.id, l2.id + 1000, l1.id]).await?;
    assert_eq!(
        both.iter().map(|l| l.id).collect::<Vec<_>>(),
        [l1.id, l2.id]
    );
    assert_eq!(Some(&both[1]), store.get_ledger(l2.id).await?.as_ref());
    assert!(store.get_ledgers(&[]).await?.is_empty());
    // Each ledger keeps the bookie that holds it.
    assert_eq!((l1.bookie.as_str(), l2.bookie.as_str()), ("b1", "b2"));
    assert_eq!(
        store.get_ledger(l2.id).await?.map(|l| l.bookie),
        Some("b2".to_string())
    );
    assert_eq!(l1.state, LedgerState::Open);
    assert!(store
        .create_ledger(t.id + 1000, 0, "b1", 0, None)
        .await
        .is_err());

    // Open → Offloaded is not allowed and changes nothing.
    let err = store
        .transition_ledger(
            l1.id,
            LedgerTransition::Offload {
                reference: "x".into(),
            },
            12,
        )
        .await;
    assert!(matches!(err, Err(MetadataError::InvalidTransition { .. })));
    assert_eq!(
        store.get_ledger(l1.id).await?.map(|l| l.state),
        Some(LedgerState::Open)
    );

    let sealed = store
        .transition_ledger(l1.id, LedgerTransition::Seal(seal(5)), 13)
        .await?;
    assert_eq!(sealed.state, LedgerState::Sealed);
    assert_eq!(sealed.seal, Some(seal(5)));
    // Sealing twice fails.
    assert!(store
        .transition_ledger(l1.id, LedgerTransition::Seal(seal(6)), 14)
        .await
        .is_err());
    let off = store
        .transition_ledger(
            l1.id,
            LedgerTransition::Offload {
                reference: "snap-1".into(),
            },
            15,
        )
        .await?;
    assert_eq!(off.offload_ref.as_deref(), Some("snap-1"));
    let del = store
        .transition_ledger(l1.id, LedgerTransition::Delete, 16)
        .await?;
    assert_eq!(del.state, LedgerState::Deleted);
    assert_eq!(del.seal, Some(seal(5)), "seal info is kept after deletion");
    assert_eq!(del.state_changed_at_ms, 16);
    assert!(store
        .transition_ledger(l1.id, LedgerTransition::Delete, 17)
        .await
        .is_err());
    assert!(matches!(
        store
            .transition_ledger(999_999, LedgerTransition::Delete, 0)
            .await,
        Err(MetadataError::LedgerNotFound(999_999))
    ));

    // A new ledger after deletion never reuses an id.
    let l3 = store.create_ledger(t.id, 5, "b1", 18, None).await?;
    assert!(l3.id > l2.id);

    let listed: Vec<_> = store
        .topic_ledgers(t.id)
        .await?
        .iter()
        .map(|l| (l.id, l.bookie.clone()))
        .collect();
    assert_eq!(
        listed,
        vec![
            (l1.id, "b1".into()),
            (l2.id, "b2".into()),
            (l3.id, "b1".into())
        ]
    );
    let open: Vec<_> = store
        .ledgers_in_states(&[LedgerState::Open])
        .await?
        .iter()
        .map(|l| l.id)
        .collect();
    assert_eq!(open, vec![l2.id, l3.id]);
    assert!(store.ledgers_in_states(&[]).await?.is_empty());
    Ok(())
}

async fn ledgers_expire_from_every_closed_state(store: &dyn MetadataStore) -> TestResult {
    let t = store.get_or_create_topic("y", 0).await?;
    // Sealed → Deleted (local deletion without a lake copy).
    let l = store.create_ledger(t.id, 0, "b1", 0, None).await?;
    store
        .transition_ledger(l.id, LedgerTransition::Seal(seal(0)), 1)
        .await?;
    let d = store
        .transition_ledger(l.id, LedgerTransition::Delete, 2)
        .await?;
    assert_eq!(d.state, LedgerState::Deleted);
    // Sealed, Offloaded and Deleted ledgers can expire; an open one cannot.
    let open = store.create_ledger(t.id, 0, "b1", 3, None).await?;
    assert!(matches!(
        store
            .transition_ledger(open.id, LedgerTransition::Expire, 4)
            .await,
        Err(MetadataError::InvalidTransition { .. })
    ));
    store
        .transition_ledger(open.id, LedgerTransition::Seal(seal(2)), 5)
        .await?;
    let sealed_expired = store
        .transition_ledger(open.id, LedgerTransition::Expire, 6)
        .await?;
    assert_eq!(sealed_expired.state, LedgerState::Expired);
    assert_eq!(sealed_expired.seal, Some(seal(2)), "seal info is kept");
    let e = store
        .transition_ledger(l.id, LedgerTransition::Expire, 7)
        .await?;
    assert_eq!(e.state, LedgerState::Expired);
    let o = store.create_ledger(t.id, 0, "b1", 8, None).await?;
    store
        .transition_ledger(o.id, LedgerTransition::Seal(seal(3)), 9)
        .await?;
    store
        .transition_ledger(
            o.id,
            LedgerTransition::Offload {
                reference: "s".into(),
            },
            10,
        )
        .await?;
    store
        .transition_ledger(o.id, LedgerTransition::Expire, 11)
        .await?;
    // Expired is final.
    for tr in [LedgerTransition::Delete, LedgerTransition::Expire] {
        assert!(matches!(
            store.transition_ledger(o.id, tr, 12).await,
            Err(MetadataError::InvalidTransition { .. })
        ));
    }
    // Expired ledgers stay listed and do not block deleting the topic.
    let states: Vec<_> = store
        .topic_ledgers(t.id)
        .await?
        .iter()
        .map(|l| l.state)
        .collect();
    assert_eq!(states, vec![LedgerState::Expired; 3]);
    assert!(store.delete_topic("y").await?);
    Ok(())
}

async fn concurrent_creates_get_distinct_ids(
    store: std::sync::Arc<dyn MetadataStore>,
) -> TestResult {
    let t = store.get_or_create_topic("z", 0).await?;
    let mut tasks = Vec::new();
    for i in 0..32 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            s.create_ledger(t.id, 0, "b1", i, None).await
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await??.id);
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 32);
    // More ids than one batched read takes; an id given three times is answered three times.
    let thrice: Vec<_> = ids.iter().chain(&ids).chain(&ids).copied().collect();
    let records = store.get_ledgers(&thrice).await?;
    let got: Vec<_> = records.iter().map(|r| r.id).collect();
    let expected: Vec<_> = ids.iter().flat_map(|id| [*id; 3]).collect();
    assert_eq!(got, expected);
    assert!(records.iter().all(|r| r.topic_id == t.id));
    Ok(())
}

async fn cursors_are_saved_whole_and_deleted(store: &dyn MetadataStore) -> TestResult {
    let t = store.get_or_create_topic("c", 0).await?;
    let other = store.get_or_create_topic("d", 0).await?;
    assert!(store.topic_cursors(t.id).await?.is_empty());
    store.save_cursor(t.id, "b", b"one", 1, None).await?;
    store.save_cursor(t.id, "a", b"two", 2, None).await?;
    store.save_cursor(t.id, "b", b"three", 3, None).await?;
    store.save_cursor(other.id, "a", b"other", 4, None).await?;
    assert_eq!(
        store.topic_cursors(t.id).await?,
        vec![
            ("a".to_string(), b"two".to_vec()),
            ("b".to_string(), b"three".to_vec())
        ]
    );
    store.delete_cursor(t.id, "a", None).await?;
    store.delete_cursor(t.id, "missing", None).await?;
    assert_eq!(
        store.topic_cursors(t.id).await?,
        vec![("b".to_string(), b"three".to_vec())]
    );
    assert!(store
        .save_cursor(t.id + 1000, "x", b"", 5, None)
        .await
        .is_err());
    Ok(())
}

async fn partitioned_topics_are_created_once_and_only_grow(
    store: &dyn MetadataStore,
) -> TestResult {
    let name = "persistent://t/n/p";
    assert_eq!(store.get_partitions(name).await?, None);
    assert!(
        store.set_partitions(name, 4, true).await.is_err(),
        "update of a missing topic"
    );
    store.set_partitions(name, 4, false).await?;
    assert_eq!(store.get_partitions(name).await?, Some(4));
    assert!(matches!(
        store.set_partitions(name, 8, false).await,
        Err(MetadataError::Conflict(_))
    ));
    assert!(
        store.set_partitions(name, 2, true).await.is_err(),
        "shrinking"
    );
    assert!(store
        .set_partitions("persistent://t/n/z", 0, false)
        .await
        .is_err());
    store.set_partitions(name, 6, true).await?;
    assert_eq!(store.get_partitions(name).await?, Some(6));
    Ok(())
}

async fn schema_versions_are_dense_and_first_writer_wins(store: &dyn MetadataStore) -> TestResult {
    let t = "persistent://t/n/s";
    assert!(store.schemas(t).await?.is_empty());
    assert!(
        store.add_schema(t, 1, b"x").await.is_err(),
        "versions start at 0"
    );
    store.add_schema(t, 0, b"v0").await?;
    assert!(matches!(
        store.add_schema(t, 0, b"other").await,
        Err(MetadataError::Conflict(_))
    ));
    store.add_schema(t, 1, b"v1").await?;
    assert_eq!(
        store.schemas(t).await?,
        vec![(0, b"v0".to_vec()), (1, b"v1".to_vec())]
    );
    assert!(store.schemas("persistent://t/n/other").await?.is_empty());
    Ok(())
}

async fn partitioned_topics_are_listed_by_prefix(store: &dyn MetadataStore) -> TestResult {
    store.set_partitions("persistent://a/n/x", 2, false).await?;
    store.set_partitions("persistent://a/n/y", 3, false).await?;
    store
        .set_partitions("persistent://a/n2/z", 1, false)
        .await?;
    assert_eq!(
        store.list_partitioned_topics("persistent://a/n/").await?,
        [
            ("persistent://a/n/x".to_string(), 2),
            ("persistent://a/n/y".to_string(), 3)
        ]
    );
    assert_eq!(store.list_partitioned_topics("").await?.len(), 3);
    assert!(store
        .list_partitioned_topics("persistent://b/")
        .await?
        .is_empty());
    Ok(())
}

async fn topics_are_listed_by_prefix(store: &dyn MetadataStore) -> TestResult {
    // Created out of name order, with a sibling namespace that shares the prefix's text up to
    // its last character, and names just past the range's end.
    for name in [
        "persistent://a/n/y",
        "persistent://a/n2/z",
        "persistent://a/n/x-partition-1",
        "persistent://a/n/x",
        "persistent://a/n/x-partition-0",
        "persistent://a/n0/w",
        "persistent://a/m/v",
        "persistent://a/n/\u{e9}t\u{e9}",
    ] {
        store.get_or_create_topic(name, 1).await?;
    }
    let names = |v: Vec<TopicRecord>| v.into_iter().map(|t| t.name).collect::<Vec<_>>();
    assert_eq!(
        names(store.list_topics_under("persistent://a/n/").await?),
        [
            "persistent://a/n/x",
            "persistent://a/n/x-partition-0",
            "persistent://a/n/x-partition-1",
            "persistent://a/n/y",
            "persistent://a/n/\u{e9}t\u{e9}",
        ]
    );
    assert_eq!(
        names(store.list_topics_under("persistent://a/n/x").await?),
        [
            "persistent://a/n/x",
            "persistent://a/n/x-partition-0",
            "persistent://a/n/x-partition-1",
        ]
    );
    assert_eq!(
        names(store.list_topics_under("persistent://a/n/\u{e9}").await?),
        ["persistent://a/n/\u{e9}t\u{e9}"]
    );
    assert_eq!(store.list_topics_under("").await?.len(), 8);
    assert!(store.list_topics_under("persistent://b/").await?.is_empty());
    let first = |v: Option<TopicRecord>| v.map(|t| t.name);
    assert_eq!(
        first(store.first_topic_from("").await?).as_deref(),
        Some("persistent://a/m/v")
    );
    assert_eq!(
        first(store.first_topic_from("persistent://a/n/x-").await?).as_deref(),
        Some("persistent://a/n/x-partition-0")
    );
    assert_eq!(
        first(store.first_topic_from("persistent://a/n2/z").await?).as_deref(),
        Some("persistent://a/n2/z")
    );
    assert_eq!(
        first(store.first_topic_from("persistent://a/n2/z\u{1}").await?),
        None
    );
    // A listing by prefix carries the same records as the walk over every topic.
    let mut all = store.list_topics().await?;
    all.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(store.list_topics_under("").await?, all);
    Ok(())
}

async fn topics_are_deleted_only_without_live_ledgers(store: &dyn MetadataStore) -> TestResult {
    let t = store.get_or_create_topic("gone", 0).await?;
    let keep = store.get_or_create_topic("kept", 0).await?;
    let l = store.create_ledger(t.id, 0, "b1", 0, None).await?;
    let k = store.create_ledger(keep.id, 0, "b1", 0, None).await?;
    store.save_cursor(t.id, "s", b"x", 1, None).await?;
    store.save_cursor(keep.id, "s", b"y", 1, None).await?;
    store.add_schema("gone", 0, b"schema").await?;
    store.set_partitions("gone", 2, false).await?;
    // An open ledger blocks the deletion and nothing changes.
    assert!(matches!(
        store.delete_topic("gone").await,
        Err(MetadataError::Conflict(_))
    ));
    assert_eq!(store.topic_cursors(t.id).await?.len(), 1);
    store
        .transition_ledger(l.id, LedgerTransition::Seal(seal(1)), 2)
        .await?;
    store
        .transition_ledger(l.id, LedgerTransition::Delete, 3)
        .await?;
    assert!(store.delete_topic("gone").await?);
    assert!(!store.delete_topic("gone").await?);
    // Read after the deletion, the last ledger id bounds every ledger the topic had (no
    // ledger can be made for it any more), and a later topic of the name gets higher ids.
    let bound = store.last_ledger_id().await?;
    assert!(
        bound >= l.id.max(k.id),
        "{bound} below {} or {}",
        l.id,
        k.id
    );
    assert!(store.create_ledger(t.id, 0, "b1", 4, None).await.is_err());
    assert_eq!(store.last_ledger_id().await?, bound);
    let names: Vec<String> = store
        .list_topics()
        .await?
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, vec!["kept".to_string()]);
    assert!(store.get_ledger(l.id).await?.is_none());
    assert!(store.schemas("gone").await?.is_empty());
    assert_eq!(store.get_partitions("gone").await?, None);
    // The other topic is untouched; a new topic of the old name has a new id.
    assert_eq!(store.topic_cursors(keep.id).await?.len(), 1);
    assert!(store.get_ledger(k.id).await?.is_some());
    let again = store.get_or_create_topic("gone", 4).await?;
    assert_ne!(again.id, t.id);
    assert!(store.create_ledger(again.id, 0, "b1", 5, None).await?.id > bound);
    assert!(store.topic_cursors(again.id).await?.is_empty());
    Ok(())
}

/// How many checks [`run_all`] makes; each gets a store of its own.
const CHECKS: usize = 17;

/// A topic's writers are fenced by epoch: ledger creation, cursor saves and deletes.
async fn writers_are_fenced_by_epoch(store: &dyn MetadataStore) -> TestResult {
    let t = store
        .get_or_create_topic("persistent://t/n/fenced", 0)
        .await?;
    let other = store
        .get_or_create_topic("persistent://t/n/free", 0)
        .await?;
    store.create_ledger(t.id, 0, "b1", 1, Some(1)).await?;
    store.fence_writers(t.id, 5).await?;
    store.fence_writers(t.id, 5).await?;
    let fenced = |r: Result<LedgerRecord, MetadataError>, at: u64| match r {
        Err(MetadataError::Fenced { fenced_at, .. }) => assert_eq!(fenced_at, at),
        other => panic!("expected a fenced writer, got {other:?}"),
    };
    let before = store.topic_ledgers(t.id).await?.len();
    fenced(store.create_ledger(t.id, 0, "b1", 2, Some(4)).await, 5);
    assert_eq!(
        store.topic_ledgers(t.id).await?.len(),
        before,
        "nothing created"
    );
    store.create_ledger(t.id, 0, "b2", 3, Some(5)).await?;
    store.create_ledger(t.id, 0, "b2", 3, Some(6)).await?;
    store.create_ledger(t.id, 0, "b2", 3, None).await?;
    assert!(matches!(
        store.fence_writers(t.id, 3).await,
        Err(MetadataError::Fenced {
            epoch: 3,
            fenced_at: 5,
            ..
        })
    ));
    store.fence_writers(t.id, 9).await?;
    fenced(store.create_ledger(t.id, 0, "b2", 4, Some(5)).await, 9);
    // A superseded writer's cursor save is refused and stores nothing; the current writer's,
    // a newer one's and an unfenced save go through.
    store.save_cursor(t.id, "s", b"at 9", 1, Some(9)).await?;
    match store.save_cursor(t.id, "s", b"at 5", 2, Some(5)).await {
        Err(MetadataError::Fenced { fenced_at: 9, .. }) => {}
        other => panic!("expected a fenced cursor save, got {other:?}"),
    }
    assert_eq!(
        store.topic_cursors(t.id).await?,
        vec![("s".to_string(), b"at 9".to_vec())]
    );
    store.save_cursor(t.id, "s", b"at 10", 3, Some(10)).await?;
    store.save_cursor(t.id, "s", b"any", 4, None).await?;
    // Nor may it delete one (an unsubscribe, deduplication turned off); the current writer
    // may, and a missing topic has nothing to delete.
    assert!(matches!(
        store.delete_cursor(t.id, "s", Some(5)).await,
        Err(MetadataError::Fenced { fenced_at: 9, .. })
    ));
    assert_eq!(store.topic_cursors(t.id).await?.len(), 1, "nothing deleted");
    store.delete_cursor(t.id, "s", Some(10)).await?;
    assert!(store.topic_cursors(t.id).await?.is_empty());
    store.delete_cursor(t.id + 1000, "s", Some(1)).await?;
    // A topic never fenced takes any writer's save; a missing topic's save is refused.
    store
        .save_cursor(other.id, "s", b"free", 5, Some(3))
        .await?;
    assert_eq!(store.topic_cursors(other.id).await?.len(), 1);
    assert!(matches!(
        store
            .save_cursor(t.id + 1000, "s", b"gone", 6, Some(1))
            .await,
        Err(MetadataError::TopicNotFound(_))
    ));
    // Fences are per topic; a missing topic is named.
    store.create_ledger(other.id, 0, "b1", 5, Some(1)).await?;
    assert!(matches!(
        store.fence_writers(t.id + 1000, 1).await,
        Err(MetadataError::TopicNotFound(_))
    ));
    Ok(())
}

/// Runs every check, each against its own fresh store from `stores` (exactly [`CHECKS`] of
/// them, so no check can silently run against another implementation).
async fn run_all(stores: Vec<std::sync::Arc<dyn MetadataStore>>) -> TestResult {
    assert_eq!(stores.len(), CHECKS, "one fresh store per check");
    let mut next = stores.into_iter();
    let mut store = || next.next().ok_or("run_all: out of stores");
    topics_are_idempotent_and_increasing(&*store()?).await?;
    ledger_ids_increase_and_lifecycle_is_enforced(&*store()?).await?;
    ledgers_expire_from_every_closed_state(&*store()?).await?;
    concurrent_creates_get_distinct_ids(store()?).await?;
    cursors_are_saved_whole_and_deleted(&*store()?).await?;
    partitioned_topics_are_created_once_and_only_grow(&*store()?).await?;
    schema_versions_are_dense_and_first_writer_wins(&*store()?).await?;
    policies_are_replaced_and_removed(&*store()?).await?;
    policies_are_created_once_and_listed_by_prefix(&*store()?).await?;
    partitioned_topics_are_listed_by_prefix(&*store()?).await?;
    topics_are_listed_by_prefix(&*store()?).await?;
    topics_are_deleted_only_without_live_ledgers(&*store()?).await?;
    writers_are_fenced_by_epoch(&*store()?).await?;
    replicated_ledgers_keep_their_ensemble(&*store()?).await?;
    sealed_ledgers_copies_move_by_compare_and_set(&*store()?).await?;
    open_ledgers_change_ensemble_until_fenced(&*store()?).await?;
    policy_feeds_report_every_write(&*store()?).await?;
    assert!(
        store().is_err(),
        "every store was used: CHECKS is out of date"
    );
    Ok(())
}

#[tokio::test]
async fn memory_store_conforms() -> TestResult {
    let stores = (0..CHECKS)
        .map(|_| {
            std::sync::Arc::new(MemoryMetadataStore::new()) as std::sync::Arc<dyn MetadataStore>
        })
        .collect();
    run_all(stores).await
}

#[tokio::test]
async fn sqlite_store_conforms() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut stores: Vec<std::sync::Arc<dyn MetadataStore>> = Vec::new();
    for i in 0..CHECKS {
        let store = SqliteMetadataStore::open(&dir.path().join(format!("m{i}.db"))).await?;
        stores.push(std::sync::Arc::new(store));
    }
    run_all(stores).await
}

#[tokio::test]
async fn sqlite_store_survives_reopen() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("meta.db");
    let (topic, ledger) = {
        let s = SqliteMetadataStore::open(&path).await?;
        let t = s.get_or_create_topic("persist", 1).await?;
        let l = s.create_ledger(t.id, 2, "b1", 3, None).await?;
        s.transition_ledger(l.id, LedgerTransition::Seal(seal(9)), 4)
            .await?;
        s.close().await;
        (t, l)
    };
    let s = SqliteMetadataStore::open(&path).await?;
    assert_eq!(s.list_topics().await?, vec![topic.clone()]);
    let l = s.get_ledger(ledger.id).await?.ok_or("ledger lost")?;
    assert_eq!(l.state, LedgerState::Sealed);
    assert_eq!(l.seal, Some(seal(9)));
    let l2 = s.create_ledger(topic.id, 0, "b1", 5, None).await?;
    assert!(l2.id > ledger.id, "ids keep increasing across reopen");
    Ok(())
}

#[tokio::test]
async fn sqlite_store_made_before_bookie_ids_is_upgraded_in_place() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("old.db");
    let ledger = {
        let s = SqliteMetadataStore::open(&path).await?;
        let t = s.get_or_create_topic("old", 1).await?;
        let l = s.create_ledger(t.id, 0, "gone", 2, None).await?;
        s.close().await;
        l
    };
    // Make the file look like one written before ADR 0007: no `bookie` column.
    {
        use sqlx::ConnectOptions;
        let mut c = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .connect()
            .await?;
        sqlx::query("ALTER TABLE ll_ledgers DROP COLUMN bookie")
            .execute(&mut c)
            .await?;
    }
    let s = SqliteMetadataStore::open(&path).await?;
    let l = s.get_ledger(ledger.id).await?.ok_or("ledger lost")?;
    assert_eq!(
        l.bookie, "",
        "a ledger from before bookie ids is the local node's"
    );
    let t = s.get_or_create_topic("old", 3).await?;
    assert_eq!(s.create_ledger(t.id, 0, "b9", 4, None).await?.bookie, "b9");
    Ok(())
}

#[tokio::test]
async fn etcd_store_conforms() -> TestResult {
    let etcd = TestEtcd::start()?;
    let mut stores: Vec<std::sync::Arc<dyn MetadataStore>> = Vec::new();
    for i in 0..CHECKS {
        let store = EtcdMetadataStore::connect(&etcd.url(&format!("/check{i}"))).await?;
        stores.push(std::sync::Arc::new(store));
    }
    run_all(stores).await
}

#[tokio::test]
async fn etcd_store_survives_reconnect_and_pages_long_listings() -> TestResult {
    let etcd = TestEtcd::start()?;
    let url = etcd.url("/persist");
    let (topic, ledger) = {
        let s = EtcdMetadataStore::connect(&url).await?;
        let t = s.get_or_create_topic("persist", 1).await?;
        let l = s.create_ledger(t.id, 2, "b1", 3, None).await?;
        s.transition_ledger(l.id, LedgerTransition::Seal(seal(9)), 4)
            .await?;
        (t, l)
    };
    let s = EtcdMetadataStore::connect(&url).await?;
    assert_eq!(s.list_topics().await?, vec![topic.clone()]);
    let l = s.get_ledger(ledger.id).await?.ok_or("ledger lost")?;
    assert_eq!(l.state, LedgerState::Sealed);
    assert_eq!(l.seal, Some(seal(9)));
    let l2 = s.create_ledger(topic.id, 0, "b1", 5, None).await?;
    assert!(l2.id > ledger.id, "ids keep increasing across reconnects");
    // Listings longer than one page (500 keys) come back whole and in order.
    for i in 0..1_003u64 {
        s.create_ledger(topic.id, 0, "b1", i as i64, None).await?;
    }
    let ids: Vec<u64> = s
        .topic_ledgers(topic.id)
        .await?
        .iter()
        .map(|l| l.id)
        .collect();
    assert_eq!(ids.len(), 1_005);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    let open = s.ledgers_in_states(&[LedgerState::Open]).await?;
    assert_eq!(open.len(), 1_004);
    // A store under another prefix of the same etcd sees none of it.
    let other = EtcdMetadataStore::connect(&etcd.url("/persist-other")).await?;
    assert!(other.list_topics().await?.is_empty());
    assert!(other.get_ledger(ledger.id).await?.is_none());
    Ok(())
}

#[tokio::test]
async fn etcd_store_refuses_an_unreachable_server_at_start() -> TestResult {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let started = std::time::Instant::now();
    let result = EtcdMetadataStore::connect(&format!("etcd://127.0.0.1:{port}")).await;
    assert!(result.is_err(), "nothing listens on {port}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    Ok(())
}
