//! The lake table's layout: the message-envelope columns (fixed field ids), the partition spec
//! and the sort order. `schemas/lake-table.schema.json` is generated from this file (a test
//! keeps them equal) so users see the layout without running anything.
//!
//! Invariants:
//! - Envelope field ids 1..=19 never change meaning; typed columns derived from a topic's
//!   schema are added after them by schema evolution and get ids from Iceberg.
//! - One row per message. An unbatched message has `batch_index = -1` and `batch_size = 0`
//!   (Pulsar's message-id convention); a batched one has its index and the batch's size.
//! - `entry_metadata` holds the entry's original `MessageMetadata` bytes on the first row of
//!   each entry (null on the others); `message_metadata` holds each batched message's original
//!   `SingleMessageMetadata` bytes. Together with `payload` they rebuild the entry exactly.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{
    MapType, NestedField, NullOrder, PrimitiveType, Schema, SortDirection, SortField, SortOrder,
    Transform, Type, UnboundPartitionSpec,
};

use crate::config::LakePartitioning;

/// Field ids of the envelope columns.
pub mod field {
    /// `ledger_id`.
    pub const LEDGER_ID: i32 = 1;
    /// `entry_id`.
    pub const ENTRY_ID: i32 = 2;
    /// `batch_index`.
    pub const BATCH_INDEX: i32 = 3;
    /// `batch_size`.
    pub const BATCH_SIZE: i32 = 4;
    /// `partition`.
    pub const PARTITION: i32 = 5;
    /// `publish_time`.
    pub const PUBLISH_TIME: i32 = 6;
    /// `event_time`.
    pub const EVENT_TIME: i32 = 7;
    /// `key`.
    pub const KEY: i32 = 8;
    /// `ordering_key`.
    pub const ORDERING_KEY: i32 = 9;
    /// `properties`.
    pub const PROPERTIES: i32 = 10;
    /// `properties.key`.
    pub const PROPERTIES_KEY: i32 = 11;
    /// `properties.value`.
    pub const PROPERTIES_VALUE: i32 = 12;
    /// `producer_name`.
    pub const PRODUCER_NAME: i32 = 13;
    /// `sequence_id`.
    pub const SEQUENCE_ID: i32 = 14;
    /// `schema_version`.
    pub const SCHEMA_VERSION: i32 = 15;
    /// `payload`.
    pub const PAYLOAD: i32 = 16;
    /// `decode_error`.
    pub const DECODE_ERROR: i32 = 17;
    /// `entry_metadata`.
    pub const ENTRY_METADATA: i32 = 18;
    /// `message_metadata`.
    pub const MESSAGE_METADATA: i32 = 19;
    /// Highest envelope field id.
    pub const LAST: i32 = 19;
    /// `topic`: only in a namespace's shared table (which never gets typed columns, so the
    /// id is never Iceberg's to hand out).
    pub const TOPIC: i32 = 20;
}

/// Name of the shared table's topic column.
pub const TOPIC_COLUMN: &str = "topic";

/// Names of the envelope columns, in order. Typed columns whose name collides with one of
/// these are prefixed with `value_`.
pub const ENVELOPE_COLUMNS: [&str; 17] = [
    "ledger_id",
    "entry_id",
    "batch_index",
    "batch_size",
    "partition",
    "publish_time",
    "event_time",
    "key",
    "ordering_key",
    "properties",
    "producer_name",
    "sequence_id",
    "schema_version",
    "payload",
    "decode_error",
    "entry_metadata",
    "message_metadata",
];

/// Version of this layout, stored in the table property `ledgerlake.layout-version`.
pub const LAYOUT_VERSION: u32 = 1;

fn prim(p: PrimitiveType) -> Type {
    Type::Primitive(p)
}

