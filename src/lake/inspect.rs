//! What a lake table holds now, beyond iceberg-rust's own `inspect()` (snapshots, manifests):
//! its live files with their partitions, for SQL's `"<topic>$files"` and
//! `"<topic>$partitions"` metadata tables.
//!
//! Invariant: only the current snapshot's live entries are listed (a `DELETED` entry only
//! records a removal), each once.

use iceberg::spec::{
    DataContentType, Datum, Literal, ManifestList, PartitionSpec, PrimitiveLiteral, PrimitiveType,
    Schema, Snapshot, Struct, Transform, Type,
};
use iceberg::table::Table;

use super::LakeError;

/// One live file of the current snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct FileRow {
    /// `data`, `position_deletes` or `equality_deletes`.
    pub content: &'static str,
    /// Where the file is.
    pub file_path: String,
    /// `parquet`, `avro` or `orc`.
    pub file_format: String,
    /// Its partition as `field=value` pairs joined by `/` (empty when unpartitioned).
    pub partition: String,
    /// Partition spec of the file's manifest.
    pub spec_id: i32,
    /// Rows.
    pub record_count: u64,
    /// Bytes.
    pub file_size_in_bytes: u64,
    /// The snapshot that added it.
    pub snapshot_id: Option<i64>,
    /// Its data sequence number.
    pub sequence_number: Option<i64>,
}

impl FileRow {
    /// Whether this file of a namespace's shared table holds `topic`'s rows (the shared spec
    /// partitions by `identity(topic)` first).
    pub fn of_topic(&self, topic: &str) -> bool {
        self.partition
            .split('/')
            .next()
            .and_then(|first| first.strip_prefix(super::schema::TOPIC_COLUMN))
            .and_then(|rest| rest.strip_prefix('='))
            == Some(topic)
    }
}

/// The manifest list of `snapshot` of `table` (read and parsed; every reader of manifests in
/// the lake goes through here).
pub(crate) async fn manifest_list(
    table: &Table,
    snapshot: &Snapshot,
) -> Result<ManifestList, LakeError> {
    let bytes = table
        .file_io()
        .new_input(snapshot.manifest_list())
        .map_err(LakeError::iceberg("opening a manifest list"))?
        .read()
        .await
        .map_err(LakeError::iceberg("reading a manifest list"))?;
    ManifestList::parse_with_version(&bytes, table.metadata().format_version())
        .map_err(LakeError::iceberg("parsing a manifest list"))
}

/// The live files of the table's current snapshot (none without a snapshot).
pub async fn current_files(table: &Table) -> Result<Vec<FileRow>, LakeError> {
    let metadata = table.metadata();
    let Some(snapshot) = metadata.current_snapshot() else {
        return Ok(Vec::new());
    };
    let io = table.file_io();
    let list = manifest_list(table, snapshot).await?;
    let schema = metadata.current_schema();
    let mut rows = Vec::new();
    for mf in list.entries() {
        let spec = metadata.partition_spec_by_id(mf.partition_spec_id);
        let manifest = mf
            .load_manifest(io)
            .await
            .map_err(LakeError::iceberg("reading a manifest"))?;
        for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
            let file = entry.data_file();
            rows.push(FileRow {
                content: match file.content_type() {
                    DataContentType::Data => "data",
                    DataContentType::PositionDeletes => "position_deletes",
                    DataContentType::EqualityDeletes => "equality_deletes",
                },
                file_path: file.file_path().to_string(),
                file_format: format!("{:?}", file.file_format()).to_lowercase(),
                partition: spec
                    .map_or_else(String::new, |s| partition_text(s, schema, file.partition())),
                spec_id: mf.partition_spec_id,
                record_count: file.record_count(),
                file_size_in_bytes: file.file_size_in_bytes(),
                snapshot_id: entry.snapshot_id(),
                sequence_number: entry.sequence_number(),
            });
        }
    }
    rows.sort_by(|a, b| (&a.partition, &a.file_path).cmp(&(&b.partition, &b.file_path)));
    Ok(rows)
}

/// `field=value/…` for a file's partition tuple (dates as dates, null as `null`).
fn partition_text(spec: &PartitionSpec, schema: &Schema, values: &Struct) -> String {
    spec.fields()
        .iter()
        .zip(values.iter())
        .map(|(field, value)| {
            let source = schema
                .field_by_id(field.source_id)
                .map(|f| f.field_type.as_ref());
            let result = source.and_then(|t| field.transform.result_type(t).ok());
            format!(
                "{}={}",
                field.name,
                value_text(value, result.as_ref(), field.transform)
            )
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn value_text(value: Option<&Literal>, result: Option<&Type>, transform: Transform) -> String {
    let Some(p) = value.and_then(Literal::as_primitive_literal) else {
        return "null".into();
    };
    match (&p, result) {
        (PrimitiveLiteral::Int(d), Some(Type::Primitive(PrimitiveType::Date))) => {
            Datum::date(*d).to_string()
        }
        // Hours since the epoch (Iceberg's `hour` transform).
        (PrimitiveLiteral::Int(h), _) if transform == Transform::Hour => {
            chrono::DateTime::from_timestamp(i64::from(*h) * 3600, 0)
                .map_or_else(|| h.to_string(), |t| t.format("%Y-%m-%d-%H").to_string())
        }
        (PrimitiveLiteral::Int(v), _) => v.to_string(),
        (PrimitiveLiteral::Long(v), _) => v.to_string(),
        (PrimitiveLiteral::String(s), _) => s.clone(),
        (PrimitiveLiteral::Boolean(b), _) => b.to_string(),
        (other, _) => format!("{other:?}"),
    }
}
