//! The subscription task driven through its command interface over a real log: dispatch by
//! subscription type (Exclusive, Failover, Shared, Key_Shared), permits, individual,
//! cumulative and batch-index acks, redelivery, consumers leaving and cursor persistence.
//!
//! Time is paused (tokio's test clock) except while the harness appends to the log: a wait for
//! a frame that must not come ends as soon as every task is idle, and intervals fire only when
//! a test advances the clock, so no test depends on how fast this machine is.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::{spawn, NewConsumer, SubscriptionCommand, SubscriptionHandle};
use crate::broker::backlog::ClientInfo;
use crate::broker::outbox::{outbox, OutboxReceiver};
use crate::broker::owner::{self, Dedup, OwnerSetup};
use crate::broker::{BrokerError, BrokerTopic, TopicPolicies};
use crate::ledger::cursor::CursorState;
use crate::ledger::{Log, Position};
use crate::protocol::command::Outbound;
use crate::protocol::frame::build_entry;
use crate::protocol::proto::command_subscribe::SubType;
use crate::protocol::proto::{base_command::Type, MessageMetadata};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// How long (test clock) a test waits for a frame that must come.
const ARRIVES: Duration = Duration::from_secs(10);
/// How long (test clock) a test watches for a frame that must not come.
const QUIET: Duration = Duration::from_millis(300);
/// How often subscriptions save their cursors in these tests.
const PERSIST_EVERY: Duration = Duration::from_secs(60);

struct Harness {
    _dir: tempfile::TempDir,
    log: Arc<Log>,
    topic: Arc<BrokerTopic>,
    next_sequence: u64,
}

impl Harness {
    async fn new() -> Result<Harness, Box<dyn std::error::Error>> {
        let (dir, log) = owner::test_log().await?;
        let name = "persistent://public/default/sub-test";
        let topic = owner::spawn(OwnerSetup {
            name: name.parse()?,
            log: log.topic(name).await?,
            lake: None,
            policies: TopicPolicies::default(),
            dedup: Dedup::Off,
            cursors: Vec::new(),
            persist_every: PERSIST_EVERY,
            publish_budget: owner::test_budget(),
            measures: Default::default(),
            activity: Default::default(),
            idle: None,
        });
        tokio::time::pause();
        Ok(Harness {
            _dir: dir,
            log,
            topic,
            next_sequence: 0,
        })
    }

    /// Appends one message (with `key` as its partition key) and waits until it is durable.
    async fn append(&mut self, key: Option<&str>) -> Result<Position, Box<dyn std::error::Error>> {
        let metadata = MessageMetadata {
            producer_name: "p".into(),
            sequence_id: self.next_sequence,
            publish_time: 1_700_000_000_000 + self.next_sequence,
            partition_key: key.map(str::to_string),
            ..Default::default()
        };
        self.next_sequence += 1;
        let entry = build_entry(&metadata, b"payload");
        // The journal thread is real: the clock runs while it writes, so a test timeout cannot
        // fire just because the runtime waited on it.
        tokio::time::resume();
        let written = async { self.topic.log.append(0, entry).await?.durable().await }.await;
        tokio::time::pause();
        Ok(written?)
    }

    fn subscribe(&self, sub_type: SubType) -> SubscriptionHandle {
        self.subscribe_as(sub_type, false)
    }

    fn subscribe_as(&self, sub_type: SubType, durable: bool) -> SubscriptionHandle {
        spawn(
            self.topic.clone(),
            "s".into(),
            sub_type,
            durable,
            self.topic.log.first_position(),
            None,
            PERSIST_EVERY,
        )
    }

    /// The oldest unacknowledged entry the saved cursor of subscription "s" records.
    async fn saved_first_unacked(&self) -> Result<Option<Position>, Box<dyn std::error::Error>> {
        for (name, blob) in self.topic.log.cursors().await? {
            if name == "s" {
                return Ok(Some(CursorState::decode(&blob)?.first_unacked));
            }
        }
        Ok(None)
    }

