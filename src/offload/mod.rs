//! The offload engine: moves sealed ledgers into the lake, exactly once, and deletes local
//! copies after the namespace's deletion lag.
//!
//! A scheduler task (on the lake runtime, every `lake.check_interval` or when asked) looks at
//! every topic, groups partitions by their table (the base topic), and runs one *pass* per table
//! that has work. A pass: applies the namespace policies ([`plan`]), writes and commits the
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

use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use serde::Serialize;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::LakeConfig;
use crate::lake::commit::{self, LedgerSlice, Progress, WriteOptions};
use crate::lake::typed::{self, PayloadCodec};
use crate::lake::{naming, Lake, LakeError};
use crate::ledger::{now_ms, LedgerState, Log, MetadataError, TopicLog};
use crate::naming::TopicName;
use crate::policies::{PoliciesError, PolicyStore};
use crate::schema as topic_schema;

mod housekeeping;
pub mod log_retention;
pub mod plan;
pub mod retention;
mod schedule;
mod status;

pub use status::{LakeStats, OffloadStatus, RetentionStats};

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

#[derive(Debug)]
struct TableSlot {
    /// Invariant: held by the one pass writing this table.
    writer: Arc<tokio::sync::Mutex<()>>,
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
    /// Invariant: true while the table may still hold files of expired ledgers (set by each
    /// expiry and at start, cleared by a successful removal).
    retention_pending: AtomicBool,
}

