//! The durable segmented log (the built-in "bookie").
//!
//! Modelled on BookKeeper's managed ledger as Pulsar uses it: a topic partition is an ordered list
//! of **ledgers**; a ledger is a dense sequence of **entries** (ids from 0); ledger ids are unique
//! and increasing across the service. An entry is an opaque payload (for the broker, a Pulsar
//! batch: metadata + payload) plus its publish time.
//!
//! # Layout on disk (`<data_dir>/ledger/`)
//! - `segments/<id>.seg`: the journal. Entries of **all** topics are appended, interleaved, to one
//!   active segment; the journal *is* the storage (every byte is written once). So 10,000 topics
//!   with open ledgers share one open file, and one `fdatasync` makes the appends of all of them
//!   durable (group commit). See [`record`] for the framing (CRC32C per entry).
//! - `index/<ledger>.idx`: written when a ledger is sealed; maps entry id → (segment, offset,
//!   length, publish time), so reads by position never scan.
//! - The metadata store ([`metadata`]) holds topics, ledgers and their lifecycle
//!   (`open → sealed → offloaded → deleted`).
//!
//! # Invariants
//! - An append is acknowledged only when durable under the sync policy (`always`: after an
//!   `fdatasync` covering it); acknowledged entries of a topic form a dense prefix per ledger.
//! - Readers never see an entry that is not acknowledged, and never get bytes that failed their
//!   CRC: corruption is an error naming ledger, entry, file and offset.
//! - A ledger is created in the metadata store before any of its entries is written, so recovery
//!   knows every ledger it may find in the journal.
//! - A segment file is deleted only when no live (open, sealed or offloaded) ledger may have
//!   entries in it.
//! - fsync and file I/O run on the journal thread or the blocking pool, never on async workers.
//! - A full volume refuses appends before they take an entry id ([`disk`]); a failed journal
//!   write or `fdatasync` stops the journal until restart (fail-stop).
//! - After recovery, index files exist only for ledgers held locally (open, sealed, offloaded):
//!   those a crash left mid-deletion are removed at open.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

mod aging;
pub mod bookie_id;
pub mod cache;
pub mod cursor;
mod disk;
pub mod error;
pub mod index;
mod journal;
pub mod metadata;
mod open_ledger;
mod quorum;
mod read;
mod reclaim;
mod recopy;
pub mod record;
mod recovery;
pub mod replica;
pub mod replicas;
mod resident;
mod seal;
pub mod segment;
pub mod stripe;
mod takeover;
pub(crate) use takeover::recoverable;
mod tickers;
mod topic;

pub use error::{AppendError, LifecycleError, OpenError, ReadError};
pub use metadata::{LedgerId, LedgerRecord, LedgerState, MetadataError, MetadataStore};
pub use recopy::{Recopied, RecopyError};
pub use replica::{AddDone, Confirmed, FencedCopy, ReplicaAdd, ReplicaSource};
pub use replicas::ReplicaAddError;
pub use takeover::TakeoverError;
pub use topic::{AppendReceipt, LedgerInfo, Replication, TopicLog};

/// A topic's record and its ledgers, read together ([`Log::topic_state`]); `None`: no such
/// topic.
pub type TopicState = Option<(metadata::TopicRecord, Vec<LedgerRecord>)>;

use crate::config::LedgerConfig;
use crate::naming::TopicName;
use cache::{CacheBudget, IndexCache};
use index::{read_index_file, IndexEntry};
use journal::{Journal, JournalSettings};
use metadata::LedgerTransition;
use replicas::replicas_to_recover;
use segment::{list_segments, SegmentReaders};

/// A message position in a topic: (ledger, entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Position {
    /// Ledger id.
    pub ledger: LedgerId,
    /// Entry id inside the ledger.
    pub entry: u64,
}

impl Position {
    /// A position.
    pub const fn new(ledger: LedgerId, entry: u64) -> Self {
        Self { ledger, entry }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ledger, self.entry)
    }
}

/// One entry read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where it is.
    pub position: Position,
    /// Publish time (ms since epoch).
    pub publish_time_ms: i64,
    /// The bytes appended.
    pub payload: Bytes,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// State shared by the log, its topics and background tasks.
