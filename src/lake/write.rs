//! Writing the rows of sealed ledgers into new data files of a table (committing them is
//! [`super::commit`]'s job).
//!
//! The work is cut into up to [`LANES`] contiguous spans of message ids of about equal size;
//! each lane has a feeder (reads the log, builds Arrow batches on a blocking thread, hands each
//! batch over as soon as it is built) and an encoder (Parquet through Iceberg's writers), so
//! both cores encode when there is enough to do. Each file holds one contiguous, sorted span.
//!
//! Invariants:
//! - Every entry of every slice is written exactly once, in message-id order within its lane.
//! - On failure the caller gets the locations of every file any lane wrote, to delete them.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::SchemaRef;
use iceberg::spec::{
    DataFile, DataFileFormat, Literal, PartitionKey, PartitionSpec, SchemaRef as IcebergSchemaRef,
    Struct,
};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};

use super::rows::RowBuilder;
use super::typed::PayloadCodec;
use super::typed::TypedColumns;
use super::{schema, LakeError};
use crate::config::LakePartitioning;
use crate::ledger::{Entry, LedgerId, TopicLog};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use std::sync::atomic::AtomicU64;

/// One sealed ledger to offload.
#[derive(Debug, Clone)]
pub struct LedgerSlice {
    /// In a namespace's shared table, the `topic` column of the ledger's rows; `None` in a
    /// topic's own table.
    pub topic: Option<Arc<str>>,
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

/// Writer properties of lake data files: ZSTD, statistics per column chunk (page statistics on
/// the id and time columns; none on the opaque byte columns, which skip dictionaries too).
pub fn parquet_properties(schema: &SchemaRef) -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_max_row_group_row_count(Some(1 << 20))
        .set_max_row_group_bytes(Some(ROW_GROUP_BYTES));
    // Page-level statistics on the id and time columns, so readers can skip pages.
    for col in ["ledger_id", "entry_id", "batch_index", "publish_time"] {
        if schema.field_with_name(col).is_ok() {
            b = b.set_column_statistics_enabled(col.into(), EnabledStatistics::Page);
        }
    }
    // Opaque, mostly unique bytes: no dictionary (it would be abandoned after its first
    // megabyte anyway) and no min/max (nobody prunes by payload; full values would bloat the
    // footer).
    for col in [
        "payload",
        "entry_metadata",
        "message_metadata",
        "ordering_key",
    ] {
        if schema.field_with_name(col).is_ok() {
            b = b
                .set_column_dictionary_enabled(col.into(), false)
                .set_column_statistics_enabled(col.into(), EnabledStatistics::None);
        }
    }
    // Unique, ascending integers: delta encoding stores a producer's sequence as almost nothing,
    // where a dictionary is abandoned after its first megabyte and leaves plain values, whose
    // size then depends on where row groups happen to end.
    if schema.field_with_name("sequence_id").is_ok() {
        b = b
            .set_column_dictionary_enabled("sequence_id".into(), false)
            .set_column_encoding("sequence_id".into(), Encoding::DELTA_BINARY_PACKED);
    }
    // Bigger pages of payload bytes give ZSTD more context per frame (no statistics or
    // dictionary live on these pages, and readers fetch the whole column chunk anyway).
    if schema.field_with_name("payload").is_ok() {
        b = b.set_column_data_page_size_limit("payload".into(), PAYLOAD_PAGE_BYTES);
    }
    b.build()
}

/// Encoded size of a row group: each is handed to storage as soon as it is encoded, so on S3
/// its upload overlaps the encoding of the next (see [`super::upload`]).
pub const ROW_GROUP_BYTES: usize = 16 << 20;

/// Data page size of the payload column.
const PAYLOAD_PAGE_BYTES: usize = 8 << 20;

/// Parallel lanes of one write (the lake runtime has two workers).
pub const LANES: usize = 2;
/// Below this many payload bytes a write uses one lane (one file per partition value).
const MIN_BYTES_PER_LANE: u64 = 8 << 20;
/// Bytes read from the log per call (about).
const READ_CHUNK_BYTES: u64 = 4 << 20;
/// Most entries read from the log per call.
const READ_CHUNK_ENTRIES: u64 = 4096;

/// What the lanes wrote.
pub(super) struct WrittenFiles {
    pub data_files: Vec<DataFile>,
    pub rows: u64,
    pub bad_payloads: u64,
    /// In a shared table: rows and bad payloads per topic.
    pub by_topic: ByTopic,
}

