//! One conformance suite for every [`Coordination`] implementation (the contract in `mod.rs`).
//! Each check gets two handles with sessions of their own on one fresh store.

use std::time::Duration;

use super::etcd::EtcdCoordination;
use super::memory::MemoryCoordination;
use super::test_etcd::TestEtcd;
use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn next(watch: &mut Watch) -> Result<WatchEvent, Box<dyn std::error::Error>> {
    Ok(tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .map_err(|_| "no watch event within 10 s")?
        .ok_or("the watch ended")?)
}

async fn compare_and_set_applies_only_when_expected(a: &dyn Coordination) -> TestResult {
    let v1 = a.put("owner/t1", b"n1", Expect::Absent, false).await?;
    assert!(v1 > 0);
    let again = a.put("owner/t1", b"n2", Expect::Absent, false).await;
    assert!(matches!(again, Err(CoordError::Conflict { found: Some(v), .. }) if v == v1));
    let stale = a
        .put("owner/t1", b"n2", Expect::Version(v1 + 100), false)
        .await;
    assert!(matches!(stale, Err(CoordError::Conflict { .. })));
    let got = a.get("owner/t1").await?.ok_or("lost")?;
    assert_eq!((got.value.as_slice(), got.version), (&b"n1"[..], v1));
    let v2 = a.put("owner/t1", b"n2", Expect::Version(v1), false).await?;
    assert!(v2 > v1);
    assert!(matches!(
        a.delete("owner/t1", Expect::Version(v1)).await,
        Err(CoordError::Conflict { .. })
    ));
    assert!(a.delete("owner/t1", Expect::Version(v2)).await?);
    assert!(a.get("owner/t1").await?.is_none());
    assert!(!a.delete("owner/t1", Expect::Any).await?);
    assert!(matches!(
        a.put("owner/t1", b"x", Expect::Version(v2), false).await,
        Err(CoordError::Conflict { found: None, .. })
    ));
    Ok(())
}

async fn one_of_concurrent_writers_wins(a: &dyn Coordination, b: &dyn Coordination) -> TestResult {
    let base = a.put("epoch", b"0", Expect::Absent, false).await?;
    let (x, y) = tokio::join!(
        a.put("epoch", b"a", Expect::Version(base), false),
        b.put("epoch", b"b", Expect::Version(base), false),
    );
    assert!(x.is_ok() != y.is_ok(), "exactly one wins: {x:?} {y:?}");
    Ok(())
}

async fn lists_are_ordered_and_versioned(a: &dyn Coordination) -> TestResult {
    a.put("nodes/b", b"2", Expect::Any, false).await?;
    a.put("nodes/a", b"1", Expect::Any, false).await?;
    let last = a.put("other/x", b"3", Expect::Any, false).await?;
    let (items, at) = a.list("nodes/").await?;
    let keys: Vec<&str> = items.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, vec!["nodes/a", "nodes/b"]);
    assert!(at >= last, "listed at {at}, last write {last}");
    assert!(items.iter().all(|(_, v)| v.version <= at));
    Ok(())
}

async fn watches_deliver_every_change_after_a_version(
    a: &dyn Coordination,
    b: &dyn Coordination,
) -> TestResult {
    a.put("w/before", b"0", Expect::Any, false).await?;
    let (_, at) = a.list("w/").await?;
    let mut live = b.watch("w/", at).await?;
    let v1 = a.put("w/one", b"1", Expect::Absent, false).await?;
    a.put("elsewhere", b"x", Expect::Any, false).await?;
    let v2 = a.put("w/one", b"2", Expect::Version(v1), false).await?;
    let v3 = a.put("w/two", b"3", Expect::Any, false).await?;
    a.delete("w/one", Expect::Any).await?;
    let expected = vec![
        WatchEvent::Put {
            key: "w/one".into(),
            value: b"1".to_vec(),
            version: v1,
        },
        WatchEvent::Put {
            key: "w/one".into(),
            value: b"2".to_vec(),
            version: v2,
        },
        WatchEvent::Put {
            key: "w/two".into(),
            value: b"3".to_vec(),
            version: v3,
        },
    ];
    for want in &expected {
        assert_eq!(&next(&mut live).await?, want);
    }
    assert!(
        matches!(next(&mut live).await?, WatchEvent::Delete { ref key, version } if key == "w/one" && version > v3)
    );
    // A watch that starts in the past replays the same changes.
    let mut replay = a.watch("w/", at).await?;
    for want in &expected {
        assert_eq!(&next(&mut replay).await?, want);
    }
    Ok(())
}

async fn closing_a_session_removes_its_ephemeral_keys(
    a: &dyn Coordination,
    b: &dyn Coordination,
) -> TestResult {
    a.put("members/a", b"addr-a", Expect::Absent, true).await?;
    a.put("durable", b"stays", Expect::Absent, false).await?;
    b.put("members/b", b"addr-b", Expect::Absent, true).await?;
    let (_, at) = b.list("members/").await?;
    let mut seen = b.watch("members/", at).await?;
    assert_eq!(*a.session().borrow(), SessionState::Live);
    a.close().await?;
    assert_eq!(*a.session().borrow(), SessionState::Closed);
    assert!(
        matches!(next(&mut seen).await?, WatchEvent::Delete { ref key, .. } if key == "members/a")
    );
    let (items, _) = b.list("members/").await?;
    assert_eq!(items.len(), 1, "only b's member key is left");
    assert!(
        b.get("durable").await?.is_some(),
        "durable keys outlive sessions"
    );
    assert!(matches!(
        a.put("members/a", b"again", Expect::Any, true).await,
        Err(CoordError::SessionEnded(SessionState::Closed))
    ));
    Ok(())
}

