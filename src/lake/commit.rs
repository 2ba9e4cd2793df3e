//! Writing sealed ledgers into a table and committing them exactly once.
//!
//! Protocol (one writer per table, enforced by the offload engine):
//! 1. Read the table's watermark (table property `ledgerlake.watermark`: partition index →
//!    highest ledger id committed). Ledgers at or below it are already in the table: they are
//!    reported as `already_committed` and not written again.
//! 2. Write the remaining ledgers' rows to new data files named
//!    `<first ledger>-<last ledger>-<attempt id>-<n>.parquet` (never reused: the attempt id is
//!    random per attempt).
//! 3. Reload the table; if the watermark moved, abandon the attempt (delete its files).
//! 4. One transaction: fast-append the files with snapshot properties (`ledgerlake.watermark`,
//!    `ledgerlake.ranges` with this commit's exact entry ranges, `ledgerlake.attempt`), and set
//!    the table property `ledgerlake.watermark`. The property survives snapshot expiry and
//!    commits by outside engines (they keep table properties).
//!
//! A crash before step 4 leaves only unreferenced files (deleted by [`super::orphans`]); a
//! crash after it is found at step 1 of the next attempt. Per partition, ledgers are committed
//! in id order, so "at or below the watermark" is exactly "committed".

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use iceberg::spec::{DataFile, DataFileFormat, Literal, PartitionKey, Struct};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use super::rows::RowBuilder;
use super::typed::{PayloadCodec, TypedColumns};
use super::{schema, Lake, LakeError};
use crate::config::LakePartitioning;
use crate::ledger::{Entry, LedgerId, TopicLog};

/// Table property and snapshot-summary key of the watermark.
pub const WATERMARK_KEY: &str = "ledgerlake.watermark";
/// Snapshot-summary key of a commit's exact ranges.
pub const RANGES_KEY: &str = "ledgerlake.ranges";
/// Snapshot-summary key of the attempt id.
pub const ATTEMPT_KEY: &str = "ledgerlake.attempt";

/// Partition index → highest ledger id committed.
pub type Watermark = BTreeMap<i32, LedgerId>;

/// One sealed ledger to offload.
#[derive(Debug, Clone)]
pub struct LedgerSlice {
    /// Partition index (-1: not partitioned).
    pub partition: i32,
    /// The partition's log.
    pub log: TopicLog,
    /// Ledger.
    pub ledger: LedgerId,
    /// Its entries (ids `0..entry_count`).
    pub entry_count: u64,
    /// Its payload bytes.
    pub size_bytes: u64,
}

/// Knobs of one write.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Target Parquet file size.
    pub target_file_size: u64,
    /// Rows per Arrow batch.
    pub batch_rows: usize,
    /// Partition granularity of the table (as created).
    pub partitioning: LakePartitioning,
    /// How the topic's payloads decode into typed columns, if it has a schema.
    pub payload_codec: Option<PayloadCodec>,
}

/// Progress counters, readable while a write runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Entries read from the log so far.
    pub entries: AtomicU64,
    /// Payload bytes read so far.
    pub bytes: AtomicU64,
}

/// What a commit did.
#[derive(Debug, Clone, Default)]
pub struct CommitOutcome {
    /// New snapshot id (`None` when nothing needed committing).
    pub snapshot_id: Option<i64>,
    /// Ledgers written and committed by this call.
    pub committed: Vec<LedgerId>,
    /// Ledgers found already committed (an earlier attempt crashed after its commit).
    pub already_committed: Vec<LedgerId>,
    /// Rows written.
    pub rows: u64,
    /// Data files written.
    pub files: usize,
    /// Bytes of Parquet written.
    pub file_bytes: u64,
    /// Rows whose payload did not decode against the topic schema.
    pub bad_payloads: u64,
}

/// Reads the watermark of a table.
pub fn read_watermark(table: &Table) -> Result<Watermark, LakeError> {
    match table.metadata().properties().get(WATERMARK_KEY) {
        None => Ok(Watermark::new()),
        Some(json) => serde_json::from_str::<BTreeMap<String, LedgerId>>(json)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                m.into_iter()
                    .map(|(k, v)| k.parse::<i32>().map(|p| (p, v)).map_err(|e| e.to_string()))
                    .collect()
            })
            .map_err(|reason| LakeError::Table {
                table: table.identifier().to_string(),
                reason: format!("invalid {WATERMARK_KEY}: {reason}"),
            }),
    }
}

fn watermark_json(w: &Watermark) -> String {
    let m: BTreeMap<String, LedgerId> = w.iter().map(|(p, l)| (p.to_string(), *l)).collect();
    serde_json::to_string(&m).unwrap_or_default()
}

