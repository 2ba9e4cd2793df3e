//! `ledgerlake perf offload`: offload throughput, end to end, beside the local limit.
//!
//! 1. Appends realistic JSON messages (varied names, cities, amounts, uuids and free text from
//!    a vocabulary; not repetitive) as Pulsar batch entries to a log on disk, and seals it.
//! 2. **Pipeline**: [`crate::lake::commit::write_and_commit`] from those sealed entries
//!    (read, decoded, unrolled) to a committed Iceberg snapshot in the chosen warehouse.
//! 3. **Local limit**: the same rows, already built as Arrow batches, encoded by plain
//!    parquet-rs (`ArrowWriter`, same writer properties) into memory, on one thread.
//! 4. Optionally dumps the rows as an Arrow IPC file, for `benches/pyiceberg_append.py` to time
//!    PyIceberg's `append` of the same rows in the same run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use parquet::arrow::ArrowWriter;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::config::{Config, LakePartitioning};
use crate::lake::commit::{self, LedgerSlice, Progress, WriteOptions};
use crate::lake::rows::RowBuilder;
use crate::lake::{Lake, LakeError};
use crate::ledger::metadata::memory::MemoryMetadataStore;
use crate::ledger::{LedgerState, Log};
use crate::naming::TopicName;
use crate::protocol::entry::build_batch_entry;
use crate::protocol::proto::{MessageMetadata, SingleMessageMetadata};

/// What to run.
#[derive(Debug, Clone)]
pub struct OffloadBenchOptions {
    /// Working directory (log; local warehouse unless `config.lake.warehouse` is set).
    pub dir: PathBuf,
    /// Service configuration supplying the lake (warehouse, catalog, S3).
    pub config: Config,
    /// Approximate payload size of one message.
    pub message_size: usize,
    /// Raw payload bytes to offload.
    pub total_bytes: u64,
    /// Messages per Pulsar batch entry.
    pub batch: usize,
    /// Write the rows as Arrow IPC here (for the PyIceberg comparison).
    pub dump_arrow: Option<PathBuf>,
}

/// Results.
#[derive(Debug, Clone, Serialize)]
pub struct OffloadBenchReport {
    /// Approximate payload size.
    pub message_size: usize,
    /// Messages.
    pub messages: u64,
    /// Raw JSON payload bytes.
    pub raw_bytes: u64,
    /// Warehouse location.
    pub warehouse: String,
    /// Pipeline: seconds from sealed entries to committed snapshot.
    pub pipeline_seconds: f64,
    /// Pipeline: raw payload MB/s.
    pub pipeline_mb_per_s: f64,
    /// Pipeline: rows/s.
    pub pipeline_rows_per_s: f64,
    /// Pipeline: CPU seconds this process used (user + system, all threads; 10 ms ticks).
    /// Steadier than wall time on a shared machine; a local S3 server's CPU is not in it.
    pub pipeline_cpu_seconds: f64,
    /// Parquet bytes committed.
    pub lake_bytes: u64,
    /// Parquet bytes / raw payload bytes.
    pub lake_ratio: f64,
    /// Plain parquet-rs encoding of the same batches to memory: seconds.
    pub parquet_rs_seconds: f64,
    /// Plain parquet-rs: raw payload MB/s.
    pub parquet_rs_mb_per_s: f64,
    /// Plain parquet-rs output bytes / raw bytes.
    pub parquet_rs_ratio: f64,
    /// Pipeline throughput / parquet-rs throughput.
    pub pipeline_vs_parquet_rs: f64,
    /// Reading the sealed entries and building the Arrow batches alone (one thread): MB/s.
    pub decode_mb_per_s: f64,
}

const WORDS: &[&str] = &[
    "order",
    "shipped",
    "delayed",
    "customer",
    "asked",
    "about",
    "refund",
    "warehouse",
    "north",
    "parcel",
    "priority",
    "express",
    "invoice",
    "paid",
    "pending",
    "blue",
    "large",
    "small",
    "fragile",
    "gift",
    "wrapped",
    "returned",
    "damaged",
    "box",
    "coupon",
    "applied",
    "weekend",
    "delivery",
    "window",
    "morning",
    "evening",
    "driver",
    "called",
    "twice",
    "left",
    "at",
    "door",
    "neighbour",
    "signed",
    "by",
    "reception",
    "missing",
    "item",
    "replacement",
    "sent",
    "loyalty",
    "points",
    "added",
    "subscription",
    "renewed",
    "cancelled",
    "address",
    "changed",
    "phone",
    "updated",
    "the",
    "and",
    "with",
    "from",
    "for",
    "please",
    "thanks",
    "urgent",
];
const CITIES: &[&str] = &[
    "Oslo", "Lisbon", "Kraków", "Lyon", "Turin", "Utrecht", "Gent", "Aarhus", "Tartu", "Porto",
    "Sevilla", "Bremen", "Graz", "Brno", "Cluj", "Malmö", "Espoo", "Cork", "Bilbao", "Nantes",
];
const FIRST: &[&str] = &[
    "Ada", "Björn", "Chloé", "Dmitri", "Eva", "Farid", "Greta", "Hugo", "Inés", "Jonas", "Kai",
    "Lena", "Mateo", "Nora", "Oskar", "Priya", "Quentin", "Rosa", "Sven", "Tamar",
];