struct Inner {
    lake: Arc<Lake>,
    log: Arc<Log>,
    policies: Arc<PolicyStore>,
    config: LakeConfig,
    tables: Mutex<HashMap<String, Arc<TableSlot>>>,
    slots: Arc<Semaphore>,
    wake: Notify,
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
        runtime: tokio::runtime::Handle,
    ) -> OffloadEngine {
        let inner = Arc::new(Inner {
            slots: Arc::new(Semaphore::new(config.max_concurrent_tables)),
            lake,
            log,
            policies,
            config,
            tables: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        let engine = OffloadEngine { inner, runtime };
        let scheduler = engine.inner.clone();
        engine
            .inner
            .tasks
            .spawn_on(async move { scheduler.run().await }, &engine.runtime);
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
        crate::lake::LakeHandle::new(self.inner.lake.clone(), self.runtime.clone())
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
    /// now finishes first). Topic deletion holds it while the log and the table go.
    pub async fn pause_table(&self, topic: &TopicName) -> tokio::sync::OwnedMutexGuard<()> {
        let slot = self.inner.slot(&topic.base().to_string());
        slot.writer.clone().lock_owned().await
    }

    /// After `topic` was deleted (call with the table paused): drops its lake table and
    /// deletes the table's files when `lake.drop_table_on_topic_delete` is on, and forgets its
    /// offload status. Returns whether a table was dropped.
    pub async fn topic_deleted(&self, topic: &TopicName) -> Result<bool, OffloadError> {
        let base = topic.base();
        lock(&self.inner.tables).remove(&base.to_string());
        if !self.inner.config.drop_table_on_topic_delete {
            return Ok(false);
        }
        let lake = self.inner.lake.clone();
        let ident = naming::table_ident(&base);
        Ok(self
            .on_lake(async move { lake.drop_table(&ident).await })
            .await??)
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
        let ident = naming::table_ident(topic);
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
    fn slot(&self, base: &str) -> Arc<TableSlot> {
        lock(&self.tables)
            .entry(base.to_string())
            .or_insert_with(|| {
                Arc::new(TableSlot {
                    writer: Arc::new(tokio::sync::Mutex::new(())),
                    manual: Mutex::new((0, 0)),
                    completed: AtomicU64::new(0),
                    runs: AtomicU64::new(0),
                    status: Mutex::new(TableStatus::default()),
                    progress: Arc::new(Progress::default()),
                    last_orphan_check: Mutex::new(None),
                    retention_pending: AtomicBool::new(true),
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
        let mut first = true;
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tick.tick() => {}
                _ = self.wake.notified() => {}
            }
            let tables = match self.tables_with_work(&mut known, first).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(error = %e, "offload: finding tables with work failed");
                    continue;
                }
            };
            first = false;
            for (key, (base, partitions)) in tables {
                let slot = self.slot(&key);
                let Ok(guard) = slot.writer.clone().try_lock_owned() else {
                    continue; // a pass is already running for this table
                };
                let inner = self.clone();
                self.tasks.spawn(async move {
                    let _writer = guard;
                    // Take the pending manual request (if any) now: this pass serves it.
                    let ticket = {
                        let mut m = lock(&slot.manual);
                        let taken = (m.0 > m.1).then_some(m.0);
                        m.1 = m.0;
                        taken
                    };
                    let more = match inner.pass(&base, partitions, &slot, ticket.is_some()).await {
                        Ok(more) => more,
                        Err(e) => {
                            tracing::warn!(topic = %base, error = %e, "offload pass failed");
                            let mut st = lock(&slot.status);
                            st.state = OffloadState::Error;
                            st.last_error = Some(e.to_string());
                            false
                        }
                    };
                    match ticket {
                        // A pass is capped in size: a request for everything stays pending
                        // (taken again by the next pass) until nothing is left.
                        Some(t) if more => {
                            let mut m = lock(&slot.manual);
                            m.1 = m.1.min(t - 1);
                        }
                        Some(t) => {
                            slot.completed.fetch_max(t, Ordering::AcqRel);
                        }
                        None => {}
                    }
                    slot.runs.fetch_add(1, Ordering::AcqRel);
                });
            }
        }
    }

    /// One pass over a table (the caller holds its writer lock). Returns whether eligible
    /// ledgers were left for a later pass (a pass commits a bounded amount).
    async fn pass(
        &self,
        base: &TopicName,
        mut partitions: Vec<(i32, String)>,
        slot: &TableSlot,
        manual: bool,
    ) -> Result<bool, OffloadError> {
        partitions.sort();
        // A request seals the open ledgers, which only the loaded logs may do; otherwise the
        // pass reads views that load nothing (an unloaded topic stays unloaded).
        let mut logs = Vec::with_capacity(partitions.len());
        for (index, name) in partitions {
            let log = if manual {
                Some(self.log.topic(&name).await?)
            } else {
                self.log.topic_view(&name).await?
            };
            if let Some(log) = log {
                logs.push((index, log));
            }
        }
        let policies = self.policies.effective(&base.namespace).await?;
        // Cheap check first: nothing sealed or offloaded anywhere, no request and no retention
        // → no I/O.
        let busy = logs.iter().any(|(_, l)| {
            l.ledgers().iter().any(|i| {
                matches!(i.state, LedgerState::Sealed | LedgerState::Offloaded)
                    || (i.state == LedgerState::Deleted && !policies.retention.is_infinite())
            })
        });
        if !busy && !manual {
            return Ok(false);
        }
        let _permit = self
            .slots
            .acquire()
            .await
            .map_err(|_| OffloadError::Stopped)?;
        if manual {
            for (_, log) in &logs {
                log.seal_current().await?;
            }
        }
        let meta = self.log.metadata();
        let now = now_ms();
        let budget = self.config.target_file_size.as_u64().saturating_mul(4);
        let mut slices = Vec::new();
        let mut planned_bytes = 0u64;
        let mut more = false;
        for (partition, log) in &logs {
            let records = meta.topic_ledgers(log.id()).await?;
            // Other nodes offload or delete the ledgers their bookies hold: keep this view's
            // record of them current (stats, and reads that go to the lake once offloaded).
            for r in records.iter().filter(|r| !self.log.holds(r)) {
                log.set_record(r.clone());
            }
            let open_bytes = log
                .ledgers()
                .iter()
                .filter(|i| i.state == LedgerState::Open)
                .map(|i| i.size_bytes)
                .sum();
            // Each bookie's node offloads the ledgers it holds (a topic moved between nodes has
            // sealed ledgers on several bookies), in ledger order: the first ledger another
            // bookie holds stops this node until that node has offloaded it.
            let mut candidates = plan::candidates(&records);
            if let Some(at) = candidates.iter().position(|r| !self.log.holds(r)) {
                candidates.truncate(at);
            }
            // An older ledger still sealing holds back the newer sealed ones: come back soon.
            let newest = records.iter().map(|r| r.id).max();
            if records
                .iter()
                .any(|r| r.state == LedgerState::Open && Some(r.id) != newest)
            {
                more = true;
            }
            // Ledgers of this bookie that hold back another bookie's (the topic moved away) go
            // whatever the thresholds: nothing else would ever offload them.
            let blocking = candidates
                .last()
                .is_some_and(|last| records.iter().any(|r| r.id > last.id && !self.log.holds(r)));
            let n = if blocking {
                candidates.len()
            } else {
                plan::eligible(&candidates, open_bytes, &policies, now, manual)
            };
            for l in candidates.into_iter().take(n) {
                let Some(seal) = l.seal else {
                    // Contract violation of the metadata store: stop this partition here rather
                    // than commit the ledger as empty.
                    tracing::error!(ledger = l.id, "sealed ledger without seal information");
                    break;
                };
                if !slices.is_empty() && planned_bytes + seal.size_bytes > budget {
                    more = true;
                    break;
                }
                planned_bytes += seal.size_bytes;
                slices.push(LedgerSlice {
                    partition: *partition,
                    log: log.clone(),
                    ledger: l.id,
                    entry_count: seal.entry_count,
                    size_bytes: seal.size_bytes,
                });
            }
        }
        let mut table = None;
        if !slices.is_empty() {
            table = Some(self.offload(base, slot, slices, &policies).await?);
        }
        self.delete_expired(&logs, &policies).await?;
        let table = match self.apply_retention(base, &logs, &policies, slot).await {
            Ok(Some(t)) => Some(t),
            Ok(None) => table,
            Err(e) => {
                let mut st = lock(&slot.status);
                if st.retention.last_error != e.to_string() {
                    tracing::warn!(topic = %base, error = %e, "retention could not remove expired data from the lake");
                }
                st.retention.last_error = e.to_string();
                table
            }
        };
        let table = match table {
            Some(t) => self.expire_history(base, t).await,
            None => None,
        };
        self.sweep_orphans(base, slot, table).await;
        let pending = {
            let m = lock(&slot.manual);
            m.0 > m.1
        };
        if more || pending {
            self.wake.notify_one();
        }
        Ok(more)
    }

    async fn offload(
        &self,
        base: &TopicName,
        slot: &TableSlot,
        slices: Vec<LedgerSlice>,
        policies: &crate::policies::EffectivePolicies,
    ) -> Result<Table, OffloadError> {
        {
            let mut st = lock(&slot.status);
            st.state = OffloadState::Running;
        }
        slot.progress.entries.store(0, Ordering::Relaxed);
        slot.progress.bytes.store(0, Ordering::Relaxed);
        let metrics = crate::metrics::node();
        // Every failed attempt counts, also one that could not reach the table (lake down).
        let table = self
            .lake
            .load_or_create_table(base, policies.lake_partitioning)
            .await
            .inspect_err(|_| {
                metrics.lake_commit_failures.inc();
            })?;
        let (table, codec) = self
            .ensure_typed_columns(base, table)
            .await
            .inspect_err(|_| {
                metrics.lake_commit_failures.inc();
            })?;
        let partitioning = table_partitioning(&table).unwrap_or(policies.lake_partitioning);
        let options = WriteOptions {
            target_file_size: self.config.target_file_size.as_u64(),
            batch_rows: self.config.batch_rows,
            partitioning,
            payload_codec: codec,
        };
        let started = Instant::now();
        let (table, outcome) =
            match commit::write_and_commit(&self.lake, table, slices, &options, &slot.progress)
                .await
            {
                Ok(done) => {
                    metrics
                        .lake_commit_seconds
                        .observe(started.elapsed().as_secs_f64());
                    done
                }
                Err(e) => {
                    metrics.lake_commit_failures.inc();
                    return Err(e.into());
                }
            };
        let ident = table.identifier().to_string();
        let reference = |snapshot: Option<i64>| match snapshot {
            Some(s) => format!("{}:{}@{}", self.lake.catalog_name(), ident, s),
            None => format!("{}:{}@watermark", self.lake.catalog_name(), ident),
        };
        for ledger in &outcome.already_committed {
            self.log.mark_offloaded(*ledger, reference(None)).await?;
        }
        crate::failpoint::hit("offload.before_mark");
        for ledger in &outcome.committed {
            self.log
                .mark_offloaded(*ledger, reference(outcome.snapshot_id))
                .await?;
        }
        if !outcome.committed.is_empty() {
            let secs = started.elapsed().as_secs_f64();
            tracing::info!(table = %ident, ledgers = outcome.committed.len(), rows = outcome.rows,
                files = outcome.files, parquet_bytes = outcome.file_bytes,
                bad_payloads = outcome.bad_payloads, seconds = secs, "offloaded");
        }
        let mut st = lock(&slot.status);
        st.state = OffloadState::Success;
        st.last_error = None;
        st.last_snapshot_id = outcome.snapshot_id.or(st.last_snapshot_id);
        st.committed_ledgers += outcome.committed.len() as u64;
        st.committed_rows += outcome.rows;
        st.bad_payloads += outcome.bad_payloads;
        Ok(table)
    }

    /// Adds the typed columns the topic's schema versions ask for; returns the payload codec.
    async fn ensure_typed_columns(
        &self,
        base: &TopicName,
        table: Table,
    ) -> Result<(Table, Option<PayloadCodec>), OffloadError> {
        let versions = topic_schema::versions(&self.log.metadata(), &base.to_string())
            .await
            .map_err(|e| OffloadError::Schema(e.to_string()))?;
        let Some((codec, wanted)) = typed::topic_codec(&base.to_string(), &versions) else {
            return Ok((table, None));
        };
        let schema = table.metadata().current_schema().clone();
        let missing: Vec<_> = wanted
            .into_iter()
            .filter(|(n, _)| schema.field_by_name(n).is_none())
            .collect();
        let table = if missing.is_empty() {
            table
        } else {
            let names: Vec<String> = missing.iter().map(|(n, _)| n.clone()).collect();
            let tx = Transaction::new(&table);
            let mut update = tx.update_schema();
            for (name, t) in missing {
                update = update.add_column(iceberg::transaction::AddColumn::optional(name, t));
            }
            let tx = update
                .apply(tx)
                .map_err(LakeError::iceberg("adding typed columns"))?;
            let t = self
                .lake
                .commit(tx, &table)
                .await
                .map_err(LakeError::iceberg("committing typed columns"))?;
            tracing::info!(topic = %base, columns = ?names, "lake table schema evolved");
            t
        };
        Ok((table, Some(codec)))
    }
}

/// The granularity a table was created with (its default spec), if it is one of ours.
fn table_partitioning(table: &Table) -> Option<crate::config::LakePartitioning> {
    use crate::config::LakePartitioning;
    let spec = table.metadata().default_partition_spec();
    match spec.fields().first().map(|f| f.transform) {
        Some(iceberg::spec::Transform::Day) => Some(LakePartitioning::Day),
        Some(iceberg::spec::Transform::Hour) => Some(LakePartitioning::Hour),
        _ => None,
    }
}
