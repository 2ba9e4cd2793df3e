//! A node whose loaded view of a ledger is older than autorecovery's move of the ledger's
//! writer place (it was away meanwhile and came back without loading the topic again): once
//! reclaim removed its copy, its reads go where the ledger is now (the other bookies, or the
//! lake once offloaded), not to the files it no longer has.

use std::sync::Arc;

use bytes::Bytes;
use bytesize::ByteSize;

use super::replication_tests::{confirmed_everywhere, node_with, stop, TestResult};
use crate::config::LedgerConfig;
use crate::coord::memory::MemoryCoordination;
use crate::ledger::metadata::memory::MemoryMetadataStore;
use crate::ledger::{Entry, LedgerId, MetadataStore, ReadError, TopicLog};

/// Appends `count` entries of 1000 bytes (each ledger spans several 4 KiB segments, so that
/// its first segments hold nothing else) and seals them as one ledger.
async fn sealed_ledger(
    t: &TopicLog,
    nodes: &[&super::replication_tests::Node],
    tag: u8,
) -> Result<(LedgerId, Vec<Bytes>), Box<dyn std::error::Error>> {
    let want: Vec<Bytes> = (0..12u8)
        .map(|i| Bytes::from(vec![tag.wrapping_add(i); 1000]))
        .collect();
    for (i, body) in want.iter().enumerate() {
        t.append(i as i64, body.clone()).await?.durable().await?;
    }
    let open = t.ledgers().last().ok_or("no ledger")?.id;
    confirmed_everywhere(nodes, t.name(), open, 12).await?;
    let sealed = t.seal_current().await?.ok_or("nothing sealed")?;
    assert_eq!((sealed.id, sealed.bookies().count()), (open, 3));
    Ok((sealed.id, want))
}

fn payloads(entries: Vec<Entry>) -> Vec<Bytes> {
    entries.into_iter().map(|e| e.payload).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_older_than_a_moved_writer_place_reads_where_the_ledger_is_now() -> TestResult {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let coord = MemoryCoordination::new();
    let small = LedgerConfig {
        segment_size: ByteSize::kib(4),
        ..LedgerConfig::default()
    };
    let mut nodes = Vec::new();
    for id in ["a:1", "b:1", "c:1"] {
        let dir = (tempfile::tempdir()?, small.clone());
        nodes.push(node_with(&meta, &coord, id, dir, |client| client).await?);
    }
    let all: Vec<&super::replication_tests::Node> = nodes.iter().collect();
    let name = "persistent://t/n/moved-place";
    let t = nodes[0].log.topic(name).await?;
    // Two ledgers written by a, 3/3/2: the first stays sealed, a offloads the second.
    let (sealed, want_sealed) = sealed_ledger(&t, &all, 0).await?;
    let (offloaded, want_offloaded) = sealed_ledger(&t, &all, 100).await?;
    nodes[0]
        .log
        .mark_offloaded(offloaded, "snap".into())
        .await?;
    assert_eq!(
        payloads(t.read_entries_stored(sealed, 0, 11).await?),
        want_sealed
    );
    assert_eq!(
        payloads(t.read_entries_stored(offloaded, 0, 11).await?),
        want_offloaded,
        "a offloaded ledger is still read from a's copy"
    );

    // While a is away, autorecovery on b gives a's writer place of both ledgers to b (the
    // step taken when no new copy can be made). a's loaded view is not told.
    let a = nodes[0].log.bookie_id().to_string();
    let before = meta.get_ledger(sealed).await?.ok_or("no ledger")?;
    let a_segments = before.first_segment..=before.seal.ok_or("not sealed")?.last_segment;
    for ledger in [sealed, offloaded] {
        let moved = nodes[1]
            .log
            .drop_lost_copies(ledger, std::slice::from_ref(&a))
            .await?;
        assert_eq!(moved.bookie, nodes[1].log.bookie_id());
        assert!(!moved.bookies().any(|x| x == a));
    }
    // a, back, writes on (its journal moves past the two ledgers' first segments) and
    // reclaims the segments the store no longer gives it.
    let other = nodes[0].log.topic("persistent://t/n/moved-filler").await?;
    for i in 0..12 {
        let body = Bytes::from(vec![7u8; 1000]);
        other.append(i, body).await?.durable().await?;
    }
    let removed = nodes[0].log.reclaim_segments().await?;
    assert!(
        a_segments.clone().all(|s| removed.contains(&s)),
        "a kept some of the sealed ledger's segments {a_segments:?}: removed {removed:?}"
    );

    // The sealed ledger is read from the bookies that hold it now, the offloaded one from
    // the lake; neither read fails on a's missing files.
    assert_eq!(
        payloads(t.read_entries_stored(sealed, 0, 11).await?),
        want_sealed
    );
    assert!(
        matches!(
            t.read_entries_stored(offloaded, 0, 11).await,
            Err(ReadError::Deleted(l)) if l == offloaded
        ),
        "the offloaded ledger is read from the lake"
    );
    assert!(t.read_from_lake(offloaded));
    assert!(!t.read_from_lake(sealed));
    stop(nodes).await
}
