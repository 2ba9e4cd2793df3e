//! The live tail of a topic's table: the messages of the ledgers the pinned lake snapshot does
//! not hold, read from the local log and decoded to the lake table's Arrow schema by the same
//! [`RowBuilder`] the offload engine writes Parquet with.
//!
//! Invariants:
//! - The tail reads exactly the ledgers and entry counts fixed when the query started
//!   ([`TailSource`]); entries appended later are not read.
//! - Pushed-down filters skip partitions, ledgers and entries by their ids and publish-time
//!   range ([`Bounds`]) and are evaluated on every decoded row; they never drop a row the
//!   filters keep.
//! - A ledger deleted locally while the query runs (its offload committed after the pinned
//!   snapshot, then its deletion lag passed) is read from the table's newest snapshot by
//!   `ledger_id`/`entry_id`/`partition` instead: no message is lost or read twice.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::compute::{cast, filter_record_batch};
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::Datum;
use iceberg::TableIdent;
use tokio::sync::mpsc::Sender;

use super::prune::Bounds;
use crate::lake::rows::RowBuilder;
use crate::lake::typed::{PayloadCodec, TypedColumns};
use crate::ledger::{LedgerId, ReadError, TopicLog};
use crate::offload::OffloadEngine;

/// Entries read from the log per call.
const READ_CHUNK: u64 = 2048;
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
    /// Invariant: ascending ids, each above the pinned snapshot's watermark of the partition.
    pub ledgers: Vec<TailLedger>,
}

/// Where a ledger deleted during the query is read from instead.
#[derive(Debug, Clone)]
pub(crate) struct LakeFallback {
    pub engine: OffloadEngine,
    pub ident: TableIdent,
}

/// What the tail of one topic table reads.
#[derive(Debug)]
pub(crate) struct TailSource {
    /// `tenant.namespace.topic`, for messages.
    pub table_name: String,
    /// The table's full Arrow schema.
    pub schema: SchemaRef,
    pub codec: Option<PayloadCodec>,
    pub parts: Vec<TailPart>,
    pub lake: Option<LakeFallback>,
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
            projection: self.projection.clone(),
            predicate: self.predicate.clone(),
        };
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema(), 2);
        let tx = builder.tx();
        let source = self.source.clone();
        let bounds = self.bounds.clone();
        builder.spawn(async move { read_tail(source, bounds, out, tx).await });
        Ok(builder.build())
    }
}

/// Turns full-schema batches into the plan's output: filtered, then projected.
struct Output {
    full: SchemaRef,
    projection: Option<Vec<usize>>,
    predicate: Option<Arc<dyn PhysicalExpr>>,
}

impl Output {
    fn shape(&self, batch: RecordBatch) -> DFResult<RecordBatch> {
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
        let shaped = self.shape(batch);
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
        for ledger in &part.ledgers {
            if !bounds.ledger_may_match(
                ledger.id as i64,
                ledger.min_publish_ms,
                ledger.max_publish_ms,
            ) {
                continue;
            }
            let Some((first, last)) = bounds.entry_span(ledger.count) else {
                continue;
            };
            let typed = source
                .codec
                .clone()
                .and_then(|c| TypedColumns::new(&out.full, c));
            let mut rows = RowBuilder::new(out.full.clone(), part.partition, typed);
            let mut next = first;
            while next <= last {
                let until = last.min(next + READ_CHUNK - 1);
                let entries = match part.log.read_entries(ledger.id, next, until).await {
                    Ok(e) => e,
                    Err(ReadError::Deleted(_)) => {
                        if rows.rows() > 0 && !flush(&mut rows, &out, &tx).await? {
                            return Ok(());
                        }
                        read_from_lake(&source, part.partition, ledger.id, next, last, &out, &tx)
                            .await?;
                        break;
                    }
                    Err(e) => {
                        return Err(DataFusionError::Execution(format!(
                        "reading the live tail of {} (ledger {}, entries {next}..={until}): {e}",
                        source.table_name, ledger.id
                    )))
                    }
                };
                if entries.is_empty() {
                    return Err(DataFusionError::Execution(format!(
                        "the live tail of {} lost entries {next}..={until} of ledger {}",
                        source.table_name, ledger.id
                    )));
                }
                next += entries.len() as u64;
                for e in &entries {
                    rows.push_entry(e);
                }
                if rows.rows() >= BATCH_ROWS && !flush(&mut rows, &out, &tx).await? {
                    return Ok(());
                }
            }
            if rows.rows() > 0 && !flush(&mut rows, &out, &tx).await? {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Sends the accumulated rows; false when the consumer went away.
async fn flush(
    rows: &mut RowBuilder,
    out: &Output,
    tx: &Sender<DFResult<RecordBatch>>,
) -> DFResult<bool> {
    let (batch, _, _) = rows
        .finish()
        .map_err(|e| DataFusionError::Execution(format!("decoding the live tail: {e}")))?;
    Ok(out.send(tx, batch).await)
}

/// Rows `first..=last` of `ledger` from the table's newest snapshot (the ledger was committed
/// and deleted locally after the query's snapshot).
async fn read_from_lake(
    source: &TailSource,
    partition: i32,
    ledger: LedgerId,
    first: u64,
    last: u64,
    out: &Output,
    tx: &Sender<DFResult<RecordBatch>>,
) -> DFResult<()> {
    let gone = || {
        DataFusionError::Execution(format!(
            "ledger {ledger} of {} was deleted locally during the query and the lake has no table",
            source.table_name
        ))
    };
    let fallback = source.lake.as_ref().ok_or_else(gone)?;
    let table = fallback
        .engine
        .load_table_here(&fallback.ident)
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?
        .ok_or_else(gone)?;
    let mut predicate: Predicate = Reference::new("ledger_id")
        .equal_to(Datum::long(ledger as i64))
        .and(Reference::new("entry_id").greater_than_or_equal_to(Datum::long(first as i64)))
        .and(Reference::new("entry_id").less_than_or_equal_to(Datum::long(last as i64)));
    if partition >= 0 {
        predicate = predicate.and(Reference::new("partition").equal_to(Datum::int(partition)));
    }
    let current = table.metadata().current_schema().clone();
    let names: Vec<String> = out
        .full
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| current.field_by_name(n).is_some())
        .collect();
    let scan = table
        .scan()
        .select(names)
        .with_filter(predicate)
        .build()
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    let mut stream = scan
        .to_arrow()
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| DataFusionError::External(Box::new(e)))?;
        let batch = conform_batch(&batch, &out.full)?;
        if !out.send(tx, batch).await {
            return Ok(());
        }
    }
    Ok(())
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
