//! Log entries → Arrow record batches in the lake table's schema (one row per message).
//!
//! CPU-bound: callers run it on a blocking thread, never on an async worker.
//!
//! Invariants:
//! - Rows are appended in message-id order of the entries given; no message is dropped (a batch
//!   entry that holds no message becomes no row). An entry that cannot be unrolled still becomes
//!   one row (`batch_index = -1`, the stored bytes after the metadata in `payload`, the reason
//!   in `decode_error`).
//! - Every column holds exactly one value per row: [`RowBuilder::push_entry`] appends an
//!   entry's shared columns for all of its rows at once, then each message's own columns.
//! - Arrays are built with the exact Arrow types of the table's Iceberg schema
//!   (`iceberg::arrow::schema_to_arrow_schema`), so the Parquet writer accepts them.

use std::sync::Arc;

use arrow::array::{
    ArrayBuilder, ArrayRef, Int32Builder, Int64Builder, LargeBinaryBuilder, MapArray, RecordBatch,
    StringArray, StringBuilder, StructArray, TimestampMicrosecondBuilder,
};
use arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, SchemaRef};

use super::typed::TypedColumns;
use crate::ledger::Entry;
use crate::naming::schema_version_from_bytes;
use crate::protocol::entry::{open_entry, BatchMessage, OpenedEntry};

/// Why a batch could not be assembled (a schema mismatch: a bug, not bad input).
#[derive(Debug, thiserror::Error)]
pub enum RowsError {
    /// Arrow refused the arrays.
    #[error("building the record batch failed: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The table schema lacks an envelope column.
    #[error("table schema has no usable column '{0}'")]
    MissingColumn(&'static str),
    /// The typed columns could not be built.
    #[error(transparent)]
    Typed(#[from] super::typed::TypedError),
}

/// Payload bytes that end a batch early (bounds memory with large messages).
pub const MAX_BATCH_PAYLOAD: usize = 32 << 20;

/// Accumulates rows of one table.
pub struct RowBuilder {
    schema: SchemaRef,
    partition: i32,
    ledger_id: Int64Builder,
    entry_id: Int64Builder,
    batch_index: Int32Builder,
    batch_size: Int32Builder,
    partition_col: Int32Builder,
    publish_time: TimestampMicrosecondBuilder,
    event_time: TimestampMicrosecondBuilder,
    key: StringBuilder,
    ordering_key: LargeBinaryBuilder,
    prop_keys: StringBuilder,
    prop_values: StringBuilder,
    prop_offsets: Vec<i32>,
    producer_name: StringBuilder,
    sequence_id: Int64Builder,
    schema_version: Int64Builder,
    payload: LargeBinaryBuilder,
    /// Rows (index since the last finish) that became undecodable rows, with the reason.
    /// Invariant: ascending row indices, each below `rows`.
    decode_errors: Vec<(usize, String)>,
    entry_metadata: LargeBinaryBuilder,
    message_metadata: LargeBinaryBuilder,
    typed: Option<TypedColumns>,
    /// The `topic` column's value (rows of a namespace's shared table), `None` otherwise.
    topic: Option<Arc<str>>,
    rows: usize,
    /// Payload bytes accumulated (bounds a batch's memory).
    payload_bytes: usize,
}

impl std::fmt::Debug for RowBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowBuilder")
            .field("rows", &self.rows)
            .finish()
    }
}

fn ms_to_us(ms: u64) -> i64 {
    (ms as i64).saturating_mul(1000)
}

