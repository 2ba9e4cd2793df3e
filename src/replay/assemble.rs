//! Lake rows → log entries: groups the rows of one ledger back into entries, in entry order,
//! whatever order the table's files return them in.
//!
//! Invariants:
//! - An entry is emitted only when all its rows arrived (one row for an unbatched, encrypted,
//!   chunked or undecodable entry; `batch_size` rows for a batch), and only when it is the next
//!   entry of the range: nothing is skipped, nothing is emitted twice, nothing is invented.
//! - Rows outside the range (other ledgers, partitions, entries already emitted) and repeated
//!   rows of an entry are ignored, so a rewrite of the table's files that duplicates or
//!   reorders rows cannot change what a consumer receives.
//! - Rows of entries after the next one wait in a reorder buffer (bounded by the ledger's rows
//!   still to come in the scanned range).

use arrow::array::{Array, AsArray, Int32Array, Int64Array, LargeBinaryArray, RecordBatch};
use arrow::datatypes::{Int32Type, Int64Type, TimestampMicrosecondType};
use bytes::Bytes;
use std::collections::BTreeMap;

use crate::ledger::{Entry, LedgerId, Position};
use crate::protocol::rebuild::{rebuild_batch, rebuild_single};

/// The columns a replay scan reads.
pub const REPLAY_COLUMNS: [&str; 9] = [
    "ledger_id",
    "entry_id",
    "batch_index",
    "batch_size",
    "partition",
    "publish_time",
    "payload",
    "entry_metadata",
    "message_metadata",
];

/// Why rows could not become entries.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AssembleError {
    /// A column is missing or has an unexpected type.
    #[error("lake rows lack column '{0}' (or it has an unexpected type)")]
    Column(&'static str),
    /// The rows of an entry contradict each other or do not rebuild.
    #[error("entry {ledger}:{entry} does not rebuild from its rows: {reason}")]
    Corrupt {
        /// Ledger.
        ledger: LedgerId,
        /// Entry.
        entry: u64,
        /// Why.
        reason: String,
    },
    /// The scan ended before every entry of the range was seen.
    #[error("the lake has no complete rows for entries {ledger}:{first}..={last}")]
    Missing {
        /// Ledger.
        ledger: LedgerId,
        /// First missing entry.
        first: u64,
        /// Last entry of the range.
        last: u64,
    },
}

/// One message row, owned until its entry is complete.
#[derive(Debug, Default)]
struct MessageRow {
    single: Option<Bytes>,
    payload: Option<Bytes>,
}

/// The rows of one entry seen so far.
#[derive(Debug)]
struct Partial {
    /// -1 rows: the single row of an unbatched/opaque/undecodable entry.
    batched: bool,
    publish_ms: i64,
    metadata: Option<Bytes>,
    /// Invariant: `messages.len()` is the number of rows the entry has.
    messages: Vec<Option<MessageRow>>,
    seen: usize,
}

/// Assembles the entries `next..end` of one ledger (of one partition) from lake rows.
#[derive(Debug)]
pub struct Assembler {
    ledger: LedgerId,
    partition: i32,
    /// Invariant: every entry before `next` was emitted, none at or after it.
    next: u64,
    end: u64,
    pending: BTreeMap<u64, Partial>,
}

struct Columns<'a> {
    ledger: &'a Int64Array,
    entry: &'a Int64Array,
    batch_index: &'a Int32Array,
    batch_size: &'a Int32Array,
    partition: &'a Int32Array,
    publish: &'a arrow::array::PrimitiveArray<TimestampMicrosecondType>,
    payload: &'a LargeBinaryArray,
    entry_metadata: &'a LargeBinaryArray,
    message_metadata: &'a LargeBinaryArray,
}