fn committed(w: &Watermark, s: &LedgerSlice) -> bool {
    w.get(&s.partition).is_some_and(|hw| s.ledger <= *hw)
}

/// A random id for one attempt.
pub fn attempt_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

type DataWriter = <DataFileWriterBuilder<
    ParquetWriterBuilder,
    DefaultLocationGenerator,
    DefaultFileNameGenerator,
> as IcebergWriterBuilder>::R;

/// Writer properties of lake data files: ZSTD, statistics per column chunk, page statistics on
/// the id and time columns.
pub fn parquet_properties(schema: &SchemaRef) -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_max_row_group_row_count(Some(1 << 20));
    // Page-level statistics on the id and time columns, so readers can skip pages.
    for col in ["ledger_id", "entry_id", "batch_index", "publish_time"] {
        if schema.field_with_name(col).is_ok() {
            b = b.set_column_statistics_enabled(col.into(), EnabledStatistics::Page);
        }
    }
    b.build()
}

/// Writes `slices` (sealed ledgers of one table, ascending per partition) into `table` and
/// commits them, following the protocol in the module docs.
pub async fn write_and_commit(
    lake: &Lake,
    table: Table,
    slices: Vec<LedgerSlice>,
    options: &WriteOptions,
    progress: &Arc<Progress>,
) -> Result<(Table, CommitOutcome), LakeError> {
    let ident = table.identifier().clone();
    let watermark = read_watermark(&table)?;
    let (done, todo): (Vec<LedgerSlice>, Vec<LedgerSlice>) =
        slices.into_iter().partition(|s| committed(&watermark, s));
    let mut outcome = CommitOutcome {
        already_committed: done.iter().map(|s| s.ledger).collect(),
        ..Default::default()
    };
    if todo.is_empty() {
        return Ok((table, outcome));
    }
    let attempt = attempt_id();
    let first = todo.iter().map(|s| s.ledger).min().unwrap_or_default();
    let last = todo.iter().map(|s| s.ledger).max().unwrap_or_default();
    let files = match write_files(&table, &todo, options, progress, &attempt, (first, last)).await {
        Ok(f) => f,
        Err((e, written)) => {
            delete_files(&table, &written).await;
            return Err(e);
        }
    };
    crate::failpoint::hit("offload.before_commit");

    let fresh = lake
        .load_table(&ident)
        .await?
        .ok_or_else(|| LakeError::Table {
            table: ident.to_string(),
            reason: "disappeared during offload".into(),
        })?;
    let locations: Vec<String> = files
        .data_files
        .iter()
        .map(|f| f.file_path().to_string())
        .collect();
    if read_watermark(&fresh)? != watermark {
        delete_files(&fresh, &locations).await;
        return Err(LakeError::Table {
            table: ident.to_string(),
            reason: "another writer committed to the table during this offload".into(),
        });
    }
    let mut next = watermark.clone();
    let mut ranges = Vec::new();
    for s in &todo {
        let hw = next.entry(s.partition).or_insert(0);
        *hw = (*hw).max(s.ledger);
        if s.entry_count > 0 {
            ranges.push(format!(
                "{}:{}:0-{}",
                s.partition,
                s.ledger,
                s.entry_count - 1
            ));
        }
    }
    let wm = watermark_json(&next);
    let summary = HashMap::from([
        (WATERMARK_KEY.to_string(), wm.clone()),
        (RANGES_KEY.to_string(), ranges.join(",")),
        (ATTEMPT_KEY.to_string(), attempt.clone()),
    ]);
    outcome.files = files.data_files.len();
    outcome.file_bytes = files
        .data_files
        .iter()
        .map(|f| f.file_size_in_bytes())
        .sum();
    outcome.rows = files.rows;
    outcome.bad_payloads = files.bad_payloads;
    let commit = async {
        let tx = Transaction::new(&fresh);
        let tx = tx
            .update_table_properties()
            .set(WATERMARK_KEY.to_string(), wm)
            .apply(tx)?;
        let tx = tx
            .fast_append()
            .with_check_duplicate(false)
            .add_data_files(files.data_files)
            .set_snapshot_properties(summary)
            .apply(tx)?;
        tx.commit(lake.catalog().as_ref()).await
    };
    let committed_table = match commit.await {
        Ok(t) => t,
        Err(e) => {
            // The commit may or may not have landed (e.g. a timeout after the catalog wrote).
            // Only delete the files if the table provably does not reference them.
            if let Ok(Some(t)) = lake.load_table(&ident).await {
                if read_watermark(&t).is_ok_and(|w| w == watermark) {
                    delete_files(&t, &locations).await;
                }
            }
            return Err(LakeError::iceberg(format!("committing to {ident}"))(e));
        }
    };
    crate::failpoint::hit("offload.after_commit");
    outcome.snapshot_id = committed_table.metadata().current_snapshot_id();
    outcome.committed = todo.iter().map(|s| s.ledger).collect();
    Ok((committed_table, outcome))
}

