//! A striped ledger (ADR 0017) on four in-process bookies: the writer's bookie holds every
//! entry, each replica its place's stripe, before and after the seal, and a fenced replica
//! answers with the end of its stripe.

use std::sync::Arc;

use bytes::Bytes;

use super::replication_tests::{
    confirmed_everywhere, node, node_in, stop, until_gone, Node, TestResult,
};
use crate::coord::memory::MemoryCoordination;
use crate::ledger::metadata::memory::MemoryMetadataStore;
use crate::ledger::{LedgerRecord, MetadataStore};

/// The entries `n` serves of `ledger` below `count`, by id (a replica serves its stripe only).
pub(super) async fn served(
    n: &Node,
    topic: &str,
    ledger: u64,
    count: u64,
) -> Result<Vec<u64>, String> {
    let got = n
        .log
        .serve_read(topic, ledger, 0, count - 1, 1 << 30)
        .await
        .map_err(|e| e.to_string())?;
    for e in &got {
        let want = Bytes::from(format!("entry {}", e.position.entry));
        if e.payload != want {
            return Err(format!("entry {} holds {:?}", e.position.entry, e.payload));
        }
    }
    Ok(got.into_iter().map(|e| e.position.entry).collect())
}

/// Each replica of `record` serves its stripe of `0..count`, and nothing else.
pub(super) async fn each_replica_serves_its_stripe(
    nodes: &[Node],
    topic: &str,
    record: &LedgerRecord,
    count: u64,
) -> TestResult {
    for (place, bookie) in record.replicas.iter().enumerate() {
        let n = by_bookie(nodes, bookie)?;
        let stripe = record.stripes().stripe(place);
        let want: Vec<u64> = (0..count).filter(|e| stripe.holds(*e)).collect();
        assert_eq!(
            served(n, topic, record.id, count).await?,
            want,
            "replica place {place}"
        );
    }
    Ok(())
}

/// Four bookies on one store; `name` on the first, whose ledgers go to all four with each entry
/// on `write_quorum` of them (ack quorum 2), written `count` entries (`entry {i}`). Returns the
/// nodes and the first ledger's record.
async fn striped(
    name: &str,
    write_quorum: u8,
    count: u64,
) -> Result<(Arc<dyn MetadataStore>, Vec<Node>, LedgerRecord), Box<dyn std::error::Error>> {
    striped_on(&["w:1", "b:1", "c:1", "d:1"], name, write_quorum, count).await
}

/// [`striped`] on the nodes `ids` (the first writes; four of them hold the ledger).
pub(super) async fn striped_on(
    ids: &[&str],
    name: &str,
    write_quorum: u8,
    count: u64,
) -> Result<(Arc<dyn MetadataStore>, Vec<Node>, LedgerRecord), Box<dyn std::error::Error>> {
    let coord = MemoryCoordination::new();
    striped_with(&coord, ids, name, write_quorum, count).await
}

/// [`striped_on`] with the members' sessions on `coord`.
pub(super) async fn striped_with(
    coord: &MemoryCoordination,
    ids: &[&str],
    name: &str,
    write_quorum: u8,
    count: u64,
) -> Result<(Arc<dyn MetadataStore>, Vec<Node>, LedgerRecord), Box<dyn std::error::Error>> {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let mut nodes = Vec::new();
    for id in ids {
        nodes.push(node(&meta, coord, id).await?);
    }
    let tw = nodes[0].log.topic(name).await?;
    tw.set_replication(crate::ledger::Replication {
        ensemble: Some(4),
        ack_quorum: Some(2),
        write_quorum: Some(write_quorum),
    });
    for i in 0..count {
        let body = Bytes::from(format!("entry {i}"));
        tw.append(i as i64, body).await?.durable().await?;
    }
    let ledger = tw.ledgers()[0].id;
    let record = meta.get_ledger(ledger).await?.ok_or("no ledger")?;
    Ok((meta, nodes, record))
}

/// `record`'s seal with its last segment left out: that one describes the journal of the
/// bookie in the writer's place, which a rebuilt whole copy changes.
pub(super) fn same_seal(record: &LedgerRecord) -> Option<crate::ledger::metadata::SealInfo> {
    record.seal.map(|s| crate::ledger::metadata::SealInfo {
        last_segment: 0,
        ..s
    })
}

