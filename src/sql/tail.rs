//! The live tail of a topic's table: the messages of the ledgers the pinned lake snapshot does
//! not hold, read by position through replay's [`EntryReader`] (the one reader that chooses
//! between log and lake) and decoded to the lake table's Arrow schema, on the blocking pool, by
//! the same [`RowBuilder`] the offload engine writes Parquet with.
//!
//! Invariants:
//! - The tail reads exactly the ledgers and entry counts fixed when the query started
//!   ([`TailSource`]); entries appended later are not read.
//! - Pushed-down filters skip partitions, ledgers and entries by their ids and publish-time
//!   range ([`Bounds`]) and are evaluated on every decoded row; they never drop a row the
//!   filters keep.
//! - A ledger deleted locally while the query runs (its offload committed after the pinned
//!   snapshot, then its deletion lag passed) is read from the lake by the same reader, entry by
//!   entry: no message is lost or read twice.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::compute::{cast, filter_record_batch};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use tokio::sync::mpsc::Sender;

use super::prune::Bounds;
use crate::lake::rows::RowBuilder;
use crate::lake::typed::{PayloadCodec, TypedColumns};
use crate::ledger::{Entry, LedgerId, Position, TopicLog};
use crate::replay::{EntryReader, ReplayError, Tier, TopicLake};

/// Entries read per call.
const READ_CHUNK: u64 = 2048;
/// How long the tail waits before asking a lake read in progress again.
const PENDING_RETRY: std::time::Duration = std::time::Duration::from_millis(20);
/// Failed reads of one chunk retried (with the reader's backoff) before the query fails: a
/// ledger committed after the reader's cached table handle was loaded is found on a retry,
/// which reloads the table.
const READ_ATTEMPTS: u32 = 4;
/// Rows per output batch (about).
const BATCH_ROWS: usize = 8192;

/// One ledger of the tail, as fixed at query start.
#[derive(Debug, Clone)]
pub(crate) struct TailLedger {
    pub id: LedgerId,
    /// Entries `0..count` belong to the query.
    pub count: u64,
    pub min_publish_ms: Option<i64>,
    pub max_publish_ms: Option<i64>,
}

/// The tail of one partition (-1: not partitioned).
#[derive(Debug, Clone)]
pub(crate) struct TailPart {
    pub partition: i32,
    pub log: TopicLog,
    /// Its lake side, for ledgers deleted locally during the query (`None`: lake disabled).
    pub lake: Option<TopicLake>,
    /// Invariant: ascending ids, each above the pinned snapshot's watermark of the partition.
    pub ledgers: Vec<TailLedger>,
}

/// What the tail of one topic table reads.
#[derive(Debug)]
pub(crate) struct TailSource {
    /// In a namespace's shared table, the `topic` column of the rows.
    pub topic: Option<Arc<str>>,
    /// `tenant.namespace.topic`, for messages.
    pub table_name: String,
    /// The table's full Arrow schema.
    pub schema: SchemaRef,
    pub codec: Option<PayloadCodec>,
    pub parts: Vec<TailPart>,
}

impl TailSource {
    fn entries(&self) -> u64 {
        self.parts
            .iter()
            .flat_map(|p| p.ledgers.iter())
            .map(|l| l.count)
            .sum()
    }
}

/// Scans the live tail (one output partition).
#[derive(Debug)]
pub(crate) struct TailExec {
    source: Arc<TailSource>,
    projection: Option<Vec<usize>>,
    bounds: Bounds,
    /// Over the full schema; rows where it is not true are dropped.
    predicate: Option<Arc<dyn PhysicalExpr>>,
    props: Arc<PlanProperties>,
    /// What EXPLAIN ANALYZE shows of the tail's side of a query.
    metrics: ExecutionPlanMetricsSet,
}

/// The tail's counters: rows out and time spent decoding (DataFusion's baseline), entries
/// read, and of them the entries read from the lake (ledgers deleted locally meanwhile).
struct TailMetrics {
    baseline: BaselineMetrics,
    entries_read: Count,
    lake_entries: Count,
    ledgers_pruned: Count,
    read_time: Time,
}

impl TailMetrics {
    fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> TailMetrics {
        TailMetrics {
            baseline: BaselineMetrics::new(set, partition),
            entries_read: MetricBuilder::new(set).counter("entries_read", partition),
            lake_entries: MetricBuilder::new(set).counter("entries_read_from_lake", partition),
            ledgers_pruned: MetricBuilder::new(set).counter("ledgers_pruned", partition),
            read_time: MetricBuilder::new(set).subset_time("read_time", partition),
        }
    }
}

