//! What a topic's lake table holds, read for `verify`: its watermark, the ranges each
//! snapshot still in its history recorded, and the id columns of every row of every data file
//! of the current snapshot (plus payload checksums with `--deep`).
//!
//! Files are fetched from the warehouse's store on the lake runtime and decoded on the
//! blocking pool, a few at a time. A file the store does not have, or that does not decode,
//! becomes a finding, never an error of the whole check.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type};
use bytes::Bytes;
use futures::StreamExt;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;

use super::check::LakeRow;
use super::report::Finding;
use super::VerifyError;
use crate::lake::commit::{parse_watermark_key, range_topic, read_watermark, RANGES_KEY};
use crate::lake::naming::TopicTable;
use crate::lake::{inspect, Lake, LakeHandle};
use crate::naming::TopicName;

/// Data files fetched and decoded at once.
const FILES_AT_ONCE: usize = 4;

/// One range a snapshot's summary records as committed: entries `0..=last_entry` of a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RecordedRange {
    /// The snapshot that committed it.
    pub snapshot_id: i64,
    /// Partition index.
    pub partition: i32,
    /// Ledger id.
    pub ledger: u64,
    /// Last entry committed.
    pub last_entry: u64,
}

/// A table as `verify` reads it.
#[derive(Debug, Default)]
pub(super) struct LakeView {
    /// The table's name, when it exists.
    pub table: Option<String>,
    /// Its current snapshot.
    pub snapshot_id: Option<i64>,
    /// Partition → highest ledger committed (this topic's, in a shared table).
    pub watermark: std::collections::BTreeMap<i32, u64>,
    /// Ranges the snapshots in the table's history recorded.
    pub ranges: Vec<RecordedRange>,
    /// Data files of the current snapshot, by index.
    /// Invariant: `LakeRow::file` of every row in `rows` is an index into this.
    pub files: Vec<String>,
    /// Bytes of those files.
    pub bytes_read: u64,
    /// (partition, ledger) → its rows.
    pub rows: HashMap<(i32, u64), Vec<LakeRow>>,
    /// Files missing or unreadable, and delete files (not applied here).
    pub findings: Vec<Finding>,
    /// Whether rows carry payload checksums.
    pub deep: bool,
}

/// Reads the table of `topic` (none: an empty view) on the lake runtime.
pub(super) async fn read(
    handle: &LakeHandle,
    topic: &TopicName,
    deep: bool,
) -> Result<LakeView, VerifyError> {
    let lake = handle.lake().clone();
    let table = handle.table_of(topic).await.map_err(VerifyError::Lake)?;
    handle
        .run(async move { read_table(lake, table, deep).await })
        .await
        .map_err(VerifyError::Lake)?
}

/// This topic's entries of a table's watermark (its own table: all of them).
fn topic_watermark(
    table: &iceberg::table::Table,
    topic: Option<&str>,
) -> Result<std::collections::BTreeMap<i32, u64>, VerifyError> {
    let all = read_watermark(table).map_err(VerifyError::Lake)?;
    Ok(all
        .iter()
        .filter_map(|(k, v)| match parse_watermark_key(k)? {
            (t, p) if t == topic => Some((p, *v)),
            _ => None,
        })
        .collect())
}

async fn read_table(lake: Arc<Lake>, at: TopicTable, deep: bool) -> Result<LakeView, VerifyError> {
    let ident = at.ident.clone();
    let topic = at.topic.as_deref();
    let Some(table) = lake.load_table(&ident).await.map_err(VerifyError::Lake)? else {
        return Ok(LakeView {
            deep,
            ..LakeView::default()
        });
    };
    let mut view = LakeView {
        deep,
        table: Some(ident.to_string()),
        snapshot_id: table.metadata().current_snapshot_id(),
        watermark: topic_watermark(&table, topic)?,
        ranges: recorded_ranges(&table, topic),
        ..LakeView::default()
    };
    let files = inspect::current_files(&table)
        .await
        .map_err(VerifyError::Lake)?;
    let mut data = Vec::new();
    for f in files {
        // In a shared table, only this topic's files.
        if topic.is_some_and(|t| !f.of_topic(t)) {
            continue;
        }
        if f.content == "data" {
            data.push(f.file_path);
        } else {
            view.findings.push(Finding::Inconsistent {
                partition: None,
                ledger: None,
                detail: format!(
                    "{} file {} (written by another engine): verify does not apply deletes",
                    f.content, f.file_path
                ),
            });
        }
    }
    let mut read = futures::stream::iter(data.into_iter().enumerate())
        .map(|(index, path)| {
            let lake = lake.clone();
            async move { (index, read_file(&lake, &path, deep).await, path) }
        })
        .buffered(FILES_AT_ONCE);
    while let Some((index, outcome, path)) = read.next().await {
        view.files.push(path.clone());
        match outcome {
            Ok((bytes, rows)) => {
                view.bytes_read += bytes;
                for (key, mut row) in rows {
                    row.file = index as u32;
                    view.rows.entry(key).or_default().push(row);
                }
            }
            Err(finding) => view.findings.push(finding),
        }
    }
    Ok(view)
}

