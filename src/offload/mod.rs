//! The offload engine: moves sealed ledgers into the lake, exactly once, and deletes local
//! copies after the namespace's deletion lag.
//!
//! A scheduler task (on the lake runtime, every `lake.check_interval` or when asked) looks at
//! the topics with work, groups them by their table (the base topic's own table, or the
//! namespace's shared table when its `lakeTableLayout` is `shared`: then one pass, and one
//! commit, carries many topics), and runs one *pass* per table ([`pass`]). A pass: applies the namespace policies ([`plan`]), writes and commits the
//! chosen ledgers ([`crate::lake::commit`]), records them `Offloaded` in the metadata store,
//! deletes local copies whose lag has passed, applies the namespace's retention policy
//! ([`retention`]: expired ledgers leave the log, then their files leave the table through
//! [`crate::lake::expire`]), and now and then removes orphan files. Without a lake, only the
//! log side of retention runs ([`log_retention`]).
//!
//! Invariants:
//! - One writer per table: a pass holds its table's writer lock for its whole duration, and
//!   only passes write to tables (orphan cleanup runs inside a pass too).
//! - A ledger becomes `Offloaded` only after the catalog commit holding it returned; it is
//!   deleted locally only from `Offloaded`, after the lag.
//! - At most `lake.max_concurrent_tables` passes run at once; all of them run on the lake
//!   runtime, never on the broker's workers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::LakeConfig;
use crate::lake::commit::Progress;
use crate::lake::{naming, Lake, LakeError};
use crate::ledger::{now_ms, LedgerState, Log, MetadataError, TopicLog};
use crate::naming::TopicName;
use crate::policies::{PoliciesError, PolicyStore};

mod housekeeping;
pub mod log_retention;
mod pass;
pub mod plan;
pub mod removals;
pub mod retention;
mod schedule;
mod status;

pub use status::{LakeStats, OffloadStatus, RetentionStats};

/// Attempts at removing a deleted topic's rows from its shared table before the deletion
/// reports the conflict (waits of 0.1, 0.2, … 1.6 s between them).
const REMOVAL_ATTEMPTS: u32 = 6;