#[derive(Debug)]
pub(crate) struct LogShared {
    pub config: LedgerConfig,
    pub index_dir: PathBuf,
    pub meta: Arc<dyn MetadataStore>,
    pub journal: Journal,
    pub segments: SegmentReaders,
    pub index_cache: IndexCache,
    pub cache_budget: Arc<CacheBudget>,
    /// Backpressure: permits are bytes of appends queued or in flight.
    pub pending: Arc<Semaphore>,
    pub max_record_body: usize,
    /// Background seals; shutdown waits for them so no seal races the next start's recovery.
    pub tasks: tokio_util::task::TaskTracker,
    /// Refuses appends while the log's volume is full or the log passed its budget.
    pub disk: disk::DiskGuard,
    /// This log's bookie id ([`bookie_id`]), recorded on every ledger it creates.
    /// Invariant: the log reads, recovers, reclaims and seals only ledgers it [`holds`](Self::holds).
    pub bookie: String,
    /// Reads other bookies' ledgers, once the node joined its cluster ([`replica`]).
    pub remote: std::sync::OnceLock<Arc<dyn replica::ReplicaSource>>,
    /// The copies this bookie holds of ledgers other nodes write ([`replicas`]).
    pub replicas: replicas::Replicas,
    /// Open ledgers' age deadlines ([`aging`]).
    pub aging: aging::Aging<topic::TopicInner>,
    /// Cancelled when the log stops: background work that waits (a seal tried again) ends.
    pub stop: CancellationToken,
    /// Closes of ledgers tried again that may run at once ([`topic::RESEALS_AT_ONCE`]).
    pub reseals: Semaphore,
}

impl LogShared {
    /// Whether this log holds a copy of `ledger`'s entries: it wrote it (an empty bookie is a
    /// ledger of an embedded store from before bookie ids, always local), or holds a replica's
    /// copy of it ([`replicas`]).
    pub(crate) fn holds(&self, ledger: &LedgerRecord) -> bool {
        held_by(ledger, &self.bookie) || self.replicas.holds(ledger.id)
    }

    /// Whether this log holds every entry of `ledger`, so reads it locally: a replica's copy
    /// of a striped ledger (ADR 0017) holds one stripe, and the ledger is read from the
    /// bookies that hold the rest.
    pub(crate) fn holds_whole(&self, ledger: &LedgerRecord) -> bool {
        held_by(ledger, &self.bookie) || (self.replicas.holds(ledger.id) && !ledger.is_striped())
    }

    /// Whether this log wrote `ledger` (only the writer recovers, offloads and deletes it).
    pub(crate) fn writes(&self, ledger: &LedgerRecord) -> bool {
        held_by(ledger, &self.bookie)
    }

    /// Admits an append of `payload_len` bytes: refused while the volume is full, then waits
    /// for room among the appends in flight (backpressure). The permit is held until done.
    pub(crate) async fn admit(
        &self,
        payload_len: usize,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, AppendError> {
        let cost = (payload_len + record::RECORD_OVERHEAD) as u32;
        self.disk.admit(u64::from(cost))?;
        self.pending
            .clone()
            .acquire_many_owned(cost)
            .await
            .map_err(|_| AppendError::Closed)
    }

    /// The index of sealed ledger `record`, which this log holds: a replica's copy still open
    /// here (its seal not heard of yet) is sealed at the recorded count first.
    pub(crate) async fn held_sealed_index(
        self: &Arc<Self>,
        record: &LedgerRecord,
    ) -> Result<Arc<[IndexEntry]>, ReadError> {
        if self.replicas.open(record.id).is_some() {
            let count = record.seal.map_or(0, |s| s.entry_count);
            replicas::replica_seal(self, record.id, count).await?;
        }
        self.sealed_index(record.id).await
    }

    /// The index of a sealed ledger, from the cache or its file.
    pub(crate) async fn sealed_index(
        self: &Arc<Self>,
        ledger: LedgerId,
    ) -> Result<Arc<[IndexEntry]>, ReadError> {
        if let Some(index) = self.index_cache.get(ledger) {
            return Ok(index);
        }
        let dir = self.index_dir.clone();
        let entries = tokio::task::spawn_blocking(move || read_index_file(&dir, ledger))
            .await
            .map_err(|_| ReadError::Cancelled)??;
        let index: Arc<[IndexEntry]> = entries.into();
        self.index_cache.insert(ledger, index.clone());
        Ok(index)
    }
}

/// Counters describing the log.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LogStats {
    /// Segment files on disk.
    pub segments: usize,
    /// Segment the journal writes to.
    pub current_segment: u32,
    /// Topics loaded in memory.
    pub loaded_topics: usize,
    /// Bytes held by tail caches.
    pub tail_cache_bytes: usize,
}

