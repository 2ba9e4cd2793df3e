//! Replay: the one place that turns a position range of a topic partition into entries,
//! choosing per range between the local log and the lake.
//!
//! - [`EntryReader`] (one per subscription) reads the local log while a ledger is local and,
//!   once a ledger is `deleted` locally (offloaded, then removed), streams it from the lake
//!   table: an Iceberg scan with predicates on the message-id columns (`ledger_id`,
//!   `entry_id`, `partition`), never on file names or positions, so replay stays correct after
//!   an outside engine compacts or rewrites the table's files.
//! - [`assemble`] rebuilds entries from rows with their original batch boundaries and metadata
//!   bytes (`protocol::rebuild`): the dispatcher cannot tell where an entry came from.
//! - Lake reads run on the replay runtime (own threads, `replay.threads`), at most
//!   `replay.max_concurrent_scans` at once; rebuilt entries wait in a read-ahead buffer bounded
//!   per subscription, per topic and per broker (`replay.read_ahead`, `topic_budget`,
//!   `broker_budget`); a stream not read for `replay.idle_release` is dropped with its buffer.
//!
//! Invariants:
//! - An entry comes from exactly one tier and is identical (message id, metadata, messages)
//!   whichever tier served it.
//! - A lake read that fails or finds rows missing returns an error, never a shortened or
//!   reordered range; the caller retries (with backoff) from the same position.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use futures::TryStreamExt;
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::Datum;
use iceberg::table::Table;
use iceberg::TableIdent;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::config::ReplayConfig;
use crate::lake::naming::TopicTable;
use crate::lake::{LakeError, LakeHandle};
use crate::ledger::{LedgerId, ReadError};
use crate::naming::TopicName;

pub mod assemble;
mod reader;
mod stream;

pub use reader::{EntryReader, Tier};

/// Why a range could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The local log failed.
    #[error(transparent)]
    Log(#[from] ReadError),
    /// The range is only in the lake, and the lake is not configured.
    #[error(
        "ledger {ledger} of {topic} was offloaded and deleted locally, but the lake is disabled"
    )]
    NoLake {
        /// Topic.
        topic: String,
        /// Ledger.
        ledger: LedgerId,
    },
    /// The catalog or warehouse failed.
    #[error("lake table {table}, ledger {ledger}: {source}")]
    Lake {
        /// Iceberg identifier.
        table: String,
        /// Ledger being read.
        ledger: LedgerId,
        /// Cause.
        #[source]
        source: Box<LakeError>,
    },
    /// The table does not exist although the ledger was offloaded.
    #[error("lake table {table} does not exist (ledger {ledger} was offloaded to it)")]
    NoTable {
        /// Iceberg identifier.
        table: String,
        /// Ledger.
        ledger: LedgerId,
    },
    /// Rows are missing or do not rebuild.
    #[error("lake table {table}: {source}")]
    Rows {
        /// Iceberg identifier.
        table: String,
        /// Cause.
        #[source]
        source: assemble::AssembleError,
    },
    /// The lake stream has no entry ready yet (a scan is starting, or the read-ahead budgets
    /// are exhausted): not a failure; the caller asks again shortly, staying responsive.
    #[error("the lake read is in progress")]
    Pending,
    /// The replay runtime stopped.
    #[error("the replay runtime stopped")]
    Stopped,
}

/// Counters of lake reads, broker-wide (for stats).
#[derive(Debug, Default)]
struct Counters {
    entries: AtomicU64,
    bytes: AtomicU64,
    scans: AtomicU64,
    errors: AtomicU64,
}

/// Broker-wide replay statistics.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayStats {
    /// Entries served from the lake.
    pub entries_from_lake: u64,
    /// Bytes of those entries.
    pub bytes_from_lake: u64,
    /// Lake scans started.
    pub scans: u64,
    /// Lake reads that failed (each is retried).
    pub read_errors: u64,
    /// The last failure, with table, ledger and range.
    pub last_error: Option<String>,
    /// Read-ahead bytes held now, broker-wide.
    pub buffered_bytes: u64,
}

struct Inner {
    /// The lake (catalog loads hop to its runtime).
    lake: LakeHandle,
    runtime: tokio::runtime::Handle,
    config: ReplayConfig,
    scans: Arc<Semaphore>,
    broker_budget: Arc<Semaphore>,
    /// Each loaded topic partition's replay budget, by name, and the size at which entries
    /// whose topics are gone are swept. Invariant: a live entry is the budget every
    /// [`TopicLake`] of that name holds; the sweep runs when the map has doubled since the
    /// last one, so a topic's load costs the same at 100,000 loaded topics as at ten.
    topic_budgets: Mutex<(HashMap<String, Weak<Semaphore>>, usize)>,
    /// Read-only table handles on the replay runtime, by identifier, with their load time.
    tables: Mutex<HashMap<TableIdent, (Table, Instant)>>,
    counters: Counters,
    last_error: Mutex<Option<String>>,
}