struct WrittenFiles {
    data_files: Vec<DataFile>,
    rows: u64,
    bad_payloads: u64,
}

async fn delete_files(table: &Table, locations: &[String]) {
    for l in locations {
        if let Err(e) = table.file_io().delete(l).await {
            tracing::warn!(file = %l, error = %e, "could not delete an uncommitted data file; orphan cleanup will");
        }
    }
}

/// Writes the rows of `slices`; on failure returns the error and the files already written.
async fn write_files(
    table: &Table,
    slices: &[LedgerSlice],
    options: &WriteOptions,
    progress: &Arc<Progress>,
    attempt: &str,
    (first, last): (LedgerId, LedgerId),
) -> Result<WrittenFiles, (LakeError, Vec<String>)> {
    let fail = |e: LakeError| (e, Vec::new());
    let metadata = table.metadata();
    let iceberg_schema = metadata.current_schema().clone();
    let arrow_schema: SchemaRef = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(&iceberg_schema)
            .map_err(LakeError::iceberg("table schema to Arrow"))
            .map_err(fail)?,
    );
    let spec = metadata.default_partition_spec().as_ref().clone();
    let location = DefaultLocationGenerator::new(metadata)
        .map_err(LakeError::iceberg("location generator"))
        .map_err(fail)?;
    let names = DefaultFileNameGenerator::new(
        format!("{first}-{last}-{attempt}"),
        None,
        DataFileFormat::Parquet,
    );
    let parquet =
        ParquetWriterBuilder::new(parquet_properties(&arrow_schema), iceberg_schema.clone());
    let rolling = RollingFileWriterBuilder::new(
        parquet,
        options.target_file_size as usize,
        table.file_io().clone(),
        location,
        names,
    );
    let builder = DataFileWriterBuilder::new(rolling);
    let partitioned = !spec.fields().is_empty();

    // Feeder: reads the log and builds record batches on blocking threads, one batch ahead of
    // the Parquet encoder below (two cores busy when there is work).
    let (tx, mut rx) = tokio::sync::mpsc::channel::<BatchResult>(2);
    let feeder = {
        let slices = slices.to_vec();
        let schema = arrow_schema.clone();
        let options = options.clone();
        let progress = progress.clone();
        async move {
            let result = feed(slices, schema, &options, &progress, &tx).await;
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
            }
        }
    };
    let feeder = tokio::spawn(feeder);

    let mut writers: BTreeMap<i32, DataWriter> = BTreeMap::new();
    let mut rows = 0u64;
    let mut bad_payloads = 0u64;
    let mut failure = None;
    while let Some(item) = rx.recv().await {
        let (batch, publish_us, bad) = match item {
            Ok(b) => b,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        rows += batch.num_rows() as u64;
        bad_payloads += bad as u64;
        let parts = if partitioned {
            split_by_partition(&batch, &publish_us, options.partitioning)
        } else {
            Ok(vec![(0, batch)])
        };
        let parts = match parts {
            Ok(p) => p,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        for (value, part) in parts {
            let writer = match writers.entry(value) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let key = partitioned.then(|| {
                        let literal = match options.partitioning {
                            LakePartitioning::Day => Literal::date(value),
                            LakePartitioning::Hour => Literal::int(value),
                        };
                        PartitionKey::new(
                            spec.clone(),
                            iceberg_schema.clone(),
                            Struct::from_iter([Some(literal)]),
                        )
                    });
                    match builder.build(key).await {
                        Ok(w) => v.insert(w),
                        Err(e) => {
                            failure = Some(LakeError::iceberg("opening a data file writer")(e));
                            break;
                        }
                    }
                }
            };
            if let Err(e) = writer.write(part).await {
                failure = Some(LakeError::iceberg("writing Parquet")(e));
                break;
            }
        }
        if failure.is_some() {
            break;
        }
    }
    drop(rx);
    let _ = feeder.await;
    let mut data_files = Vec::new();
    for (_, mut w) in writers {
        match w.close().await {
            Ok(files) => data_files.extend(files),
            Err(e) => {
                failure.get_or_insert(LakeError::iceberg("closing a data file")(e));
            }
        }
    }
    match failure {
        None => Ok(WrittenFiles {
            data_files,
            rows,
            bad_payloads,
        }),
        Some(e) => {
            let written = data_files
                .iter()
                .map(|f| f.file_path().to_string())
                .collect();
            Err((e, written))
        }
    }
}

