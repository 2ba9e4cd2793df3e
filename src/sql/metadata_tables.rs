//! The metadata tables of a topic's lake table beside `"<topic>$snapshots"` (iceberg's own):
//! `"<topic>$history"` (which snapshot was current when, as Spark's history table),
//! `"<topic>$files"` (the current snapshot's live files) and `"<topic>$partitions"` (rows,
//! files and bytes per partition). Each is built once when the query opens it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::datasource::MemTable;
use iceberg::table::Table;

use super::SqlError;
use crate::lake::inspect::{current_files, FileRow};

fn mem(schema: Schema, columns: Vec<ArrayRef>) -> Result<MemTable, SqlError> {
    let schema = Arc::new(schema);
    let batch = RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| SqlError::Execution(e.to_string()))?;
    MemTable::try_new(schema, vec![vec![batch]]).map_err(|e| SqlError::Execution(e.to_string()))
}

/// `$history`: made_current_at, snapshot_id, parent_id, is_current_ancestor.
pub(super) fn history(table: &Table) -> Result<MemTable, SqlError> {
    let metadata = table.metadata();
    let mut ancestors = HashSet::new();
    let mut at = metadata.current_snapshot_id();
    while let Some(id) = at {
        if !ancestors.insert(id) {
            break;
        }
        at = metadata
            .snapshot_by_id(id)
            .and_then(|s| s.parent_snapshot_id());
    }
    let log = metadata.history();
    let utc = Some("UTC".into());
    let schema = Schema::new(vec![
        Field::new(
            "made_current_at",
            DataType::Timestamp(TimeUnit::Millisecond, utc.clone()),
            false,
        ),
        Field::new("snapshot_id", DataType::Int64, false),
        Field::new("parent_id", DataType::Int64, true),
        Field::new("is_current_ancestor", DataType::Boolean, false),
    ]);
    let made: TimestampMillisecondArray = log.iter().map(|h| Some(h.timestamp_ms)).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(made.with_timezone_opt(utc)),
        Arc::new(log.iter().map(|h| h.snapshot_id).collect::<Int64Array>()),
        Arc::new(
            log.iter()
                .map(|h| {
                    metadata
                        .snapshot_by_id(h.snapshot_id)
                        .and_then(|s| s.parent_snapshot_id())
                })
                .collect::<Int64Array>(),
        ),
        Arc::new(
            log.iter()
                .map(|h| Some(ancestors.contains(&h.snapshot_id)))
                .collect::<BooleanArray>(),
        ),
    ];
    mem(schema, columns)
}

/// The table's live files; in a namespace's shared table, only those of topic `own`.
async fn files_of(table: &Table, own: Option<&str>) -> Result<Vec<FileRow>, SqlError> {
    let mut rows = current_files(table)
        .await
        .map_err(|e| SqlError::Execution(e.to_string()))?;
    if let Some(topic) = own {
        rows.retain(|r| r.of_topic(topic));
    }
    Ok(rows)
}

/// `$files`: content, file_path, file_format, partition, spec_id, record_count,
/// file_size_in_bytes, snapshot_id, sequence_number.
pub(super) async fn files(table: &Table, own: Option<&str>) -> Result<MemTable, SqlError> {
    let rows = files_of(table, own).await?;
    let schema = Schema::new(vec![
        Field::new("content", DataType::Utf8, false),
        Field::new("file_path", DataType::Utf8, false),
        Field::new("file_format", DataType::Utf8, false),
        Field::new("partition", DataType::Utf8, false),
        Field::new("spec_id", DataType::Int32, false),
        Field::new("record_count", DataType::Int64, false),
        Field::new("file_size_in_bytes", DataType::Int64, false),
        Field::new("snapshot_id", DataType::Int64, true),
        Field::new("sequence_number", DataType::Int64, true),
    ]);
    let text = |f: fn(&FileRow) -> &str| -> ArrayRef {
        Arc::new(rows.iter().map(|r| Some(f(r))).collect::<StringArray>())
    };
    let columns: Vec<ArrayRef> = vec![
        text(|r| r.content),
        text(|r| &r.file_path),
        text(|r| &r.file_format),
        text(|r| &r.partition),
        Arc::new(rows.iter().map(|r| r.spec_id).collect::<Int32Array>()),
        Arc::new(
            rows.iter()
                .map(|r| r.record_count as i64)
                .collect::<Int64Array>(),
        ),
        Arc::new(
            rows.iter()
                .map(|r| r.file_size_in_bytes as i64)
                .collect::<Int64Array>(),
        ),
        Arc::new(rows.iter().map(|r| r.snapshot_id).collect::<Int64Array>()),
        Arc::new(
            rows.iter()
                .map(|r| r.sequence_number)
                .collect::<Int64Array>(),
        ),
    ];
    mem(schema, columns)
}

/// `$partitions`: partition, record_count, file_count, total_data_file_size_in_bytes (data
/// files only, as Spark's partitions table).
pub(super) async fn partitions(table: &Table, own: Option<&str>) -> Result<MemTable, SqlError> {
    let mut by: BTreeMap<String, (i64, i64, i64)> = BTreeMap::new();
    for r in files_of(table, own)
        .await?
        .iter()
        .filter(|r| r.content == "data")
    {
        let e = by.entry(r.partition.clone()).or_default();
        e.0 += r.record_count as i64;
        e.1 += 1;
        e.2 += r.file_size_in_bytes as i64;
    }
    let schema = Schema::new(vec![
        Field::new("partition", DataType::Utf8, false),
        Field::new("record_count", DataType::Int64, false),
        Field::new("file_count", DataType::Int64, false),
        Field::new("total_data_file_size_in_bytes", DataType::Int64, false),
    ]);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(by.keys().map(|k| Some(k.as_str())).collect::<StringArray>()),
        Arc::new(by.values().map(|v| v.0).collect::<Int64Array>()),
        Arc::new(by.values().map(|v| v.1).collect::<Int64Array>()),
        Arc::new(by.values().map(|v| v.2).collect::<Int64Array>()),
    ];
    mem(schema, columns)
}