/// The broker's access to the lake for replay. Cheap to clone.
#[derive(Clone)]
pub struct Replay {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A configured budget as semaphore permits (one per byte; `Config::validate` caps budgets at
/// 4 GiB so permits fit the `u32` that `acquire_many` takes).
pub(crate) fn budget_bytes(b: bytesize::ByteSize) -> usize {
    b.as_u64().min(u64::from(u32::MAX)) as usize
}

/// How long a loaded table handle is reused before the catalog is asked again (a failed read
/// always reloads).
const TABLE_TTL: std::time::Duration = std::time::Duration::from_secs(5);

impl Replay {
    /// Replay from `lake`, with lake reads on `runtime` (the replay runtime).
    pub fn new(lake: LakeHandle, runtime: tokio::runtime::Handle, config: ReplayConfig) -> Self {
        Replay {
            inner: Arc::new(Inner {
                lake,
                runtime,
                scans: Arc::new(Semaphore::new(config.max_concurrent_scans)),
                broker_budget: Arc::new(Semaphore::new(budget_bytes(config.broker_budget))),
                topic_budgets: Mutex::new((HashMap::new(), 0)),
                tables: Mutex::new(HashMap::new()),
                counters: Counters::default(),
                last_error: Mutex::new(None),
                config,
            }),
        }
    }

    /// The lake side of one topic partition.
    pub fn topic(&self, name: &TopicName) -> TopicLake {
        let budget = {
            let mut guard = lock(&self.inner.topic_budgets);
            let (budgets, sweep_at) = &mut *guard;
            crate::memory::sweep_when_doubled(budgets, sweep_at, |_, w| w.strong_count() > 0);
            let key = name.to_string();
            match budgets.get(&key).and_then(Weak::upgrade) {
                Some(s) => s,
                None => {
                    let cap = budget_bytes(self.inner.config.topic_budget);
                    let s = Arc::new(Semaphore::new(cap));
                    budgets.insert(key, Arc::downgrade(&s));
                    s
                }
            }
        };
        TopicLake {
            replay: self.clone(),
            base: name.base(),
            resolved: Arc::new(OnceLock::new()),
            partition: name.partition().map_or(-1, |p| p as i32),
            topic: name.to_string(),
            budget,
        }
    }

    /// Broker-wide statistics.
    pub fn stats(&self) -> ReplayStats {
        let c = &self.inner.counters;
        let cap = budget_bytes(self.inner.config.broker_budget) as u64;
        ReplayStats {
            entries_from_lake: c.entries.load(Ordering::Relaxed),
            bytes_from_lake: c.bytes.load(Ordering::Relaxed),
            scans: c.scans.load(Ordering::Relaxed),
            read_errors: c.errors.load(Ordering::Relaxed),
            last_error: lock(&self.inner.last_error).clone(),
            buffered_bytes: cap - self.inner.broker_budget.available_permits() as u64,
        }
    }

    fn record_error(&self, e: &ReplayError) {
        self.inner.counters.errors.fetch_add(1, Ordering::Relaxed);
        *lock(&self.inner.last_error) = Some(e.to_string());
    }
}

/// The lake table of one topic partition, as replay reads it. Cheap to clone.
#[derive(Clone)]
pub struct TopicLake {
    replay: Replay,
    /// The base topic: its namespace's layout says which table holds its rows.
    base: TopicName,
    /// Invariant: set once, from the namespace's `lakeTableLayout` (which changes only while
    /// the namespace has no topics, so never during a topic's life).
    resolved: Arc<OnceLock<TopicTable>>,
    /// -1 when the topic is not partitioned.
    partition: i32,
    topic: String,
    /// Read-ahead budget shared by the partition's subscriptions.
    budget: Arc<Semaphore>,
}

impl std::fmt::Debug for TopicLake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicLake")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .finish()
    }
}

impl TopicLake {
    fn table_name(&self) -> String {
        match self.resolved.get() {
            Some(t) => format!("{}.{}", self.replay.inner.lake.catalog_name(), t.ident),
            None => format!("the lake table of {}", self.base),
        }
    }

    /// The table holding this topic's rows.
    async fn resolve(&self, ledger: LedgerId) -> Result<&TopicTable, ReplayError> {
        if let Some(t) = self.resolved.get() {
            return Ok(t);
        }
        let t = self
            .replay
            .inner
            .lake
            .table_of(&self.base)
            .await
            .map_err(|e| self.lake_error(ledger)(e))?;
        Ok(self.resolved.get_or_init(|| t))
    }

    fn config(&self) -> &ReplayConfig {
        &self.replay.inner.config
    }