/// A finished batch: rows, each row's publish time (µs), rows with a decode error.
type RowBatch = (RecordBatch, Vec<i64>, usize);
/// What the feeder hands to the encoder.
type BatchResult = Result<RowBatch, LakeError>;

/// Payload bytes that end an Arrow batch early (bounds memory with large messages).
const MAX_BATCH_PAYLOAD: usize = 32 << 20;

/// Entries read from the log per call.
const READ_CHUNK_ENTRIES: u64 = 4096;

async fn feed(
    slices: Vec<LedgerSlice>,
    schema: SchemaRef,
    options: &WriteOptions,
    progress: &Progress,
    tx: &tokio::sync::mpsc::Sender<BatchResult>,
) -> Result<(), LakeError> {
    let mut builder: Option<RowBuilder> = None;
    let mut builder_partition = i32::MIN;
    for s in slices {
        let mut next = 0u64;
        while next < s.entry_count {
            let last = (next + READ_CHUNK_ENTRIES).min(s.entry_count) - 1;
            let entries = s
                .log
                .read_entries(s.ledger, next, last)
                .await
                .map_err(|source| LakeError::Read {
                    ledger: s.ledger,
                    source,
                })?;
            if entries.is_empty() {
                return Err(LakeError::Table {
                    table: s.log.name().to_string(),
                    reason: format!("ledger {} ends before entry {next}", s.ledger),
                });
            }
            next += entries.len() as u64;
            count(progress, &entries);
            // A new partition needs a builder of its own (the partition column is per builder).
            let mut b = match builder.take() {
                Some(b) if builder_partition == s.partition => b,
                other => {
                    if let Some(mut old) = other {
                        if old.rows() > 0 {
                            send(tx, tokio::task::spawn_blocking(move || old.finish()).await)
                                .await?;
                        }
                    }
                    builder_partition = s.partition;
                    let typed = options
                        .payload_codec
                        .clone()
                        .and_then(|c| TypedColumns::new(&schema, c));
                    RowBuilder::new(schema.clone(), s.partition, typed)
                }
            };
            let batch_rows = options.batch_rows;
            let (b2, finished) = tokio::task::spawn_blocking(move || {
                let mut finished = Vec::new();
                for e in &entries {
                    b.push_entry(e);
                    if b.rows() >= batch_rows || b.payload_bytes() >= MAX_BATCH_PAYLOAD {
                        finished.push(b.finish());
                    }
                }
                (b, finished)
            })
            .await
            .map_err(|_| LakeError::Stopped)?;
            for f in finished {
                tx.send(f.map_err(LakeError::from))
                    .await
                    .map_err(|_| LakeError::Stopped)?;
            }
            builder = Some(b2);
        }
    }
    if let Some(mut b) = builder {
        if b.rows() > 0 {
            send(tx, tokio::task::spawn_blocking(move || b.finish()).await).await?;
        }
    }
    Ok(())
}

async fn send(
    tx: &tokio::sync::mpsc::Sender<BatchResult>,
    joined: Result<Result<RowBatch, super::rows::RowsError>, tokio::task::JoinError>,
) -> Result<(), LakeError> {
    let item = joined
        .map_err(|_| LakeError::Stopped)?
        .map_err(LakeError::from);
    tx.send(item).await.map_err(|_| LakeError::Stopped)
}

/// Splits a batch into runs of one partition value each (rows keep their order).
fn split_by_partition(
    batch: &RecordBatch,
    publish_us: &[i64],
    granularity: LakePartitioning,
) -> Result<Vec<(i32, RecordBatch)>, LakeError> {
    let values: Vec<i32> = publish_us
        .iter()
        .map(|t| schema::partition_value(*t, granularity))
        .collect();
    let Some(&first) = values.first() else {
        return Ok(Vec::new());
    };
    if values.iter().all(|v| *v == first) {
        return Ok(vec![(first, batch.clone())]);
    }
    let mut distinct: Vec<i32> = values.clone();
    distinct.sort_unstable();
    distinct.dedup();
    distinct
        .into_iter()
        .map(|v| {
            let mask: BooleanArray = values.iter().map(|x| Some(*x == v)).collect();
            arrow::compute::filter_record_batch(batch, &mask)
                .map(|b| (v, b))
                .map_err(|e| LakeError::Rows(e.into()))
        })
        .collect()
}

/// Counts entries read, for progress reporting.
fn count(progress: &Progress, entries: &[Entry]) {
    progress
        .entries
        .fetch_add(entries.len() as u64, Ordering::Relaxed);
    progress.bytes.fetch_add(
        entries.iter().map(|e| e.payload.len() as u64).sum(),
        Ordering::Relaxed,
    );
}
