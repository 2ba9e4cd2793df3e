//! Replay from the lake with pulsar-rs: messages produced across many ledgers (unbatched,
//! batched LZ4, batched ZSTD, keys, properties, event times) are consumed once from the local
//! log, then offloaded, deleted locally, the service restarted, and consumed again from the
//! lake plus the local tail: the two sequences must be identical.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use ledgerlake::ledger::LedgerState;
use ledgerlake::service::Service;
use pulsar::compression::{Compression, CompressionLz4, CompressionZstd};
use pulsar::consumer::{ConsumerOptions, InitialPosition};
use pulsar::message::proto::command_subscribe::SubType;
use pulsar::{producer, Consumer, Pulsar, TokioExecutor};

use crate::common::{runtime, TestResult};
use crate::offload::{config, http, offload_and_wait};

const TOPIC: &str = "persistent://public/default/replay-rs";

/// What a consumer sees of one message.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    id: (u64, u64, i32, Option<i32>),
    payload: Vec<u8>,
    key: Option<String>,
    properties: BTreeMap<String, String>,
    publish_time: u64,
    event_time: Option<u64>,
    producer: String,
    sequence_id: u64,
}

async fn produce(client: &Pulsar<TokioExecutor>) -> Result<Vec<Seen>, Box<dyn std::error::Error>> {
    let mut sent = Vec::new();
    let phases: [(Option<usize>, Option<Compression>, usize); 3] = [
        (None, None, 300),
        (
            Some(10),
            Some(Compression::Lz4(CompressionLz4::default())),
            700,
        ),
        (
            Some(25),
            Some(Compression::Zstd(CompressionZstd::default())),
            300,
        ),
    ];
    for (phase, (batch, compression, n)) in phases.into_iter().enumerate() {
        let batched = batch.is_some();
        let mut p = client
            .producer()
            .with_topic(TOPIC)
            .with_options(producer::ProducerOptions {
                batch_size: batch.map(|b| b as u32),
                compression,
                ..Default::default()
            })
            .build()
            .await?;
        for window in (0..n).collect::<Vec<_>>().chunks(50) {
            let mut receipts = Vec::new();
            for &i in window {
                let payload =
                    format!("{phase}/{i}/{}/{}", "ü".repeat(i % 11), "x".repeat(400)).into_bytes();
                let msg = producer::Message {
                    payload: payload.clone(),
                    partition_key: (i % 3 != 0).then(|| format!("key-{}", i % 17)),
                    properties: [("phase".to_string(), phase.to_string())].into(),
                    event_time: (i % 2 == 0).then_some(1_700_000_000_000 + i as u64),
                    ..Default::default()
                };
                receipts.push((payload, p.send_non_blocking(msg).await?));
            }
            if batched {
                p.send_batch().await?;
            }
            for (payload, r) in receipts {
                let id = r.await?.message_id.ok_or("no id")?;
                sent.push((id.ledger_id, id.entry_id, payload));
            }
        }
    }
    Ok(sent
        .into_iter()
        .map(|(l, e, payload)| Seen {
            id: (l, e, 0, None),
            payload,
            key: None,
            properties: BTreeMap::new(),
            publish_time: 0,
            event_time: None,
            producer: String::new(),
            sequence_id: 0,
        })
        .collect())
}

