//! Short places of a striped ledger (ADR 0017): a replica that failed during writes, or that
//! did not answer a takeover's fence, is recorded vacant at the seal, and autorecovery fills
//! the vacant places one at a time, the writer's first.

use bytes::Bytes;

use std::sync::Arc;

use super::replication_tests::{node, node_with, stop, until_gone, Node, TestResult};
use super::striping_tests::{audit, by_bookie, each_replica_serves_its_stripe, striped_with};
use super::striping_tests::{orphaned, same_seal, served, until_member};
use crate::coord::memory::MemoryCoordination;
use crate::ledger::metadata::VACANT;
use crate::ledger::{AddDone, LedgerState, ReadError, ReplicaAdd, ReplicaSource, TakeoverError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_failed_during_writes_is_sealed_vacant_and_its_stripe_refilled() -> TestResult
{
    let name = "persistent://t/n/short-place";
    let coord = MemoryCoordination::new();
    let ids = ["w:1", "b:1", "c:1", "d:1"];
    let (meta, mut nodes, record) = striped_with(&coord, &ids, name, 3, 10).await?;
    // The second place's bookie stops serving and stays a member: no spare takes its place,
    // and its write sets keep their ack quorum with the writer and one replica.
    let victim = record.replicas[1].clone();
    by_bookie(&nodes, &victim)?.stop.cancel();
    let tw = nodes[0].log.topic(name).await?;
    for i in 10..22u64 {
        let body = Bytes::from(format!("entry {i}"));
        tw.append(i as i64, body).await?.durable().await?;
    }
    // With no spare to take its place the ledger rolls (ADR 0016): the first ledger is
    // sealed at what its quorum confirmed, the rest goes to the next one.
    tw.seal_current().await?;
    let sealed = meta.get_ledger(record.id).await?.ok_or("no ledger")?;
    let count = sealed.seal.ok_or("not sealed")?.entry_count;
    assert!((10..=22).contains(&count), "sealed at {count}");
    let mut want = record.replicas.clone();
    want[1] = VACANT.to_string();
    assert_eq!(
        sealed.replicas, want,
        "the short place is vacant, the others keep theirs"
    );
    assert!(
        !sealed.bookies().any(|b| b == victim),
        "no reader goes to it"
    );
    // The victim leaves, a spare joins: autorecovery copies the second place's stripe there.
    let at = nodes
        .iter()
        .position(|n| n.log.bookie_id() == victim)
        .ok_or("ours")?;
    let gone = nodes.remove(at);
    gone.membership.leave().await?;
    nodes.push(node(&meta, &coord, "e:1").await?);
    let spare = nodes[3].log.bookie_id().to_string();
    until_member(&nodes[0], &spare).await?;
    until_gone(&nodes[0], &victim).await?;
    audit(&nodes).await?;
    let after = meta.get_ledger(sealed.id).await?.ok_or("no ledger")?;
    want[1] = spare;
    assert_eq!(after.replicas, want, "the spare fills the vacant place");
    assert_eq!(
        (after.bookie.as_str(), after.seal),
        (record.bookie.as_str(), sealed.seal)
    );
    each_replica_serves_its_stripe(&nodes, name, &after, count).await?;
    nodes.push(gone);
    stop(nodes).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_place_is_sealed_vacant_and_places_are_refilled_writer_first() -> TestResult {
    let name = "persistent://t/n/unanswered-place";
    let coord = MemoryCoordination::new();
    let ids = ["b:1", "c:1", "d:1", "e:1"];
    let (meta, mut nodes, record) =
        orphaned(&coord, &ids, name, (3, 5, 3), (20, &|_, _| false)).await?;
    // 5/4/3: each write set's three replicas need two answers. The fourth replica goes too.
    let lost = nodes.pop().ok_or("four nodes")?;
    lost.stop.cancel();
    lost.membership.leave().await?;
    until_gone(&nodes[0], lost.log.bookie_id()).await?;
    let taken = nodes[0].log.take_over_open_ledgers(name).await?;
    let sealed = taken.first().ok_or("nothing taken over")?;
    assert_eq!(sealed.seal.map(|s| s.entry_count), Some(20));
    let mut want = record.replicas.clone();
    want[3] = VACANT.to_string();
    assert_eq!(
        (sealed.bookie.as_str(), &sealed.replicas),
        (VACANT, &want),
        "no whole copy, and the unanswered place is vacant"
    );
    // Readers merge the stripes without asking a vacant place; the first replica's node
    // offloads the ledger while no bookie holds it whole.
    let view = nodes[1].log.topic_to_read(name).await?;
    let read = view.read_entries(sealed.id, 0, 19).await?;
    let ids: Vec<u64> = read.iter().map(|e| e.position.entry).collect();
    assert_eq!(ids, (0..20).collect::<Vec<_>>());
    let mut offloading = Vec::new();
    for n in &nodes {
        let here = n.log.offloaded_here(std::slice::from_ref(sealed)).await;
        offloading.push(here.contains(&sealed.id));
    }
    assert_eq!(offloading, [true, false, false]);
    // A spare joins: the writer's place is filled first (a whole copy, so readers get one
    // back), not the vacant replica place.
    let mut spares = Vec::new();
    nodes.push(node(&meta, &coord, "f:1").await?);
    spares.push(nodes[3].log.bookie_id().to_string());
    until_member(&nodes[0], &spares[0]).await?;
    audit(&nodes).await?;
    let after = meta.get_ledger(sealed.id).await?.ok_or("no ledger")?;
    assert_eq!((&after.bookie, &after.replicas), (&spares[0], &want));
    // A second spare joins: it fills the vacant replica place with that place's stripe.
    nodes.push(node(&meta, &coord, "g:1").await?);
    spares.push(nodes[4].log.bookie_id().to_string());
    until_member(&nodes[0], &spares[1]).await?;
    audit(&nodes).await?;
    let after = meta.get_ledger(sealed.id).await?.ok_or("no ledger")?;
    want[3] = spares[1].clone();
    assert_eq!((&after.bookie, &after.replicas), (&spares[0], &want));
    assert_eq!(same_seal(&after), same_seal(sealed));
    let writer = by_bookie(&nodes, &after.bookie)?;
    assert_eq!(
        served(writer, name, sealed.id, 20).await?,
        (0..20).collect::<Vec<_>>()
    );
    let here = |n: &Node| {
        let (log, after) = (n.log.clone(), after.clone());
        async move {
            let here = log.offloaded_here(std::slice::from_ref(&after)).await;
            here.contains(&after.id)
        }
    };
    assert!(here(writer).await && !here(&nodes[0]).await);
    each_replica_serves_its_stripe(&nodes, name, &after, 20).await?;
    nodes.push(lost);
    stop(nodes).await
}

/// A bookie client whose recovery adds to one bookie fail (a copy that answered the fence
/// and then cannot be completed).
#[derive(Debug)]
struct RefusesRecovery {
    inner: Arc<dyn ReplicaSource>,
    bookie: String,
}

#[async_trait::async_trait]
impl ReplicaSource for RefusesRecovery {
    async fn read(
        &self,
        bookie: &str,
        topic: &str,
        ledger: u64,
        first: u64,
        last: u64,
    ) -> Result<Vec<crate::ledger::Entry>, ReadError> {
        self.inner.read(bookie, topic, ledger, first, last).await
    }

    async fn confirmed(
        &self,
        bookie: &str,
        topic: &str,
        ledger: u64,
    ) -> Result<crate::ledger::Confirmed, ReadError> {
        self.inner.confirmed(bookie, topic, ledger).await
    }

    fn add(&self, bookie: &str, add: ReplicaAdd, done: AddDone) {
        if add.recovery && bookie == self.bookie {
            done(Err("refused by the test".into()));
        } else {
            self.inner.add(bookie, add, done);
        }
    }

    async fn sealed(
        &self,
        bookie: &str,
        topic: &str,
        ledger: u64,
        count: u64,
    ) -> Result<u64, ReadError> {
        self.inner.sealed(bookie, topic, ledger, count).await
    }

    async fn choose(&self, except: &str, n: usize) -> Vec<String> {
        self.inner.choose(except, n).await
    }

    async fn fence(
        &self,
        bookie: &str,
        topic: &str,
        ledger: u64,
    ) -> Result<crate::ledger::FencedCopy, ReadError> {
        self.inner.fence(bookie, topic, ledger).await
    }

    async fn is_live(&self, bookie: &str) -> bool {
        self.inner.is_live(bookie).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_copy_that_cannot_be_completed_fails_the_takeover() -> TestResult {
    let coord = MemoryCoordination::new();
    // 4/3/2, the writer gone: the third place missed its entries from 24 on. It answers the
    // fence, but no recovery add reaches it. An answered copy may be the only one holding
    // some acknowledged entries (here it is not): it is never left vacant, nothing is sealed.
    let name = "persistent://t/n/incomplete-place";
    let skip = |place: usize, e: u64| place == 2 && e >= 24;
    let ids = ["b:1", "c:1", "d:1"];
    let (meta, mut nodes, record) = orphaned(&coord, &ids, name, (2, 4, 2), (30, &skip)).await?;
    let bookie = record.replicas[2].clone();
    let refused = bookie.clone();
    let dir = (tempfile::tempdir()?, crate::config::LedgerConfig::default());
    let heir = node_with(&meta, &coord, "h:1", dir, move |inner| {
        Arc::new(RefusesRecovery {
            inner,
            bookie: refused,
        })
    })
    .await?;
    let taken = heir.log.take_over_open_ledgers(name).await;
    nodes.push(heir);
    match taken {
        Err(TakeoverError::Incomplete { bookie: b, .. }) => assert_eq!(b, bookie),
        other => panic!("expected the takeover to fail on the third place: {other:?}"),
    }
    let after = meta.get_ledger(record.id).await?.ok_or("no ledger")?;
    assert_eq!(after.state, LedgerState::Open, "nothing sealed");
    // Without the fault the takeover completes the third place and seals every entry.
    let taken = nodes[0].log.take_over_open_ledgers(name).await?;
    let sealed = taken.first().ok_or("nothing taken over")?;
    assert_eq!(sealed.seal.map(|s| s.entry_count), Some(30));
    assert_eq!(sealed.replicas, record.replicas);
    stop(nodes).await
}