/// What recovery did at open.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RecoveryReport {
    /// Ledgers found open and sealed by recovery.
    pub sealed_ledgers: usize,
    /// Entries found in them.
    pub recovered_entries: u64,
    /// Bytes of torn tail dropped.
    pub truncated_bytes: u64,
    /// Segment files reclaimed.
    pub reclaimed_segments: usize,
    /// Index files of ledgers no longer held locally, removed (left by a crash mid-deletion).
    pub stale_index_files: usize,
    /// (segment, offset) of records that failed their checksum with intact framing; skipped by
    /// recovery, reported on every read of them.
    pub corrupt_records: Vec<(u32, u64)>,
    /// This bookie's replicated ledgers found open, kept as copies for their topics' next owner
    /// to take over (the broker loads those topics at start rather than wait for a client).
    pub left_open_replicated: Vec<LedgerId>,
}

/// Recovery's scan over a segment directory, for the fuzz target and the hostile-bytes tests:
/// the ledgers `open` count as open from segment 1, and the newest segment is durable below
/// `floor`. Returns how many entries each open ledger has, or why the bytes are refused. The
/// scan may trim a torn tail of the newest segment, as at startup.
#[doc(hidden)]
pub fn scan_segments_for_tests(
    dir: &Path,
    open: &[LedgerId],
    floor: u64,
    max_body: usize,
) -> Result<Vec<(LedgerId, usize)>, OpenError> {
    let open: BTreeMap<LedgerId, u32> = open.iter().map(|id| (*id, 1)).collect();
    let scan = recovery::scan(dir, &open, HashMap::new(), max_body, |_| Ok(floor))?;
    Ok(scan
        .ledgers
        .into_iter()
        .map(|(id, w)| (id, w.entries.len()))
        .collect())
}

/// How often a bookie holding replica copies checks them against the store.
const REPLICA_COLLECTION: Duration = Duration::from_secs(30);

/// Whether bookie `bookie` holds the entries of `ledger` (an empty bookie: a ledger of an
/// embedded store from before bookie ids, always local).
fn held_by(ledger: &LedgerRecord, bookie: &str) -> bool {
    ledger.bookie.is_empty() || ledger.bookie == bookie
}

/// The log service: owns the journal, the metadata store handle and every topic's log.
#[derive(Debug)]
pub struct Log {
    shared: Arc<LogShared>,
    /// Invariant: at most one [`TopicLog`] per topic name.
    topics: tokio::sync::Mutex<HashMap<String, TopicLog>>,
    /// The same topics by id, for synchronous access (stats, transitions by topic id).
    /// Invariant: holds exactly the logs in `topics`, each under its own id (an id names one
    /// topic, and `topics` holds one log per name); a look-up or a forget costs the same at
    /// 100,000 loaded topics as at ten.
    loaded: Mutex<HashMap<metadata::TopicId, TopicLog>>,
    /// Ledger transitions this log recorded (offloaded, deleted, expired). Invariant: bumped
    /// after the store recorded one and before the loaded topics are looked up to apply it,
    /// so a topic loading meanwhile sees it change and reads its ledgers again.
    transitions: AtomicU64,
    stop: CancellationToken,
    report: RecoveryReport,
    /// The directory the log lives in.
    dir: PathBuf,
}