/// Waits until every ledger of `topic` with entries was offloaded and deleted locally.
async fn wait_all_deleted(
    service: &Service,
    topic: &str,
) -> Result<ledgerlake::ledger::TopicLog, Box<dyn std::error::Error>> {
    let log = service.log.topic(topic).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while log
        .ledgers()
        .iter()
        .any(|l| l.entry_count > 0 && l.state != LedgerState::Deleted)
    {
        if Instant::now() > deadline {
            return Err(format!("ledgers not deleted: {:?}", log.ledgers()).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(log)
}

async fn consume_all(
    client: &Pulsar<TokioExecutor>,
    subscription: &str,
    n: usize,
) -> Result<Vec<Seen>, Box<dyn std::error::Error>> {
    let mut consumer: Consumer<Vec<u8>, _> = client
        .consumer()
        .with_topic(TOPIC)
        .with_subscription(subscription)
        .with_subscription_type(SubType::Exclusive)
        .with_options(ConsumerOptions::default().with_initial_position(InitialPosition::Earliest))
        .build()
        .await?;
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        let msg = tokio::time::timeout(Duration::from_secs(30), consumer.try_next())
            .await
            .map_err(|_| format!("no message after {} of {n}", got.len()))??
            .ok_or("stream ended")?;
        consumer.ack(&msg).await?;
        let m = msg.metadata();
        got.push(Seen {
            id: (
                msg.message_id.id.ledger_id,
                msg.message_id.id.entry_id,
                msg.message_id.id.batch_index.unwrap_or(-1),
                msg.message_id.batch_size,
            ),
            payload: msg.payload.data.clone(),
            key: m.partition_key.clone(),
            properties: m
                .properties
                .iter()
                .map(|kv| (kv.key.clone(), kv.value.clone()))
                .collect(),
            publish_time: m.publish_time,
            event_time: m.event_time,
            producer: m.producer_name.clone(),
            sequence_id: m.sequence_id,
        });
    }
    consumer.close().await?;
    Ok(got)
}

#[test]
fn pulsar_rs_replays_offloaded_ranges_identically() -> TestResult {
    runtime()?.block_on(async {
        let dir = tempfile::tempdir()?;
        let mut cfg = config(dir.path())?;
        cfg.lake.check_interval = Duration::from_millis(100);
        cfg.ledger.rollover_entries = 15;
        // Passes are capped at 4 × this: "offload everything" takes several passes.
        cfg.lake.target_file_size = bytesize::ByteSize::kib(64);
        // Small read-ahead, quick release: a consumer that stops reading holds little.
        cfg.replay.read_ahead = bytesize::ByteSize::kib(64);
        cfg.replay.idle_release = Duration::from_secs(1);
        let service = Service::start(&cfg).await?;
        let ns = "/admin/v2/namespaces/public/default";
        let (code, _) = http(
            "PUT",
            service.http_addr,
            &format!("{ns}/offloadDeletionLagMs"),
            "0",
        )
        .await?;
        assert_eq!(code, 204);
        // Nothing is offloaded until asked, so the first pass reads the local log.
        let (code, _) = http(
            "PUT",
            service.http_addr,
            &format!("{ns}/offloadThreshold"),
            "-1",
        )
        .await?;
        assert_eq!(code, 204);
        let client: Pulsar<TokioExecutor> =
            Pulsar::builder(format!("pulsar://{}", service.pulsar_addr), TokioExecutor)
                .build()
                .await?;
        let sent = produce(&client).await?;
        let local = consume_all(&client, "before", sent.len()).await?;
        let sent_ids: Vec<_> = sent.iter().map(|s| (s.id.0, s.id.1, &s.payload)).collect();
        let local_ids: Vec<_> = local.iter().map(|s| (s.id.0, s.id.1, &s.payload)).collect();
        assert_eq!(
            local_ids, sent_ids,
            "local consumption matches what was produced"
        );

        let path = "/admin/v2/persistent/public/default/replay-rs";
        let status = offload_and_wait(service.http_addr, path).await?;
        assert_eq!(status["status"], "SUCCESS", "{status}");
        assert_eq!(
            status["firstUnoffloadedMessage"],
            serde_json::Value::Null,
            "one request offloads everything, over several passes: {status}"
        );
        let log = wait_all_deleted(&service, TOPIC).await?;
        assert!(
            log.ledgers().len() > 20,
            "many ledgers: {}",
            log.ledgers().len()
        );
        drop(client);
        service.shutdown().await?;

        // After a restart only the lake holds these ledgers; a local tail follows them.
        let service = Service::start(&cfg).await?;
        let client: Pulsar<TokioExecutor> =
            Pulsar::builder(format!("pulsar://{}", service.pulsar_addr), TokioExecutor)
                .build()
                .await?;
        let mut tail = client.producer().with_topic(TOPIC).build().await?;
        for i in 0..30 {
            tail.send_non_blocking(format!("tail-{i}").into_bytes())
                .await?
                .await?;
        }
        // A consumer that takes one message and stops: the lake stream buffers at most the
        // read-ahead (plus one entry), and drops its buffer once idle.
        let mut slow: Consumer<Vec<u8>, _> = client
            .consumer()
            .with_topic(TOPIC)
            .with_subscription("slow")
            .with_options(
                ConsumerOptions::default().with_initial_position(InitialPosition::Earliest),
            )
            .build()
            .await?;
        tokio::time::timeout(Duration::from_secs(30), slow.try_next())
            .await??
            .ok_or("no message")?;
        let path_stats = "/admin/v2/persistent/public/default/replay-rs/stats";
        let buffered = || async {
            let (_, stats) = http("GET", service.http_addr, path_stats, "").await?;
            Ok::<u64, Box<dyn std::error::Error>>(
                stats["replay"]["bufferedBytes"]
                    .as_u64()
                    .unwrap_or(u64::MAX),
            )
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = buffered().await?;
        assert!(held <= 64 * 1024 + 16 * 1024, "buffered {held} bytes");
        let deadline = Instant::now() + Duration::from_secs(10);
        while buffered().await? > 0 {
            assert!(
                Instant::now() < deadline,
                "idle lake stream kept its buffer"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        drop(slow);
        let replayed = consume_all(&client, "after", local.len() + 30).await?;
        assert_eq!(
            &replayed[..local.len()],
            &local[..],
            "lake replay is identical"
        );
        let tail_payloads: Vec<_> = replayed[local.len()..]
            .iter()
            .map(|s| String::from_utf8_lossy(&s.payload).to_string())
            .collect();
        assert_eq!(
            tail_payloads,
            (0..30).map(|i| format!("tail-{i}")).collect::<Vec<_>>()
        );
        let (_, stats) = http("GET", service.http_addr, &format!("{path}/stats"), "").await?;
        assert!(
            stats["replay"]["entriesFromLake"].as_u64().unwrap_or(0) > 0,
            "{stats}"
        );
        drop(client);
        service.shutdown().await?;
        Ok(())
    })
}

fn parquet_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            parquet_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "parquet") {
            out.push(p);
        }
    }
    Ok(())
}

/// A lake data file that disappears gives the consumer nothing wrong: no message until it is
/// back, the failure (table, ledger, entries) in stats, then every message exactly once.
#[test]
fn a_missing_lake_file_stalls_replay_without_losing_or_inventing_messages() -> TestResult {
    runtime()?.block_on(async {
        let dir = tempfile::tempdir()?;
        let mut cfg = config(dir.path())?;
        cfg.lake.check_interval = Duration::from_millis(100);
        cfg.ledger.rollover_entries = 50;
        cfg.replay.retry_max = Duration::from_millis(500);
        let service = Service::start(&cfg).await?;
        let ns = "/admin/v2/namespaces/public/default";
        http(
            "PUT",
            service.http_addr,
            &format!("{ns}/offloadDeletionLagMs"),
            "0",
        )
        .await?;
        let client: Pulsar<TokioExecutor> =
            Pulsar::builder(format!("pulsar://{}", service.pulsar_addr), TokioExecutor)
                .build()
                .await?;
        let topic = "persistent://public/default/replay-missing";
        let mut p = client.producer().with_topic(topic).build().await?;
        for i in 0..200 {
            p.send_non_blocking(format!("m{i}").into_bytes())
                .await?
                .await?;
        }
        drop(p);
        let path = "/admin/v2/persistent/public/default/replay-missing";
        offload_and_wait(service.http_addr, path).await?;
        wait_all_deleted(&service, topic).await?;
        let mut files = Vec::new();
        parquet_files(&dir.path().join("data/warehouse"), &mut files)?;
        assert!(!files.is_empty());
        for f in &files {
            std::fs::rename(f, f.with_extension("away"))?;
        }
        let mut consumer: Consumer<Vec<u8>, _> = client
            .consumer()
            .with_topic(topic)
            .with_subscription("s")
            .with_options(
                ConsumerOptions::default().with_initial_position(InitialPosition::Earliest),
            )
            .build()
            .await?;
        let nothing = tokio::time::timeout(Duration::from_secs(3), consumer.try_next()).await;
        assert!(
            nothing.is_err(),
            "a message arrived while its file was missing"
        );
        let (_, stats) = http("GET", service.http_addr, &format!("{path}/stats"), "").await?;
        let error = stats["subscriptions"]["s"]["lastReadError"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            error.contains("public.default.replay_missing") && error.contains("ledger"),
            "{stats}"
        );
        assert!(
            stats["replay"]["readErrors"].as_u64().unwrap_or(0) > 0,
            "{stats}"
        );
        // e.g. "lake table ledgerlake.public.default.replay_missing, ledger 1: scanning ledger 1
        // entries 0..50: ... path: .../data/publish_day=.../1-2-<attempt>-00000.parquet ..."
        assert!(
            error.contains("entries 0..") && error.contains(".parquet"),
            "the error names the range and the file: {error}"
        );
        for f in &files {
            std::fs::rename(f.with_extension("away"), f)?;
        }
        let mut got = Vec::new();
        while got.len() < 200 {
            let msg = tokio::time::timeout(Duration::from_secs(30), consumer.try_next())
                .await??
                .ok_or("stream ended")?;
            consumer.ack(&msg).await?;
            got.push(String::from_utf8(msg.payload.data.clone())?);
        }
        assert_eq!(got, (0..200).map(|i| format!("m{i}")).collect::<Vec<_>>());
        drop(consumer);
        drop(client);
        service.shutdown().await?;
        Ok(())
    })
}