/// The envelope schema every lake table starts with.
pub fn envelope_schema() -> Schema {
    use field::*;
    let doc = |f: NestedField, d: &str| Arc::new(f.with_doc(d));
    let fields =
        vec![
        doc(
            NestedField::required(LEDGER_ID, "ledger_id", prim(PrimitiveType::Long)),
            "Ledger of the message id",
        ),
        doc(
            NestedField::required(ENTRY_ID, "entry_id", prim(PrimitiveType::Long)),
            "Entry of the message id",
        ),
        doc(
            NestedField::required(BATCH_INDEX, "batch_index", prim(PrimitiveType::Int)),
            "Index in the batch; -1 for an unbatched message",
        ),
        doc(
            NestedField::required(BATCH_SIZE, "batch_size", prim(PrimitiveType::Int)),
            "Messages in the batch; 0 for an unbatched message",
        ),
        doc(
            NestedField::required(PARTITION, "partition", prim(PrimitiveType::Int)),
            "Partition index; -1 for a non-partitioned topic",
        ),
        doc(
            NestedField::required(PUBLISH_TIME, "publish_time", prim(PrimitiveType::Timestamptz)),
            "Publish time set by the producer (ms precision)",
        ),
        doc(
            NestedField::optional(EVENT_TIME, "event_time", prim(PrimitiveType::Timestamptz)),
            "Event time, when the producer set one",
        ),
        doc(
            NestedField::optional(KEY, "key", prim(PrimitiveType::String)),
            "Message key (partition key)",
        ),
        doc(
            NestedField::optional(ORDERING_KEY, "ordering_key", prim(PrimitiveType::Binary)),
            "Ordering key",
        ),
        doc(
            NestedField::optional(
                PROPERTIES,
                "properties",
                Type::Map(MapType::new(
                    Arc::new(NestedField::map_key_element(
                        PROPERTIES_KEY,
                        prim(PrimitiveType::String),
                    )),
                    Arc::new(NestedField::map_value_element(
                        PROPERTIES_VALUE,
                        prim(PrimitiveType::String),
                        true,
                    )),
                )),
            ),
            "Message properties (a batched message's own, from its SingleMessageMetadata)",
        ),
        doc(
            NestedField::required(PRODUCER_NAME, "producer_name", prim(PrimitiveType::String)),
            "Producer name",
        ),
        doc(
            NestedField::required(SEQUENCE_ID, "sequence_id", prim(PrimitiveType::Long)),
            "Producer sequence id",
        ),
        doc(
            NestedField::optional(SCHEMA_VERSION, "schema_version", prim(PrimitiveType::Long)),
            "Version of the topic schema the producer used",
        ),
        doc(
            NestedField::optional(PAYLOAD, "payload", prim(PrimitiveType::Binary)),
            "Message bytes (decompressed); null for a null-value message",
        ),
        doc(
            NestedField::optional(DECODE_ERROR, "decode_error", prim(PrimitiveType::String)),
            "Why the payload did not decode against the topic schema (typed columns are then null)",
        ),
        doc(
            NestedField::optional(ENTRY_METADATA, "entry_metadata", prim(PrimitiveType::Binary)),
            "Original MessageMetadata bytes, on the first row of each entry",
        ),
        doc(
            NestedField::optional(
                MESSAGE_METADATA,
                "message_metadata",
                prim(PrimitiveType::Binary),
            ),
            "Original SingleMessageMetadata bytes of a batched message",
        ),
    ];
    // The field ids above are distinct and every type is valid: building cannot fail.
    Schema::builder()
        .with_fields(fields)
        .build()
        .unwrap_or_else(|e| unreachable!("envelope schema is valid: {e}"))
}

/// The `topic` value of a shared table's file partition (the shared spec's first field), if
/// it has one.
pub fn partition_topic(partition: &iceberg::spec::Struct) -> Option<&str> {
    match partition.fields().first() {
        Some(Some(iceberg::spec::Literal::Primitive(iceberg::spec::PrimitiveLiteral::String(
            t,
        )))) => Some(t),
        _ => None,
    }
}

/// The schema of a namespace's shared table: the envelope, then the `topic` column.
pub fn shared_schema() -> Schema {
    let envelope = envelope_schema();
    let mut fields = envelope.as_struct().fields().to_vec();
    fields.push(Arc::new(
        NestedField::required(field::TOPIC, TOPIC_COLUMN, prim(PrimitiveType::String))
            .with_doc("Local name of the (base) topic the message belongs to"),
    ));
    Schema::builder()
        .with_fields(fields)
        .build()
        .unwrap_or_else(|e| unreachable!("shared schema is valid: {e}"))
}

/// The partition spec: `day(publish_time)` or `hour(publish_time)`.
pub fn partition_spec(granularity: LakePartitioning) -> UnboundPartitionSpec {
    time_spec(UnboundPartitionSpec::builder(), granularity)
}

/// The shared table's partition spec: `identity(topic)`, then the time field, so a topic's
/// scan prunes to its own files and every file holds one topic.
pub fn shared_partition_spec(granularity: LakePartitioning) -> UnboundPartitionSpec {
    let builder = UnboundPartitionSpec::builder()
        .add_partition_field(field::TOPIC, TOPIC_COLUMN, Transform::Identity)
        .unwrap_or_else(|e| unreachable!("partition spec is valid: {e}"));
    time_spec(builder, granularity)
}

fn time_spec(
    builder: iceberg::spec::UnboundPartitionSpecBuilder,
    granularity: LakePartitioning,
) -> UnboundPartitionSpec {
    let (name, transform) = match granularity {
        LakePartitioning::Day => ("publish_day", Transform::Day),
        LakePartitioning::Hour => ("publish_hour", Transform::Hour),
    };
    builder
        .add_partition_field(field::PUBLISH_TIME, name, transform)
        .map(|b| b.build())
        .unwrap_or_else(|e| unreachable!("partition spec is valid: {e}"))
}