impl Log {
    /// Opens the log in `dir`, running recovery: rebuilds ledgers left open by a crash, truncates
    /// a torn tail, seals the recovered ledgers and reclaims unreferenced segments.
    pub async fn open(
        dir: &Path,
        config: LedgerConfig,
        meta: Arc<dyn MetadataStore>,
    ) -> Result<Log, OpenError> {
        let segments_dir = dir.join("segments");
        let index_dir = dir.join("index");
        let replicas_dir = dir.join("replicas");
        for d in [dir, &segments_dir, &index_dir, &replicas_dir] {
            std::fs::create_dir_all(d).map_err(|source| OpenError::Io {
                path: d.to_path_buf(),
                source,
            })?;
        }
        let id_dir = dir.to_path_buf();
        let bookie = tokio::task::spawn_blocking(move || bookie_id::load_or_create(&id_dir))
            .await
            .map_err(|e| OpenError::Journal(e.to_string()))??;
        let max_record_body =
            record::RECORD_BODY_FIXED_LEN + config.max_entry_size.as_u64() as usize;
        // The copies this bookie holds of other writers' ledgers: those still open are rebuilt
        // from the journal like its own open ledgers (but never sealed by it).
        let mut replica_plan = replicas_to_recover(&replicas_dir, &meta, &bookie).await?;
        // Only this bookie's ledgers: another node's open ledger is that node's to recover.
        let own_open: Vec<LedgerRecord> = meta
            .ledgers_in_states(&[LedgerState::Open])
            .await?
            .into_iter()
            .filter(|l| held_by(l, &bookie))
            .collect();
        let mut open: BTreeMap<LedgerId, u32> =
            own_open.iter().map(|l| (l.id, l.first_segment)).collect();
        // Its own replicated ledgers left open are not sealed here: its copy may lack entries
        // its quorum acknowledged. They wait, as copies, for the topic's next owner to take
        // them over with the replicas' copies ([`takeover`]).
        let own_replicated: Vec<(LedgerId, u32)> = own_open
            .iter()
            .filter(|l| !l.replicas.is_empty())
            .map(|l| (l.id, l.first_segment))
            .collect();
        // Offsets below which the newest segment is known durable: the end of sealed ledgers'
        // entries in it, and the clean-shutdown marker.
        let sealed: Vec<(LedgerId, u32)> = meta
            .ledgers_in_states(&[LedgerState::Sealed, LedgerState::Offloaded])
            .await?
            .into_iter()
            .filter(|l| held_by(l, &bookie))
            // An empty ledger has no index file (and no entry to bound the floor).
            .filter_map(|l| {
                l.seal
                    .filter(|s| s.entry_count > 0)
                    .map(|s| (l.id, s.last_segment))
            })
            .collect();
        open.extend(replica_plan.scan.iter().map(|(id, first)| (*id, *first)));
        let marker = segment::read_clean_marker(&segments_dir);
        let scan_dir = segments_dir.clone();
        let floor_index_dir = index_dir.clone();
        let stripes = replica_plan.stripes.clone();
        let (scan, first_segments) = tokio::task::spawn_blocking(move || {
            let floor = |last: u32| -> Result<u64, OpenError> {
                let mut floor = match marker {
                    Some((segment, offset)) if segment == last => offset,
                    _ => 0,
                };
                for (id, _) in sealed.iter().filter(|(_, s)| *s == last) {
                    for e in read_index_file(&floor_index_dir, *id)? {
                        if e.segment == last {
                            floor = floor.max(u64::from(e.offset) + u64::from(e.len));
                        }
                    }
                }
                Ok(floor)
            };
            recovery::scan(&scan_dir, &open, stripes, max_record_body, floor)
                .map(|scan| (scan, open))
        })
        .await
        .map_err(|e| OpenError::Journal(e.to_string()))??;

        let journal = Journal::start(
            JournalSettings {
                dir: segments_dir.clone(),
                segment_size: config.segment_size.as_u64(),
                preallocate: config.preallocate,
                sync: config.sync,
                sync_interval: config.sync_interval,
                group_commit_max_bytes: config.group_commit_max_size.as_u64() as usize,
            },
            scan.next_segment,
        )
        .map_err(|e| OpenError::Journal(e.to_string()))?;
        segment::remove_clean_marker(&segments_dir).map_err(|source| OpenError::Io {
            path: segments_dir.clone(),
            source,
        })?;
        let disk = disk::DiskGuard::new(&segments_dir, &config);
        let shared = Arc::new(LogShared {
            disk,
            index_dir,
            meta,
            journal,
            segments: SegmentReaders::new(segments_dir, config.max_open_segments),
            index_cache: IndexCache::new(config.index_cache_ledgers),
            cache_budget: CacheBudget::new(config.tail_cache_size.as_u64() as usize),
            pending: Arc::new(Semaphore::new(config.max_pending_size.as_u64() as usize)),
            max_record_body,
            config,
            tasks: tokio_util::task::TaskTracker::new(),
            bookie,
            remote: std::sync::OnceLock::new(),
            replicas: replicas::Replicas::new(
                replicas_dir,
                std::mem::take(&mut replica_plan.sealed),
                Vec::new(),
                std::mem::take(&mut replica_plan.fenced),
            ),
            aging: aging::Aging::new(),
            stop: CancellationToken::new(),
            reseals: Semaphore::new(topic::RESEALS_AT_ONCE),
        });

        crate::failpoint::hit("ledger.recovery.after_scan");
        let mut report = RecoveryReport {
            truncated_bytes: scan.truncated.map_or(0, |t| t.2),
            corrupt_records: scan.corrupt_records.clone(),
            ..Default::default()
        };
        report.left_open_replicated = own_replicated.iter().map(|(id, _)| *id).collect();
        if !own_replicated.is_empty() {
            let (dir, own) = (shared.replicas.dir.clone(), own_replicated.clone());
            tokio::task::spawn_blocking(move || replicas::register_own(&dir, &own))
                .await
                .map_err(|e| OpenError::Journal(e.to_string()))?
                .map_err(|source| OpenError::Io {
                    path: shared.replicas.dir.clone(),
                    source,
                })?;
        }
        let mut own = scan.ledgers;
        let copies: Vec<(u32, open_ledger::OpenLedger)> = replica_plan
            .scan
            .iter()
            .chain(own_replicated.iter().map(|(id, first)| (id, first)))
            .filter_map(|(id, first)| {
                let written = own.remove(id)?;
                let stripe = replica_plan.stripes.get(id).cloned().unwrap_or_default();
                Some((
                    *first,
                    open_ledger::OpenLedger::replica(*id, *first, written, stripe),
                ))
            })
            .collect();
        shared.replicas.restore(copies);
        replica_plan.finish(&shared).await?;
        let recovered = seal::seal_recovered(&shared, own, &first_segments).await?;
        report.sealed_ledgers = recovered.ledgers;
        report.recovered_entries = recovered.entries;
        let mut log = Log {
            stop: shared.stop.clone(),
            shared,
            topics: tokio::sync::Mutex::new(HashMap::new()),
            loaded: Mutex::new(HashMap::new()),
            transitions: AtomicU64::new(0),
            report,
            dir: dir.to_path_buf(),
        };
        log.report.reclaimed_segments = log
            .reclaim_segments()
            .await
            .map_err(|e| OpenError::Journal(format!("reclaiming segments: {e}")))?
            .len();
        log.report.stale_index_files = reclaim::remove_stale_index_files(&log.shared).await?;
        log.spawn_age_ticker();
        log.spawn_disk_ticker();
        log.spawn_replica_collector();
        tracing::info!(report = ?log.report, "log recovered");
        Ok(log)
    }

