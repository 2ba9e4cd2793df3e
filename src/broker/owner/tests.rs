//! The topic owner driven through its handle over a real log: SENDs answered in order with
//! their positions, deduplication (duplicates answered without appending, the state folded
//! again after a restart and when deduplication is switched on), the producer registry's
//! exclusivity rules, and deletion refused while clients are attached unless forced.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{spawn, test_log, Dedup, OwnerSetup};
use crate::broker::publisher::PublisherMeasure;
use crate::broker::topic::{ProducerSlot, Published, TopicPolicies};
use crate::broker::{BrokerError, BrokerTopic};
use crate::ledger::{Log, Position};
use crate::protocol::frame::build_entry;
use crate::protocol::proto::MessageMetadata;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TOPIC: &str = "persistent://public/default/owner-test";

struct Harness {
    _dir: tempfile::TempDir,
    log: Arc<Log>,
}

impl Harness {
    async fn new() -> Result<Harness, Box<dyn std::error::Error>> {
        let (dir, log) = test_log().await?;
        Ok(Harness { _dir: dir, log })
    }

    /// Loads the topic as the broker does: deduplication folded at load when `dedup`.
    async fn load(&self, dedup: bool) -> Result<Arc<BrokerTopic>, Box<dyn std::error::Error>> {
        self.load_with(dedup, None).await
    }

    /// [`Harness::load`], unloading once idle as `idle` says.
    async fn load_with(
        &self,
        dedup: bool,
        idle: Option<super::IdleUnload>,
    ) -> Result<Arc<BrokerTopic>, Box<dyn std::error::Error>> {
        let log = self.log.topic(TOPIC).await?;
        let state = if dedup {
            Dedup::load(&log, None).await?
        } else {
            Dedup::Off
        };
        Ok(spawn(OwnerSetup {
            name: TOPIC.parse()?,
            log,
            lake: None,
            policies: TopicPolicies {
                deduplication: dedup,
                max_producers: None,
                backlog: Default::default(),
                consumers: Default::default(),
                inactive: None,
                replication: Default::default(),
            },
            dedup: state,
            cursors: Vec::new(),
            persist_every: Duration::from_secs(3600),
            publish_budget: super::test_budget(),
            measures: Default::default(),
            activity: Default::default(),
            idle,
        }))
    }
}

/// Publishes one message of producer `p` with sequence id `seq` and waits until it settles.
async fn send(topic: &BrokerTopic, p: &str, seq: u64) -> Result<Published, BrokerError> {
    send_as(topic, publisher(p), seq).await
}

/// [`send`] by registration `p`.
async fn send_as(
    topic: &BrokerTopic,
    p: Arc<PublisherMeasure>,
    seq: u64,
) -> Result<Published, BrokerError> {
    let metadata = MessageMetadata {
        producer_name: p.name.to_string(),
        sequence_id: seq,
        publish_time: 1_700_000_000_000,
        ..Default::default()
    };
    let entry = build_entry(&metadata, b"payload");
    let (reply, settled) = oneshot::channel();
    topic.publish(p, seq as i64, 0, entry, reply).await?;
    settled
        .await
        .map_err(|_| BrokerError::Stopped("owner stopped".into()))
}

fn position(p: Published) -> Result<Position, String> {
    match p {
        Published::Persisted(Ok(pos)) => Ok(pos),
        other => Err(format!("expected a durable append, got {other:?}")),
    }
}

/// A registration of producer `name` (id 0 on connection 1).
fn publisher(name: &str) -> Arc<PublisherMeasure> {
    Arc::new(PublisherMeasure::new(
        0,
        Arc::from(name),
        "Shared",
        Default::default(),
    ))
}