impl TailExec {
    pub fn new(
        source: Arc<TailSource>,
        projection: Option<Vec<usize>>,
        projected: SchemaRef,
        bounds: Bounds,
        predicate: Option<Arc<dyn PhysicalExpr>>,
    ) -> TailExec {
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(projected),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        TailExec {
            source,
            projection,
            bounds,
            predicate,
            props,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for TailExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let ledgers: usize = self.source.parts.iter().map(|p| p.ledgers.len()).sum();
        write!(
            f,
            "LiveTailExec: table={} partitions={} ledgers={} entries={}",
            self.source.table_name,
            self.source.parts.len(),
            ledgers,
            self.source.entries()
        )?;
        let bounds = self.bounds.describe();
        if !bounds.is_empty() {
            write!(f, " pruning=[{bounds}]")?;
        }
        if let Some(p) = &self.predicate {
            write!(f, " predicate=[{p}]")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for TailExec {
    fn name(&self) -> &str {
        "LiveTailExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "LiveTailExec has one partition, asked for {partition}"
            )));
        }
        let out = Output {
            full: self.source.schema.clone(),
            stored: stored_schema(&self.source.schema),
            projection: self.projection.clone(),
            predicate: self.predicate.clone(),
            metrics: TailMetrics::new(&self.metrics, partition),
        };
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema(), 2);
        let tx = builder.tx();
        let source = self.source.clone();
        let bounds = self.bounds.clone();
        builder.spawn(async move { read_tail(source, bounds, out, tx).await });
        Ok(builder.build())
    }
}

/// Turns full-schema batches into the plan's output: conformed to the table's schema, filtered,
/// then projected.
struct Output {
    /// The table's schema (strings as views).
    full: SchemaRef,
    /// What the row builder writes (the lake's storage types: strings as `Utf8`).
    stored: SchemaRef,
    projection: Option<Vec<usize>>,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    metrics: TailMetrics,
}

impl Output {
    fn shape(&self, batch: RecordBatch) -> DFResult<RecordBatch> {
        let batch = conform_batch(&batch, &self.full)?;
        let batch = match &self.predicate {
            None => batch,
            Some(p) => {
                let mask = p.evaluate(&batch)?.into_array(batch.num_rows())?;
                let mask = mask
                    .as_any()
                    .downcast_ref::<arrow::array::BooleanArray>()
                    .ok_or_else(|| {
                        DataFusionError::Internal("tail predicate is not boolean".into())
                    })?;
                filter_record_batch(&batch, mask)?
            }
        };
        Ok(match &self.projection {
            None => batch,
            Some(p) => batch.project(p)?,
        })
    }

    async fn send(&self, tx: &Sender<DFResult<RecordBatch>>, batch: RecordBatch) -> bool {
        let shaped = {
            let _timer = self.metrics.baseline.elapsed_compute().timer();
            self.shape(batch)
        };
        if let Ok(b) = &shaped {
            self.metrics.baseline.record_output(b.num_rows());
        }
        match shaped {
            Ok(b) if b.num_rows() == 0 => true,
            other => tx.send(other).await.is_ok(),
        }
    }
}

