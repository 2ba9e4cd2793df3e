//! Three or four logs on one metadata store, each serving its bookie on 127.0.0.1 and
//! registered as a member with a session of its own: a replicated ledger's entries reach every
//! bookie, a replica that drops out lags behind (or, with a spare bookie, is replaced in the
//! same ledger: `TopicLog::change_ensemble`), and a new owner taking the ledger over after its
//! writer left fences the replicas, ends the ledger at the longest copy and completes the
//! shorter one.

use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::cluster::membership::{tests::record, Membership, NodeRecord};
use crate::config::LedgerConfig;
use crate::coord::memory::MemoryCoordination;
use crate::ledger::metadata::memory::MemoryMetadataStore;
use crate::ledger::{LedgerState, MetadataStore};

pub(super) type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(super) struct Node {
    pub(super) log: Arc<Log>,
    addr: SocketAddr,
    pub(super) stop: CancellationToken,
    pub(super) membership: Arc<Membership>,
    pub(super) dir: tempfile::TempDir,
}

pub(super) async fn node(
    meta: &Arc<dyn MetadataStore>,
    coord: &MemoryCoordination,
    id: &str,
) -> Result<Node, Box<dyn std::error::Error>> {
    node_in(meta, coord, id, tempfile::tempdir()?).await
}

/// [`node`] on data directory `dir` (a node restarting on its disk).
pub(super) async fn node_in(
    meta: &Arc<dyn MetadataStore>,
    coord: &MemoryCoordination,
    id: &str,
    dir: tempfile::TempDir,
) -> Result<Node, Box<dyn std::error::Error>> {
    node_with(meta, coord, id, (dir, LedgerConfig::default()), |client| {
        client
    })
    .await
}

/// [`node_in`] with `config` for its log, the log reading other bookies through `wrap` of the
/// bookie client (a test's fault injection).
pub(super) async fn node_with(
    meta: &Arc<dyn MetadataStore>,
    coord: &MemoryCoordination,
    id: &str,
    (dir, config): (tempfile::TempDir, LedgerConfig),
    wrap: impl FnOnce(Arc<dyn crate::ledger::ReplicaSource>) -> Arc<dyn crate::ledger::ReplicaSource>,
) -> Result<Node, Box<dyn std::error::Error>> {
    let log = Arc::new(Log::open(dir.path(), config, meta.clone()).await?);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    serve(listener, log.clone(), None, None, stop.clone());
    let me = NodeRecord {
        bookie: log.bookie_id().to_string(),
        bookie_addr: Some(addr.to_string()),
        ..record(id)
    };
    let session: Arc<dyn crate::coord::Coordination> = Arc::new(coord.new_session());
    let membership = Arc::new(Membership::join(session, me, std::time::Duration::ZERO).await?);
    log.set_replica_source(wrap(Arc::new(client::BookieClient::new(
        membership.clone(),
        super::dial::Dialer::default(),
    ))));
    Ok(Node {
        log,
        addr,
        stop,
        membership,
        dir,
    })
}