impl<'a> Columns<'a> {
    fn of(batch: &'a RecordBatch) -> Result<Self, AssembleError> {
        let col = |name: &'static str| {
            batch
                .column_by_name(name)
                .ok_or(AssembleError::Column(name))
        };
        let i64s = |name: &'static str| {
            col(name)?
                .as_primitive_opt::<Int64Type>()
                .ok_or(AssembleError::Column(name))
        };
        let i32s = |name: &'static str| {
            col(name)?
                .as_primitive_opt::<Int32Type>()
                .ok_or(AssembleError::Column(name))
        };
        let bin = |name: &'static str| {
            col(name)?
                .as_binary_opt::<i64>()
                .ok_or(AssembleError::Column(name))
        };
        Ok(Columns {
            ledger: i64s("ledger_id")?,
            entry: i64s("entry_id")?,
            batch_index: i32s("batch_index")?,
            batch_size: i32s("batch_size")?,
            partition: i32s("partition")?,
            publish: col("publish_time")?
                .as_primitive_opt::<TimestampMicrosecondType>()
                .ok_or(AssembleError::Column("publish_time"))?,
            payload: bin("payload")?,
            entry_metadata: bin("entry_metadata")?,
            message_metadata: bin("message_metadata")?,
        })
    }
}

/// Other engines may write Iceberg `binary` as Arrow Binary or BinaryView: read it as LargeBinary.
fn large_binaries(batch: &RecordBatch) -> Result<RecordBatch, AssembleError> {
    use arrow::datatypes::DataType;
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| matches!(f.data_type(), DataType::Binary | DataType::BinaryView))
    {
        return Ok(batch.clone());
    }
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (f, a) in schema.fields().iter().zip(batch.columns()) {
        if matches!(f.data_type(), DataType::Binary | DataType::BinaryView) {
            let cast = arrow::compute::cast(a, &DataType::LargeBinary)
                .map_err(|_| AssembleError::Column("payload"))?;
            fields.push(f.as_ref().clone().with_data_type(DataType::LargeBinary));
            columns.push(cast);
        } else {
            fields.push(f.as_ref().clone());
            columns.push(a.clone());
        }
    }
    RecordBatch::try_new(
        std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
        columns,
    )
    .map_err(|_| AssembleError::Column("payload"))
}

fn bytes_at(a: &LargeBinaryArray, row: usize) -> Option<Bytes> {
    (!a.is_null(row)).then(|| Bytes::copy_from_slice(a.value(row)))
}

impl Assembler {
    /// Assembles entries `first..end` of `ledger` (rows of `partition`; -1 when the topic is
    /// not partitioned).
    pub fn new(ledger: LedgerId, partition: i32, first: u64, end: u64) -> Self {
        Self {
            ledger,
            partition,
            next: first,
            end,
            pending: BTreeMap::new(),
        }
    }

    /// The next entry to emit.
    pub fn next_entry(&self) -> u64 {
        self.next
    }

    /// Whether every entry of the range was emitted.
    pub fn done(&self) -> bool {
        self.next >= self.end
    }