async fn read_tail(
    source: Arc<TailSource>,
    bounds: Bounds,
    out: Output,
    tx: Sender<DFResult<RecordBatch>>,
) -> DFResult<()> {
    for part in &source.parts {
        if !bounds.partition_may_match(part.partition) {
            continue;
        }
        let mut reader = EntryReader::new(part.log.clone(), part.lake.clone());
        for ledger in &part.ledgers {
            if !bounds.ledger_may_match(
                ledger.id as i64,
                ledger.min_publish_ms,
                ledger.max_publish_ms,
            ) {
                out.metrics.ledgers_pruned.add(1);
                continue;
            }
            let Some((first, last)) = bounds.entry_span(ledger.count) else {
                out.metrics.ledgers_pruned.add(1);
                continue;
            };
            let typed = source
                .codec
                .clone()
                .and_then(|c| TypedColumns::new(&out.stored, c));
            let mut rows = Some(
                RowBuilder::new(out.stored.clone(), part.partition, typed)
                    .with_topic(source.topic.clone()),
            );
            let mut next = first;
            while next <= last {
                let wanted = (last - next + 1).min(READ_CHUNK) as usize;
                let entries = {
                    let _timer = out.metrics.read_time.timer();
                    read_chunk(&mut reader, &source, ledger.id, next, wanted).await?
                };
                next += entries.len() as u64;
                out.metrics.entries_read.add(entries.len());
                if reader.tier() == Tier::Lake {
                    out.metrics.lake_entries.add(entries.len());
                }
                let builder = rows
                    .take()
                    .ok_or_else(|| DataFusionError::Internal("tail row builder lost".into()))?;
                let flush_now = next > last;
                let (builder, batch) = decode(
                    builder,
                    entries,
                    flush_now,
                    out.metrics.baseline.elapsed_compute(),
                )
                .await?;
                rows = Some(builder);
                if let Some(batch) = batch {
                    if !out.send(&tx, batch).await {
                        return Ok(());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Up to `wanted` entries of `ledger` from `first` on, through replay's reader: the local log,
/// or the lake for a ledger deleted locally during the query (its offload committed after the
/// pinned snapshot).
async fn read_chunk(
    reader: &mut EntryReader,
    source: &TailSource,
    ledger: LedgerId,
    first: u64,
    wanted: usize,
) -> DFResult<Vec<Entry>> {
    let from = Position::new(ledger, first);
    let mut failures = 0;
    loop {
        match reader.read_from(from, wanted).await {
            Ok(mut entries) => {
                entries.retain(|e| e.position.ledger == ledger);
                let in_order = entries
                    .iter()
                    .enumerate()
                    .all(|(i, e)| e.position.entry == first + i as u64);
                if entries.is_empty() || !in_order {
                    return Err(DataFusionError::Execution(format!(
                        "the live tail of {} lost entries from {from} (ledger {ledger})",
                        source.table_name
                    )));
                }
                return Ok(entries);
            }
            Err(ReplayError::Pending) => tokio::time::sleep(PENDING_RETRY).await,
            Err(e) if failures + 1 < READ_ATTEMPTS => {
                failures += 1;
                tracing::debug!(table = %source.table_name, %from, error = %e, "tail read retried");
                tokio::time::sleep(reader.retry_delay()).await;
            }
            Err(e) => {
                return Err(DataFusionError::Execution(format!(
                    "reading the live tail of {} from {from}: {e}",
                    source.table_name
                )))
            }
        }
    }
}

/// Decodes `entries` into `rows` on the blocking pool (row decoding never runs on async
/// workers); returns the builder and a batch when it is full or `finish` is asked.
async fn decode(
    mut rows: RowBuilder,
    entries: Vec<Entry>,
    finish: bool,
    compute: &Time,
) -> DFResult<(RowBuilder, Option<RecordBatch>)> {
    let compute = compute.clone();
    tokio::task::spawn_blocking(move || {
        let _timer = compute.timer();
        for e in &entries {
            rows.push_entry(e);
        }
        if rows.rows() == 0 || (!finish && rows.rows() < BATCH_ROWS) {
            return Ok((rows, None));
        }
        let (batch, _, _) = rows
            .finish()
            .map_err(|e| DataFusionError::Execution(format!("decoding the live tail: {e}")))?;
        Ok((rows, Some(batch)))
    })
    .await
    .map_err(|e| DataFusionError::Execution(format!("decoding the live tail: {e}")))?
}

/// `schema` as the lake stores it: top-level string views as `Utf8` (the row builder's and
/// Iceberg's type; the table reads them as views, see `catalog::iceberg_to_arrow`).
pub(crate) fn stored_schema(schema: &SchemaRef) -> SchemaRef {
    strings_as(schema, &DataType::Utf8View, DataType::Utf8)
}

/// `schema` with every top-level field of type `from` given type `to`.
pub(crate) fn strings_as(schema: &SchemaRef, from: &DataType, to: DataType) -> SchemaRef {
    let fields: Vec<arrow::datatypes::FieldRef> = schema
        .fields()
        .iter()
        .map(|f| {
            if f.data_type() == from {
                Arc::new(f.as_ref().clone().with_data_type(to.clone()))
            } else {
                f.clone()
            }
        })
        .collect();
    Arc::new(arrow::datatypes::Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ))
}

/// `batch` in exactly `schema`: columns by name, cast where the type differs (a file written by
/// another engine may hold `binary` where the table says `large_binary`), null where missing.
pub(crate) fn conform_batch(batch: &RecordBatch, schema: &SchemaRef) -> DFResult<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(RecordBatch::try_new_with_options(
            schema.clone(),
            batch.columns().to_vec(),
            &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?);
    }
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
            Some(c) => cast(c, f.data_type()).map_err(DataFusionError::from),
            None => Ok(new_null_array(f.data_type(), batch.num_rows())),
        })
        .collect::<DFResult<_>>()?;
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}