/// Waits until `n` no longer counts bookie `gone` among the members (its copy of the roster
/// follows a watch, so it learns of a leave shortly after).
pub(super) async fn until_gone(n: &Node, gone: &str) -> Result<(), Box<dyn std::error::Error>> {
    for _ in 0..500 {
        if !n.membership.nodes().await?.iter().any(|m| m.bookie == gone) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Err(format!("bookie {gone} is still a member for {}", n.log.bookie_id()).into())
}

async fn entries(n: &Node, topic: &str, ledger: u64, count: u64) -> Result<Vec<Bytes>, ReadError> {
    let mut out = Vec::new();
    while (out.len() as u64) < count {
        let got = n
            .log
            .serve_read(topic, ledger, out.len() as u64, count - 1, 1 << 20)
            .await?;
        out.extend(got.into_iter().map(|e| e.payload));
    }
    Ok(out)
}

/// Waits until every node's bookie confirms `count` entries of `ledger` (a writer acknowledges
/// at its ack quorum; the last replica may still be writing, and a seal then leaves it out).
pub(super) async fn confirmed_everywhere(
    nodes: &[&Node],
    topic: &str,
    ledger: u64,
    count: u64,
) -> TestResult {
    for _ in 0..500 {
        let mut all = true;
        for n in nodes {
            let c = n.log.serve_confirmed(topic, ledger).await;
            all &= c.is_ok_and(|c| c.count >= count);
        }
        if all {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Err(format!("ledger {ledger}: not every bookie confirmed {count} entries").into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_owner_takes_over_ends_at_the_longest_copy_and_completes_the_shorter() -> TestResult {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let coord = MemoryCoordination::new();
    let (w, b, c) = (
        node(&meta, &coord, "w:1").await?,
        node(&meta, &coord, "b:1").await?,
        node(&meta, &coord, "c:1").await?,
    );
    let name = "persistent://t/n/taken";
    let tw = w.log.topic(name).await?;
    let body = |i: u64| Bytes::from(format!("entry {i}"));
    for i in 0..10 {
        tw.append(i as i64, body(i)).await?.durable().await?;
    }
    let ledger = tw.ledgers()[0].id;
    let record = meta.get_ledger(ledger).await?.ok_or("no ledger")?;
    let mut replicas = record.replicas.clone();
    replicas.sort();
    let mut expected = vec![b.log.bookie_id().to_string(), c.log.bookie_id().to_string()];
    expected.sort();
    assert_eq!((replicas, record.ack_quorum), (expected, 2));

    // C's listener stops: entry 10 is acknowledged by W and B only (and C gets nothing more
    // of the ledger).
    c.stop.cancel();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    tw.append(10, body(10)).await?.durable().await?;
    // C serves again (same address), its copy 10 entries long; W leaves the cluster with the
    // ledger open.
    let listener = TcpListener::bind(c.addr).await?;
    let c_stop = CancellationToken::new();
    serve(listener, c.log.clone(), None, None, c_stop.clone());
    w.membership.leave().await?;
    until_gone(&b, w.log.bookie_id()).await?;

    let taken = b.log.take_over_open_ledgers(name).await?;
    assert_eq!(taken.len(), 1);
    let sealed = &taken[0];
    assert_eq!(sealed.state, LedgerState::Sealed);
    assert_eq!(sealed.seal.map(|s| s.entry_count), Some(11));
    assert_eq!(
        sealed.bookie,
        b.log.bookie_id(),
        "the longest copy's bookie"
    );
    assert_eq!(sealed.replicas, vec![c.log.bookie_id().to_string()]);
    // Both copies hold all 11 entries, C's completed by recovery adds.
    let want: Vec<Bytes> = (0..11).map(body).collect();
    assert_eq!(entries(&b, name, ledger, 11).await?, want);
    assert_eq!(entries(&c, name, ledger, 11).await?, want);
    // The old writer's adds to the taken-over ledger are refused by both copies.
    for n in [&b, &c] {
        assert!(n
            .log
            .replica_add(ledger, 11, 0, body(11), false)
            .await
            .is_err());
    }

    for n in [&w, &b, &c] {
        n.stop.cancel();
    }
    c_stop.cancel();
    for n in [w, b, c] {
        n.log.shutdown().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autorecovery_copies_a_lost_bookies_ledgers_checked_against_the_seal() -> TestResult {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let coord = MemoryCoordination::new();
    let mut nodes = Vec::new();
    for id in ["a:1", "b:1", "c:1", "d:1"] {
        nodes.push(node(&meta, &coord, id).await?);
    }
    let name = "persistent://t/n/recopied";
    let writer = &nodes[0];
    let t = writer.log.topic(name).await?;
    let body = |i: u64| Bytes::from(format!("entry {i}"));
    for i in 0..25 {
        t.append(i as i64, body(i)).await?.durable().await?;
    }
    let open = t.ledgers()[0].id;
    let holders: Vec<&Node> = {
        let r = meta.get_ledger(open).await?.ok_or("no ledger")?;
        nodes
            .iter()
            .filter(|n| r.bookies().any(|b| b == n.log.bookie_id()))
            .collect()
    };
    confirmed_everywhere(&holders, name, open, 25).await?;
    let sealed = t.seal_current().await?.ok_or("nothing sealed")?;
    assert_eq!(
        (sealed.bookies().count(), sealed.write_quorum),
        (3, 3),
        "the default ensemble: three of the four bookies"
    );
    let holds =
        |n: &Node, r: &crate::ledger::LedgerRecord| r.bookies().any(|b| b == n.log.bookie_id());
    // A replica's node goes for good; the one bookie not holding the ledger is the target.
    let (lost_at, spare_at) = (
        (1..4)
            .find(|i| holds(&nodes[*i], &sealed))
            .ok_or("no replica")?,
        (1..4)
            .find(|i| !holds(&nodes[*i], &sealed))
            .ok_or("no spare")?,
    );
    let lost = nodes[lost_at].log.bookie_id().to_string();
    nodes[lost_at].stop.cancel();
    nodes[lost_at].membership.leave().await?;
    for n in &nodes {
        if n.log.bookie_id() != lost {
            until_gone(n, &lost).await?;
        }
    }

    // Within the delay nothing is copied; the ledger waits for the missing bookie.
    let config = |delay_ms| crate::config::AutoRecoveryConfig {
        enabled: true,
        delay: std::time::Duration::from_millis(delay_ms),
        audit_interval: std::time::Duration::from_secs(60),
    };
    let spare = &nodes[spare_at];
    let patient = autorecovery::AutoRecovery::new(
        spare.log.clone(),
        spare.membership.clone(),
        config(60_000),
    );
    assert_eq!(patient.pass().await?, 0);
    let status = patient.status();
    assert_eq!(status.under_replicated.len(), 1);
    assert_eq!(status.under_replicated[0].waiting_for, vec![lost.clone()]);

    // Past the delay, only the target copies: every other node's pass makes nothing.
    for (i, n) in nodes.iter().enumerate() {
        if i == spare_at || i == lost_at {
            continue;
        }
        let ar = autorecovery::AutoRecovery::new(n.log.clone(), n.membership.clone(), config(0));
        assert_eq!(ar.pass().await?, 0, "node {i} is not the target");
    }
    let eager =
        autorecovery::AutoRecovery::new(spare.log.clone(), spare.membership.clone(), config(0));
    assert_eq!(eager.pass().await?, 1);
    let status = eager.status();
    assert_eq!(
        (status.copies_made, status.bytes_copied),
        (1, sealed.seal.map_or(0, |s| s.size_bytes))
    );
    let moved = meta.get_ledger(sealed.id).await?.ok_or("ledger gone")?;
    assert!(
        !moved.bookies().any(|b| b == lost),
        "the lost bookie is dropped"
    );
    assert!(holds(spare, &moved), "the new copy is recorded");
    assert_eq!(
        (moved.bookie.as_str(), moved.seal),
        (writer.log.bookie_id(), sealed.seal)
    );
    // Every listed bookie serves all 25 entries, the new copy included.
    let want: Vec<Bytes> = (0..25).map(body).collect();
    for n in nodes.iter().filter(|n| holds(n, &moved)) {
        assert_eq!(entries(n, name, sealed.id, 25).await?, want);
    }
    // Nothing is left to do, and a second copy on the same bookie is refused.
    assert_eq!(eager.pass().await?, 0);
    assert!(eager.status().under_replicated.is_empty());
    assert!(matches!(
        spare.log.recopy_ledger(sealed.id, &[], None).await,
        Err(crate::ledger::RecopyError::AlreadyHeld(_))
    ));

    stop(nodes).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_cannot_be_read_whole_is_dropped_and_not_recorded() -> TestResult {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let coord = MemoryCoordination::new();
    // A writes alone a ledger its namespace wants on two bookies; then B joins.
    let a = node(&meta, &coord, "a:1").await?;
    let name = "persistent://t/n/mismatch";
    let t = a.log.topic(name).await?;
    t.set_replication(crate::ledger::Replication {
        ensemble: Some(2),
        ack_quorum: Some(1),
        write_quorum: None,
    });
    for i in 0..5 {
        t.append(i, Bytes::from(format!("m{i}")))
            .await?
            .durable()
            .await?;
    }
    let sealed = t.seal_current().await?.ok_or("nothing sealed")?;
    assert_eq!((sealed.bookies().count(), sealed.write_quorum), (1, 2));
    let b = node(&meta, &coord, "b:1").await?;
    // A sealed record claiming entries A does not hold (as after a lost copy).
    let seal = sealed.seal.ok_or("no seal")?;
    let forged = crate::ledger::metadata::LedgerTransition::SealPlaced(Box::new(
        crate::ledger::metadata::PlacedSeal {
            seal,
            bookie: sealed.bookie.clone(),
            replicas: Vec::new(),
            first_segment: sealed.first_segment,
        },
    ));
    let other = meta
        .get_or_create_topic("persistent://t/n/other", 0)
        .await?;
    let l = meta
        .create_ledger_placed(
            other.id,
            sealed.first_segment,
            crate::ledger::metadata::Placement {
                bookie: &sealed.bookie,
                replicas: &[],
                ack_quorum: 1,
                write_quorum: 2,
                stripe_width: 0,
            },
            0,
            None,
        )
        .await?;
    meta.transition_ledger(l.id, forged, 1).await?;
    // Nothing of it can be read from A: nothing is recorded and no copy is kept.
    let err = b.log.recopy_ledger(l.id, &[], None).await;
    assert!(
        matches!(err, Err(crate::ledger::RecopyError::Unreadable { .. })),
        "{err:?}"
    );
    let after = meta.get_ledger(l.id).await?.ok_or("gone")?;
    assert_eq!(
        after.bookies().collect::<Vec<_>>(),
        vec![sealed.bookie.as_str()]
    );
    assert!(!b.log.holds(&after));
    // The genuine ledger copies fine: its seal matches.
    let ok = b.log.recopy_ledger(sealed.id, &[], None).await?;
    assert_eq!(ok.entries, 5);
    assert!(b.log.holds(&ok.record));

    for n in [&a, &b] {
        n.stop.cancel();
    }
    for n in [a, b] {
        n.log.shutdown().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_writer_is_dropped_and_a_replica_takes_its_place_when_no_copy_can_be_made(
) -> TestResult {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let coord = MemoryCoordination::new();
    let mut nodes = Vec::new();
    for id in ["a:1", "b:1", "c:1"] {
        nodes.push(node(&meta, &coord, id).await?);
    }
    let name = "persistent://t/n/promoted";
    let t = nodes[0].log.topic(name).await?;
    for i in 0..12 {
        t.append(i, Bytes::from(format!("m{i}")))
            .await?
            .durable()
            .await?;
    }
    let open = t.ledgers()[0].id;
    confirmed_everywhere(&nodes.iter().collect::<Vec<_>>(), name, open, 12).await?;
    let sealed = t.seal_current().await?.ok_or("nothing sealed")?;
    assert_eq!(sealed.bookies().count(), 3);
    // A copy is refused before anything is copied while the ledger has its copies.
    assert!(matches!(
        nodes[1].log.recopy_ledger(sealed.id, &[], None).await,
        Err(crate::ledger::RecopyError::AlreadyHeld(_))
    ));
    // The writer's node goes for good; two bookies are left, both holding the ledger: no copy
    // can be made, the lost writer is dropped and the first live holder takes its place.
    let writer = nodes[0].log.bookie_id().to_string();
    nodes[0].stop.cancel();
    nodes[0].membership.leave().await?;
    for n in &nodes[1..] {
        until_gone(n, &writer).await?;
    }
    let config = crate::config::AutoRecoveryConfig {
        enabled: true,
        delay: std::time::Duration::ZERO,
        audit_interval: std::time::Duration::from_secs(60),
    };
    let heirs: Vec<&Node> = nodes[1..].iter().collect();
    // Each heir audits (a second round if a minute turned between the two passes and
    // neither was the one to act).
    for _ in 0..2 {
        for n in &heirs {
            let ar = autorecovery::AutoRecovery::new(
                n.log.clone(),
                n.membership.clone(),
                config.clone(),
            );
            assert_eq!(ar.pass().await?, 0, "no copy is made");
            assert!(ar.status().under_replicated.is_empty());
        }
        let now = meta.get_ledger(sealed.id).await?.ok_or("gone")?;
        if !now.bookies().any(|b| b == writer) {
            break;
        }
    }
    let after = meta.get_ledger(sealed.id).await?.ok_or("gone")?;
    assert!(!after.bookies().any(|b| b == writer));
    let heir = heirs
        .iter()
        .find(|n| n.log.bookie_id() == after.bookie)
        .ok_or("a live holder writes it now")?;
    assert_eq!(after.bookies().count(), 2);
    assert!(heir.log.writes(&after));
    assert_eq!(after.write_quorum, 3);
    assert_eq!(after.seal.map(|s| s.entry_count), Some(12));
    // Both copies still serve every entry.
    for n in &heirs {
        assert_eq!(entries(n, name, sealed.id, 12).await?.len(), 12);
    }
    stop(nodes).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stops_mid_ledger_is_replaced_in_the_same_ledger() -> TestResult {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let coord = MemoryCoordination::new();
    let mut nodes = Vec::new();
    for id in ["w:1", "b:1", "c:1", "d:1"] {
        nodes.push(node(&meta, &coord, id).await?);
    }
    let name = "persistent://t/n/replaced";
    let tw = nodes[0].log.topic(name).await?;
    let body = |i: u64| Bytes::from(format!("entry {i}"));
    for i in 0..10 {
        tw.append(i as i64, body(i)).await?.durable().await?;
    }
    let ledger = tw.ledgers()[0].id;
    let before = meta.get_ledger(ledger).await?.ok_or("no ledger")?;
    assert_eq!((before.replicas.len(), before.ack_quorum), (2, 2));
    let by_bookie = |b: &str| nodes.iter().position(|n| n.log.bookie_id() == b);
    let stopped = by_bookie(&before.replicas[0]).ok_or("a replica of ours")?;
    let spare = (1..4)
        .find(|&i| {
            !before
                .replicas
                .iter()
                .any(|b| b == nodes[i].log.bookie_id())
        })
        .ok_or("a fourth bookie")?;

    // The first replica's listener stops; the writer goes on in the same ledger, and the
    // spare takes the stopped one's place in its record, catching up from the writer.
    nodes[stopped].stop.cancel();
    for i in 10..20 {
        tw.append(i as i64, body(i)).await?.durable().await?;
    }
    let swapped: Vec<String> = before
        .replicas
        .iter()
        .map(|b| {
            if *b == before.replicas[0] {
                nodes[spare].log.bookie_id().to_string()
            } else {
                b.clone()
            }
        })
        .collect();
    let mut replaced = false;
    for _ in 0..500 {
        let now = meta.get_ledger(ledger).await?.ok_or("no ledger")?;
        if now.replicas == swapped {
            assert_eq!(now.state, LedgerState::Open, "the ledger did not roll");
            replaced = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(replaced, "the spare never took the stopped replica's place");
    assert_eq!(tw.ledgers().len(), 1, "no other ledger was opened");
    for i in 20..25 {
        tw.append(i as i64, body(i)).await?.durable().await?;
    }
    // The spare holds every entry: the earlier ones from the writer's journal, the later
    // ones directly.
    confirmed_everywhere(&[&nodes[spare]], name, ledger, 25).await?;
    let want: Vec<Bytes> = (0..25).map(body).collect();
    assert_eq!(entries(&nodes[spare], name, ledger, 25).await?, want);

    stop(nodes).await
}

/// Stops every node's bookie listener, then shuts each log down.
pub(super) async fn stop(nodes: Vec<Node>) -> TestResult {
    for n in &nodes {
        n.stop.cancel();
    }
    for n in nodes {
        n.log.shutdown().await?;
    }
    Ok(())
}