impl RowBuilder {
    /// A builder for rows of `partition` (-1: not partitioned) in the table schema `schema`,
    /// with `typed` decoding the payload into the schema's typed columns (if any).
    pub fn new(schema: SchemaRef, partition: i32, typed: Option<TypedColumns>) -> Self {
        Self {
            schema,
            partition,
            ledger_id: Int64Builder::new(),
            entry_id: Int64Builder::new(),
            batch_index: Int32Builder::new(),
            batch_size: Int32Builder::new(),
            partition_col: Int32Builder::new(),
            publish_time: TimestampMicrosecondBuilder::new().with_timezone("+00:00"),
            event_time: TimestampMicrosecondBuilder::new().with_timezone("+00:00"),
            key: StringBuilder::new(),
            ordering_key: LargeBinaryBuilder::new(),
            prop_keys: StringBuilder::new(),
            prop_values: StringBuilder::new(),
            prop_offsets: vec![0],
            producer_name: StringBuilder::new(),
            sequence_id: Int64Builder::new(),
            schema_version: Int64Builder::new(),
            payload: LargeBinaryBuilder::new(),
            decode_errors: Vec::new(),
            entry_metadata: LargeBinaryBuilder::new(),
            message_metadata: LargeBinaryBuilder::new(),
            typed,
            topic: None,
            rows: 0,
            payload_bytes: 0,
        }
    }

    /// Rows of a namespace's shared table: every row's `topic` column is `topic` (the schema
    /// must have that column).
    pub fn with_topic(mut self, topic: Option<Arc<str>>) -> Self {
        self.topic = topic;
        self
    }

    /// Rows accumulated since the last [`RowBuilder::finish`].
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether the rows accumulated make a batch: `batch_rows` rows, or fewer rows that already
    /// hold [`MAX_BATCH_PAYLOAD`] bytes of payload.
    pub fn is_full(&self, batch_rows: usize) -> bool {
        self.rows >= batch_rows || self.payload_bytes >= MAX_BATCH_PAYLOAD
    }

    /// Appends the messages of one entry.
    pub fn push_entry(&mut self, entry: &Entry) {
        let opened = match open_entry(&entry.payload) {
            Ok(opened) => opened,
            Err(e) => return self.push_undecodable(entry, &e.to_string()),
        };
        match opened.batch() {
            // All or nothing: a batch with a broken record becomes one undecodable row.
            Some(batch) => {
                let mut messages = Vec::with_capacity(batch.capacity_hint());
                for message in batch {
                    match message {
                        Ok(message) => messages.push(message),
                        Err(e) => return self.push_undecodable(entry, &e.to_string()),
                    }
                }
                self.push_batch(entry, &opened, &messages)
            }
            None => self.push_single(entry, &opened),
        }
        debug_assert_eq!(
            self.ledger_id.len(),
            self.rows,
            "a column lost step with the rows"
        );
        debug_assert_eq!(
            self.payload.len(),
            self.rows,
            "a column lost step with the rows"
        );
    }