    fn lake_error(&self, ledger: LedgerId) -> impl FnOnce(LakeError) -> ReplayError + '_ {
        move |e| ReplayError::Lake {
            table: self.table_name(),
            ledger,
            source: Box::new(e),
        }
    }

    /// A read-only handle on the table whose scans run on the current (replay) runtime.
    async fn table(&self, ledger: LedgerId) -> Result<Table, ReplayError> {
        let ident = self.resolve(ledger).await?.ident.clone();
        if let Some((t, at)) = lock(&self.replay.inner.tables).get(&ident) {
            if at.elapsed() < TABLE_TTL {
                return Ok(t.clone());
            }
        }
        let loaded = match self.replay.inner.lake.load_table_here(&ident).await {
            Ok(t) => t,
            Err(LakeError::Stopped) => return Err(ReplayError::Stopped),
            Err(e) => return Err(self.lake_error(ledger)(e)),
        };
        let Some(table) = loaded else {
            return Err(ReplayError::NoTable {
                table: self.table_name(),
                ledger,
            });
        };
        lock(&self.replay.inner.tables).insert(ident, (table.clone(), Instant::now()));
        Ok(table)
    }

    /// Forgets the cached table handle (after a failed read: the table may have changed).
    fn invalidate(&self) {
        if let Some(t) = self.resolved.get() {
            lock(&self.replay.inner.tables).remove(&t.ident);
        }
    }

    fn predicate(&self, ledger: LedgerId, first: u64, last: Option<u64>) -> Predicate {
        let mut p = Reference::new("ledger_id")
            .equal_to(Datum::long(ledger as i64))
            .and(Reference::new("entry_id").greater_than_or_equal_to(Datum::long(first as i64)));
        if let Some(last) = last {
            p = p.and(Reference::new("entry_id").less_than_or_equal_to(Datum::long(last as i64)));
        }
        if self.partition >= 0 {
            p = p.and(Reference::new("partition").equal_to(Datum::int(self.partition)));
        }
        // In a shared table: prunes to the topic's files (ledger ids alone are unique, but
        // every topic's files would be planned).
        if let Some(topic) = self.resolved.get().and_then(|t| t.topic.as_ref()) {
            p = p.and(
                Reference::new(crate::lake::schema::TOPIC_COLUMN).equal_to(Datum::string(topic)),
            );
        }
        p
    }

    /// The first entry of `ledger` published at or after `publish_time_ms`, from the lake
    /// (partition pruning on `publish_time` and file statistics on the id columns; only the
    /// `entry_id` column is read).
    async fn first_at_or_after(
        &self,
        ledger: LedgerId,
        publish_time_ms: i64,
    ) -> Result<Option<u64>, ReplayError> {
        let this = self.clone();
        self.on_runtime(async move {
            let _scan = this.replay.inner.scans.acquire().await;
            // A table handle cached before the ledger's offload committed holds none of its
            // rows (a ledger another bookie holds is read from the lake from its commit on):
            // an empty answer is asked once more of a freshly loaded table.
            match this.scan_first_at_or_after(ledger, publish_time_ms).await? {
                Some(entry) => Ok(Some(entry)),
                None => {
                    this.invalidate();
                    this.scan_first_at_or_after(ledger, publish_time_ms).await
                }
            }
        })
        .await
    }

    /// One scan of [`TopicLake::first_at_or_after`].
    async fn scan_first_at_or_after(
        &self,
        ledger: LedgerId,
        publish_time_ms: i64,
    ) -> Result<Option<u64>, ReplayError> {
        let table = self.table(ledger).await?;
        let predicate = self.predicate(ledger, 0, None).and(
            Reference::new("publish_time").greater_than_or_equal_to(Datum::timestamptz_micros(
                publish_time_ms.saturating_mul(1000),
            )),
        );
        let result: Result<Option<u64>, iceberg::Error> = async {
            let stream = table
                .scan()
                .select(["ledger_id", "entry_id", "publish_time"])
                .with_filter(predicate)
                .build()?
                .to_arrow()
                .await?;
            let batches: Vec<_> = stream.try_collect().await?;
            let at_us = publish_time_ms.saturating_mul(1000);
            Ok(batches
                .iter()
                .filter_map(|b| assemble::min_entry_at_or_after(b, ledger, at_us))
                .min())
        }
        .await;
        result.map_err(|e| {
            self.invalidate();
            self.lake_error(ledger)(LakeError::iceberg("seek by publish time")(e))
        })
    }

    /// Runs `fut` on the replay runtime. Spawned at the call, not at the first poll, so the
    /// caller's future holds only the join handle, never `fut` itself (a lake scan's future
    /// is kilobytes; held inline it would make every subscription task that large).
    fn on_runtime<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T, ReplayError>> + Send + 'static,
    ) -> impl std::future::Future<Output = Result<T, ReplayError>> + Send + 'static {
        let task = self.replay.inner.runtime.spawn(fut);
        async move { task.await.map_err(|_| ReplayError::Stopped)? }
    }
}