    /// Takes the rows of `batch`; appends every entry that became complete (in order) to `out`.
    pub fn push(&mut self, batch: &RecordBatch, out: &mut Vec<Entry>) -> Result<(), AssembleError> {
        let batch = &large_binaries(batch)?;
        let c = Columns::of(batch)?;
        for row in 0..batch.num_rows() {
            if c.ledger.value(row) as u64 != self.ledger || c.partition.value(row) != self.partition
            {
                continue;
            }
            let entry = c.entry.value(row);
            if entry < 0 || (entry as u64) < self.next || entry as u64 >= self.end {
                continue;
            }
            let entry = entry as u64;
            let index = c.batch_index.value(row);
            let corrupt = |reason: &str| AssembleError::Corrupt {
                ledger: self.ledger,
                entry,
                reason: reason.to_string(),
            };
            let partial = match self.pending.entry(entry) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let rows = if index < 0 {
                        1
                    } else {
                        let n = c.batch_size.value(row);
                        if n <= 0 || n > 1_000_000 {
                            return Err(corrupt("batch row with an impossible batch_size"));
                        }
                        n as usize
                    };
                    v.insert(Partial {
                        batched: index >= 0,
                        publish_ms: c.publish.value(row).div_euclid(1000),
                        metadata: None,
                        messages: (0..rows).map(|_| None).collect(),
                        seen: 0,
                    })
                }
            };
            if partial.batched != (index >= 0) {
                return Err(corrupt("batched and unbatched rows for one entry"));
            }
            let slot = usize::try_from(index.max(0)).unwrap_or(0);
            let Some(cell) = partial.messages.get_mut(slot) else {
                return Err(corrupt("batch_index beyond batch_size"));
            };
            if cell.is_some() {
                continue; // a repeated row (e.g. a rewrite that duplicated it)
            }
            if slot == 0 {
                partial.metadata = bytes_at(c.entry_metadata, row);
            }
            *cell = Some(MessageRow {
                single: bytes_at(c.message_metadata, row),
                payload: bytes_at(c.payload, row),
            });
            partial.seen += 1;
            if entry == self.next {
                self.drain(out)?;
            }
        }
        Ok(())
    }

    /// Emits the complete entries at the head of the range.
    fn drain(&mut self, out: &mut Vec<Entry>) -> Result<(), AssembleError> {
        while let Some(first) = self.pending.first_entry() {
            if *first.key() != self.next || first.get().seen < first.get().messages.len() {
                return Ok(());
            }
            let partial = first.remove();
            let entry = self.next;
            out.push(Entry {
                position: Position::new(self.ledger, entry),
                publish_time_ms: partial.publish_ms,
                payload: rebuild(partial).map_err(|reason| AssembleError::Corrupt {
                    ledger: self.ledger,
                    entry,
                    reason,
                })?,
            });
            self.next += 1;
        }
        Ok(())
    }

    /// Called when the scan ended: an error unless every entry of the range was emitted.
    pub fn finish(&self) -> Result<(), AssembleError> {
        if self.done() {
            return Ok(());
        }
        Err(AssembleError::Missing {
            ledger: self.ledger,
            first: self.next,
            last: self.end - 1,
        })
    }
}

fn rebuild(p: Partial) -> Result<Bytes, String> {
    let mut rows = p.messages.into_iter().map(Option::unwrap_or_default);
    if !p.batched {
        let row = rows.next().unwrap_or_default();
        return match p.metadata {
            // Undecodable when offloaded: the row holds the whole stored entry.
            None => row
                .payload
                .ok_or_else(|| "undecodable entry without bytes".to_string()),
            Some(meta) => rebuild_single(&meta, row.payload.as_deref()).map_err(|e| e.to_string()),
        };
    }
    let meta = p
        .metadata
        .ok_or_else(|| "batch without its entry metadata".to_string())?;
    let rows: Vec<MessageRow> = rows.collect();
    if rows.iter().any(|r| r.single.is_none()) {
        return Err("batched message without its single-message metadata".into());
    }
    rebuild_batch(
        &meta,
        rows.iter().map(|r| {
            (
                r.single.as_deref().unwrap_or_default(),
                r.payload.as_deref(),
            )
        }),
    )
    .map_err(|e| e.to_string())
}