    /// The largest entry the log accepts (what a replica's add may carry).
    pub fn max_entry_size(&self) -> usize {
        self.shared.config.max_entry_size.as_u64() as usize
    }

    /// This log's bookie id (recorded on the ledgers it creates).
    pub fn bookie_id(&self) -> &str {
        &self.shared.bookie
    }

    /// Whether this log holds a copy of the entries of `ledger`, written here or replicated
    /// here (other nodes' bookies hold the rest).
    pub fn holds(&self, ledger: &LedgerRecord) -> bool {
        self.shared.holds(ledger)
    }

    /// Whether this log wrote `ledger` (a replica drops its copy once the store says so).
    pub fn writes(&self, ledger: &LedgerRecord) -> bool {
        self.shared.writes(ledger)
    }

    /// The directory the log lives in (its volume is the one that must not fill up).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The metadata store the log uses (shared with the broker and the admin API).
    pub fn metadata(&self) -> Arc<dyn MetadataStore> {
        self.shared.meta.clone()
    }

    /// The I/O error that stopped the journal, if any: from then on no append is acknowledged
    /// until the process restarts (liveness reports it, so a supervisor restarts it).
    pub fn journal_failure(&self) -> Option<Arc<str>> {
        self.shared.journal.failure()
    }

    /// What recovery did when this log was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// The log of topic `name`, created (in the metadata store) if it does not exist.
    pub async fn topic(&self, name: &str) -> Result<TopicLog, metadata::MetadataError> {
        let mut topics = self.topics.lock().await;
        if let Some(t) = topics.get(name) {
            return Ok(t.clone());
        }
        let record = self.shared.meta.get_or_create_topic(name, now_ms()).await?;
        let seen = self.transitions.load(Ordering::SeqCst);
        let ledgers = self.shared.meta.topic_ledgers(record.id).await?;
        let t = TopicLog::new(self.shared.clone(), record.id, record.name, ledgers);
        topics.insert(name.to_string(), t.clone());
        {
            let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
            loaded.insert(t.id(), t.clone());
            crate::metrics::node().topic_logs.set(loaded.len() as i64);
        }
        // A transition recorded after the read above may have looked for this topic before it
        // was listed as loaded: read its ledgers again and apply what moved on.
        if self.transitions.load(Ordering::SeqCst) != seen {
            t.catch_up(self.shared.meta.topic_ledgers(t.id()).await?);
        }
        Ok(t)
    }

