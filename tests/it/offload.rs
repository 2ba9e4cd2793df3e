//! The offload engine end to end in process: pulsar-rs produces, the admin API triggers an
//! offload, and the Iceberg table (local warehouse, SQLite catalog) is scanned back with
//! iceberg-rust; plus the exactly-once guards of the commit protocol and orphan cleanup.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{
    Array, AsArray, Int32Array, Int64Array, LargeBinaryArray, MapArray, StringArray,
};
use arrow::datatypes::TimestampMicrosecondType;
use futures::TryStreamExt;
use ledgerlake::config::{Config, LakePartitioning, ServerConfig};
use ledgerlake::lake::commit::{self, LedgerSlice, Progress, WriteOptions};
use ledgerlake::lake::{naming, orphans, Lake};
use ledgerlake::ledger::metadata::memory::MemoryMetadataStore;
use ledgerlake::ledger::Log;
use ledgerlake::naming::TopicName;
use ledgerlake::service::Service;
use pulsar::compression::{Compression, CompressionZstd};
use pulsar::{producer, Pulsar, TokioExecutor};

use crate::common::{runtime, TestResult};

pub(crate) fn config(dir: &std::path::Path) -> Result<Config, Box<dyn std::error::Error>> {
    Ok(Config {
        data_dir: dir.join("data"),
        server: ServerConfig {
            pulsar_addr: "127.0.0.1:0".parse()?,
            http_addr: "127.0.0.1:0".parse()?,
            pg_addr: "127.0.0.1:0".parse()?,
            ..ServerConfig::default()
        },
        ..Config::default()
    })
}

pub(crate) async fn http(
    method: &str,
    addr: SocketAddr,
    path: &str,
    body: &str,
) -> Result<(u16, serde_json::Value), Box<dyn std::error::Error>> {
    let url = format!("http://{addr}{path}");
    let client = reqwest::Client::new();
    let req = match method {
        "PUT" => client.put(&url).body(body.to_string()),
        "DELETE" => client.delete(&url),
        _ => client.get(&url),
    };
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    Ok((status, json))
}