/// Why an offload request or pass failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OffloadError {
    /// The topic does not exist.
    #[error("topic {0} does not exist")]
    TopicNotFound(String),
    /// The lake failed.
    #[error(transparent)]
    Lake(#[from] LakeError),
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Metadata(#[from] MetadataError),
    /// Namespace policies could not be read.
    #[error(transparent)]
    Policies(#[from] PoliciesError),
    /// Sealing or deleting a ledger failed.
    #[error("ledger lifecycle: {0}")]
    Lifecycle(#[from] crate::ledger::LifecycleError),
    /// The topic's schema could not be read.
    #[error("topic schema: {0}")]
    Schema(String),
    /// The engine is shutting down.
    #[error("the offload engine is stopped")]
    Stopped,
}

/// Offload state of a table, with Pulsar's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OffloadState {
    /// No pass has committed or failed yet.
    #[default]
    NotRun,
    /// A pass is writing or committing.
    Running,
    /// The last pass succeeded.
    Success,
    /// The last pass failed (see `lastError`); it is retried on the next check.
    Error,
}

/// A Pulsar message id as the admin API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageIdJson {
    /// Ledger.
    pub ledger_id: u64,
    /// Entry.
    pub entry_id: u64,
    /// Partition (-1: not partitioned).
    pub partition_index: i32,
}

/// What the engine remembers about a table between passes.
#[derive(Debug, Clone, Default)]
struct TableStatus {
    state: OffloadState,
    last_error: Option<String>,
    last_snapshot_id: Option<i64>,
    committed_ledgers: u64,
    committed_rows: u64,
    bad_payloads: u64,
    retention: RetentionStats,
}

/// Writer locks by table identifier.
type WriterLocks = HashMap<String, Arc<tokio::sync::Mutex<()>>>;

/// What the engine keeps per base topic (requests, status, progress).
#[derive(Debug)]
struct TableSlot {
    /// Manual "offload everything now" requests: (last ticket issued, last ticket taken by a
    /// pass). Invariant: taken ≤ issued; a request is pending while issued > taken.
    manual: Mutex<(u64, u64)>,
    /// Last ticket whose pass has finished (successfully or not).
    completed: AtomicU64,
    /// Completed passes (for callers waiting on a request).
    runs: AtomicU64,
    status: Mutex<TableStatus>,
    progress: Arc<Progress>,
    last_orphan_check: Mutex<Option<Instant>>,
    /// Invariant: true while the table may still hold files of the topic's expired ledgers
    /// (set by each expiry and at start; cleared by a successful removal, or by a pass that
    /// finds none of the topic's ledgers expired). A pass over a table with it set is never
    /// skipped as idle.
    retention_pending: AtomicBool,
    /// After a ledger of the topic could not be read in a shared pass: until when the topic
    /// sits out its table's passes, and that rest's length (doubling with each failure).
    /// Invariant: `None` once a successful commit held ledgers of the topic.
    unreadable: Mutex<Option<(Instant, std::time::Duration)>>,
}

struct Inner {
    lake: Arc<Lake>,
    log: Arc<Log>,
    policies: Arc<PolicyStore>,
    config: LakeConfig,
    /// How often deleted and expired ledgers are listed for retention
    /// (`broker.retention_check_interval`; [`schedule`]).
    retention_every: std::time::Duration,
    /// Base topic → its slot.
    tables: Mutex<HashMap<String, Arc<TableSlot>>>,
    /// Table identifier → its writer lock, and the size at which the map is pruned next.
    /// Invariant: a lock is held by the one pass writing the table (or by a topic deletion
    /// pausing it); an entry nobody holds may be dropped.
    writers: Mutex<(WriterLocks, usize)>,
    slots: Arc<Semaphore>,
    /// Where a pass starts planning among its partitions, turned by every pass: a pass is
    /// capped in size, and a busy first partition must not starve the others of a table.
    rotation: std::sync::atomic::AtomicUsize,
    wake: Notify,
    /// Removals to finish after their grace: (table, when), to the finisher task
    /// ([`housekeeping`]).
    finish_tx: tokio::sync::mpsc::UnboundedSender<(iceberg::TableIdent, i64)>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// The offload engine. Cheap to share.
#[derive(Clone)]
pub struct OffloadEngine {
    inner: Arc<Inner>,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for OffloadEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadEngine")
            .field("lake", &self.inner.lake)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn partition_index(name: &TopicName) -> i32 {
    name.partition().map_or(-1, |p| p as i32)
}

impl OffloadEngine {
    /// Starts the engine's scheduler on `runtime` (the lake runtime).
    pub fn start(
        lake: Arc<Lake>,
        log: Arc<Log>,
        policies: Arc<PolicyStore>,
        config: LakeConfig,
        retention_every: std::time::Duration,
        runtime: tokio::runtime::Handle,
    ) -> OffloadEngine {
        let (finish_tx, finish_rx) = tokio::sync::mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            slots: Arc::new(Semaphore::new(config.max_concurrent_tables)),
            lake,
            log,
            policies,
            config,
            retention_every,
            tables: Mutex::new(HashMap::new()),
            writers: Mutex::new((HashMap::new(), 0)),
            rotation: std::sync::atomic::AtomicUsize::new(0),
            wake: Notify::new(),
            finish_tx,
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        let engine = OffloadEngine { inner, runtime };
        let scheduler = engine.inner.clone();
        engine
            .inner
            .tasks
            .spawn_on(async move { scheduler.run().await }, &engine.runtime);
        let finisher = engine.inner.clone();
        engine.inner.tasks.spawn_on(
            async move { finisher.finish_removals(finish_rx).await },
            &engine.runtime,
        );
        engine
    }

    /// The lake this engine writes to.
    pub fn lake(&self) -> &Arc<Lake> {
        &self.inner.lake
    }

    /// Runs `fut` on the lake runtime, where the catalog's connections live (for callers on
    /// other runtimes: admin handlers, tests, later the SQL engine).
    pub async fn run_on_lake<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, OffloadError> {
        self.on_lake(fut).await
    }

    /// The lake with its runtime, for readers on other runtimes (replay, SQL).
    pub fn lake_handle(&self) -> crate::lake::LakeHandle {
        crate::lake::LakeHandle::new(
            self.inner.lake.clone(),
            self.runtime.clone(),
            self.inner.policies.clone(),
        )
    }

    async fn on_lake<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, OffloadError> {
        self.lake_handle()
            .run(fut)
            .await
            .map_err(|_| OffloadError::Stopped)
    }

    /// Holds off offload passes of `topic`'s table until the guard is dropped (a pass running
    /// now finishes first). `verify` holds it while it reads both tiers; a topic's deletion
    /// holds it through its [`removals::Deletion`].
    pub async fn pause_table(
        &self,
        topic: &TopicName,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>, OffloadError> {
        Ok(self.inner.paused_table(topic).await?.1)
    }

    /// Asks for everything written to `topic` so far to be offloaded (the open ledger is sealed
    /// first). Returns the request's ticket; it is done once
    /// [`OffloadStatus::completed_request`] reaches it (see `status` for the outcome).
    pub async fn request(&self, topic: &TopicName) -> Result<u64, OffloadError> {
        let base = topic.base();
        if self.partition_logs(&base).await?.is_empty() {
            return Err(OffloadError::TopicNotFound(base.to_string()));
        }
        let slot = self.inner.slot(&base.to_string());
        let ticket = {
            let mut m = lock(&slot.manual);
            m.0 += 1;
            m.0
        };
        self.inner.wake.notify_one();
        Ok(ticket)
    }

    /// The topic's partitions (or itself) that exist in the log, with their indexes.
    async fn partition_logs(&self, base: &TopicName) -> Result<Vec<(i32, TopicLog)>, OffloadError> {
        self.inner.partition_logs(base).await
    }

    /// Offload status of `topic`'s table.
    pub async fn status(&self, topic: &TopicName) -> Result<OffloadStatus, OffloadError> {
        let base = topic.base();
        let logs = self.partition_logs(&base).await?;
        if logs.is_empty() {
            return Err(OffloadError::TopicNotFound(base.to_string()));
        }
        let slot = self.inner.slot(&base.to_string());
        let st = lock(&slot.status).clone();
        let now = now_ms();
        let mut first_unoffloaded: Option<MessageIdJson> = None;
        let mut last_offloaded: Option<MessageIdJson> = None;
        let (mut lag_bytes, mut oldest_ms) = (0u64, None::<i64>);
        let meta = self.inner.log.metadata();
        for (partition, log) in &logs {
            let records = meta.topic_ledgers(log.id()).await?;
            for info in log.ledgers() {
                let pending = matches!(info.state, LedgerState::Sealed | LedgerState::Open);
                if pending && info.entry_count > 0 {
                    lag_bytes += info.size_bytes;
                    if let Some(t) = info.min_publish_ms {
                        oldest_ms = Some(oldest_ms.map_or(t, |o| o.min(t)));
                    }
                    let id = MessageIdJson {
                        ledger_id: info.id,
                        entry_id: 0,
                        partition_index: *partition,
                    };
                    if first_unoffloaded.is_none_or(|f| id.ledger_id < f.ledger_id) {
                        first_unoffloaded = Some(id);
                    }
                }
            }
            for r in records.iter().filter(|r| r.offload_ref.is_some()) {
                let Some(seal) = r.seal.filter(|s| s.entry_count > 0) else {
                    continue;
                };
                let id = MessageIdJson {
                    ledger_id: r.id,
                    entry_id: seal.entry_count - 1,
                    partition_index: *partition,
                };
                if last_offloaded.is_none_or(|l| id.ledger_id > l.ledger_id) {
                    last_offloaded = Some(id);
                }
            }
        }
        Ok(OffloadStatus {
            status: st.state,
            last_error: st.last_error.unwrap_or_default(),
            first_unoffloaded_message: first_unoffloaded,
            last_offloaded_message: last_offloaded,
            offload_lag_bytes: lag_bytes,
            offload_lag_seconds: oldest_ms.map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0),
            runs: slot.runs.load(Ordering::Acquire),
            request_pending: {
                let m = lock(&slot.manual);
                m.0 > slot.completed.load(Ordering::Acquire)
            },
            completed_request: slot.completed.load(Ordering::Acquire),
            progress_entries: slot.progress.entries.load(Ordering::Relaxed),
            progress_bytes: slot.progress.bytes.load(Ordering::Relaxed),
            committed_ledgers: st.committed_ledgers,
            committed_rows: st.committed_rows,
            bad_payloads: st.bad_payloads,
            last_snapshot_id: st.last_snapshot_id,
            retention: st.retention.clone(),
        })
    }

    /// The `lake` object of a topic's stats: where its table is and how far behind it is.
    pub async fn lake_stats(&self, topic: &TopicName) -> Result<LakeStats, OffloadError> {
        let status = self.status(topic).await?;
        let ident = self.inner.table_of(topic).await?.ident;
        let lake = self.inner.lake.clone();
        let lookup = ident.clone();
        let table = self
            .on_lake(async move { lake.load_table(&lookup).await })
            .await??;
        let levels = ident.namespace().as_ref().clone();
        Ok(LakeStats {
            catalog: self.inner.lake.catalog_name().to_string(),
            table: format!("{}.{}", levels.join("."), ident.name()),
            namespace: levels,
            table_name: ident.name().to_string(),
            table_exists: table.is_some(),
            location: table.as_ref().map(|t| t.metadata().location().to_string()),
            snapshot_id: table
                .as_ref()
                .and_then(|t| t.metadata().current_snapshot_id()),
            last_offloaded_message_id: status.last_offloaded_message,
            offload_lag_bytes: status.offload_lag_bytes,
            offload_lag_seconds: status.offload_lag_seconds,
            status: status.status,
            last_error: status.last_error,
            bad_payloads: status.bad_payloads,
        })
    }

    /// Stops the scheduler and waits for running passes to finish.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

impl Inner {
    /// The table of `topic` under its namespace's layout.
    async fn table_of(&self, topic: &TopicName) -> Result<naming::TopicTable, OffloadError> {
        let layout = self
            .policies
            .effective(&topic.namespace)
            .await?
            .lake_table_layout;
        Ok(naming::TopicTable::of(topic, layout))
    }

    /// `topic`'s table, and its writer lock once taken (a pass running now finishes first).
    async fn paused_table(
        &self,
        topic: &TopicName,
    ) -> Result<(naming::TopicTable, tokio::sync::OwnedMutexGuard<()>), OffloadError> {
        let table = self.table_of(topic).await?;
        let paused = self.writer(&table.ident).lock_owned().await;
        Ok((table, paused))
    }

    /// The writer lock of the table `ident`. Locks nobody holds are forgotten once the map
    /// has doubled since the last pruning (amortised: tables come and go with topics).
    fn writer(&self, ident: &iceberg::TableIdent) -> Arc<tokio::sync::Mutex<()>> {
        let mut guard = lock(&self.writers);
        let (writers, next) = &mut *guard;
        crate::memory::sweep_when_doubled(writers, next, |_, w| Arc::strong_count(w) > 1);
        writers.entry(ident.to_string()).or_default().clone()
    }

    fn slot(&self, base: &str) -> Arc<TableSlot> {
        lock(&self.tables)
            .entry(base.to_string())
            .or_insert_with(|| {
                Arc::new(TableSlot {
                    manual: Mutex::new((0, 0)),
                    completed: AtomicU64::new(0),
                    runs: AtomicU64::new(0),
                    status: Mutex::new(TableStatus::default()),
                    progress: Arc::new(Progress::default()),
                    last_orphan_check: Mutex::new(None),
                    retention_pending: AtomicBool::new(true),
                    unreadable: Mutex::new(None),
                })
            })
            .clone()
    }

    async fn partition_logs(&self, base: &TopicName) -> Result<Vec<(i32, TopicLog)>, OffloadError> {
        Ok(self.log.partitions_of(base).await?)
    }

    async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.config.check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut known = schedule::TopicNames::default();
        let mut retention = schedule::RetentionListing::default();
        let mut first = true;
        // Recorded removals of deleted topics are done again at the first tick, then every
        // orphan check interval, one round at a time.
        let mut redo: Option<(Instant, tokio::task::JoinHandle<()>)> = None;
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tick.tick() => {}
                _ = self.wake.notified() => {}
            }
            if redo.as_ref().is_none_or(|(at, round)| {
                round.is_finished() && at.elapsed() >= self.config.orphan_check_interval
            }) {
                let inner = self.clone();
                let round = self.tasks.spawn(async move {
                    if let Err(e) = inner.redo_removals().await {
                        tracing::warn!(error = %e, "doing recorded lake removals again failed");
                    }
                });
                redo = Some((Instant::now(), round));
            }
            let tables = match self
                .tables_with_work(&mut known, &mut retention, first)
                .await
            {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(error = %e, "offload: finding tables with work failed");
                    continue;
                }
            };
            first = false;
            for (table, topics) in self.group_by_table(tables).await {
                let Ok(guard) = self.writer(&table.ident).try_lock_owned() else {
                    continue; // a pass is already running for this table
                };
                let inner = self.clone();
                self.tasks.spawn(async move {
                    let _writer = guard;
                    inner.run_pass(&table, topics).await;
                });
            }
        }
    }
}