    /// Deletes topic `name` from the log: refuses further appends, seals its open ledger,
    /// deletes every ledger's local copy (segments are reclaimed once no live ledger uses them)
    /// and then its metadata (ledgers, cursors, schemas, partition count). The caller makes
    /// sure nobody uses the topic (the broker unloads it first). Returns whether it existed.
    pub async fn delete_topic(&self, name: &str) -> Result<bool, LifecycleError> {
        if !self.topic_exists(name).await? {
            return Ok(self.shared.meta.delete_topic(name).await?);
        }
        let topic = self.topic(name).await?;
        let deleted = self.delete_loaded(name, &topic).await;
        if deleted.is_err() {
            // The topic stays and takes appends again (in a new ledger), whatever step failed:
            // ledgers whose local copies went before the failure are read from the lake, as
            // deleted ones are. The repeated DELETE finishes the deletion.
            topic.deletion_failed();
        }
        deleted
    }

    /// [`Log::delete_topic`] of an existing topic, `topic` its log.
    async fn delete_loaded(&self, name: &str, topic: &TopicLog) -> Result<bool, LifecycleError> {
        self.close_all_for_deletion(topic).await?;
        for r in self.shared.meta.topic_ledgers(topic.id()).await? {
            if matches!(r.state, LedgerState::Sealed | LedgerState::Offloaded) {
                self.delete_local(r.id).await?;
            }
        }
        {
            // Every log of the name goes, listed ones too (under the one lock): the topic's
            // rows are deleted next, so a log loaded meanwhile would be stale.
            let mut topics = self.topics.lock().await;
            if let Some(cached) = topics.remove(name) {
                self.unlist(&cached);
            }
            self.unlist(topic);
        }
        let existed = self.shared.meta.delete_topic(name).await?;
        tracing::info!(topic = name, "topic deleted from the log");
        Ok(existed)
    }

