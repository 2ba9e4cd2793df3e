//! A lake stream: a task on the replay runtime that scans the lake table ledger by ledger from
//! a position and hands rebuilt entries to one subscription's reader through a read-ahead
//! buffer.
//!
//! Invariants:
//! - The stream yields the entries of locally deleted ledgers in order from its start position,
//!   without gaps; it ends (channel closed) at the first ledger that is still local, and stops
//!   with one error item when a read fails.
//! - Every buffered entry holds permits for its bytes from the subscription's read-ahead, the
//!   topic's and the broker's budgets; they are returned when the reader takes the entry (or
//!   the stream is dropped).

use std::sync::Arc;
use std::time::Instant;

use futures::TryStreamExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::assemble::{Assembler, REPLAY_COLUMNS};
use super::{ReplayError, TopicLake};
use crate::lake::LakeError;
use crate::ledger::{Entry, LedgerId, LedgerState, Position, TopicLog};

/// An entry waiting in a read-ahead buffer, with the memory permits it holds.
pub(crate) struct Buffered {
    pub entry: Entry,
    _permits: [OwnedSemaphorePermit; 3],
}

/// The receiving end of a lake stream. Dropping it stops the task and frees its buffer.
pub(crate) struct LakeStream {
    rx: mpsc::Receiver<Result<Buffered, ReplayError>>,
    /// Invariant: the position after the last entry taken (the next one the stream yields,
    /// possibly in a later ledger).
    pub next: Position,
    /// When the reader last took from it.
    pub last_used: Instant,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LakeStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LakeStream {
    /// Starts streaming from `from` on the replay runtime.
    pub fn start(lake: TopicLake, log: TopicLog, from: Position) -> LakeStream {
        let (tx, rx) = mpsc::channel(8192);
        let runtime = lake.replay.inner.runtime.clone();
        let task = runtime.spawn(async move {
            if let Err(e) = produce(&lake, &log, from, &tx).await {
                if let ReplayError::Stopped = e {
                    return; // the reader is gone
                }
                lake.invalidate();
                lake.replay.record_error(&e);
                tracing::warn!(topic = %lake.topic, table = %lake.table_name(), error = %e,
                    "lake read failed; the consumer retries from {from}");
                let _ = tx.send(Err(e)).await;
            }
        });
        LakeStream {
            rx,
            next: from,
            last_used: Instant::now(),
            task,
        }
    }

    /// Waits for the next entry; `None` when the lake range ended.
    pub async fn recv(&mut self) -> Option<Result<Buffered, ReplayError>> {
        self.last_used = Instant::now();
        self.rx.recv().await
    }

    /// Entries buffered and not taken yet.
    pub fn buffered(&self) -> usize {
        self.rx.len()
    }

    /// Whether the producing task has ended (the range is done, or it failed).
    pub fn finished(&self) -> bool {
        self.task.is_finished()
    }

    /// The next entry if one is buffered already.
    pub fn try_recv(&mut self) -> Option<Result<Buffered, ReplayError>> {
        self.rx.try_recv().ok()
    }
}

/// Where the stream starts in each ledger: the ledgers at or after `from` that hold entries
/// from there on.
fn next_ledger(log: &TopicLog, from: Position) -> Option<(LedgerId, LedgerState, u64, u64)> {
    log.ledgers().into_iter().find_map(|l| {
        let first = if l.id == from.ledger {
            from.entry
        } else if l.id > from.ledger {
            0
        } else {
            return None;
        };
        (first < l.entry_count).then_some((l.id, l.state, first, l.entry_count))
    })
}

async fn produce(
    lake: &TopicLake,
    log: &TopicLog,
    from: Position,
    tx: &mpsc::Sender<Result<Buffered, ReplayError>>,
) -> Result<(), ReplayError> {
    let cfg = lake.config();
    let size = super::budget_bytes;
    let budgets = [
        (
            Arc::new(Semaphore::new(size(cfg.read_ahead))),
            size(cfg.read_ahead),
        ),
        (lake.budget.clone(), size(cfg.topic_budget)),
        (
            lake.replay.inner.broker_budget.clone(),
            size(cfg.broker_budget),
        ),
    ];
    let mut at = from;
    while let Some((ledger, state, first, end)) = next_ledger(log, at) {
        if state != LedgerState::Deleted && !log.read_from_lake(ledger) {
            return Ok(()); // local from here on: the reader reads the log
        }
        let mut scan = LedgerScan::open(lake, ledger, first, end, None).await?;
        while let Some(entries) = scan.next().await? {
            for entry in entries {
                let permits = acquire(&budgets, entry.payload.len()).await?;
                let item = Buffered {
                    entry,
                    _permits: permits,
                };
                if tx.send(Ok(item)).await.is_err() {
                    return Err(ReplayError::Stopped);
                }
            }
        }
        at = Position::new(ledger + 1, 0);
    }
    Ok(())
}

/// Permits for `bytes` from each budget (semaphore, size), clipped to the budget's size so
/// that one entry larger than a budget still passes alone.
async fn acquire(
    budgets: &[(Arc<Semaphore>, usize); 3],
    bytes: usize,
) -> Result<[OwnedSemaphorePermit; 3], ReplayError> {
    let mut out = Vec::with_capacity(3);
    for (budget, size) in budgets {
        let n = bytes.clamp(1, (*size).max(1)) as u32;
        out.push(
            budget
                .clone()
                .acquire_many_owned(n)
                .await
                .map_err(|_| ReplayError::Stopped)?,
        );
    }
    out.try_into().map_err(|_| ReplayError::Stopped)
}

/// One Iceberg scan of a ledger's entries, yielding complete entries in order.
pub(crate) struct LedgerScan {
    batches: iceberg::scan::ArrowRecordBatchStream,
    asm: Assembler,
    table: String,
    /// Held for the scan's life: at most `replay.max_concurrent_scans` scans run.
    _slot: OwnedSemaphorePermit,
    lake_error: Box<dyn Fn(iceberg::Error) -> ReplayError + Send + Sync>,
}

impl LedgerScan {
    /// Opens a scan of entries `first..end` (`..=last` when given) of `ledger`.
    pub async fn open(
        lake: &TopicLake,
        ledger: LedgerId,
        first: u64,
        end: u64,
        last: Option<u64>,
    ) -> Result<LedgerScan, ReplayError> {
        let slot = lake
            .replay
            .inner
            .scans
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ReplayError::Stopped)?;
        lake.replay
            .inner
            .counters
            .scans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let table = lake.table(ledger).await?;
        let end = last.map_or(end, |l| end.min(l + 1));
        let table_name = lake.table_name();
        let lake_error = {
            let table = table_name.clone();
            move |e: iceberg::Error| ReplayError::Lake {
                table: table.clone(),
                ledger,
                source: Box::new(LakeError::iceberg(format!(
                    "scanning ledger {ledger} entries {first}..{end}"
                ))(e)),
            }
        };
        let batches = table
            .scan()
            .select(REPLAY_COLUMNS)
            .with_filter(lake.predicate(ledger, first, last))
            .build()
            .map_err(&lake_error)?
            .to_arrow()
            .await
            .map_err(&lake_error)?;
        Ok(LedgerScan {
            batches,
            asm: Assembler::new(ledger, lake.partition, first, end),
            table: table_name,
            _slot: slot,
            lake_error: Box::new(lake_error),
        })
    }

    /// The next run of complete entries; `None` once every entry of the range was yielded.
    /// An error if the scan ends with entries missing.
    pub async fn next(&mut self) -> Result<Option<Vec<Entry>>, ReplayError> {
        let mut out = Vec::new();
        while !self.asm.done() {
            let Some(batch) = self.batches.try_next().await.map_err(&self.lake_error)? else {
                break;
            };
            self.asm
                .push(&batch, &mut out)
                .map_err(|source| ReplayError::Rows {
                    table: self.table.clone(),
                    source,
                })?;
            if !out.is_empty() {
                return Ok(Some(out));
            }
        }
        self.asm.finish().map_err(|source| ReplayError::Rows {
            table: self.table.clone(),
            source,
        })?;
        Ok(None)
    }
}
