//! Three logs on one metadata store, each serving its bookie on 127.0.0.1 and registered as a
//! member with a session of its own: a replicated ledger's entries reach every bookie, a
//! replica that drops out lags behind, and a new owner taking the ledger over after its writer
//! left fences the replicas, ends the ledger at the longest copy and completes the shorter one.

use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::cluster::membership::{tests::record, Membership, NodeRecord};
use crate::config::LedgerConfig;
use crate::coord::memory::MemoryCoordination;
use crate::ledger::metadata::memory::MemoryMetadataStore;
use crate::ledger::{LedgerState, MetadataStore};

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Node {
    log: Arc<Log>,
    addr: SocketAddr,
    stop: CancellationToken,
    membership: Arc<Membership>,
    _dir: tempfile::TempDir,
}

async fn node(
    meta: &Arc<dyn MetadataStore>,
    coord: &MemoryCoordination,
    id: &str,
) -> Result<Node, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let log = Arc::new(Log::open(dir.path(), LedgerConfig::default(), meta.clone()).await?);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    serve(listener, log.clone(), stop.clone());
    let me = NodeRecord {
        bookie: log.bookie_id().to_string(),
        bookie_addr: Some(addr.to_string()),
        ..record(id)
    };
    let session: Arc<dyn crate::coord::Coordination> = Arc::new(coord.new_session());
    let membership = Arc::new(Membership::join(session, me, std::time::Duration::ZERO).await?);
    log.set_replica_source(Arc::new(client::BookieClient::new(membership.clone())));
    Ok(Node {
        log,
        addr,
        stop,
        membership,
        _dir: dir,
    })
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
    serve(listener, c.log.clone(), c_stop.clone());
    w.membership.leave().await?;

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