/// Rows and bad payloads written per topic (shared tables).
pub type ByTopic = BTreeMap<Arc<str>, (u64, u64)>;

/// Entries `first..end` of one ledger.
#[derive(Debug, Clone)]
struct Span {
    topic: Option<Arc<str>>,
    partition: i32,
    log: TopicLog,
    ledger: LedgerId,
    first: u64,
    end: u64,
    /// Average entry size, for read chunking.
    avg_entry: u64,
}

/// A finished batch: rows, each row's publish time (µs), rows with a decode error.
type RowBatch = (RecordBatch, ScalarBuffer<i64>, usize);
/// What a feeder hands to its encoder.
type BatchResult = Result<RowBatch, LakeError>;

type Rolling = RollingFileWriterBuilder<
    ParquetWriterBuilder,
    DefaultLocationGenerator,
    DefaultFileNameGenerator,
>;
type DataWriter = <DataFileWriterBuilder<
    ParquetWriterBuilder,
    DefaultLocationGenerator,
    DefaultFileNameGenerator,
> as IcebergWriterBuilder>::R;

/// What every lane shares.
struct Lane {
    arrow_schema: SchemaRef,
    iceberg_schema: IcebergSchemaRef,
    spec: PartitionSpec,
    /// Invariant: clones share the file-name counter, so lanes never reuse a name.
    rolling: Rolling,
    options: WriteOptions,
    progress: Arc<Progress>,
}

/// Cuts `slices` into at most `lanes` contiguous spans of about equal payload bytes.
fn split(slices: &[LedgerSlice], lanes: usize) -> Vec<Vec<Span>> {
    let total: u64 = slices.iter().map(|s| s.size_bytes).sum();
    let lanes = lanes.clamp(1, ((total / MIN_BYTES_PER_LANE) as usize).max(1));
    let per_lane = total.div_ceil(lanes as u64).max(1);
    let mut out: Vec<Vec<Span>> = vec![Vec::new()];
    let mut in_lane = 0u64;
    for s in slices {
        let avg = (s.size_bytes / s.entry_count.max(1)).max(1);
        let mut first = 0u64;
        while first < s.entry_count {
            let room = per_lane.saturating_sub(in_lane);
            let last_lane = out.len() == lanes;
            let take = if last_lane {
                s.entry_count - first
            } else {
                room.div_ceil(avg).clamp(1, s.entry_count - first)
            };
            if let Some(lane) = out.last_mut() {
                lane.push(Span {
                    topic: s.topic.clone(),
                    partition: s.partition,
                    log: s.log.clone(),
                    ledger: s.ledger,
                    first,
                    end: first + take,
                    avg_entry: avg,
                });
            }
            first += take;
            in_lane += take * avg;
            if in_lane >= per_lane && !last_lane {
                out.push(Vec::new());
                in_lane = 0;
            }
        }
    }
    out.retain(|l| !l.is_empty());
    out
}

/// Writes the rows of `slices`; on failure returns the error and the files already written.
pub(super) async fn write_files(
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
    let lane = Arc::new(Lane {
        spec: metadata.default_partition_spec().as_ref().clone(),
        rolling: RollingFileWriterBuilder::new(
            parquet,
            options.target_file_size as usize,
            table.file_io().clone(),
            location,
            names,
        ),
        arrow_schema,
        iceberg_schema,
        options: options.clone(),
        progress: progress.clone(),
    });
    let handles: Vec<_> = split(slices, LANES)
        .into_iter()
        .map(|spans| tokio::spawn(write_lane(lane.clone(), spans)))
        .collect();
    let mut written = WrittenFiles {
        data_files: Vec::new(),
        rows: 0,
        bad_payloads: 0,
        by_topic: ByTopic::new(),
    };
    let mut failure = None;
    let mut partial_files = Vec::new();
    for h in handles {
        match h.await {
            Ok(Ok((files, rows, bad, by_topic))) => {
                written.data_files.extend(files);
                written.rows += rows;
                written.bad_payloads += bad;
                for (topic, (r, b)) in by_topic {
                    let sum = written.by_topic.entry(topic).or_default();
                    sum.0 += r;
                    sum.1 += b;
                }
            }
            Ok(Err((e, files))) => {
                partial_files.extend(files);
                failure.get_or_insert(e);
            }
            Err(_) => {
                failure.get_or_insert(LakeError::Stopped);
            }
        }
    }
    match failure {
        None => Ok(written),
        Some(e) => {
            partial_files.extend(written.data_files.iter().map(|f| f.file_path().to_string()));
            Err((e, partial_files))
        }
    }
}