    fn push_batch(&mut self, entry: &Entry, opened: &OpenedEntry, messages: &[BatchMessage<'_>]) {
        let m = &opened.metadata;
        let shared = EntryColumns {
            rows: messages.len(),
            batch_size: opened.batch_size.unwrap_or(0) as i32,
            schema_version: m
                .schema_version
                .as_deref()
                .and_then(schema_version_from_bytes),
        };
        self.push_entry_columns(entry, opened, &shared);
        for msg in messages {
            let s = &msg.single;
            let null_value = s.null_value.unwrap_or(false);
            self.push_message(
                opened,
                &shared,
                MessageRow {
                    batch_index: msg.batch_index as i32,
                    event_ms: s.event_time,
                    key: s.partition_key,
                    ordering_key: s.ordering_key,
                    sequence_id: s
                        .sequence_id
                        .unwrap_or_else(|| m.sequence_id.wrapping_add(u64::from(msg.batch_index))),
                    payload: (!null_value).then_some(msg.payload),
                    single_raw: Some(msg.single_raw),
                },
                s.properties(),
            );
        }
    }

    fn push_single(&mut self, entry: &Entry, opened: &OpenedEntry) {
        let m = &opened.metadata;
        let null_value = m.null_value.unwrap_or(false);
        let shared = EntryColumns {
            rows: 1,
            // An opaque batch (encrypted or chunked) is one row for all its messages.
            batch_size: opened.batch_size.map_or(0, |n| n as i32),
            schema_version: m
                .schema_version
                .as_deref()
                .and_then(schema_version_from_bytes),
        };
        self.push_entry_columns(entry, opened, &shared);
        self.push_message(
            opened,
            &shared,
            MessageRow {
                batch_index: -1,
                event_ms: m.event_time,
                key: m.partition_key.as_deref(),
                ordering_key: m.ordering_key.as_deref(),
                sequence_id: m.sequence_id,
                payload: (!null_value).then_some(&opened.payload[..]),
                single_raw: None,
            },
            m.properties
                .iter()
                .map(|kv| (kv.key.as_str(), kv.value.as_str())),
        );
    }

    /// Appends the columns every row of one entry shares, for all of its rows at once.
    ///
    /// The caller then appends `shared.rows` messages with [`RowBuilder::push_message`].
    fn push_entry_columns(&mut self, entry: &Entry, opened: &OpenedEntry, shared: &EntryColumns) {
        let n = shared.rows;
        if n == 0 {
            return;
        }
        let m = &opened.metadata;
        self.ledger_id
            .append_value_n(entry.position.ledger as i64, n);
        self.entry_id.append_value_n(entry.position.entry as i64, n);
        self.batch_size.append_value_n(shared.batch_size, n);
        self.partition_col.append_value_n(self.partition, n);
        self.publish_time
            .append_value_n(ms_to_us(m.publish_time), n);
        self.producer_name.append_value_n(&m.producer_name, n);
        match shared.schema_version {
            Some(v) => self.schema_version.append_value_n(v as i64, n),
            None => self.schema_version.append_nulls(n),
        }
        // The entry's raw metadata goes on its first row only.
        self.entry_metadata.append_value(&opened.metadata_raw);
        self.entry_metadata.append_nulls(n - 1);
    }

    /// Appends the columns that differ between the messages of one entry (`shared` describes
    /// the entry, for the typed columns' schema version).
    fn push_message<'a>(
        &mut self,
        opened: &OpenedEntry,
        shared: &EntryColumns,
        row: MessageRow<'_>,
        properties: impl Iterator<Item = (&'a str, &'a str)>,
    ) {
        for (k, v) in properties {
            self.prop_keys.append_value(k);
            self.prop_values.append_value(v);
        }
        self.prop_offsets.push(self.prop_keys.len() as i32);
        self.batch_index.append_value(row.batch_index);
        match row
            .event_ms
            .or(opened.metadata.event_time)
            .filter(|t| *t > 0)
        {
            Some(t) => self.event_time.append_value(ms_to_us(t)),
            None => self.event_time.append_null(),
        }
        self.key.append_option(row.key);
        self.ordering_key.append_option(row.ordering_key);
        self.sequence_id.append_value(row.sequence_id as i64);
        match row.payload {
            Some(p) => {
                self.payload.append_value(p);
                self.payload_bytes += p.len();
            }
            None => self.payload.append_null(),
        }
        if let Some(t) = &mut self.typed {
            match row.payload {
                Some(p) if !opened.opaque => t.push(p, shared.schema_version),
                _ => t.push_null(),
            }
        }
        self.message_metadata.append_option(row.single_raw);
        self.rows += 1;
    }

    fn push_undecodable(&mut self, entry: &Entry, why: &str) {
        let publish = entry.publish_time_ms.saturating_mul(1000);
        self.ledger_id.append_value(entry.position.ledger as i64);
        self.entry_id.append_value(entry.position.entry as i64);
        self.batch_index.append_value(-1);
        self.batch_size.append_value(0);
        self.partition_col.append_value(self.partition);
        self.publish_time.append_value(publish);
        self.event_time.append_null();
        self.key.append_null();
        self.ordering_key.append_null();
        self.prop_offsets.push(self.prop_keys.len() as i32);
        self.producer_name.append_value("");
        self.sequence_id.append_value(-1);
        self.schema_version.append_null();
        self.payload.append_value(&entry.payload);
        self.payload_bytes += entry.payload.len();
        self.decode_errors
            .push((self.rows, format!("entry does not decode: {why}")));
        self.entry_metadata.append_null();
        self.message_metadata.append_null();
        if let Some(t) = &mut self.typed {
            t.push_null();
        }
        self.rows += 1;
    }