/// The ranges in the summaries of the current snapshot and its ancestors still in the
/// table's metadata (snapshots of other branches, or rolled back, are not the table's).
fn recorded_ranges(table: &iceberg::table::Table, topic: Option<&str>) -> Vec<RecordedRange> {
    let metadata = table.metadata();
    let mut out = Vec::new();
    // Ranges name a shared table's topics escaped (they are comma separated).
    let topic = topic.map(range_topic);
    let topic = topic.as_deref();
    let mut next = metadata.current_snapshot();
    while let Some(s) = next {
        next = s
            .parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id));
        let Some(ranges) = s.summary().additional_properties.get(RANGES_KEY) else {
            continue;
        };
        for r in ranges.split(',').filter(|r| !r.is_empty()) {
            if let Some((of, range)) = parse_range(s.snapshot_id(), r) {
                if of == topic {
                    out.push(range);
                }
            }
        }
    }
    out
}

/// `[topic:]partition:ledger:0-last` (the commit's format), with the topic (shared tables).
fn parse_range(snapshot_id: i64, text: &str) -> Option<(Option<&str>, RecordedRange)> {
    let mut parts = text.rsplitn(3, ':');
    let (_, last) = parts.next()?.split_once('-')?;
    let ledger = parts.next()?.parse().ok()?;
    let (topic, partition) = parse_watermark_key(parts.next()?)?;
    Some((
        topic,
        RecordedRange {
            snapshot_id,
            partition,
            ledger,
            last_entry: last.parse().ok()?,
        },
    ))
}

type KeyedRows = Vec<((i32, u64), LakeRow)>;

/// Fetches one data file and decodes its id columns: its size and rows, or the finding.
async fn read_file(lake: &Lake, path: &str, deep: bool) -> Result<(u64, KeyedRows), Finding> {
    let unreadable = |detail: String| Finding::UnreadableFile {
        path: path.to_string(),
        detail,
    };
    let Some(object) = lake.object_path(path) else {
        return Err(unreadable("outside the warehouse's store".into()));
    };
    let bytes = match lake.store().get(&object).await {
        Ok(got) => got
            .bytes()
            .await
            .map_err(|e| unreadable(format!("reading: {e}")))?,
        Err(object_store::Error::NotFound { source, .. }) => {
            return Err(Finding::MissingFile {
                path: path.to_string(),
                detail: source.to_string(),
            })
        }
        Err(e) => return Err(unreadable(e.to_string())),
    };
    let size = bytes.len() as u64;
    let rows = tokio::task::spawn_blocking(move || decode(bytes, deep))
        .await
        .map_err(|e| unreadable(format!("decoding task: {e}")))?
        .map_err(unreadable)?;
    Ok((size, rows))
}

/// The id columns (and payload checksums with `deep`) of every row of a Parquet file.
fn decode(bytes: Bytes, deep: bool) -> Result<KeyedRows, String> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| e.to_string())?;
    let mut columns = vec![
        "partition",
        "ledger_id",
        "entry_id",
        "batch_index",
        "batch_size",
    ];
    if deep {
        columns.push("payload");
    }
    let mask = ProjectionMask::columns(builder.parquet_schema(), columns.iter().copied());
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| e.to_string())?;
        decode_batch(&batch, deep, &mut out)?;
    }
    Ok(out)
}

fn int_column(batch: &RecordBatch, name: &str) -> Result<ArrayRef, String> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| format!("no column {name}"))?;
    cast(column, &DataType::Int64).map_err(|e| format!("column {name}: {e}"))
}

fn decode_batch(batch: &RecordBatch, deep: bool, out: &mut KeyedRows) -> Result<(), String> {
    let [partition, ledger, entry, index, size] = [
        "partition",
        "ledger_id",
        "entry_id",
        "batch_index",
        "batch_size",
    ]
    .map(|name| int_column(batch, name));
    let (partition, ledger, entry, index, size) = (partition?, ledger?, entry?, index?, size?);
    let (partition, ledger, entry, index, size) = (
        partition.as_primitive::<Int64Type>(),
        ledger.as_primitive::<Int64Type>(),
        entry.as_primitive::<Int64Type>(),
        index.as_primitive::<Int64Type>(),
        size.as_primitive::<Int64Type>(),
    );
    let payload = if deep {
        let column = batch
            .column_by_name("payload")
            .ok_or_else(|| "no column payload".to_string())?;
        Some(cast(column, &DataType::LargeBinary).map_err(|e| format!("column payload: {e}"))?)
    } else {
        None
    };
    let payload = payload.as_ref().map(|p| p.as_binary::<i64>());
    out.reserve(batch.num_rows());
    for i in 0..batch.num_rows() {
        if [partition, ledger, entry, index, size]
            .iter()
            .any(|c| c.is_null(i))
        {
            return Err(format!("row {i} has a NULL id column"));
        }
        let crc = payload
            .filter(|p| !p.is_null(i))
            .map(|p| crc32c::crc32c(p.value(i)));
        out.push((
            (partition.value(i) as i32, ledger.value(i) as u64),
            LakeRow {
                entry: entry.value(i) as u64,
                batch_index: index.value(i) as i32,
                batch_size: size.value(i) as i32,
                file: 0,
                crc,
            },
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_ranges_parse_as_the_commit_writes_them() {
        let range = |partition, ledger, last_entry| RecordedRange {
            snapshot_id: 5,
            partition,
            ledger,
            last_entry,
        };
        assert_eq!(
            parse_range(5, "-1:12:0-99"),
            Some((None, range(-1, 12, 99)))
        );
        assert_eq!(parse_range(5, "3:12"), None);
        assert_eq!(parse_range(5, "x:12:0-1"), None);
        // A shared table's ranges name their topic (which may contain ':').
        assert_eq!(
            parse_range(5, "a:b:2:12:0-7"),
            Some((Some("a:b"), range(2, 12, 7)))
        );
    }
}