type LaneOutput = (Vec<DataFile>, u64, u64, ByTopic);

async fn write_lane(
    lane: Arc<Lane>,
    spans: Vec<Span>,
) -> Result<LaneOutput, (LakeError, Vec<String>)> {
    let started = std::time::Instant::now();
    let builder = DataFileWriterBuilder::new(lane.rolling.clone());
    let partitioned = !lane.spec.fields().is_empty();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<BatchResult>(2);
    let feeder = {
        let lane = lane.clone();
        tokio::spawn(async move {
            if let Err(e) = feed(spans, &lane, &tx).await {
                let _ = tx.send(Err(e)).await;
            }
        })
    };
    let mut writers = Writers::default();
    let (mut rows, mut bad_payloads) = (0u64, 0u64);
    let mut by_topic = ByTopic::new();
    let mut failure = None;
    let mut data_files = Vec::new();
    while let Some(item) = rx.recv().await {
        let result = match item {
            Ok((batch, publish_us, bad)) => {
                rows += batch.num_rows() as u64;
                bad_payloads += bad as u64;
                // A shared table's spans come topic by topic: a topic's files are closed
                // when the next topic starts (bounded open writers, one file per topic).
                let topic = batch_topic(&batch);
                if let Some(t) = &topic {
                    let sum = by_topic.entry(t.clone()).or_default();
                    sum.0 += batch.num_rows() as u64;
                    sum.1 += bad as u64;
                }
                if topic != writers.topic {
                    close_writers(&mut writers, &mut data_files, &mut failure).await;
                    writers.topic = topic;
                }
                encode(
                    &lane,
                    &builder,
                    &mut writers,
                    partitioned,
                    batch,
                    &publish_us,
                )
                .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            failure = Some(e);
            break;
        }
    }
    drop(rx);
    let _ = feeder.await;
    let encoded_ms = started.elapsed().as_millis() as u64;
    close_writers(&mut writers, &mut data_files, &mut failure).await;
    tracing::debug!(
        rows,
        encoded_ms,
        closed_ms = started.elapsed().as_millis() as u64,
        "lane finished"
    );
    match failure {
        None => Ok((data_files, rows, bad_payloads, by_topic)),
        Some(e) => Err((
            e,
            data_files
                .iter()
                .map(|f| f.file_path().to_string())
                .collect(),
        )),
    }
}

/// The open data-file writers of one lane: one per time partition value, all of one topic.
#[derive(Default)]
struct Writers {
    /// The `topic` column of the rows they hold (shared tables), `None` otherwise.
    topic: Option<Arc<str>>,
    by_value: BTreeMap<i32, DataWriter>,
}

/// Closes every open writer, adding its files to `data_files` (or the error to `failure`).
async fn close_writers(
    writers: &mut Writers,
    data_files: &mut Vec<DataFile>,
    failure: &mut Option<LakeError>,
) {
    for (_, mut w) in std::mem::take(&mut writers.by_value) {
        match w.close().await {
            Ok(files) => data_files.extend(files),
            Err(e) => {
                failure.get_or_insert(LakeError::iceberg("closing a data file")(e));
            }
        }
    }
}

/// The `topic` column of a batch of a shared table (every row has the same), else `None`.
fn batch_topic(batch: &RecordBatch) -> Option<Arc<str>> {
    use arrow::array::{Array, AsArray};
    let column = batch.column_by_name(schema::TOPIC_COLUMN)?;
    let strings = column.as_string_opt::<i32>()?;
    (!strings.is_empty() && strings.is_valid(0)).then(|| Arc::from(strings.value(0)))
}

/// Writes one batch, split by partition value, to the writer of each value.
async fn encode(
    lane: &Lane,
    builder: &DataFileWriterBuilder<
        ParquetWriterBuilder,
        DefaultLocationGenerator,
        DefaultFileNameGenerator,
    >,
    writers: &mut Writers,
    partitioned: bool,
    batch: RecordBatch,
    publish_us: &[i64],
) -> Result<(), LakeError> {
    let parts = if partitioned {
        split_by_partition(&batch, publish_us, lane.options.partitioning)?
    } else {
        vec![(0, batch)]
    };
    for (value, part) in parts {
        let writer = match writers.by_value.entry(value) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                let key = partitioned.then(|| {
                    let literal = match lane.options.partitioning {
                        LakePartitioning::Day => Literal::date(value),
                        LakePartitioning::Hour => Literal::int(value),
                    };
                    // The shared table's spec starts with identity(topic).
                    let values = match &writers.topic {
                        Some(t) => vec![Some(Literal::string(t.as_ref())), Some(literal)],
                        None => vec![Some(literal)],
                    };
                    PartitionKey::new(
                        lane.spec.clone(),
                        lane.iceberg_schema.clone(),
                        Struct::from_iter(values),
                    )
                });
                let w = builder
                    .build(key)
                    .await
                    .map_err(LakeError::iceberg("opening a data file writer"))?;
                v.insert(w)
            }
        };
        writer
            .write(part)
            .await
            .map_err(LakeError::iceberg("writing Parquet"))?;
    }
    Ok(())
}