    /// Takes the accumulated rows as one record batch, with each row's publish time (µs) and
    /// the number of rows whose payload did not decode against the topic schema.
    pub fn finish(&mut self) -> Result<(RecordBatch, ScalarBuffer<i64>, usize), RowsError> {
        let next = BatchShape {
            rows: self.rows,
            payload: self.payload.values_slice().len(),
            entry_metadata: self.entry_metadata.values_slice().len(),
            message_metadata: self.message_metadata.values_slice().len(),
            key: self.key.values_slice().len(),
            ordering_key: self.ordering_key.values_slice().len(),
            producer_name: self.producer_name.values_slice().len(),
            properties: self.prop_keys.len(),
            prop_keys: self.prop_keys.values_slice().len(),
            prop_values: self.prop_values.values_slice().len(),
        };
        let mut typed_columns = Vec::new();
        let mut errors = std::mem::take(&mut self.decode_errors);
        let mut bad_payloads = 0;
        if let Some(t) = &mut self.typed {
            let (columns, typed_errors) = t.finish()?;
            typed_columns = columns;
            for (row, why) in typed_errors {
                if row < self.rows {
                    bad_payloads += 1;
                    errors.push((row, why));
                }
            }
        }
        let decode_error = decode_error_column(self.rows, errors);
        let field_type = |name: &'static str| -> Result<DataType, RowsError> {
            self.schema
                .field_with_name(name)
                .map(|f| f.data_type().clone())
                .map_err(|_| RowsError::MissingColumn(name))
        };
        let properties = {
            let DataType::Map(entries_field, sorted) = field_type("properties")? else {
                return Err(RowsError::MissingColumn("properties"));
            };
            let DataType::Struct(kv_fields) = entries_field.data_type().clone() else {
                return Err(RowsError::MissingColumn("properties"));
            };
            let keys: ArrayRef = Arc::new(self.prop_keys.finish());
            let values: ArrayRef = Arc::new(self.prop_values.finish());
            let entries = StructArray::try_new(kv_fields, vec![keys, values], None)?;
            let offsets =
                OffsetBuffer::new(std::mem::replace(&mut self.prop_offsets, vec![0]).into());
            let nulls: Option<NullBuffer> = None;
            Arc::new(MapArray::try_new(
                entries_field,
                offsets,
                entries,
                nulls,
                sorted,
            )?) as ArrayRef
        };
        let publish_time = self.publish_time.finish();
        let publish = publish_time.values().clone();
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.ledger_id.finish()),
            Arc::new(self.entry_id.finish()),
            Arc::new(self.batch_index.finish()),
            Arc::new(self.batch_size.finish()),
            Arc::new(self.partition_col.finish()),
            Arc::new(publish_time),
            Arc::new(self.event_time.finish()),
            Arc::new(self.key.finish()),
            Arc::new(self.ordering_key.finish()),
            properties,
            Arc::new(self.producer_name.finish()),
            Arc::new(self.sequence_id.finish()),
            Arc::new(self.schema_version.finish()),
            Arc::new(self.payload.finish()),
            Arc::new(decode_error),
            Arc::new(self.entry_metadata.finish()),
            Arc::new(self.message_metadata.finish()),
        ];
        if let Some(topic) = &self.topic {
            let values: ArrayRef = Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                topic.as_ref(),
                self.rows,
            )));
            let wanted = self
                .schema
                .field_with_name("topic")
                .map(|f| f.data_type().clone())
                .map_err(|_| RowsError::MissingColumn("topic"))?;
            columns.push(if *values.data_type() == wanted {
                values
            } else {
                arrow::compute::cast(&values, &wanted)?
            });
        }
        columns.extend(typed_columns);
        self.rows = 0;
        self.payload_bytes = 0;
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        self.reserve_like(&next);
        Ok((batch, publish, bad_payloads))
    }

    /// Sizes every builder for a batch like the last one: growing each buffer by doubling
    /// from nothing, for every batch, costs copies and fresh pages each time.
    fn reserve_like(&mut self, shape: &BatchShape) {
        let rows = shape.rows;
        self.payload = LargeBinaryBuilder::with_capacity(rows, shape.payload);
        self.entry_metadata = LargeBinaryBuilder::with_capacity(rows, shape.entry_metadata);
        self.message_metadata = LargeBinaryBuilder::with_capacity(rows, shape.message_metadata);
        self.key = StringBuilder::with_capacity(rows, shape.key);
        self.ordering_key = LargeBinaryBuilder::with_capacity(rows, shape.ordering_key);
        self.producer_name = StringBuilder::with_capacity(rows, shape.producer_name);
        self.prop_keys = StringBuilder::with_capacity(shape.properties, shape.prop_keys);
        self.prop_values = StringBuilder::with_capacity(shape.properties, shape.prop_values);
        self.prop_offsets.reserve(rows);
        self.ledger_id = Int64Builder::with_capacity(rows);
        self.entry_id = Int64Builder::with_capacity(rows);
        self.sequence_id = Int64Builder::with_capacity(rows);
        self.schema_version = Int64Builder::with_capacity(rows);
        self.batch_index = Int32Builder::with_capacity(rows);
        self.batch_size = Int32Builder::with_capacity(rows);
        self.partition_col = Int32Builder::with_capacity(rows);
        self.publish_time =
            TimestampMicrosecondBuilder::with_capacity(rows).with_timezone("+00:00");
        self.event_time = TimestampMicrosecondBuilder::with_capacity(rows).with_timezone("+00:00");
    }
}