/// Requests an offload and waits until the pass after the request is done.
pub(crate) async fn offload_and_wait(
    addr: SocketAddr,
    path: &str,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let (status, body) = http("PUT", addr, &format!("{path}/offload"), "").await?;
    assert_eq!(status, 200, "{body}");
    let ticket = body["request"].as_u64().ok_or("no request ticket")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, s) = http("GET", addr, &format!("{path}/offload"), "").await?;
        if s["completedRequest"].as_u64().unwrap_or(0) >= ticket {
            return Ok(s);
        }
        if Instant::now() > deadline {
            return Err(format!("offload did not finish: {s}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A produced message as the lake must show it.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    ledger: i64,
    entry: i64,
    batch_index: i32,
    key: Option<String>,
    props: BTreeMap<String, String>,
    payload: Vec<u8>,
    publish_us: i64,
    event_us: Option<i64>,
}

async fn scan(
    service: &Service,
    topic: &TopicName,
) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let engine = service.offload.clone().ok_or("lake disabled")?;
    let lake = engine.lake().clone();
    let ident = naming::table_ident(topic);
    let batches = engine
        .run_on_lake(async move {
            let table = lake.load_table(&ident).await?.ok_or("no table")?;
            let stream = table.scan().build()?.to_arrow().await?;
            let b: Vec<arrow::array::RecordBatch> = stream.try_collect().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(b)
        })
        .await?
        .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for b in batches {
        let col = |n: &str| b.column_by_name(n).cloned().ok_or(format!("no column {n}"));
        let ledger = col("ledger_id")?;
        let ledger = ledger
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or("ledger_id")?;
        let entry = col("entry_id")?;
        let entry = entry
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or("entry_id")?;
        let bi = col("batch_index")?;
        let bi = bi
            .as_any()
            .downcast_ref::<Int32Array>()
            .ok_or("batch_index")?;
        let key = col("key")?;
        let key = key.as_any().downcast_ref::<StringArray>().ok_or("key")?;
        let payload = col("payload")?;
        let payload = payload
            .as_any()
            .downcast_ref::<LargeBinaryArray>()
            .ok_or("payload")?;
        let props = col("properties")?;
        let props = props
            .as_any()
            .downcast_ref::<MapArray>()
            .ok_or("properties")?;
        let publish = col("publish_time")?;
        let publish = publish.as_primitive::<TimestampMicrosecondType>();
        let event = col("event_time")?;
        let event = event.as_primitive::<TimestampMicrosecondType>();
        for i in 0..b.num_rows() {
            let kv = props.value(i);
            let ks = kv.column(0).as_string::<i32>();
            let vs = kv.column(1).as_string::<i32>();
            rows.push(Row {
                ledger: ledger.value(i),
                entry: entry.value(i),
                batch_index: bi.value(i),
                key: (!key.is_null(i)).then(|| key.value(i).to_string()),
                props: (0..kv.len())
                    .map(|j| (ks.value(j).to_string(), vs.value(j).to_string()))
                    .collect(),
                payload: payload.value(i).to_vec(),
                publish_us: publish.value(i),
                event_us: (!event.is_null(i)).then(|| event.value(i)),
            });
        }
    }
    rows.sort_by_key(|r| (r.ledger, r.entry, r.batch_index));
    Ok(rows)
}

#[test]
fn pulsar_rs_messages_land_in_the_lake_exactly() -> TestResult {
    runtime()?.block_on(async {
        let dir = tempfile::tempdir()?;
        let service = Service::start(&config(dir.path())?).await?;
        let client: Pulsar<TokioExecutor> =
            Pulsar::builder(format!("pulsar://{}", service.pulsar_addr), TokioExecutor)
                .build()
                .await?;
        // Topics are created only in namespaces that exist.
        let addr = service.http_addr;
        let tenant = r#"{"adminRoles":[],"allowedClusters":["standalone"]}"#;
        assert_eq!(
            http("PUT", addr, "/admin/v2/tenants/acme", tenant).await?.0,
            204
        );
        let ns = "/admin/v2/namespaces/acme/orders-ns";
        assert_eq!(http("PUT", addr, ns, "").await?.0, 204);
        let topic: TopicName = "persistent://acme/orders-ns/Orders.v1".parse()?;
        let mut expected = Vec::new();
        let mut in_entry: BTreeMap<(u64, u64), i32> = BTreeMap::new();
        for (batched, n) in [(false, 300usize), (true, 700)] {
            let options = producer::ProducerOptions {
                batch_size: batched.then_some(100),
                compression: batched.then(|| Compression::Zstd(CompressionZstd::default())),
                ..Default::default()
            };
            let mut p = client
                .producer()
                .with_topic(topic.to_string())
                .with_options(options)
                .build()
                .await?;
            for window in (0..n).collect::<Vec<_>>().chunks(100) {
                let mut receipts = Vec::new();
                for i in window {
                    let payload = format!("{batched}-{i}-{}", "é".repeat(i % 7)).into_bytes();
                    let msg = producer::Message {
                        payload: payload.clone(),
                        partition_key: Some(format!("k{}", i % 13)),
                        properties: [("i".to_string(), i.to_string())].into(),
                        event_time: Some(1_700_000_000_000 + *i as u64),
                        ..Default::default()
                    };
                    receipts.push((payload, *i, p.send_non_blocking(msg).await?));
                }
                if batched {
                    p.send_batch().await?;
                }
                for (payload, i, r) in receipts {
                    let id = r.await?.message_id.ok_or("no id")?;
                    // A batched message's index is its place among the receipts of its entry.
                    let batch_index = if batched {
                        let n = in_entry.entry((id.ledger_id, id.entry_id)).or_insert(0);
                        *n += 1;
                        *n - 1
                    } else {
                        -1
                    };
                    expected.push(Row {
                        ledger: id.ledger_id as i64,
                        entry: id.entry_id as i64,
                        batch_index,
                        key: Some(format!("k{}", i % 13)),
                        props: [("i".to_string(), i.to_string())].into(),
                        payload,
                        publish_us: 0,
                        event_us: Some((1_700_000_000_000 + i as i64) * 1000),
                    });
                }
            }
        }
        let addr = service.http_addr;
        let path = "/admin/v2/persistent/acme/orders-ns/Orders.v1";
        let status = offload_and_wait(addr, path).await?;
        assert_eq!(status["status"], "SUCCESS", "{status}");
        assert_eq!(status["firstUnoffloadedMessage"], serde_json::Value::Null);

        let mut rows = scan(&service, &topic).await?;
        assert_eq!(rows.len(), expected.len());
        for r in &mut rows {
            assert!(r.publish_us > 1_700_000_000_000_000, "publish time in µs");
            r.publish_us = 0;
        }
        expected.sort_by_key(|r| (r.ledger, r.entry, r.batch_index));
        assert_eq!(rows, expected);

        // Stats name the table; asking again commits nothing twice.
        let (code, stats) = http("GET", addr, &format!("{path}/stats"), "").await?;
        assert_eq!(code, 200);
        assert_eq!(stats["lake"]["table"], "acme.orders_ns.__4frders__2ev1");
        assert!(stats["lake"]["snapshotId"].is_i64(), "{stats}");
        assert_eq!(stats["lake"]["offloadLagBytes"], 0);
        offload_and_wait(addr, path).await?;
        assert_eq!(scan(&service, &topic).await?.len(), expected.len());

        // Unknown topics and bad policy values are clear errors.
        let (code, _) = http(
            "GET",
            addr,
            "/admin/v2/persistent/acme/orders-ns/nope/offload",
            "",
        )
        .await?;
        assert_eq!(code, 404);
        let (code, _) = http(
            "PUT",
            addr,
            "/admin/v2/namespaces/acme/orders-ns/offloadDeletionLagMs",
            "soon",
        )
        .await?;
        assert_eq!(code, 400);
        drop(client);
        service.shutdown().await?;
        Ok(())
    })
}

#[test]
fn namespace_policies_drive_automatic_offload_and_local_deletion() -> TestResult {
    runtime()?.block_on(async {
        let dir = tempfile::tempdir()?;
        let mut cfg = config(dir.path())?;
        cfg.lake.check_interval = Duration::from_millis(100);
        let service = Service::start(&cfg).await?;
        let addr = service.http_addr;
        let ns = "/admin/v2/namespaces/public/default";
        // Off by size: sealed ledgers stay local.
        assert_eq!(
            http("PUT", addr, &format!("{ns}/offloadThreshold"), "-1")
                .await?
                .0,
            204
        );
        assert_eq!(
            http("GET", addr, &format!("{ns}/offloadThreshold"), "")
                .await?
                .1,
            -1
        );
        assert_eq!(
            http("PUT", addr, &format!("{ns}/offloadDeletionLagMs"), "0")
                .await?
                .0,
            204
        );
        assert_eq!(
            http("PUT", addr, &format!("{ns}/lakePartitioning"), "\"hour\"")
                .await?
                .0,
            204
        );
        assert_eq!(
            http("GET", addr, &format!("{ns}/lakePartitioning"), "")
                .await?
                .1,
            "hour"
        );
        let log = service
            .log
            .topic("persistent://public/default/auto")
            .await?;
        for i in 0..10u8 {
            log.append(
                1_700_000_000_000,
                ledgerlake::protocol::frame::build_entry(
                    &ledgerlake::protocol::proto::MessageMetadata {
                        producer_name: "p".into(),
                        sequence_id: u64::from(i),
                        publish_time: 1_700_000_000_000,
                        ..Default::default()
                    },
                    &[i],
                ),
            )
            .await?
            .durable()
            .await?;
        }
        let sealed = log.seal_current().await?.ok_or("nothing sealed")?;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let state = |log: &ledgerlake::ledger::TopicLog| {
            log.ledgers()
                .into_iter()
                .find(|l| l.id == sealed.id)
                .map(|l| l.state)
        };
        assert_eq!(state(&log), Some(ledgerlake::ledger::LedgerState::Sealed));
        // As soon as possible: offloaded, then (lag 0) deleted locally, without restart.
        assert_eq!(
            http("PUT", addr, &format!("{ns}/offloadThreshold"), "0")
                .await?
                .0,
            204
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while state(&log) != Some(ledgerlake::ledger::LedgerState::Deleted) {
            assert!(
                Instant::now() < deadline,
                "ledger not offloaded and deleted: {:?}",
                state(&log)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let topic: TopicName = "auto".parse()?;
        assert_eq!(scan(&service, &topic).await?.len(), 10);
        // The namespace asked for hourly partitions when the table was created.
        let engine = service.offload.clone().ok_or("lake disabled")?;
        let lake = engine.lake().clone();
        let ident = naming::table_ident(&topic);
        let transforms = engine
            .run_on_lake(async move {
                let t = lake.load_table(&ident).await.ok().flatten();
                t.map(|t| {
                    let spec = t.metadata().default_partition_spec().clone();
                    spec.fields()
                        .iter()
                        .map(|f| f.transform.to_string())
                        .collect::<Vec<_>>()
                })
            })
            .await?
            .ok_or("no table")?;
        assert_eq!(transforms, vec!["hour".to_string()]);
        assert_eq!(
            http("DELETE", addr, &format!("{ns}/offloadDeletionLagMs"), "")
                .await?
                .0,
            204
        );
        assert_eq!(
            http("GET", addr, &format!("{ns}/offloadDeletionLagMs"), "")
                .await?
                .1,
            3_600_000
        );
        service.shutdown().await?;
        Ok(())
    })
}

/// A log (in-memory metadata) and a lake under `dir`.
async fn log_and_lake(dir: &std::path::Path) -> Result<(Log, Lake), Box<dyn std::error::Error>> {
    let cfg = config(dir)?;
    let meta = Arc::new(MemoryMetadataStore::new());
    let log = Log::open(&dir.join("ledger"), cfg.ledger.clone(), meta).await?;
    Ok((log, Lake::open(&cfg).await?))
}

#[test]
fn commits_are_exactly_once_and_orphans_are_removed() -> TestResult {
    let rt = runtime()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let (log, lake) = log_and_lake(dir.path()).await?;
        let topic: TopicName = "persistent://t/n/x".parse()?;
        let tlog = log.topic(&topic.to_string()).await?;
        let slices = vec![sealed_slice(&tlog, -1, 50).await?];
        let sealed_id = slices[0].ledger;
        let options = write_options();
        let progress = Arc::new(Progress::default());
        let stale = lake
            .load_or_create_table(&topic, LakePartitioning::Day)
            .await?;
        let (_, first) =
            commit::write_and_commit(&lake, stale.clone(), slices.clone(), &options, &progress)
                .await?;
        assert_eq!(first.committed, vec![sealed_id]);
        assert_eq!(first.rows, 50);
        // A stale handle (loaded before the commit) must not commit the range again.
        let again =
            commit::write_and_commit(&lake, stale, slices.clone(), &options, &progress).await;
        assert!(again.is_err(), "stale handle committed twice");
        // A fresh handle sees the range as committed and writes nothing.
        let fresh = lake
            .load_table(&naming::table_ident(&topic))
            .await?
            .ok_or("table")?;
        let (_, second) =
            commit::write_and_commit(&lake, fresh.clone(), slices, &options, &progress).await?;
        assert!(second.committed.is_empty());
        assert_eq!(second.already_committed, vec![sealed_id]);
        let files = orphans::referenced_files(&fresh).await?;
        assert_eq!(files.current.len(), 1, "one data file per day partition");
        assert_eq!(fresh.metadata().snapshots().count(), 1, "one snapshot");

        // An unreferenced file in the data folder is removed; referenced ones stay.
        let data_dir = format!("{}/data", fresh.metadata().location());
        let orphan = format!("{data_dir}/left-by-a-crash.parquet");
        let orphan_path = orphan.trim_start_matches("file:").to_string();
        std::fs::write(&orphan_path, b"PAR1")?;
        let kept = orphans::delete_orphans(&lake, &fresh, Duration::from_secs(3600)).await?;
        assert!(kept.deleted.is_empty() && kept.too_young == 1, "{kept:?}");
        let report = orphans::delete_orphans(&lake, &fresh, Duration::ZERO).await?;
        assert_eq!(report.deleted, vec![orphan]);
        assert!(!std::path::Path::new(&orphan_path).exists());
        for f in &files.current {
            assert!(
                std::path::Path::new(f.trim_start_matches("file:")).exists(),
                "{f}"
            );
        }
        log.shutdown().await?;
        Ok(())
    })
}

/// `n` entries appended to `tlog` and sealed, as the slice of partition `partition`.
async fn sealed_slice(
    tlog: &ledgerlake::ledger::TopicLog,
    partition: i32,
    n: u64,
) -> Result<LedgerSlice, Box<dyn std::error::Error>> {
    for i in 0..n {
        let meta = ledgerlake::protocol::proto::MessageMetadata {
            producer_name: "p".into(),
            sequence_id: i,
            publish_time: 1_700_000_000_000 + i,
            ..Default::default()
        };
        tlog.append(
            1_700_000_000_000 + i as i64,
            ledgerlake::protocol::frame::build_entry(&meta, b"x"),
        )
        .await?
        .durable()
        .await?;
    }
    let sealed = tlog.seal_current().await?.ok_or("nothing sealed")?;
    Ok(LedgerSlice {
        topic: None,
        partition,
        log: tlog.clone(),
        ledger: sealed.id,
        entry_count: n,
        size_bytes: 0,
    })
}

fn write_options() -> WriteOptions {
    WriteOptions {
        target_file_size: 1 << 20,
        batch_rows: 16,
        partitioning: LakePartitioning::Day,
        payload_codec: None,
    }
}

/// Two writers of one table that write different partitions (two nodes offloading their own
/// partitions, or their own topics of a shared table) both commit: a commit is abandoned only
/// when a partition it writes moved, and keeps the others' watermark.
#[test]
fn commits_of_other_partitions_do_not_abandon_an_attempt() -> TestResult {
    let rt = runtime()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let (log, lake) = log_and_lake(dir.path()).await?;
        let topic: TopicName = "persistent://t/n/y".parse()?;
        let p0 = sealed_slice(&log.topic(&format!("{topic}-partition-0")).await?, 0, 10).await?;
        let p1 = sealed_slice(&log.topic(&format!("{topic}-partition-1")).await?, 1, 20).await?;
        let progress = Arc::new(Progress::default());
        let stale = lake
            .load_or_create_table(&topic, LakePartitioning::Day)
            .await?;
        commit::write_and_commit(
            &lake,
            stale.clone(),
            vec![p1.clone()],
            &write_options(),
            &progress,
        )
        .await?;
        // The stale handle saw no watermark at all; partition 0 did not move: it commits.
        let (table, outcome) =
            commit::write_and_commit(&lake, stale, vec![p0.clone()], &write_options(), &progress)
                .await?;
        assert_eq!(outcome.committed, vec![p0.ledger]);
        let watermark = commit::read_watermark(&table)?;
        let expected: commit::Watermark =
            [("0".to_string(), p0.ledger), ("1".to_string(), p1.ledger)].into();
        assert_eq!(watermark, expected);
        assert_eq!(table.metadata().snapshots().count(), 2);
        log.shutdown().await?;
        Ok(())
    })
}