/// Reads the spans and hands finished batches to the encoder as soon as they are built.
async fn feed(
    spans: Vec<Span>,
    lane: &Lane,
    tx: &tokio::sync::mpsc::Sender<BatchResult>,
) -> Result<(), LakeError> {
    let options = &lane.options;
    let mut builder: Option<RowBuilder> = None;
    let mut builder_key: Option<(Option<Arc<str>>, i32)> = None;
    for s in spans {
        let chunk = (READ_CHUNK_BYTES / s.avg_entry).clamp(1, READ_CHUNK_ENTRIES);
        let mut next = s.first;
        while next < s.end {
            let last = (next + chunk).min(s.end) - 1;
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
            count(&lane.progress, &entries);
            // A new partition or topic needs a builder of its own (those columns are per
            // builder).
            let key = (s.topic.clone(), s.partition);
            let mut b = match builder.take() {
                Some(b) if builder_key.as_ref() == Some(&key) => b,
                other => {
                    if let Some(mut old) = other {
                        if old.rows() > 0 {
                            let done = tokio::task::spawn_blocking(move || old.finish())
                                .await
                                .map_err(|_| LakeError::Stopped)?;
                            tx.send(done.map_err(LakeError::from))
                                .await
                                .map_err(|_| LakeError::Stopped)?;
                        }
                    }
                    builder_key = Some(key);
                    let typed = options
                        .payload_codec
                        .clone()
                        .and_then(|c| TypedColumns::new(&lane.arrow_schema, c));
                    RowBuilder::new(lane.arrow_schema.clone(), s.partition, typed)
                        .with_topic(s.topic.clone())
                }
            };
            let batch_rows = options.batch_rows;
            let out = tx.clone();
            let b2 = tokio::task::spawn_blocking(move || {
                for e in &entries {
                    b.push_entry(e);
                    if b.is_full(batch_rows)
                        && out
                            .blocking_send(b.finish().map_err(LakeError::from))
                            .is_err()
                    {
                        return None;
                    }
                }
                Some(b)
            })
            .await
            .map_err(|_| LakeError::Stopped)?
            .ok_or(LakeError::Stopped)?;
            builder = Some(b2);
        }
    }
    if let Some(mut b) = builder {
        if b.rows() > 0 {
            let done = tokio::task::spawn_blocking(move || b.finish())
                .await
                .map_err(|_| LakeError::Stopped)?;
            tx.send(done.map_err(LakeError::from))
                .await
                .map_err(|_| LakeError::Stopped)?;
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lanes_are_contiguous_and_cover_everything() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let meta = Arc::new(crate::ledger::metadata::memory::MemoryMetadataStore::new());
        let log =
            crate::ledger::Log::open(dir.path(), crate::config::LedgerConfig::default(), meta)
                .await?;
        let t = log.topic("persistent://a/b/c").await?;
        let slice = |ledger, entries, bytes| LedgerSlice {
            topic: None,
            partition: -1,
            log: t.clone(),
            ledger,
            entry_count: entries,
            size_bytes: bytes,
        };
        let slices = vec![
            slice(1, 1000, 20 << 20),
            slice(2, 0, 0),
            slice(3, 500, 10 << 20),
        ];
        let lanes = split(&slices, 2);
        assert_eq!(lanes.len(), 2);
        let covered: Vec<Vec<(u64, u64, u64)>> = lanes
            .iter()
            .map(|l| l.iter().map(|s| (s.ledger, s.first, s.end)).collect())
            .collect();
        // About half the bytes each (the average entry size rounds down: 751 entries).
        assert_eq!(
            covered,
            vec![vec![(1, 0, 751)], vec![(1, 751, 1000), (3, 0, 500)]]
        );
        // Small writes stay in one lane.
        assert_eq!(split(&[slice(1, 10, 1000)], 2).len(), 1);
        log.shutdown().await?;
        Ok(())
    }
}