/// A registration of producer `name`, id `producer_id` on connection 1.
fn slot(name: &str, producer_id: u64, exclusive: bool) -> (ProducerSlot, CancellationToken) {
    let close = CancellationToken::new();
    let slot = ProducerSlot {
        conn: 1,
        exclusive,
        close: close.clone(),
        publisher: Arc::new(PublisherMeasure::new(
            producer_id,
            Arc::from(name),
            if exclusive { "Exclusive" } else { "Shared" },
            Default::default(),
        )),
    };
    (slot, close)
}

#[tokio::test]
async fn sends_settle_in_order_and_duplicates_are_not_stored() -> TestResult {
    let h = Harness::new().await?;
    let topic = h.load(true).await?;
    // Queued back to back, answered in append order.
    let mut pending = Vec::new();
    for seq in 0..5u64 {
        let metadata = MessageMetadata {
            producer_name: "p".into(),
            sequence_id: seq,
            ..Default::default()
        };
        let entry = build_entry(&metadata, b"x");
        let (reply, settled) = oneshot::channel();
        topic
            .publish(publisher("p"), seq as i64, 0, entry, reply)
            .await?;
        pending.push(settled);
    }
    let mut positions = Vec::new();
    for rx in pending {
        positions.push(position(rx.await?)?);
    }
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    assert!(matches!(send(&topic, "p", 2).await?, Published::Duplicate));
    assert_eq!(topic.log.last_confirmed(), positions.last().copied());
    // Another producer's ids are its own.
    position(send(&topic, "q", 2).await?)?;
    topic.stop().await;
    // Loaded again, the state is folded from the log.
    let topic = h.load(true).await?;
    let (s, _rx) = slot("p", 7, false);
    assert_eq!(topic.add_producer(s, None).await?, 4);
    assert!(matches!(send(&topic, "p", 4).await?, Published::Duplicate));
    position(send(&topic, "p", 5).await?)?;
    topic.stop().await;
    h.log.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn switching_deduplication_on_folds_what_was_written_without_it() -> TestResult {
    let h = Harness::new().await?;
    let topic = h.load(false).await?;
    for seq in 0..3 {
        position(send(&topic, "p", seq).await?)?;
    }
    // Without deduplication a re-send is stored again.
    position(send(&topic, "p", 1).await?)?;
    let on = TopicPolicies {
        deduplication: true,
        ..TopicPolicies::default()
    };
    // The broker's pass hands over changed policies only, and saves no snapshot of a topic
    // without deduplication.
    assert!(!topic.needs_policies(&TopicPolicies::default()));
    assert!(!topic.may_deduplicate());
    assert!(topic.needs_policies(&on));
    topic.set_policies(on).await;
    assert!(!topic.needs_policies(&on));
    assert!(topic.may_deduplicate());
    assert!(matches!(send(&topic, "p", 2).await?, Published::Duplicate));
    position(send(&topic, "p", 3).await?)?;
    // Switched off again: nothing is refused.
    topic.set_policies(TopicPolicies::default()).await;
    position(send(&topic, "p", 3).await?)?;
    topic.stop().await;
    h.log.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn the_producer_limit_applies_to_new_producers_at_once() -> TestResult {
    let h = Harness::new().await?;
    let topic = h.load(false).await?;
    let limit = |max| TopicPolicies {
        deduplication: false,
        max_producers: max,
        backlog: Default::default(),
        consumers: Default::default(),
        inactive: None,
        replication: Default::default(),
    };
    topic.set_policies(limit(Some(2))).await;
    let mut kept = Vec::new();
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        let (s, rx) = slot(name, i as u64, false);
        topic.add_producer(s, None).await?;
        kept.push(rx);
    }
    let (c, _c) = slot("c", 3, false);
    let refused = topic.add_producer(c, None).await;
    assert!(
        matches!(&refused, Err(BrokerError::ProducerBusy(m)) if m.contains("max producers")),
        "{refused:?}"
    );
    // Raised on the live topic: the next producer gets in; connected ones are never dropped.
    topic.set_policies(limit(Some(3))).await;
    let (c, _c) = slot("c", 3, false);
    topic.add_producer(c, None).await?;
    topic.set_policies(limit(Some(1))).await;
    let (d, _d) = slot("d", 4, false);
    assert!(topic.add_producer(d, None).await.is_err());
    topic.remove_producer("a".into(), 1, 0).await;
    topic.set_policies(limit(None)).await;
    let (d, _d) = slot("d", 4, false);
    topic.add_producer(d, None).await?;
    topic.stop().await;
    h.log.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn an_exclusive_producer_excludes_every_other() -> TestResult {
    let h = Harness::new().await?;
    let topic = h.load(false).await?;
    let (a, _a) = slot("a", 1, false);
    assert_eq!(topic.add_producer(a, None).await?, -1);
    let (same_name, _s) = slot("a", 2, false);
    let refused = topic.add_producer(same_name, None).await;
    assert!(
        matches!(refused, Err(BrokerError::ProducerBusy(_))),
        "{refused:?}"
    );
    // As Pulsar answers an exclusive producer that is not alone: fenced.
    let (exclusive, _e) = slot("x", 3, true);
    let refused = topic.add_producer(exclusive, None).await;
    assert!(
        matches!(refused, Err(BrokerError::ProducerFenced(_))),
        "{refused:?}"
    );
    // Once "a" goes, an exclusive producer gets the topic, and then nobody else does.
    topic.remove_producer("a".into(), 1, 1).await;
    let (exclusive, _e) = slot("x", 3, true);
    topic.add_producer(exclusive, None).await?;
    let (b, _b) = slot("b", 4, false);
    let refused = topic.add_producer(b, None).await;
    assert!(
        matches!(refused, Err(BrokerError::ProducerBusy(_))),
        "{refused:?}"
    );
    // Removing with another connection's producer id leaves the registration alone.
    topic.remove_producer("x".into(), 1, 99).await;
    let (b, _b) = slot("b", 4, false);
    assert!(topic.add_producer(b, None).await.is_err());
    topic.stop().await;
    h.log.shutdown().await?;
    Ok(())
}

/// Asks `topic` to register a `WaitForExclusive` producer in the background, and returns
/// once the owner has answered or queued it: (the registration's answer, queued or not).
async fn wait_for_exclusive(
    topic: &Arc<BrokerTopic>,
    slot: ProducerSlot,
) -> (tokio::task::JoinHandle<Result<i64, BrokerError>>, bool) {
    let (queued, told) = oneshot::channel();
    let topic = topic.clone();
    let answer = tokio::spawn(async move { topic.add_producer(slot, Some(queued)).await });
    // The owner fires `queued` when it queues the producer, and drops it otherwise.
    let queued = told.await.is_ok();
    (answer, queued)
}

#[tokio::test]
async fn a_wait_for_exclusive_producer_waits_its_turn() -> TestResult {
    let h = Harness::new().await?;
    let topic = h.load(false).await?;
    // Alone, it is registered at once.
    let (w, _w) = slot("w", 1, true);
    let (first, queued) = wait_for_exclusive(&topic, w).await;
    assert!(!queued);
    assert_eq!(first.await??, -1);
    topic.remove_producer("w".into(), 1, 1).await;

    let (a, _a) = slot("a", 2, false);
    topic.add_producer(a, None).await?;
    let (w, _w) = slot("w", 3, true);
    let (waiter, queued) = wait_for_exclusive(&topic, w).await;
    assert!(queued, "told it waits while a is there");
    let (v, _v) = slot("v", 4, true);
    let (later, queued) = wait_for_exclusive(&topic, v).await;
    assert!(queued, "v waits behind w");
    // A waiter whose connection gave up is skipped.
    let (gone, _g) = slot("gone", 5, true);
    let (gave_up, queued) = wait_for_exclusive(&topic, gone).await;
    assert!(queued);
    gave_up.abort();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished() && !later.is_finished());

    // Newcomers do not pass the waiters: a shared one is busy, an exclusive one fenced.
    let (s, _s) = slot("s", 8, false);
    let refused = topic.add_producer(s, None).await;
    assert!(
        matches!(refused, Err(BrokerError::ProducerBusy(_))),
        "{refused:?}"
    );
    let (x, _x) = slot("x", 9, true);
    let refused = topic.add_producer(x, None).await;
    assert!(
        matches!(refused, Err(BrokerError::ProducerFenced(_))),
        "{refused:?}"
    );
    // a goes: w, the oldest, gets the topic alone; v waits on.
    topic.remove_producer("a".into(), 1, 2).await;
    assert_eq!(waiter.await??, -1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!later.is_finished(), "v registered beside w");
    let (b, _b) = slot("b", 6, false);
    let refused = topic.add_producer(b, None).await;
    assert!(
        matches!(refused, Err(BrokerError::ProducerBusy(_))),
        "{refused:?}"
    );
    // w goes: v gets it; the one that gave up is not registered.
    topic.remove_producer("w".into(), 1, 3).await;
    assert_eq!(later.await??, -1);
    topic.remove_producer("v".into(), 1, 4).await;
    let (gone, _g) = slot("gone", 7, false);
    topic.add_producer(gone, None).await?;
    topic.stop().await;
    h.log.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_waiter_that_gave_up_holds_nobody_back() -> TestResult {
    let h = Harness::new().await?;
    let topic = h.load(false).await?;
    let (a, _a) = slot("a", 1, false);
    topic.add_producer(a, None).await?;
    let (w, _w) = slot("w", 2, true);
    let (gave_up, queued) = wait_for_exclusive(&topic, w).await;
    assert!(queued);
    gave_up.abort();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Nobody waits any more: a shared newcomer joins a.
    let (s, _s) = slot("s", 3, false);
    assert_eq!(topic.add_producer(s, None).await?, -1);
    // An exclusive producer whose own registration is still there (a reconnect racing its
    // old connection's close) is busy, which its client retries, not fenced.
    topic.remove_producer("a".into(), 1, 1).await;
    topic.remove_producer("s".into(), 1, 3).await;
    let (x, _x) = slot("x", 4, true);
    topic.add_producer(x, None).await?;
    let (again, _g) = slot("x", 5, true);
    let refused = topic.add_producer(again, None).await;
    assert!(
        matches!(refused, Err(BrokerError::ProducerBusy(_))),
        "{refused:?}"
    );
    topic.stop().await;
    h.log.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn deletion_is_refused_while_a_producer_is_attached_unless_forced() -> TestResult {
    let h = Harness::new().await?;
    let topic = h.load(false).await?;
    position(send(&topic, "p", 0).await?)?;
    let (p, close) = slot("p", 5, false);
    topic.add_producer(p, None).await?;
    let refused = topic.delete(false).await;
    assert!(
        matches!(refused, Err(BrokerError::TopicBusy(_))),
        "{refused:?}"
    );
    // Still serving after the refusal.
    position(send(&topic, "p", 1).await?)?;
    topic.delete(true).await?;
    assert!(close.is_cancelled(), "the producer was not told to close");
    // The owner has stopped: the handle refuses, the client must load the topic anew.
    let after = send(&topic, "p", 2).await;
    assert!(matches!(after, Err(BrokerError::Stopped(_))), "{after:?}");
    h.log.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_registration_nobody_waits_for_is_undone() -> TestResult {
    let h = Harness::new().await?;
    let topic = h.load(false).await?;
    // The connection that asked closed before the answer: its oneshot is gone.
    let (reply, gone) = tokio::sync::oneshot::channel();
    drop(gone);
    let (exclusive, _e) = slot("ghost", 1, true);
    let cmd = crate::broker::topic::TopicCommand::AddProducer(Box::new(
        crate::broker::topic::NewProducer {
            slot: exclusive,
            reply,
            queued: None,
        },
    ));
    topic.owner.send(cmd).await?;
    // Neither its name nor its exclusivity is held.
    let (s, _s) = slot("ghost", 2, false);
    assert_eq!(topic.add_producer(s, None).await?, -1);
    topic.stop().await;
    h.log.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn an_idle_topic_asks_to_be_unloaded_and_a_client_keeps_it_loaded() -> TestResult {
    let h = Harness::new().await?;
    let (ask, mut asked) = tokio::sync::mpsc::unbounded_channel();
    let after = Duration::from_millis(300);
    let topic = h
        .load_with(
            false,
            Some(super::IdleUnload {
                after: Some(after),
                ask,
            }),
        )
        .await?;
    // A producer attached: the topic never asks, however long it stays.
    let (s, _rx) = slot("p", 1, false);
    topic.add_producer(s, None).await?;
    position(send(&topic, "p", 0).await?)?;
    let waited = tokio::time::timeout(after * 3, asked.recv()).await;
    assert!(
        waited.is_err(),
        "a topic with a producer asked to be unloaded"
    );
    // Its producer gone, it asks once the period ran out since the producer left...
    let left = std::time::Instant::now();
    topic.remove_producer("p".into(), 1, 1).await;
    let (weak, what) = tokio::time::timeout(after * 4, asked.recv())
        .await?
        .ok_or("queue closed")?;
    assert_eq!(what, super::IdleAsk::Unload);
    assert!(left.elapsed() >= after, "asked after {:?}", left.elapsed());
    let same = weak.upgrade().ok_or("topic dropped")?;
    assert!(Arc::ptr_eq(&same, &topic));
    // ...and a client that comes before the broker gets to it keeps it loaded.
    let (s, _rx2) = slot("q", 2, false);
    topic.add_producer(s, None).await?;
    assert!(
        !topic.unload_if_idle().await,
        "unloaded with a producer attached"
    );
    position(send(&topic, "q", 0).await?)?;
    topic.remove_producer("q".into(), 1, 2).await;
    // Idle but not for the whole period yet: refused; once it has been, unloaded.
    assert!(
        !topic.unload_if_idle().await,
        "unloaded before the idle period ran out"
    );
    tokio::time::sleep(after).await;
    assert!(
        topic.unload_if_idle().await,
        "an idle topic was not unloaded"
    );
    assert!(matches!(
        topic.add_producer(slot("r", 3, false).0, None).await,
        Err(BrokerError::Stopped(_))
    ));
    Ok(())
}

#[tokio::test]
async fn each_producer_registration_counts_its_own_durable_appends() -> TestResult {
    let h = Harness::new().await?;
    let topic = h.load(false).await?;
    let (a, _a) = slot("p1", 1, false);
    let first = a.publisher.clone();
    topic.add_producer(a, None).await?;
    for seq in 0..3 {
        position(send_as(&topic, first.clone(), seq).await?)?;
    }
    assert_eq!(topic.measures.publishers().len(), 1);
    // The same name registered again (its client reconnected): a registration of its own.
    topic.remove_producer("p1".into(), 1, 1).await;
    let (again, _b) = slot("p1", 1, false);
    let second = again.publisher.clone();
    topic.add_producer(again, None).await?;
    position(send_as(&topic, second.clone(), 3).await?)?;
    assert_eq!(first.appended.totals().0, 3);
    assert_eq!(second.appended.totals().0, 1);
    let listed = topic.measures.publishers();
    assert!(listed.len() == 1 && Arc::ptr_eq(&listed[0], &second));
    let stats = second.stats(60_000);
    assert_eq!(
        (stats.msg_in_counter, stats.producer_name.as_str()),
        (1, "p1")
    );
    assert!(stats.average_msg_size > 0.0);
    topic.remove_producer("p1".into(), 1, 1).await;
    let gone = topic.subscriptions().await; // answered after the removal
    assert!(gone.is_empty() && topic.measures.publishers().is_empty());
    topic.stop().await;
    h.log.shutdown().await?;
    Ok(())
}