async fn ending_another_session_removes_its_keys(
    a: &dyn Coordination,
    b: &dyn Coordination,
) -> TestResult {
    let va = a.put("members/a", b"addr-a", Expect::Absent, true).await?;
    a.put("owners/t", b"a", Expect::Absent, true).await?;
    a.put("durable", b"stays", Expect::Absent, false).await?;
    b.put("members/b", b"addr-b", Expect::Absent, true).await?;
    assert!(matches!(
        b.end_session_of("members/a", Expect::Version(va + 100))
            .await,
        Err(CoordError::Conflict { .. })
    ));
    assert!(!b.end_session_of("durable", Expect::Any).await?);
    assert!(!b.end_session_of("absent", Expect::Any).await?);
    assert!(
        a.get("members/a").await?.is_some(),
        "refused ends end nothing"
    );
    let mut state = a.session();
    assert!(b.end_session_of("members/a", Expect::Version(va)).await?);
    for key in ["members/a", "owners/t"] {
        assert!(b.get(key).await?.is_none(), "{key} went with its session");
    }
    assert!(b.get("durable").await?.is_some());
    assert!(b.get("members/b").await?.is_some(), "other sessions stand");
    tokio::time::timeout(
        Duration::from_secs(10),
        state.wait_for(|s| *s == SessionState::Lost),
    )
    .await??;
    assert!(matches!(
        a.put("members/a", b"again", Expect::Any, true).await,
        Err(CoordError::SessionEnded(SessionState::Lost))
    ));
    b.put("owners/t", b"b", Expect::Absent, true).await?;
    Ok(())
}

/// How many checks [`run_all`] makes; each gets a pair of handles on a store of its own.
const CHECKS: usize = 6;

type Handle = Box<dyn Coordination>;

async fn run_all(mut pairs: Vec<(Handle, Handle)>) -> TestResult {
    assert_eq!(pairs.len(), CHECKS, "one fresh store per check");
    pairs.reverse();
    let mut pair = || pairs.pop().ok_or("run_all: out of stores");
    let (a, _) = pair()?;
    compare_and_set_applies_only_when_expected(&*a).await?;
    let (a, b) = pair()?;
    one_of_concurrent_writers_wins(&*a, &*b).await?;
    let (a, _) = pair()?;
    lists_are_ordered_and_versioned(&*a).await?;
    let (a, b) = pair()?;
    watches_deliver_every_change_after_a_version(&*a, &*b).await?;
    let (a, b) = pair()?;
    closing_a_session_removes_its_ephemeral_keys(&*a, &*b).await?;
    let (a, b) = pair()?;
    ending_another_session_removes_its_keys(&*a, &*b).await?;
    assert!(
        pair().is_err(),
        "every store was used: CHECKS is out of date"
    );
    Ok(())
}

#[tokio::test]
async fn memory_coordination_conforms() -> TestResult {
    let pairs = (0..CHECKS)
        .map(|_| {
            let a = MemoryCoordination::new();
            let b = a.new_session();
            (Box::new(a) as Handle, Box::new(b) as Handle)
        })
        .collect();
    run_all(pairs).await
}

#[tokio::test]
async fn etcd_coordination_conforms() -> TestResult {
    let etcd = TestEtcd::start()?;
    let client =
        etcd_client::Client::connect([format!("http://{}", etcd.client_addr)], None).await?;
    let mut pairs = Vec::new();
    for i in 0..CHECKS {
        let root = format!("/coord{i}");
        let ttl = Duration::from_secs(5);
        let a = EtcdCoordination::start(client.clone(), &root, ttl).await?;
        let b = EtcdCoordination::start(client.clone(), &root, ttl).await?;
        pairs.push((Box::new(a) as Handle, Box::new(b) as Handle));
    }
    run_all(pairs).await
}

/// A node that stops renewing (hung, partitioned) learns it lost its session before etcd
/// drops its ephemeral keys, and the keys go within the time-to-live.
#[tokio::test]
async fn an_unrenewed_etcd_session_is_lost_before_its_keys_expire() -> TestResult {
    let etcd = TestEtcd::start()?;
    let client =
        etcd_client::Client::connect([format!("http://{}", etcd.client_addr)], None).await?;
    let ttl = Duration::from_secs(3);
    let a = EtcdCoordination::start(client.clone(), "/lease", ttl).await?;
    let b = EtcdCoordination::start(client.clone(), "/lease", ttl).await?;
    a.put("owner", b"a", Expect::Absent, true).await?;
    // Renewals keep it alive well past one time-to-live.
    tokio::time::sleep(ttl * 2).await;
    assert_eq!(*a.session().borrow(), SessionState::Live);
    assert!(b.get("owner").await?.is_some());

    let mut state = a.session();
    a.stop_renewing();
    let stopped = tokio::time::Instant::now();
    tokio::time::timeout(ttl, state.wait_for(|s| *s == SessionState::Lost)).await??;
    let lost_after = stopped.elapsed();
    assert!(
        b.get("owner").await?.is_some(),
        "lost reported after {lost_after:?}, but the key was already gone"
    );
    let deadline = stopped + ttl + Duration::from_secs(3);
    while b.get("owner").await?.is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the key outlived its lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(matches!(
        a.put("owner", b"a", Expect::Any, true).await,
        Err(CoordError::SessionEnded(SessionState::Lost))
    ));
    // Another session can now claim what the lost one held.
    b.put("owner", b"b", Expect::Absent, true).await?;
    Ok(())
}