    async fn close(self) -> TestResult {
        tokio::time::resume();
        self.log.shutdown().await?;
        Ok(())
    }
}

/// A consumer as the subscription sees it: its key and the frames it receives.
#[derive(Debug)]
struct TestConsumer {
    id: u64,
    frames: OutboxReceiver,
}

impl TestConsumer {
    fn key(&self) -> (u64, u64) {
        (1, self.id)
    }

    /// The next MESSAGE's entry position and redelivery count (other frames are skipped).
    async fn next_message(&mut self) -> Option<(Position, u32)> {
        loop {
            let frame = tokio::time::timeout(ARRIVES, self.frames.recv())
                .await
                .ok()??;
            if let Outbound::Message(c, _) = frame {
                let m = c.message?;
                return Some((
                    Position::new(m.message_id.ledger_id, m.message_id.entry_id),
                    m.redelivery_count.unwrap_or(0),
                ));
            }
        }
    }

    async fn messages(&mut self, n: usize) -> Vec<Position> {
        let mut out = Vec::new();
        for _ in 0..n {
            match self.next_message().await {
                Some((p, _)) => out.push(p),
                None => break,
            }
        }
        out
    }

    /// Whether a MESSAGE arrives within [`QUIET`].
    async fn receives_nothing(&mut self) -> bool {
        loop {
            match tokio::time::timeout(QUIET, self.frames.recv()).await {
                Err(_) | Ok(None) => return true,
                Ok(Some(Outbound::Message(..))) => return false,
                Ok(Some(Outbound::Command(c))) => {
                    assert_ne!(c.r#type, Type::Message as i32);
                }
            }
        }
    }
}

async fn join(
    sub: &SubscriptionHandle,
    id: u64,
    sub_type: SubType,
    name: &str,
    permits: u32,
) -> Result<TestConsumer, BrokerError> {
    let (out, frames) = outbox();
    let joined = sub
        .ask(|reply| {
            SubscriptionCommand::AddConsumer(Box::new(NewConsumer {
                key: (1, id),
                sub_type,
                name: name.into(),
                priority: 0,
                out,
                client: Arc::new(ClientInfo {
                    address: "/127.0.0.1:4000".into(),
                    version: "test-client".into(),
                }),
                reply,
            }))
        })
        .await
        .unwrap_or_else(|| Err(BrokerError::Stopped("subscription stopped".into())));
    joined?;
    if permits > 0 {
        let _ = sub.tx.send(SubscriptionCommand::Flow((1, id), permits));
    }
    Ok(TestConsumer { id, frames })
}

fn ack(sub: &SubscriptionHandle, positions: &[Position], cumulative: bool) {
    let _ = sub.tx.send(SubscriptionCommand::Ack {
        positions: positions.iter().map(|p| (*p, None)).collect(),
        cumulative,
    });
}

#[tokio::test]
async fn exclusive_takes_one_consumer_and_respects_permits() -> TestResult {
    let mut h = Harness::new().await?;
    let mut written = Vec::new();
    for _ in 0..5 {
        written.push(h.append(None).await?);
    }
    let sub = h.subscribe(SubType::Exclusive);
    let mut c = join(&sub, 1, SubType::Exclusive, "a", 3).await?;
    let second = join(&sub, 2, SubType::Exclusive, "b", 1).await;
    assert!(
        matches!(second, Err(BrokerError::ConsumerBusy(_))),
        "{second:?}"
    );
    let other_type = join(&sub, 3, SubType::Shared, "c", 1).await;
    assert!(matches!(other_type, Err(BrokerError::ConsumerBusy(_))));
    assert_eq!(c.messages(3).await, written[..3]);
    assert!(c.receives_nothing().await, "no message beyond the permits");
    let _ = sub.tx.send(SubscriptionCommand::Flow(c.key(), 10));
    assert_eq!(c.messages(2).await, written[3..]);
    // Appended after the consumer caught up: delivered when it becomes durable.
    let later = h.append(None).await?;
    assert_eq!(c.messages(1).await, vec![later]);
    h.close().await
}

#[tokio::test]
async fn shared_spreads_entries_without_duplicates_and_redelivers_a_leavers_backlog() -> TestResult
{
    let mut h = Harness::new().await?;
    let mut written = BTreeSet::new();
    for _ in 0..10 {
        written.insert(h.append(None).await?);
    }
    let sub = h.subscribe(SubType::Shared);
    let mut a = join(&sub, 1, SubType::Shared, "a", 4).await?;
    let mut b = join(&sub, 2, SubType::Shared, "b", 100).await?;
    let got_a = a.messages(4).await;
    assert!(a.receives_nothing().await, "a has 4 permits");
    let got_b = b.messages(10 - got_a.len()).await;
    let all: BTreeSet<Position> = got_a.iter().chain(&got_b).copied().collect();
    assert_eq!(all.len(), 10, "no entry twice: {got_a:?} {got_b:?}");
    assert_eq!(all, written);
    // a leaves without acknowledging: its entries go to b, marked as redelivered.
    let _ = sub.tx.send(SubscriptionCommand::RemoveConsumer(a.key()));
    let mut again = Vec::new();
    for _ in 0..got_a.len() {
        let (p, count) = b.next_message().await.ok_or("redelivery missing")?;
        assert!(count >= 1, "redelivered entries carry their count");
        again.push(p);
    }
    again.sort();
    let mut expected = got_a.clone();
    expected.sort();
    assert_eq!(again, expected);
    h.close().await
}

#[tokio::test]
async fn failover_sends_to_one_consumer_and_moves_its_backlog_when_it_leaves() -> TestResult {
    let mut h = Harness::new().await?;
    let mut written = Vec::new();
    for _ in 0..6 {
        written.push(h.append(None).await?);
    }
    let sub = h.subscribe(SubType::Failover);
    // Ordered by (priority, name): "a" is active although it joined second.
    let mut b = join(&sub, 2, SubType::Failover, "b", 0).await?;
    let mut a = join(&sub, 1, SubType::Failover, "a", 0).await?;
    for c in [&a, &b] {
        let _ = sub.tx.send(SubscriptionCommand::Flow(c.key(), 100));
    }
    let got = a.messages(6).await;
    assert_eq!(got, written);
    assert!(b.receives_nothing().await, "the standby gets nothing");
    ack(&sub, &got[..2], false);
    let _ = sub.tx.send(SubscriptionCommand::RemoveConsumer(a.key()));
    // The unacknowledged ones move to b, in order.
    assert_eq!(b.messages(4).await, written[2..]);
    h.close().await
}

#[tokio::test]
async fn key_shared_keeps_each_key_on_one_consumer() -> TestResult {
    let mut h = Harness::new().await?;
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    let mut key_of = HashMap::new();
    for i in 0..40 {
        let k = keys[i % keys.len()];
        key_of.insert(h.append(Some(k)).await?, k);
    }
    let sub = h.subscribe(SubType::KeyShared);
    let mut a = join(&sub, 1, SubType::KeyShared, "a", 0).await?;
    let mut b = join(&sub, 2, SubType::KeyShared, "b", 0).await?;
    for c in [&a, &b] {
        let _ = sub.tx.send(SubscriptionCommand::Flow(c.key(), 1000));
    }
    let mut owner: HashMap<&str, u64> = HashMap::new();
    let mut seen = BTreeSet::new();
    let mut last_per_key: HashMap<&str, Position> = HashMap::new();
    while seen.len() < 40 {
        let (id, got) = tokio::select! {
            m = a.next_message() => (1, m),
            m = b.next_message() => (2, m),
        };
        let (p, _) = got.ok_or("a message is missing")?;
        let k = key_of[&p];
        assert_eq!(
            *owner.entry(k).or_insert(id),
            id,
            "key {k} went to two consumers"
        );
        if let Some(prev) = last_per_key.insert(k, p) {
            assert!(prev < p, "key {k} out of order");
        }
        assert!(seen.insert(p), "{p} delivered twice");
    }
    h.close().await
}

#[tokio::test]
async fn acks_and_redelivery_requests() -> TestResult {
    let mut h = Harness::new().await?;
    let mut written = Vec::new();
    for _ in 0..6 {
        written.push(h.append(None).await?);
    }
    let sub = h.subscribe(SubType::Shared);
    let mut c = join(&sub, 1, SubType::Shared, "a", 100).await?;
    let got = c.messages(6).await;
    assert_eq!(got, written);
    // Individual acks of 0 and 3, a cumulative ack up to 1: 2, 4 and 5 stay unacknowledged.
    ack(&sub, &[got[0], got[3]], false);
    ack(&sub, &[got[1]], true);
    let _ = sub.tx.send(SubscriptionCommand::Redeliver(c.key()));
    let mut again = c.messages(3).await;
    again.sort();
    assert_eq!(again, vec![got[2], got[4], got[5]]);
    let stats = sub
        .ask(SubscriptionCommand::Stats)
        .await
        .ok_or("no stats")?;
    assert_eq!(stats.unacked_entries, 3);
    // Each consumer's own stats, as Pulsar gives them: 100 permits, 9 messages sent (6 and
    // the 3 redelivered), 3 of them unacknowledged.
    let [c0] = stats.consumers.as_slice() else {
        return Err(format!("one consumer expected: {:?}", stats.consumers).into());
    };
    assert_eq!(
        (
            c0.consumer_name.as_str(),
            c0.available_permits,
            c0.unacked_messages
        ),
        ("a", 91, 3)
    );
    assert_eq!(
        (
            c0.address.as_str(),
            c0.client_version.as_str(),
            c0.msg_out_counter
        ),
        ("/127.0.0.1:4000", "test-client", 9)
    );
    assert!(!c0.blocked_consumer_on_unacked_msgs);
    ack(&sub, &again, false);
    let mark = sub
        .ask(SubscriptionCommand::MarkDelete)
        .await
        .flatten()
        .ok_or("no mark-delete position")?;
    assert_eq!(mark, got[5], "everything acknowledged");
    h.close().await
}

#[tokio::test]
async fn a_batch_acknowledged_in_part_stays_unacknowledged() -> TestResult {
    let mut h = Harness::new().await?;
    let first = h.append(None).await?;
    let sub = h.subscribe(SubType::Shared);
    let mut c = join(&sub, 1, SubType::Shared, "a", 100).await?;
    assert_eq!(c.messages(1).await, vec![first]);
    // Indices still unacknowledged: bit 1 of the first word.
    let _ = sub.tx.send(SubscriptionCommand::Ack {
        positions: vec![(first, Some(vec![0b10]))],
        cumulative: false,
    });
    let _ = sub.tx.send(SubscriptionCommand::Redeliver(c.key()));
    let (again, count) = c.next_message().await.ok_or("redelivery missing")?;
    assert_eq!((again, count >= 1), (first, true));
    // The rest of the batch acknowledged: nothing is left.
    ack(&sub, &[first], false);
    let _ = sub.tx.send(SubscriptionCommand::Redeliver(c.key()));
    assert!(c.receives_nothing().await);
    let stats = sub
        .ask(SubscriptionCommand::Stats)
        .await
        .ok_or("no stats")?;
    assert_eq!(stats.unacked_entries, 0);
    h.close().await
}

#[tokio::test]
async fn an_entry_written_later_reaches_a_waiting_consumer() -> TestResult {
    let mut h = Harness::new().await?;
    let sub = h.subscribe(SubType::Exclusive);
    let mut c = join(&sub, 1, SubType::Exclusive, "a", 10).await?;
    assert!(c.receives_nothing().await);
    let p = h.append(Some("x")).await?;
    assert_eq!(c.messages(1).await, vec![p]);
    h.close().await
}

#[tokio::test]
async fn a_durable_cursor_is_saved_once_per_interval_and_on_flush() -> TestResult {
    let mut h = Harness::new().await?;
    let mut written = Vec::new();
    for _ in 0..4 {
        written.push(h.append(None).await?);
    }
    let sub = h.subscribe_as(SubType::Exclusive, true);
    let mut c = join(&sub, 1, SubType::Exclusive, "a", 10).await?;
    let got = c.messages(4).await;
    assert_eq!(got, written);
    // A new durable subscription is saved at its first tick (right after it starts: the test
    // clock moves once every task is idle), at its start.
    tokio::time::sleep(Duration::from_millis(10)).await;
    sub.ask(SubscriptionCommand::Stats).await.ok_or("stopped")?;
    assert_eq!(h.saved_first_unacked().await?, Some(written[0]));
    ack(&sub, &got[..2], true);
    // The ack is not saved before the interval has passed ...
    tokio::time::advance(PERSIST_EVERY - Duration::from_secs(1)).await;
    sub.ask(SubscriptionCommand::Stats).await.ok_or("stopped")?;
    assert_eq!(h.saved_first_unacked().await?, Some(written[0]));
    // ... and is once it has.
    tokio::time::advance(Duration::from_secs(2)).await;
    sub.ask(SubscriptionCommand::Stats).await.ok_or("stopped")?;
    assert_eq!(h.saved_first_unacked().await?, Some(written[2]));
    // A flush saves at once.
    ack(&sub, &[got[2]], true);
    sub.ask(SubscriptionCommand::Flush).await.ok_or("stopped")?;
    assert_eq!(h.saved_first_unacked().await?, Some(written[3]));
    h.close().await
}

#[tokio::test]
async fn a_non_durable_subscription_saves_nothing() -> TestResult {
    let mut h = Harness::new().await?;
    let first = h.append(None).await?;
    let sub = h.subscribe(SubType::Shared);
    let mut c = join(&sub, 1, SubType::Shared, "a", 10).await?;
    assert_eq!(c.messages(1).await, vec![first]);
    ack(&sub, &[first], false);
    tokio::time::advance(PERSIST_EVERY * 3).await;
    sub.ask(SubscriptionCommand::Flush).await.ok_or("stopped")?;
    assert_eq!(h.saved_first_unacked().await?, None);
    h.close().await
}

#[tokio::test]
async fn a_consumer_nobody_waits_for_is_detached() -> TestResult {
    let h = Harness::new().await?;
    let sub = h.subscribe(SubType::Exclusive);
    // The connection that asked closed before the answer: its oneshot is gone.
    let (reply, gone) = tokio::sync::oneshot::channel();
    drop(gone);
    let (out, _frames) = outbox();
    let _ = sub
        .tx
        .send(SubscriptionCommand::AddConsumer(Box::new(NewConsumer {
            key: (1, 9),
            sub_type: SubType::Exclusive,
            name: "ghost".into(),
            priority: 0,
            out,
            client: Arc::default(),
            reply,
        })));
    // The exclusive subscription is free for the next consumer.
    join(&sub, 1, SubType::Exclusive, "a", 1).await?;
    h.close().await
}

/// An owner superseded by a later one (fenced higher) cannot delete the subscription's cursor:
/// the delete says so instead of reporting success, and the cursor stays for the new owner.
#[tokio::test]
async fn a_superseded_owner_cannot_delete_a_cursor_and_says_so() -> TestResult {
    let h = Harness::new().await?;
    h.topic.log.fence(3).await?;
    let sub = h.subscribe_as(SubType::Exclusive, true);
    sub.ask(SubscriptionCommand::Flush).await;
    assert!(
        h.saved_first_unacked().await?.is_some(),
        "the cursor is saved"
    );
    // Another node takes the topic over at a later epoch.
    h.log.metadata().fence_writers(h.topic.log.id(), 4).await?;
    let deleted = sub
        .ask(SubscriptionCommand::Delete)
        .await
        .ok_or("answered")?;
    assert!(
        matches!(
            deleted,
            Err(BrokerError::Metadata(
                crate::ledger::metadata::MetadataError::Fenced { .. }
            ))
        ),
        "{deleted:?}"
    );
    assert!(
        h.saved_first_unacked().await?.is_some(),
        "the cursor stays for the new owner"
    );
    h.close().await
}