/// What the rows of one entry share.
struct EntryColumns {
    /// Rows the entry becomes.
    rows: usize,
    batch_size: i32,
    schema_version: Option<u64>,
}

/// The `decode_error` column of `rows` rows from the reasons of the rows that have one.
fn decode_error_column(rows: usize, mut errors: Vec<(usize, String)>) -> StringArray {
    if errors.is_empty() {
        return StringArray::new_null(rows);
    }
    // Stable, so a row flagged twice (no caller does) would keep its first reason.
    errors.sort_by_key(|(row, _)| *row);
    let bytes = errors.iter().map(|(_, why)| why.len()).sum();
    let mut column = StringBuilder::with_capacity(rows, bytes);
    let mut next = 0;
    for (row, why) in &errors {
        if *row < next || *row >= rows {
            continue;
        }
        column.append_nulls(row - next);
        column.append_value(why);
        next = row + 1;
    }
    column.append_nulls(rows - next);
    column.finish()
}

/// One message's values, from its batch record or from the entry's metadata.
struct MessageRow<'a> {
    /// -1 for an unbatched or opaque entry.
    batch_index: i32,
    /// Falls back to the entry's event time.
    event_ms: Option<u64>,
    key: Option<&'a str>,
    ordering_key: Option<&'a [u8]>,
    sequence_id: u64,
    /// `None` for a null value.
    payload: Option<&'a [u8]>,
    single_raw: Option<&'a [u8]>,
}

/// Sizes of one finished batch (rows, properties, bytes of the variable-width columns).
struct BatchShape {
    rows: usize,
    payload: usize,
    entry_metadata: usize,
    message_metadata: usize,
    key: usize,
    ordering_key: usize,
    producer_name: usize,
    properties: usize,
    prop_keys: usize,
    prop_values: usize,
}