/// One realistic JSON message of about `size` bytes.
pub fn json_message(rng: &mut StdRng, n: u64, size: usize) -> Vec<u8> {
    let mut note = String::new();
    let head = format!(
        "{{\"order_id\":\"{:08x}-{:04x}-{:04x}\",\"seq\":{n},\"customer\":{{\"name\":\"{} {}\",\"city\":\"{}\"}},\"amount\":{}.{:02},\"currency\":\"EUR\",\"status\":\"{}\",\"note\":\"",
        rng.random::<u32>(),
        rng.random::<u16>(),
        rng.random::<u16>(),
        FIRST[rng.random_range(0..FIRST.len())],
        FIRST[rng.random_range(0..FIRST.len())],
        CITIES[rng.random_range(0..CITIES.len())],
        rng.random_range(1..5000),
        rng.random_range(0..100),
        WORDS[rng.random_range(0..WORDS.len())],
    );
    let target = size.saturating_sub(head.len() + 2);
    while note.len() < target {
        if !note.is_empty() {
            note.push(' ');
        }
        note.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    note.truncate(target);
    format!("{head}{note}\"}}").into_bytes()
}

/// Builds one Pulsar batch entry (stored form) of `payloads`, keyed by customer.
pub fn batch_entry(
    payloads: &[Vec<u8>],
    first_seq: u64,
    publish_ms: u64,
    keys: bool,
) -> bytes::Bytes {
    let meta = MessageMetadata {
        producer_name: "perf-offload".into(),
        sequence_id: first_seq,
        publish_time: publish_ms,
        ..Default::default()
    };
    let singles = payloads.iter().enumerate().map(|(i, p)| {
        let seq = first_seq + i as u64;
        let single = SingleMessageMetadata {
            partition_key: keys.then(|| format!("customer-{}", seq % 997)),
            sequence_id: Some(seq),
            ..Default::default()
        };
        (single, p)
    });
    build_batch_entry(meta, singles)
}

fn mb_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs.max(1e-9)
}