/// The node whose bookie is `bookie`.
pub(super) fn by_bookie<'a>(nodes: &'a [Node], bookie: &str) -> Result<&'a Node, String> {
    nodes
        .iter()
        .find(|n| n.log.bookie_id() == bookie)
        .ok_or_else(|| format!("no node of ours is bookie {bookie}"))
}

/// One autorecovery audit on each of `nodes`, with no recovery delay.
pub(super) async fn audit<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> TestResult {
    let config = crate::config::AutoRecoveryConfig {
        enabled: true,
        delay: std::time::Duration::ZERO,
        audit_interval: std::time::Duration::from_secs(60),
    };
    for n in nodes {
        let ar = super::autorecovery::AutoRecovery::new(
            n.log.clone(),
            n.membership.clone(),
            config.clone(),
        );
        ar.pass().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_ledger_gives_the_writer_every_entry_and_each_replica_its_stripe() -> TestResult {
    let name = "persistent://t/n/striped";
    let (_, nodes, record) = striped(name, 3, 30).await?;
    let ledger = record.id;
    assert_eq!(
        (
            record.replicas.len(),
            record.stripe_width,
            record.ack_quorum
        ),
        (3, 2, 2),
        "four bookies, each entry on three"
    );
    // Acknowledged entries are readable once the writer publishes them, just after.
    confirmed_everywhere(&[&nodes[0]], name, ledger, 30).await?;
    assert_eq!(
        served(&nodes[0], name, ledger, 30).await?,
        (0..30).collect::<Vec<_>>()
    );
    // Every replica has made its last entry durable before the seal lists it.
    let last_held = |place: usize| {
        (0..30u64)
            .rev()
            .find(|e| record.stripes().stripe(place).holds(*e))
    };
    let ends: Vec<u64> = (0..3).filter_map(|p| last_held(p).map(|e| e + 1)).collect();
    for (place, bookie) in record.replicas.iter().enumerate() {
        let n = by_bookie(&nodes, bookie)?;
        confirmed_everywhere(&[n], name, ledger, ends[place]).await?;
    }
    each_replica_serves_its_stripe(&nodes, name, &record, 30).await?;

    let tw = nodes[0].log.topic(name).await?;
    let sealed = tw.seal_current().await?.ok_or("nothing sealed")?;
    assert_eq!(sealed.seal.map(|s| s.entry_count), Some(30));
    assert_eq!(sealed.replicas, record.replicas);
    // The sealed copies (their index files stand absent entries for other stripes) serve
    // their stripes alike once each has learnt the seal.
    let mut all = false;
    for _ in 0..250 {
        all = true;
        for n in &nodes[1..] {
            all &= n
                .log
                .serve_confirmed(name, ledger)
                .await
                .is_ok_and(|c| !c.open);
        }
        if all {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(all, "every replica sealed its copy");
    each_replica_serves_its_stripe(&nodes, name, &sealed, 30).await?;

    stop(nodes).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_striped_copy_answers_the_end_of_its_stripe() -> TestResult {
    let name = "persistent://t/n/fenced-stripe";
    let (_, nodes, record) = striped(name, 2, 10).await?;
    let ledger = record.id;
    assert_eq!(
        record.stripe_width, 1,
        "each entry on the writer and one replica"
    );
    // Place 1 holds entries 1, 4, 7: its copy ends at 8.
    let bookie = &record.replicas[1];
    let n = by_bookie(&nodes, bookie)?;
    confirmed_everywhere(&[n], name, ledger, 8).await?;
    let fenced = n.log.replica_fence(ledger).await?;
    assert_eq!(fenced.seal.entry_count, 8);
    assert_eq!(served(n, name, ledger, 10).await?, vec![1, 4, 7]);

    stop(nodes).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_copy_is_rebuilt_from_the_journal_with_its_stripe_after_a_restart() -> TestResult
{
    let name = "persistent://t/n/restarted-stripe";
    let (meta, mut nodes, record) = striped(name, 3, 10).await?;
    let ledger = record.id;
    // Place 2 holds the entries whose residue mod 3 is 1 or 2: its copy ends after entry 8.
    let stripe = record.stripes().stripe(2);
    let at = nodes
        .iter()
        .position(|n| n.log.bookie_id() == record.replicas[2])
        .ok_or("ours")?;
    confirmed_everywhere(&[&nodes[at]], name, ledger, 9).await?;
    let restarted = nodes.remove(at);
    restarted.stop.cancel();
    restarted.log.shutdown().await?;
    let log = crate::ledger::Log::open(
        restarted.dir.path(),
        crate::config::LedgerConfig::default(),
        meta.clone(),
    )
    .await?;
    let held: Vec<u64> = log
        .serve_read(name, ledger, 0, 9, 1 << 30)
        .await?
        .into_iter()
        .map(|e| e.position.entry)
        .collect();
    let want: Vec<u64> = (0..10).filter(|e| stripe.holds(*e)).collect();
    assert_eq!(held, want, "rebuilt with the entries of its stripe");
    // It takes the next entry of its stripe (10), and no other: not 9 (another stripe's),
    // not 11 (past 10).
    let add = |entry: u64| log.replica_add(ledger, entry, 0, Bytes::from("x"), false);
    for wrong in [9, 11] {
        assert!(
            matches!(
                add(wrong).await,
                Err(crate::ledger::ReplicaAddError::OutOfOrder { .. })
            ),
            "entry {wrong}"
        );
    }
    add(10).await?.await??;
    log.shutdown().await?;

    stop(nodes).await
}

/// A striped ledger's quorums: ack quorum, write quorum, stripe width.
pub(super) type Quorums = (u8, u8, u8);

/// The nodes `ids` on one store, and a striped ledger of topic `name` with `quorums`, its
/// replicas on the nodes, whose writer ("gone", never a member) sent `count` entries to each
/// write set's places before it went, except those `skip` names (place, entry).
pub(super) async fn orphaned(
    coord: &MemoryCoordination,
    ids: &[&str],
    name: &str,
    (ack_quorum, write_quorum, stripe_width): Quorums,
    (count, skip): (u64, &dyn Fn(usize, u64) -> bool),
) -> Result<(Arc<dyn MetadataStore>, Vec<Node>, LedgerRecord), Box<dyn std::error::Error>> {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let mut nodes = Vec::new();
    for id in ids {
        nodes.push(node(&meta, coord, id).await?);
    }
    let topic = meta.get_or_create_topic(name, 0).await?;
    let replicas: Vec<String> = nodes
        .iter()
        .map(|n| n.log.bookie_id().to_string())
        .collect();
    let placement = crate::ledger::metadata::Placement {
        bookie: "gone",
        replicas: &replicas,
        ack_quorum,
        write_quorum,
        stripe_width,
    };
    let record = meta
        .create_ledger_placed(topic.id, 1, placement, 0, None)
        .await?;
    for e in 0..count {
        for place in record.stripes().write_set(e) {
            if skip(place, e) {
                continue;
            }
            let body = Bytes::from(format!("entry {e}"));
            let add = nodes[place]
                .log
                .replica_add(record.id, e, e as i64, body, false);
            add.await?.await??;
        }
    }
    Ok((meta, nodes, record))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_ledger_whose_writer_is_gone_is_taken_over_from_its_stripes() -> TestResult {
    let coord = MemoryCoordination::new();
    // A 4/3/2 ledger whose writer (a bookie no longer a member) sent 30 entries to the stripes
    // before it went; the third place missed the last of its entries (24 on).
    let name = "persistent://t/n/orphan-stripe";
    let skip = |place: usize, e: u64| place == 2 && e >= 24;
    let ids = ["b:1", "c:1", "d:1"];
    let (meta, mut nodes, record) = orphaned(&coord, &ids, name, (2, 4, 2), (30, &skip)).await?;
    let heir = &nodes[0].log;
    assert_eq!(
        heir.pinning_holder(name).await?,
        None,
        "no node is waited for"
    );
    let taken = heir.take_over_open_ledgers(name).await?;
    assert_eq!(taken.len(), 1);
    let sealed = &taken[0];
    assert_eq!(
        sealed.seal.map(|s| s.entry_count),
        Some(30),
        "every entry some place holds"
    );
    assert_eq!(
        (sealed.bookie.as_str(), &sealed.replicas),
        (crate::ledger::metadata::VACANT, &record.replicas),
        "the places are kept, and no bookie holds the ledger whole"
    );
    assert_eq!(meta.get_ledger(record.id).await?.as_ref(), Some(sealed));
    // The third place's stripe was completed: every place serves its stripe of the 30
    // entries, and a reader merges them.
    each_replica_serves_its_stripe(&nodes, name, sealed, 30).await?;
    let view = heir.topic_to_read(name).await?;
    let read = view.read_entries(sealed.id, 0, 29).await?;
    let ids: Vec<u64> = read.iter().map(|e| e.position.entry).collect();
    assert_eq!(ids, (0..30).collect::<Vec<_>>());
    // A bookie outside the ensemble joins: autorecovery rebuilds the whole copy there, and it
    // matches the seal the takeover computed from the stripes.
    nodes.push(node(&meta, &coord, "e:1").await?);
    until_member(&nodes[0], nodes[3].log.bookie_id()).await?;
    audit(&nodes).await?;
    let rebuilt = meta.get_ledger(record.id).await?.ok_or("no ledger")?;
    assert_eq!(
        (rebuilt.bookie.as_str(), same_seal(&rebuilt)),
        (nodes[3].log.bookie_id(), same_seal(sealed))
    );
    stop(nodes).await
}

/// Waits until `n` counts bookie `bookie` among the members.
pub(super) async fn until_member(n: &Node, bookie: &str) -> TestResult {
    for _ in 0..500 {
        if n.membership
            .nodes()
            .await?
            .iter()
            .any(|m| m.bookie == bookie)
        {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Err(format!("bookie {bookie} never became a member").into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_takeover_needs_enough_answers_from_every_write_set() -> TestResult {
    let name = "persistent://t/n/unanswered-stripe";
    let (meta, nodes, record) = striped(name, 3, 10).await?;
    // 4/3/2: an acknowledged entry may be on one replica of its write set only, so both
    // must answer; with one replica gone the ledger's end cannot be known.
    // Both leave the members (a stopped listener may still accept a connection already
    // queued, and answer the fence).
    let replica = by_bookie(&nodes, &record.replicas[0])?;
    replica.stop.cancel();
    replica.membership.leave().await?;
    nodes[0].stop.cancel();
    nodes[0].membership.leave().await?;
    let heir = by_bookie(&nodes, &record.replicas[1])?;
    until_gone(heir, nodes[0].log.bookie_id()).await?;
    until_gone(heir, &record.replicas[0]).await?;
    assert!(matches!(
        heir.log.take_over_open_ledgers(name).await,
        Err(crate::ledger::TakeoverError::TooFewAnswers { needed: 2, .. })
    ));
    let after = meta.get_ledger(record.id).await?.ok_or("no ledger")?;
    assert_eq!(
        after.state,
        crate::ledger::LedgerState::Open,
        "nothing sealed"
    );
    stop(nodes).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_striped_ledger_is_read_from_the_stripes_when_its_writer_cannot_serve(
) -> TestResult {
    let name = "persistent://t/n/merged";
    let (_, nodes, record) = striped(name, 3, 40).await?;
    let tw = nodes[0].log.topic(name).await?;
    let sealed = tw.seal_current().await?.ok_or("nothing sealed")?;
    // A replica's node reads the ledger whole: not from its own stripe, from the writer.
    let reader = by_bookie(&nodes, &record.replicas[0])?;
    let ids = |entries: Vec<crate::ledger::Entry>| -> Vec<u64> {
        entries.iter().map(|e| e.position.entry).collect()
    };
    let view = reader.log.topic_to_read(name).await?;
    let all: Vec<u64> = (0..40).collect();
    assert_eq!(ids(view.read_entries(sealed.id, 0, 39).await?), all);
    // The writer's bookie stops serving: the range is merged from the three stripes.
    nodes[0].stop.cancel();
    let view = reader.log.topic_to_read(name).await?;
    let merged = view.read_entries(sealed.id, 0, 39).await?;
    for e in &merged {
        assert_eq!(
            e.payload,
            Bytes::from(format!("entry {}", e.position.entry))
        );
    }
    assert_eq!(ids(merged), all);
    assert_eq!(
        ids(view.read_entries(sealed.id, 17, 23).await?),
        (17..=23).collect::<Vec<_>>()
    );
    stop(nodes).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_writers_whole_copy_is_rebuilt_from_the_stripes_on_a_spare_bookie() -> TestResult {
    let name = "persistent://t/n/rebuilt";
    let ids = ["w:1", "b:1", "c:1", "d:1", "e:1"];
    let (meta, nodes, record) = striped_on(&ids, name, 3, 50).await?;
    let tw = nodes[0].log.topic(name).await?;
    let sealed = tw.seal_current().await?.ok_or("nothing sealed")?;
    let writer = nodes[0].log.bookie_id().to_string();
    let spare = nodes
        .iter()
        .find(|n| !sealed.bookies().any(|b| b == n.log.bookie_id()))
        .ok_or("a fifth bookie outside the ensemble")?;
    // The writer's node goes for good: no bookie left holds the ledger whole.
    nodes[0].stop.cancel();
    nodes[0].membership.leave().await?;
    until_gone(spare, &writer).await?;
    // Autorecovery on the survivors: the spare, the one live bookie the ledger does not
    // list, copies it whole from the stripes and takes the writer's place.
    audit(&nodes[1..]).await?;
    let after = meta.get_ledger(sealed.id).await?.ok_or("no ledger")?;
    assert_eq!(
        after.bookie,
        spare.log.bookie_id(),
        "the spare writes it now"
    );
    assert_eq!(
        after.replicas, record.replicas,
        "the stripes keep their places"
    );
    assert_eq!(
        same_seal(&after),
        same_seal(&sealed),
        "checked against the seal"
    );
    assert!(spare.log.holds(&after));
    let entries = spare
        .log
        .serve_read(name, sealed.id, 0, 49, 1 << 30)
        .await?;
    let ids: Vec<u64> = entries.iter().map(|e| e.position.entry).collect();
    assert_eq!(ids, (0..50).collect::<Vec<_>>());
    stop(nodes).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_writer_takes_its_striped_ledger_over_with_its_whole_copy() -> TestResult {
    let name = "persistent://t/n/restarted-writer";
    let coord = MemoryCoordination::new();
    let ids = ["w:1", "b:1", "c:1", "d:1"];
    let (meta, mut nodes, record) = striped_with(&coord, &ids, name, 3, 20).await?;
    // The writer's process ends with the ledger open; it comes back on the same disk.
    let old = nodes.remove(0);
    old.stop.cancel();
    old.membership.leave().await?;
    old.log.shutdown().await?;
    let back = node_in(&meta, &coord, "w:1", old.dir).await?;
    assert_eq!(back.log.bookie_id(), record.bookie);
    let taken = back.log.take_over_open_ledgers(name).await?;
    assert_eq!(taken.len(), 1);
    let sealed = &taken[0];
    assert_eq!(sealed.seal.map(|s| s.entry_count), Some(20));
    assert_eq!(
        (sealed.bookie.as_str(), &sealed.replicas),
        (record.bookie.as_str(), &record.replicas),
        "its whole copy and every place"
    );
    let ids: Vec<u64> = back
        .log
        .serve_read(name, sealed.id, 0, 19, 1 << 30)
        .await?
        .iter()
        .map(|e| e.position.entry)
        .collect();
    assert_eq!(ids, (0..20).collect::<Vec<_>>());
    each_replica_serves_its_stripe(&nodes, name, sealed, 20).await?;
    nodes.push(back);
    stop(nodes).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_replicas_stripe_is_copied_into_its_place_on_a_spare_bookie() -> TestResult {
    let name = "persistent://t/n/restriped";
    let ids = ["w:1", "b:1", "c:1", "d:1", "e:1"];
    let (meta, nodes, record) = striped_on(&ids, name, 3, 50).await?;
    let tw = nodes[0].log.topic(name).await?;
    let sealed = tw.seal_current().await?.ok_or("nothing sealed")?;
    let spare = nodes
        .iter()
        .find(|n| !sealed.bookies().any(|b| b == n.log.bookie_id()))
        .ok_or("a fifth bookie outside the ensemble")?;
    // The second place's node goes for good.
    let lost = by_bookie(&nodes, &record.replicas[1])?;
    lost.stop.cancel();
    lost.membership.leave().await?;
    until_gone(spare, lost.log.bookie_id()).await?;
    let survivors: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.log.bookie_id() != lost.log.bookie_id())
        .collect();
    audit(survivors).await?;
    let after = meta.get_ledger(sealed.id).await?.ok_or("no ledger")?;
    let mut want = record.replicas.clone();
    want[1] = spare.log.bookie_id().to_string();
    assert_eq!(after.replicas, want, "the spare takes the lost place");
    assert_eq!(
        (after.bookie.as_str(), after.seal),
        (record.bookie.as_str(), sealed.seal)
    );
    // It holds that place's stripe, and only it.
    each_replica_serves_its_stripe(&nodes, name, &after, 50).await?;
    stop(nodes).await
}