/// Rows are sorted by message id inside every file.
pub fn sort_order() -> SortOrder {
    let asc = |source_id| SortField {
        source_id,
        transform: Transform::Identity,
        direction: SortDirection::Ascending,
        null_order: NullOrder::First,
    };
    SortOrder::builder()
        .with_order_id(1)
        .with_sort_field(asc(field::LEDGER_ID))
        .with_sort_field(asc(field::ENTRY_ID))
        .with_sort_field(asc(field::BATCH_INDEX))
        .build_unbound()
        .unwrap_or_else(|e| unreachable!("sort order is valid: {e}"))
}

/// Table properties set at creation.
pub fn table_properties(topic: &str) -> HashMap<String, String> {
    HashMap::from([
        ("write.format.default".into(), "parquet".into()),
        ("write.parquet.compression-codec".into(), "zstd".into()),
        ("ledgerlake.topic".into(), topic.to_string()),
        (
            "ledgerlake.layout-version".into(),
            LAYOUT_VERSION.to_string(),
        ),
    ])
}

/// The partition value of a publish time (µs) under `granularity`: days or hours since the
/// epoch, as Iceberg's transforms compute them.
pub fn partition_value(publish_time_us: i64, granularity: LakePartitioning) -> i32 {
    let unit = match granularity {
        LakePartitioning::Day => 86_400_000_000i64,
        LakePartitioning::Hour => 3_600_000_000i64,
    };
    publish_time_us.div_euclid(unit) as i32
}

/// The layout as JSON (what `schemas/lake-table.schema.json` holds).
pub fn layout_json() -> serde_json::Value {
    serde_json::json!({
        "description": "ledgerlake lake table layout (one Iceberg table per topic; per namespace under lakeTableLayout = shared, see shared_layout). Generated by `ledgerlake lake schema`; typed columns from the topic's JSON/Avro schema are added after these by schema evolution.",
        "layout_version": LAYOUT_VERSION,
        "identifier": "namespace [tenant', namespace'], table topic' (see README: sanitising rule)",
        "schema": envelope_schema(),
        "partition_spec": {
            "day (default)": partition_spec(LakePartitioning::Day),
            "hour": partition_spec(LakePartitioning::Hour),
        },
        "sort_order": sort_order(),
        "properties": table_properties("persistent://<tenant>/<namespace>/<topic>"),
        "shared_layout": {
            "description": "lakeTableLayout = shared: every topic of the namespace in the table [tenant', namespace'].__topics; the envelope plus a `topic` column (the base topic's local name); no typed columns",
            "schema": shared_schema(),
            "partition_spec": {
                "day (default)": shared_partition_spec(LakePartitioning::Day),
                "hour": shared_partition_spec(LakePartitioning::Hour),
            },
            "properties": table_properties("persistent://<tenant>/<namespace>"),
            "watermark_keys": "<topic>:<partition index>",
            "ranges": "topic:partition:ledger:first_entry-last_entry, comma separated (the topic with % and , escaped as %25 and %2C)",
        },
        "snapshot_summary": {
            "ledgerlake.watermark": "JSON object: partition index -> highest ledger id committed so far (every snapshot)",
            "ledgerlake.ranges": "this commit's exact ranges: partition:ledger:first_entry-last_entry, comma separated",
            "ledgerlake.attempt": "id of the offload attempt that wrote the commit's files",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_names_match_field_ids() {
        let s = envelope_schema();
        let top: Vec<&str> = s
            .as_struct()
            .fields()
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(top, ENVELOPE_COLUMNS);
        assert_eq!(s.highest_field_id(), field::LAST);
    }

    #[test]
    fn partition_values_match_iceberg_transforms() {
        assert_eq!(partition_value(0, LakePartitioning::Day), 0);
        assert_eq!(partition_value(-1, LakePartitioning::Day), -1);
        assert_eq!(
            partition_value(86_400_000_000 * 3 + 5, LakePartitioning::Day),
            3
        );
        assert_eq!(
            partition_value(3_600_000_000 * 7, LakePartitioning::Hour),
            7
        );
    }

    #[test]
    fn schema_file_is_generated_from_code() -> Result<(), Box<dyn std::error::Error>> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/schemas/lake-table.schema.json"
        );
        let on_disk: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        assert_eq!(
            on_disk,
            layout_json(),
            "schemas/lake-table.schema.json is stale: run `ledgerlake lake schema > schemas/lake-table.schema.json`"
        );
        Ok(())
    }
}