/// Runs the benchmark.
pub async fn run(
    opts: OffloadBenchOptions,
) -> Result<OffloadBenchReport, Box<dyn std::error::Error + Send + Sync>> {
    let log_dir = opts.dir.join("ledger");
    let mut config = opts.config.clone();
    config.data_dir = opts.dir.clone();
    let meta = Arc::new(MemoryMetadataStore::new());
    let mut ledger_cfg = config.ledger.clone();
    ledger_cfg.rollover_size = bytesize::ByteSize::gib(4);
    ledger_cfg.rollover_entries = u64::MAX / 2;
    let log = Log::open(&log_dir, ledger_cfg, meta).await?;
    let topic: TopicName =
        format!("persistent://public/perf/offload-{}", opts.message_size).parse()?;
    let tlog = log.topic(&topic.to_string()).await?;

    // 1. Realistic JSON messages as batch entries.
    let mut rng = StdRng::seed_from_u64(42);
    let (mut n, mut raw) = (0u64, 0u64);
    let start_ms = 1_767_225_600_000u64; // 2026-01-01
    let mut receipts = Vec::new();
    while raw < opts.total_bytes {
        let payloads: Vec<Vec<u8>> = (0..opts.batch)
            .map(|i| json_message(&mut rng, n + i as u64, opts.message_size))
            .collect();
        raw += payloads.iter().map(|p| p.len() as u64).sum::<u64>();
        let entry = batch_entry(&payloads, n, start_ms + n / 10, true);
        n += payloads.len() as u64;
        receipts.push(tlog.append((start_ms + n / 10) as i64, entry).await?);
        if receipts.len() >= 1024 {
            for r in receipts.drain(..) {
                r.durable().await?;
            }
        }
    }
    for r in receipts {
        r.durable().await?;
    }
    tlog.seal_current().await?;
    let slices: Vec<LedgerSlice> = tlog
        .ledgers()
        .into_iter()
        .filter(|l| l.state == LedgerState::Sealed && l.entry_count > 0)
        .map(|l| LedgerSlice {
            topic: None,
            partition: -1,
            log: tlog.clone(),
            ledger: l.id,
            entry_count: l.entry_count,
            size_bytes: l.size_bytes,
        })
        .collect();

    // 2. The pipeline.
    let lake = Lake::open(&config).await?;
    let table = lake
        .load_or_create_table(&topic, LakePartitioning::Day)
        .await?;
    let options = WriteOptions {
        target_file_size: config.lake.target_file_size.as_u64(),
        batch_rows: config.lake.batch_rows,
        partitioning: LakePartitioning::Day,
        payload_codec: None,
    };
    let arrow_schema = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())
            .map_err(LakeError::iceberg("schema"))?,
    );
    let started = Instant::now();
    let cpu_before = super::process_cpu_seconds();
    let (_, outcome) = commit::write_and_commit(
        &lake,
        table,
        slices.clone(),
        &options,
        &Arc::new(Progress::default()),
    )
    .await?;
    let pipeline = started.elapsed().as_secs_f64();
    let pipeline_cpu = super::process_cpu_seconds() - cpu_before;

    // 3. The same rows as Arrow batches, then plain parquet-rs to memory.
    let decode_started = Instant::now();
    let batches = build_batches(&slices, arrow_schema.clone(), options.batch_rows).await?;
    let decode_secs = decode_started.elapsed().as_secs_f64();
    let props = commit::parquet_properties(&arrow_schema);
    let encode_schema = arrow_schema.clone();
    let to_encode = batches.clone();
    let (parquet_secs, parquet_bytes) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut out = Vec::with_capacity(64 << 20);
        let mut w = ArrowWriter::try_new(&mut out, encode_schema, Some(props))?;
        for b in &to_encode {
            w.write(b)?;
        }
        w.close()?;
        Ok::<_, parquet::errors::ParquetError>((started.elapsed().as_secs_f64(), out.len() as u64))
    })
    .await??;
    if let Some(path) = &opts.dump_arrow {
        dump_ipc(path, &arrow_schema, &batches)?;
    }
    log.shutdown().await?;
    let pipeline_mb = mb_per_s(raw, pipeline);
    let parquet_mb = mb_per_s(raw, parquet_secs);
    Ok(OffloadBenchReport {
        message_size: opts.message_size,
        messages: n,
        raw_bytes: raw,
        warehouse: config.warehouse_location(),
        pipeline_seconds: pipeline,
        pipeline_mb_per_s: pipeline_mb,
        pipeline_rows_per_s: outcome.rows as f64 / pipeline,
        pipeline_cpu_seconds: pipeline_cpu,
        lake_bytes: outcome.file_bytes,
        lake_ratio: outcome.file_bytes as f64 / raw as f64,
        parquet_rs_seconds: parquet_secs,
        parquet_rs_mb_per_s: parquet_mb,
        parquet_rs_ratio: parquet_bytes as f64 / raw as f64,
        pipeline_vs_parquet_rs: pipeline_mb / parquet_mb,
        decode_mb_per_s: mb_per_s(raw, decode_secs),
    })
}

async fn build_batches(
    slices: &[LedgerSlice],
    schema: arrow::datatypes::SchemaRef,
    batch_rows: usize,
) -> Result<Vec<RecordBatch>, Box<dyn std::error::Error + Send + Sync>> {
    let mut out = Vec::new();
    let mut b = RowBuilder::new(schema, -1, None);
    for s in slices {
        let mut next = 0;
        while next < s.entry_count {
            let last = (next + 4096).min(s.entry_count) - 1;
            let entries = s.log.read_entries(s.ledger, next, last).await?;
            next += entries.len() as u64;
            for e in &entries {
                b.push_entry(e);
                if b.is_full(batch_rows) {
                    out.push(b.finish()?.0);
                }
            }
        }
    }
    if b.rows() > 0 {
        out.push(b.finish()?.0);
    }
    Ok(out)
}

fn dump_ipc(
    path: &Path,
    schema: &arrow::datatypes::SchemaRef,
    batches: &[RecordBatch],
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let file = std::fs::File::create(path)?;
    let mut w = arrow::ipc::writer::FileWriter::try_new(std::io::BufWriter::new(file), schema)?;
    for b in batches {
        w.write(b)?;
    }
    w.finish()?;
    Ok(())
}