/// The smallest `entry_id` among rows of `ledger` in `batch` published at or after `publish_us` (for
/// seeks by publish time; the scan's filter may be applied only per row group).
pub fn min_entry_at_or_after(
    batch: &RecordBatch,
    ledger: LedgerId,
    publish_us: i64,
) -> Option<u64> {
    let ledgers = batch
        .column_by_name("ledger_id")?
        .as_primitive_opt::<Int64Type>()?;
    let entries = batch
        .column_by_name("entry_id")?
        .as_primitive_opt::<Int64Type>()?;
    let times = batch
        .column_by_name("publish_time")?
        .as_primitive_opt::<TimestampMicrosecondType>()?;
    (0..batch.num_rows())
        .filter(|&i| times.value(i) >= publish_us && ledgers.value(i) as u64 == ledger)
        .filter_map(|i| u64::try_from(entries.value(i)).ok())
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lake::rows::RowBuilder;
    use crate::lake::schema::envelope_schema;
    use crate::protocol::entry::build_batch_entry;
    use crate::protocol::frame::build_entry;
    use crate::protocol::proto::{KeyValue, MessageMetadata, SingleMessageMetadata};
    use proptest::prelude::*;

    fn entries(shapes: &[u8]) -> Vec<Entry> {
        shapes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let meta = MessageMetadata {
                    producer_name: "p".into(),
                    sequence_id: i as u64,
                    publish_time: 1_700_000_000_000 + i as u64,
                    replicated_from: Some("elsewhere".into()),
                    ..Default::default()
                };
                let payload = match n {
                    0 => build_entry(&meta, format!("single {i}").as_bytes()),
                    // Not a Pulsar entry at all: kept whole, replayed whole.
                    1 => bytes::Bytes::from(vec![0xde, 0xad, i as u8]),
                    n => build_batch_entry(
                        meta,
                        (0..n).map(|j| {
                            let single = SingleMessageMetadata {
                                partition_key: Some(format!("k{j}")),
                                properties: vec![KeyValue {
                                    key: "j".into(),
                                    value: j.to_string(),
                                }],
                                ..Default::default()
                            };
                            (single, format!("message {i}.{j}").into_bytes())
                        }),
                    ),
                };
                Entry {
                    position: Position::new(7, i as u64),
                    publish_time_ms: 1_700_000_000_000 + i as i64,
                    payload,
                }
            })
            .collect()
    }

    fn rows(entries: &[Entry]) -> RecordBatch {
        let schema = iceberg::arrow::schema_to_arrow_schema(&envelope_schema())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut b = RowBuilder::new(std::sync::Arc::new(schema), -1, None);
        for e in entries {
            b.push_entry(e);
        }
        b.finish().unwrap_or_else(|e| panic!("{e}")).0
    }

    proptest! {
        /// Whatever the order and grouping of rows (as a rewrite of the table's files may
        /// produce), with repeated rows, the entries come back exactly and in order.
        #[test]
        fn entries_come_back_from_shuffled_rows(
            shapes in proptest::collection::vec(0u8..6, 1..20),
            seed in any::<u64>(),
            chunk in 1usize..7,
        ) {
            let original = entries(&shapes);
            let batch = rows(&original);
            let n = batch.num_rows();
            let mut order: Vec<u32> = (0..n as u32).collect();
            order.push((seed % n as u64) as u32); // a duplicated row
            let mut rng = seed;
            for i in (1..order.len()).rev() {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                order.swap(i, (rng >> 33) as usize % (i + 1));
            }
            let indices = arrow::array::UInt32Array::from(order);
            let shuffled = arrow::compute::take_record_batch(&batch, &indices)
                .unwrap_or_else(|e| panic!("{e}"));
            let mut asm = Assembler::new(7, -1, 0, original.len() as u64);
            let mut out = Vec::new();
            let mut at = 0;
            while at < shuffled.num_rows() {
                let len = chunk.min(shuffled.num_rows() - at);
                asm.push(&shuffled.slice(at, len), &mut out).unwrap_or_else(|e| panic!("{e}"));
                at += len;
            }
            prop_assert!(asm.finish().is_ok());
            prop_assert_eq!(out, original);
        }
    }

    #[test]
    fn a_missing_row_is_an_error_not_a_gap() {
        let original = entries(&[0, 3, 0]);
        let batch = rows(&original);
        // Drop one message of the batch (row 2 of 5).
        let keep = arrow::array::UInt32Array::from(vec![0u32, 1, 3, 4]);
        let holed =
            arrow::compute::take_record_batch(&batch, &keep).unwrap_or_else(|e| panic!("{e}"));
        let mut asm = Assembler::new(7, -1, 0, 3);
        let mut out = Vec::new();
        asm.push(&holed, &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), 1, "only the entry before the hole");
        assert!(matches!(
            asm.finish(),
            Err(AssembleError::Missing {
                ledger: 7,
                first: 1,
                last: 2
            })
        ));
    }

    #[test]
    fn a_range_starts_mid_ledger() {
        let original = entries(&[2, 0, 4, 0]);
        let mut asm = Assembler::new(7, -1, 2, 4);
        let mut out = Vec::new();
        asm.push(&rows(&original), &mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(asm.finish().is_ok());
        assert_eq!(out, original[2..].to_vec());
    }
}