    /// First steps of deleting `topic`, which change nothing a reader sees: appends refused,
    /// the open ledger sealed, and a wait for seals still running in the background (a
    /// rollover's) until no ledger of the topic is open.
    async fn close_all_for_deletion(&self, topic: &TopicLog) -> Result<(), LifecycleError> {
        topic.close_for_deletion().await?;
        let mut waits = 0;
        loop {
            let ledgers = self.shared.meta.topic_ledgers(topic.id()).await?;
            match ledgers.iter().find(|r| r.state == LedgerState::Open) {
                None => return Ok(()),
                Some(r) if waits >= 500 => return Err(LifecycleError::StillOpen(r.id)),
                Some(_) => {
                    waits += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// Whether a topic of that name exists (loaded or in the metadata store).
    pub async fn topic_exists(&self, name: &str) -> Result<bool, metadata::MetadataError> {
        if self.topics.lock().await.contains_key(name) {
            return Ok(true);
        }
        Ok(self.shared.meta.get_topic(name).await?.is_some())
    }

    fn loaded_topic(&self, topic_id: metadata::TopicId) -> Option<TopicLog> {
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&topic_id)
            .cloned()
    }

    /// Records that a sealed ledger is committed to the lake (`sealed → offloaded`).
    pub async fn mark_offloaded(
        &self,
        ledger: LedgerId,
        reference: String,
    ) -> Result<LedgerRecord, LifecycleError> {
        let record = self
            .shared
            .meta
            .transition_ledger(ledger, LedgerTransition::Offload { reference }, now_ms())
            .await?;
        self.transitions.fetch_add(1, Ordering::SeqCst);
        if let Some(t) = self.loaded_topic(record.topic_id) {
            t.set_record(record.clone());
        }
        Ok(record)
    }

    /// Deletes the local copy of a ledger (`offloaded → deleted`, or `sealed → deleted` when its
    /// topic is deleted): records the state first, then removes its index and reclaims the
    /// segments no live ledger needs any more.
    pub async fn delete_local(&self, ledger: LedgerId) -> Result<LedgerRecord, LifecycleError> {
        self.leave_local(ledger, LedgerTransition::Delete).await
    }

    /// Expires a ledger by retention (`sealed | offloaded | deleted → expired`): records the
    /// state first (from then on no reader sees it), then removes whatever is left locally.
    /// Removing its rows from the lake is the offload engine's part.
    pub async fn expire_ledger(&self, ledger: LedgerId) -> Result<LedgerRecord, LifecycleError> {
        self.leave_local(ledger, LedgerTransition::Expire).await
    }

    async fn leave_local(
        &self,
        ledger: LedgerId,
        transition: LedgerTransition,
    ) -> Result<LedgerRecord, LifecycleError> {
        let record = self
            .shared
            .meta
            .transition_ledger(ledger, transition, now_ms())
            .await?;
        self.transitions.fetch_add(1, Ordering::SeqCst);
        if let Some(t) = self.loaded_topic(record.topic_id) {
            t.set_record(record.clone());
        }
        crate::failpoint::hit("ledger.local_delete.after_record");
        self.shared.index_cache.remove(ledger);
        let path = index::index_path(&self.shared.index_dir, ledger);
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(LifecycleError::Io { path, source }),
        })
        .await?;
        self.reclaim_segments().await?;
        Ok(record)
    }

    /// Deletes segment files that no live ledger may reference. Returns the ids removed.
    pub async fn reclaim_segments(&self) -> Result<Vec<u32>, LifecycleError> {
        reclaim::reclaim(&self.shared).await
    }

    /// Waits until everything appended before the call is durable.
    pub async fn sync(&self) -> Result<(), AppendError> {
        self.shared.journal.barrier().await
    }

    /// Graceful stop: stops background tasks, then flushes and fsyncs the journal. Appends made
    /// after this fail with [`AppendError::Closed`].
    pub async fn shutdown(&self) -> Result<(), AppendError> {
        self.stop.cancel();
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
        self.shared.pending.close();
        self.shared.journal.shutdown().await
    }

    /// The logs of `base` (a topic, or every existing partition of a partitioned topic) with
    /// their partition indexes (-1: not partitioned), ordered by index: the loaded ones, and
    /// uncached views of the others ([`Log::topic_view`]). The one lake table of a topic holds
    /// these.
    pub async fn partitions_of(
        &self,
        base: &TopicName,
    ) -> Result<Vec<(i32, TopicLog)>, MetadataError> {
        let mut out = Vec::new();
        for (index, name) in self.partition_names(base).await? {
            if let Some(t) = self.topic_view(&name).await? {
                out.push((index, t));
            }
        }
        Ok(out)
    }

    /// The names of the existing partitions of `base` (or of `base` itself, -1), ordered by
    /// index.
    pub(crate) async fn partition_names(
        &self,
        base: &TopicName,
    ) -> Result<Vec<(i32, String)>, MetadataError> {
        let base_name = base.base().to_string();
        let mut out = Vec::new();
        // The partitions' names all start with the base name (`<base>-partition-<i>`).
        for t in self.metadata().list_topics_under(&base_name).await? {
            let Ok(name) = t.name.parse::<TopicName>() else {
                continue;
            };
            if name.base().to_string() == base_name {
                out.push((name.partition().map_or(-1, |p| p as i32), t.name));
            }
        }
        out.sort_by_key(|(p, _)| *p);
        Ok(out)
    }

    /// Current counters (the segment directory is listed on the blocking pool).
    pub async fn stats(&self) -> LogStats {
        let dir = self.shared.segments.dir().to_path_buf();
        let segments =
            tokio::task::spawn_blocking(move || list_segments(&dir).map_or(0, |s| s.len()))
                .await
                .unwrap_or(0);
        LogStats {
            segments,
            current_segment: self.shared.journal.current_segment(),
            loaded_topics: self.loaded.lock().unwrap_or_else(|p| p.into_inner()).len(),
            tail_cache_bytes: self.shared.cache_budget.used(),
        }
    }
}

/// Runs file-system work on the blocking pool, never on an async worker.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, LifecycleError> + Send + 'static,
) -> Result<T, LifecycleError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| LifecycleError::Io {
            path: PathBuf::new(),
            source: std::io::Error::other(format!("blocking task failed: {e}")),
        })?
}

impl Drop for Log {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests;