/// The rows [`RowBuilder::push_entry`] makes of `entry`, each as its batch index and the
/// CRC32C of its `payload` value (`None` when NULL): one row `-1` for an entry that is not a
/// batch (or whose batch is opaque) and for one that does not decode, one row per message of
/// a batch, none for an empty batch. `ledgerlake verify` holds the lake to this.
pub fn entry_rows(entry: &Entry) -> Vec<(i32, Option<u32>)> {
    let undecodable = || vec![(-1, Some(crc32c::crc32c(&entry.payload)))];
    let Ok(opened) = open_entry(&entry.payload) else {
        return undecodable();
    };
    match opened.batch() {
        Some(batch) => {
            let mut rows = Vec::with_capacity(batch.capacity_hint());
            for message in batch {
                let Ok(message) = message else {
                    return undecodable();
                };
                let null = message.single.null_value.unwrap_or(false);
                rows.push((
                    message.batch_index as i32,
                    (!null).then(|| crc32c::crc32c(message.payload)),
                ));
            }
            rows
        }
        None => {
            let null = opened.metadata.null_value.unwrap_or(false);
            vec![(-1, (!null).then(|| crc32c::crc32c(&opened.payload)))]
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Int32Type, Int64Type, TimestampMicrosecondType};
    use bytes::Bytes;

    use super::*;
    use crate::lake::schema::envelope_schema;
    use crate::ledger::Position;
    use crate::perf::offload_bench::batch_entry;
    use crate::protocol::rebuild::frame_entry;

    fn builder() -> RowBuilder {
        let schema = iceberg::arrow::schema_to_arrow_schema(&envelope_schema())
            .unwrap_or_else(|e| panic!("{e}"));
        RowBuilder::new(Arc::new(schema), 3, None)
    }

    fn entry(entry: u64, payload: Bytes) -> Entry {
        Entry {
            position: Position { ledger: 7, entry },
            publish_time_ms: 1_000 + entry as i64,
            payload,
        }
    }

    #[test]
    fn batches_unroll_and_broken_entries_become_one_flagged_row() {
        let payloads: Vec<Vec<u8>> = (0..3).map(|i| format!("m{i}").into_bytes()).collect();
        let good = batch_entry(&payloads, 10, 5_000, true);
        // A batch declaring one record more than it holds: the whole batch becomes one
        // undecodable row, none of its three good records a row of its own.
        let torn = {
            let opened = open_entry(&good).unwrap_or_else(|e| panic!("{e}"));
            let mut meta = opened.metadata.clone();
            meta.num_messages_in_batch = Some(4);
            frame_entry(&prost::Message::encode_to_vec(&meta), &opened.payload)
        };
        let mut b = builder();
        b.push_entry(&entry(0, good.clone()));
        b.push_entry(&entry(1, Bytes::from_static(b"not an entry")));
        b.push_entry(&entry(2, torn.clone()));
        b.push_entry(&entry(3, good.clone()));
        assert_eq!(b.rows(), 8);
        // `entry_rows` names the same rows, with their payloads' checksums.
        let named: Vec<(i32, Option<u32>)> = [
            good.clone(),
            Bytes::from_static(b"not an entry"),
            torn.clone(),
            good.clone(),
        ]
        .iter()
        .enumerate()
        .flat_map(|(i, p)| entry_rows(&entry(i as u64, p.clone())))
        .collect();
        let crc = |b: &[u8]| Some(crc32c::crc32c(b));
        assert_eq!(
            named,
            [
                (0, crc(b"m0")),
                (1, crc(b"m1")),
                (2, crc(b"m2")),
                (-1, crc(b"not an entry")),
                (-1, crc(&torn)),
                (0, crc(b"m0")),
                (1, crc(b"m1")),
                (2, crc(b"m2")),
            ]
        );
        let (batch, publish, bad) = b.finish().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bad, 0);
        assert_eq!(batch.num_rows(), 8);
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .cloned()
                .unwrap_or_else(|| panic!("{name}"))
        };
        let entry_ids: Vec<i64> = col("entry_id")
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(entry_ids, [0, 0, 0, 1, 2, 3, 3, 3]);
        let index: Vec<i32> = col("batch_index")
            .as_primitive::<Int32Type>()
            .values()
            .to_vec();
        assert_eq!(index, [0, 1, 2, -1, -1, 0, 1, 2]);
        let sizes: Vec<i32> = col("batch_size")
            .as_primitive::<Int32Type>()
            .values()
            .to_vec();
        assert_eq!(sizes, [3, 3, 3, 0, 0, 3, 3, 3]);
        let parts = col("partition");
        assert!(parts
            .as_primitive::<Int32Type>()
            .values()
            .iter()
            .all(|p| *p == 3));
        let seq: Vec<i64> = col("sequence_id")
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(seq, [10, 11, 12, -1, -1, 10, 11, 12]);
        // Batched rows carry the metadata's publish time; broken ones the entry's.
        let times = col("publish_time");
        let times = times.as_primitive::<TimestampMicrosecondType>();
        assert_eq!(
            times.values().to_vec(),
            [
                5_000_000, 5_000_000, 5_000_000, 1_001_000, 1_002_000, 5_000_000, 5_000_000,
                5_000_000
            ]
        );
        assert_eq!(&publish[..], times.values());
        let errors = col("decode_error");
        let errors = errors.as_string::<i32>();
        let flagged: Vec<usize> = (0..8).filter(|i| errors.is_valid(*i)).collect();
        assert_eq!(flagged, [3, 4]);
        assert!(errors.value(3).starts_with("entry does not decode"));
        assert!(
            errors.value(4).contains("declared size"),
            "{}",
            errors.value(4)
        );
        let payload = col("payload");
        let payload = payload.as_binary::<i64>();
        assert_eq!(payload.value(1), b"m1");
        assert_eq!(payload.value(4), &torn[..]);
        let producers = col("producer_name");
        assert_eq!(producers.as_string::<i32>().value(7), "perf-offload");
        assert_eq!(producers.as_string::<i32>().value(3), "");
        // The entry's raw metadata sits on the first row of each entry only.
        let meta = col("entry_metadata");
        let with_meta: Vec<usize> = (0..8).filter(|i| meta.is_valid(*i)).collect();
        assert_eq!(with_meta, [0, 5]);
        assert_eq!(col("schema_version").null_count(), 8);
        assert_eq!(col("message_metadata").null_count(), 2);
        // The builder starts over, sized like the last batch.
        assert_eq!(b.rows(), 0);
        assert!(b.finish().is_ok_and(|(batch, _, _)| batch.num_rows() == 0));
    }

    #[test]
    fn bad_payloads_and_broken_entries_are_flagged_in_one_batch() {
        use crate::lake::typed::{PayloadCodec, TypedColumns};
        let envelope = iceberg::arrow::schema_to_arrow_schema(&envelope_schema())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut fields: Vec<arrow::datatypes::FieldRef> =
            envelope.fields().iter().cloned().collect();
        fields.push(Arc::new(arrow::datatypes::Field::new(
            "id",
            arrow::datatypes::DataType::Int64,
            true,
        )));
        let schema = Arc::new(arrow::datatypes::Schema::new(fields));
        let typed = TypedColumns::new(&schema, PayloadCodec::Json);
        assert!(typed.is_some());
        let mut b = RowBuilder::new(schema, -1, typed);
        let payloads = [
            br#"{"id":1}"#.to_vec(),
            b"not json".to_vec(),
            br#"{"id":3}"#.to_vec(),
        ];
        b.push_entry(&entry(0, Bytes::from_static(b"not an entry")));
        b.push_entry(&entry(1, batch_entry(&payloads, 0, 5_000, false)));
        let (batch, _, bad) = b.finish().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bad, 1);
        let ids = batch
            .column_by_name("id")
            .cloned()
            .unwrap_or_else(|| panic!("id"));
        let ids = ids.as_primitive::<Int64Type>();
        let got: Vec<Option<i64>> = ids.iter().collect();
        assert_eq!(got, [None, Some(1), None, Some(3)]);
        let errors = batch
            .column_by_name("decode_error")
            .cloned()
            .unwrap_or_else(|| panic!("decode_error"));
        let errors = errors.as_string::<i32>();
        let flagged: Vec<usize> = (0..4).filter(|i| errors.is_valid(*i)).collect();
        assert_eq!(flagged, [0, 2]);
        assert!(errors.value(0).starts_with("entry does not decode"));
        assert!(!errors.value(2).starts_with("entry does not decode"));
    }

    #[test]
    fn decode_errors_land_on_their_rows() {
        let column = decode_error_column(
            6,
            vec![
                (4, "d".into()),
                (1, "b".into()),
                (4, "later".into()),
                (9, "x".into()),
            ],
        );
        let got: Vec<Option<&str>> = column.iter().collect();
        assert_eq!(got, [None, Some("b"), None, None, Some("d"), None]);
        assert_eq!(decode_error_column(3, Vec::new()).null_count(), 3);
    }
}
