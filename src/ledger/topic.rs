//! A topic partition's log: an ordered list of ledgers, appends to the open one, rollover and
//! sealing, and reads by position.
//!
//! The broker gives each topic partition one owning task, which is the only appender; the handle
//! is still internally synchronised (an uncontended `std::sync::Mutex` never held across
//! `.await`) so that readers and the age-based rollover can share it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::{oneshot, watch};

use super::cache::TailCache;
use super::error::{AppendError, LifecycleError};
use super::journal::{AppendRequest, Reply};
use super::metadata::{LedgerId, LedgerRecord, LedgerState, TopicId};
use super::open_ledger::OpenLedger;
use super::seal::seal_ledger;
use super::{now_ms, LogShared, Position};

mod ensemble;
mod entries;
mod fencing;
mod positions;
mod replicated;
mod sealing;
pub(crate) use sealing::RESEALS_AT_ONCE;

pub use replicated::Replication;

/// Summary of one ledger of a topic.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LedgerInfo {
    /// Ledger id.
    pub id: LedgerId,
    /// Lifecycle state.
    pub state: LedgerState,
    /// Entries (for the open ledger: confirmed entries so far).
    pub entry_count: u64,
    /// Payload bytes.
    pub size_bytes: u64,
    /// Publish-time range.
    pub min_publish_ms: Option<i64>,
    /// Publish-time range.
    pub max_publish_ms: Option<i64>,
    /// Whether this log reads its entries from the lake ([`TopicLog::read_from_lake`]):
    /// deleted locally, or offloaded while this node does not hold it whole.
    pub from_lake: bool,
}

/// What the topic knows about each of its ledgers.
#[derive(Debug, Clone)]
enum LedgerView {
    /// Open, or sealing in progress: served from the in-memory index.
    Open(Arc<OpenLedger>),
    /// Sealed, offloaded or deleted, as the metadata store records it. Boxed: a map node holds
    /// eleven values, and a loaded topic with one ledger would pay for eleven records.
    Closed(Box<LedgerRecord>),
}

impl LedgerView {
    /// Whether `view` is the open view of `old` itself (nobody closed or replaced it).
    fn is_open(view: Option<&LedgerView>, old: &Arc<OpenLedger>) -> bool {
        matches!(view, Some(LedgerView::Open(o)) if Arc::ptr_eq(o, old))
    }
}

/// Append-side state.
#[derive(Debug)]
struct WriterState {
    /// Invariant: `Some` only for a ledger in `Open` state in the metadata store.
    current: Option<Arc<OpenLedger>>,
    /// Invariant: next entry id of `current` (= entries submitted to it).
    next_entry: u64,
    bytes: u64,
    opened_at: Instant,
    /// Invariant: true while an age deadline of this topic is queued ([`super::aging`]; until
    /// the log stops); set and cleared only under this lock, so a ledger's opening and first
    /// entry find a deadline queued or queue one.
    age_armed: bool,
}

#[derive(Debug)]
pub(crate) struct TopicInner {
    pub name: String,
    pub id: TopicId,
    pub(super) shared: Arc<LogShared>,
    writer: Mutex<WriterState>,
    /// Serialises ledger creation and sealing of this topic.
    roll_lock: tokio::sync::Mutex<()>,
    /// Invariant: ordered by ledger id, which is the topic's ledger order.
    ledgers: Mutex<BTreeMap<LedgerId, LedgerView>>,
    cache: Mutex<TailCache>,
    lac: Arc<watch::Sender<Option<Position>>>,
    /// True from the start of the topic's deletion on, false again if the deletion fails
    /// ([`TopicLog::deletion_failed`]). Invariant: no ledger is created while it is set
    /// (checked under `roll_lock`).
    deleted: std::sync::atomic::AtomicBool,
    /// Entries this view reads of each open ledger another bookie writes, fixed when the view
    /// was made ([`super::Log::topic_to_read`]). Invariant: empty for a view that writes.
    pub(super) foreign_open: HashMap<LedgerId, u64>,
    /// The ownership epoch this writer fenced the topic at (0: unfenced, a single node).
    /// Invariant: every ledger created while it is non-zero is created with it, so a newer
    /// owner's fence refuses this writer's next ledger.
    writer_epoch: std::sync::atomic::AtomicU64,
    /// How the topic's next ledgers are replicated (the namespace's persistence policy).
    replication: Mutex<Replication>,
    /// What the topic's age deadlines hold ([`super::aging`]).
    pub(super) age_token: Arc<super::aging::AgeToken<TopicInner>>,
    /// Closes of this topic's ledgers running in the background (a rollover's seal, a seal
    /// tried again), and the wake-up each one gives when it ends ([`TopicLog::retries_ended`]).
    /// Invariant: the count is raised before such a close is spawned and lowered (then all
    /// waiters woken) when its task ends or is dropped; a rollover's seal that fails raises it
    /// for the retry before lowering it for itself.
    retrying: std::sync::atomic::AtomicU32,
    retry_ended: tokio::sync::Notify,
}

/// Handle to one topic partition's log. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TopicLog {
    pub(crate) inner: Arc<TopicInner>,
}

/// Resolves when the append is durable (per the sync policy), giving its position.
#[derive(Debug)]
pub struct AppendReceipt {
    rx: oneshot::Receiver<Result<Position, AppendError>>,
    position: Position,
}

impl AppendReceipt {
    /// The position the entry was assigned (valid once the receipt resolves `Ok`).
    pub fn position(&self) -> Position {
        self.position
    }

    /// Waits until the entry is durable.
    pub async fn durable(self) -> Result<Position, AppendError> {
        self.rx.await.map_err(|_| AppendError::Closed)?
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TopicLog {
    pub(crate) fn new(
        shared: Arc<LogShared>,
        id: TopicId,
        name: String,
        records: Vec<LedgerRecord>,
    ) -> TopicLog {
        Self::reader(shared, id, name, records, HashMap::new())
    }

    /// A view of the topic's `records` in which the open ledgers of other bookies hold the
    /// entry counts of `foreign_open`.
    pub(crate) fn reader(
        shared: Arc<LogShared>,
        id: TopicId,
        name: String,
        records: Vec<LedgerRecord>,
        foreign_open: HashMap<LedgerId, u64>,
    ) -> TopicLog {
        let last = records
            .iter()
            .rev()
            .filter_map(|r| {
                let count = r
                    .seal
                    .map_or_else(|| foreign_open.get(&r.id).copied(), |s| Some(s.entry_count));
                match count {
                    Some(n) if n > 0 => Some(Position::new(r.id, n - 1)),
                    _ => None,
                }
            })
            .next();
        // Expired ledgers are gone for readers: the view never lists them.
        let ledgers = records
            .into_iter()
            .filter(|r| r.state != LedgerState::Expired)
            .map(|r| (r.id, LedgerView::Closed(Box::new(r))))
            .collect();
        let cache = TailCache::new(
            shared.config.tail_cache_topic_size.as_u64() as usize,
            shared.cache_budget.clone(),
        );
        TopicLog {
            inner: Arc::new_cyclic(|me| TopicInner {
                age_token: Arc::new(super::aging::AgeToken::new(me.clone())),
                name,
                id,
                writer: Mutex::new(WriterState {
                    current: None,
                    next_entry: 0,
                    bytes: 0,
                    opened_at: Instant::now(),
                    age_armed: false,
                }),
                roll_lock: tokio::sync::Mutex::new(()),
                ledgers: Mutex::new(ledgers),
                cache: Mutex::new(cache),
                lac: Arc::new(watch::channel(last).0),
                deleted: std::sync::atomic::AtomicBool::new(false),
                foreign_open,
                writer_epoch: std::sync::atomic::AtomicU64::new(0),
                replication: Mutex::new(Replication::default()),
                retrying: std::sync::atomic::AtomicU32::new(0),
                retry_ended: tokio::sync::Notify::new(),
                shared,
            }),
        }
    }

    /// Full topic name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Id of the topic in the metadata store.
    pub fn id(&self) -> TopicId {
        self.inner.id
    }

    /// Whether this view writes the topic (it has an open ledger of its own).
    pub(crate) fn is_writing(&self) -> bool {
        lock(&self.inner.writer).current.is_some()
            || lock(&self.inner.ledgers)
                .values()
                .any(|v| matches!(v, LedgerView::Open(_)))
    }

    /// The open ledger `ledger` this view writes (or is sealing).
    pub(crate) fn open_view(&self, ledger: LedgerId) -> Option<Arc<OpenLedger>> {
        match lock(&self.inner.ledgers).get(&ledger) {
            Some(LedgerView::Open(o)) => Some(o.clone()),
            _ => None,
        }
    }

    /// Whether this view never wrote and no longer matches `records` (the store's ledgers of
    /// the topic, which another node changed): such a view is replaced by a fresh one. A view
    /// that is writing is the store's source of truth and is never stale.
    pub(crate) fn is_stale_reader(&self, records: &[LedgerRecord]) -> bool {
        if lock(&self.inner.writer).current.is_some() {
            return false;
        }
        let views = lock(&self.inner.ledgers);
        if views.values().any(|v| matches!(v, LedgerView::Open(_))) {
            return false;
        }
        let stored = records
            .iter()
            .filter(|r| r.state != LedgerState::Expired)
            .map(|r| (r.id, r.state));
        let known = views.values().map(|v| match v {
            LedgerView::Open(o) => (o.id, LedgerState::Open),
            LedgerView::Closed(r) => (r.id, r.state),
        });
        !stored.eq(known)
    }

    /// Appends one entry. Returns once the entry is queued (waiting only for backpressure or a
    /// ledger rollover); the receipt resolves when it is durable. Entries of one topic are
    /// assigned dense ids in call order and become durable in that order.
    pub async fn append(
        &self,
        publish_time_ms: i64,
        payload: Bytes,
    ) -> Result<AppendReceipt, AppendError> {
        self.refuse_if_deleted()?;
        let shared = &self.inner.shared;
        self.refuse_if_journal_failed()?;
        let max = shared.config.max_entry_size.as_u64() as usize;
        if payload.len() > max {
            return Err(AppendError::TooLarge {
                size: payload.len(),
                max,
            });
        }
        let permit = shared.admit(payload.len()).await?;
        loop {
            {
                let mut w = lock(&self.inner.writer);
                if let Some(current) = w.current.clone() {
                    if !self.should_roll(&w, payload.len()) {
                        let entry_id = w.next_entry;
                        if entry_id == 0 {
                            // A ledger opened ahead of its first entry ages from that entry.
                            w.opened_at = Instant::now();
                            if !w.age_armed {
                                w.age_armed = shared.aging.queue(
                                    &self.inner.age_token,
                                    w.opened_at,
                                    shared.config.rollover_age,
                                );
                            }
                        }
                        w.next_entry += 1;
                        w.bytes += payload.len() as u64;
                        let position = Position::new(current.id, entry_id);
                        lock(&self.inner.cache).insert(position, publish_time_ms, payload.clone());
                        let (tx, rx) = oneshot::channel();
                        // A replicated entry is acknowledged by its quorum, not the journal.
                        let reply = match &current.quorum {
                            Some(_) => {
                                self.replicate(&current, (entry_id, publish_time_ms), &payload, tx);
                                Reply::Quorum
                            }
                            None => Reply::Direct(tx),
                        };
                        let quorum = current.quorum.clone();
                        let submitted = shared.journal.submit(AppendRequest {
                            ledger: current,
                            entry_id,
                            publish_time_ms,
                            payload,
                            reply,
                            _permit: permit,
                        });
                        if let (Err(e), Some(q)) = (&submitted, quorum) {
                            // The entry went to the replicas: its receipt must not wait on a
                            // journal that will never answer.
                            q.journal_failed(&e.to_string());
                        }
                        submitted?;
                        return Ok(AppendReceipt { rx, position });
                    }
                }
            }
            self.roll(payload.len()).await?;
        }
    }

    /// Opens the topic's ledger now if it has none, so that its first append does not wait for
    /// the ledger's creation (Pulsar opens a topic's ledger when the topic loads for a
    /// producer). A ledger that gets no entry is discarded, not sealed, when the topic closes.
    pub async fn open_ledger(&self) -> Result<(), AppendError> {
        if lock(&self.inner.writer).current.is_some() {
            return Ok(());
        }
        self.roll(0).await
    }

    fn should_roll(&self, w: &WriterState, next_len: usize) -> bool {
        let c = &self.inner.shared.config;
        let degraded = || {
            w.current
                .as_ref()
                .and_then(|l| l.quorum.as_ref())
                .is_some_and(|q| q.degraded())
        };
        w.next_entry > 0
            && (w.bytes + next_len as u64 > c.rollover_size.as_u64()
                || w.next_entry >= c.rollover_entries
                || w.opened_at.elapsed() >= c.rollover_age
                // A replica failed and is not being replaced: the next entries go to a new
                // ledger with a full ensemble.
                || degraded())
    }

    /// Opens a new ledger if there is none or the current one is due; seals the old one in the
    /// background once its entries are durable.
    async fn roll(&self, next_len: usize) -> Result<(), AppendError> {
        let _guard = self.inner.roll_lock.lock().await;
        self.refuse_if_deleted()?;
        self.refuse_if_journal_failed()?;
        let settling = {
            let w = lock(&self.inner.writer);
            if w.current.is_some() && !self.should_roll(&w, next_len) {
                return Ok(());
            }
            w.current
                .as_ref()
                .and_then(|c| c.quorum.clone().map(|q| (q, w.next_entry)))
        };
        // A replicated ledger's entries confirm by quorum, not in journal order: the next
        // ledger opens only once every entry of this one is confirmed or failed, so no entry
        // of the next is confirmed (and read past) while one of this one may still be.
        if let Some((quorum, submitted)) = settling {
            quorum.settled(submitted).await;
        }
        let shared = &self.inner.shared;
        let replicated::Placed {
            replicas,
            ack_quorum,
            write_quorum,
            stripe_width,
        } = self.placement().await?;
        let record = shared
            .meta
            .create_ledger_placed(
                self.inner.id,
                shared.journal.current_segment(),
                super::metadata::Placement {
                    bookie: &shared.bookie,
                    replicas: &replicas,
                    ack_quorum,
                    write_quorum,
                    stripe_width,
                },
                now_ms(),
                self.writer_epoch(),
            )
            .await
            .map_err(|e| AppendError::Metadata(Arc::new(e)))?;
        let ledger = Arc::new(if replicas.is_empty() {
            OpenLedger::new(record.id, record.first_segment, self.inner.lac.clone())
        } else {
            let stripes = record.stripes();
            let quorum = super::quorum::Quorum::new(record.id, replicas, ack_quorum, stripes);
            OpenLedger::replicated(
                record.id,
                record.first_segment,
                self.inner.lac.clone(),
                Arc::new(quorum),
            )
        });
        lock(&self.inner.ledgers).insert(record.id, LedgerView::Open(ledger.clone()));
        let old = {
            let mut w = lock(&self.inner.writer);
            let old = w.current.replace(ledger);
            w.next_entry = 0;
            w.bytes = 0;
            w.opened_at = Instant::now();
            if !w.age_armed {
                // A ledger opened ahead that gets no entry is discarded at its age (an open
                // ledger pins the journal's segments); its first entry starts its age again.
                w.age_armed = shared.aging.queue(
                    &self.inner.age_token,
                    w.opened_at,
                    shared.config.rollover_age,
                );
            }
            old
        };
        tracing::debug!(topic = %self.inner.name, ledger = record.id, "opened ledger");
        if let Some(old) = old {
            let topic = self.clone();
            let closing = self.closing_in_background();
            shared.tasks.spawn(async move {
                // A failure is logged, and tried again (counted anew), by the call.
                let _ = topic.seal_or_retry(old).await;
                drop(closing);
            });
        }
        Ok(())
    }

    /// Fail-stop: no ledger is created, nor any entry id taken, once the journal failed.
    fn refuse_if_journal_failed(&self) -> Result<(), AppendError> {
        match self.inner.shared.journal.failure() {
            Some(e) => Err(AppendError::JournalFailed(e)),
            None => Ok(()),
        }
    }

    fn refuse_if_deleted(&self) -> Result<(), AppendError> {
        if self
            .inner
            .deleted
            .load(std::sync::atomic::Ordering::Acquire)
        {
            Err(AppendError::TopicDeleted(self.inner.name.clone()))
        } else {
            Ok(())
        }
    }

    /// Seals `old`: waits until its entries are durable, writes its index file, records the seal.
    async fn seal(&self, old: Arc<OpenLedger>) -> Result<LedgerRecord, LifecycleError> {
        let shared = self.inner.shared.clone();
        shared.journal.barrier().await?;
        let record = match &old.quorum {
            Some(quorum) => self.seal_replicated(&old, quorum).await?,
            None => {
                let (entries, info) = {
                    let w = old.written();
                    (w.entries.clone(), w.seal_info(old.first_segment))
                };
                seal_ledger(&shared, old.id, entries, info).await?
            }
        };
        {
            // Only over its own open view: a record set meanwhile (a later state) stays.
            let mut ledgers = lock(&self.inner.ledgers);
            if LedgerView::is_open(ledgers.get(&record.id), &old) {
                ledgers.insert(record.id, LedgerView::Closed(Box::new(record.clone())));
            }
        }
        tracing::debug!(topic = %self.inner.name, ledger = record.id,
            entries = record.seal.map_or(0, |s| s.entry_count), "sealed ledger");
        Ok(record)
    }

    /// The topic's ledgers in order, deleted ones (lake only) included, expired ones not.
    pub fn ledgers(&self) -> Vec<LedgerInfo> {
        lock(&self.inner.ledgers)
            .values()
            .map(|v| match v {
                LedgerView::Open(o) => {
                    let w = o.written();
                    let info = w.seal_info(o.first_segment);
                    LedgerInfo {
                        id: o.id,
                        state: LedgerState::Open,
                        entry_count: o.confirmed(),
                        size_bytes: info.size_bytes,
                        min_publish_ms: info.min_publish_ms,
                        max_publish_ms: info.max_publish_ms,
                        from_lake: false,
                    }
                }
                LedgerView::Closed(r) => LedgerInfo {
                    id: r.id,
                    state: r.state,
                    entry_count: r.seal.map_or_else(
                        || self.inner.foreign_open.get(&r.id).copied().unwrap_or(0),
                        |s| s.entry_count,
                    ),
                    size_bytes: r.seal.map_or(0, |s| s.size_bytes),
                    min_publish_ms: r.seal.and_then(|s| s.min_publish_ms),
                    max_publish_ms: r.seal.and_then(|s| s.max_publish_ms),
                    from_lake: self.lake_holds_for_this_log(r),
                },
            })
            .collect()
    }

    /// Position of the last durable entry of the topic, `None` when it has none.
    pub fn last_confirmed(&self) -> Option<Position> {
        *self.inner.lac.borrow()
    }

    /// A watch that changes whenever a new entry becomes durable (for tailing readers).
    pub fn watch_confirmed(&self) -> watch::Receiver<Option<Position>> {
        self.inner.lac.subscribe()
    }

    /// Updates the topic's view after the service changed a ledger's state. A record older
    /// than the view's (a state earlier in the lifecycle, read before a later transition) is
    /// ignored: states only move forward. A sealed record of a ledger the view had as another
    /// writer's open one (a takeover) moves the last confirmed position up to its last entry.
    pub(crate) fn set_record(&self, record: LedgerRecord) {
        let mut ledgers = lock(&self.inner.ledgers);
        if record.state == LedgerState::Expired {
            ledgers.remove(&record.id);
        } else if let Some(v) = ledgers.get_mut(&record.id) {
            if matches!(v, LedgerView::Closed(old) if old.state.as_u8() > record.state.as_u8()) {
                return;
            }
            let last = record
                .seal
                .as_ref()
                .and_then(|s| s.entry_count.checked_sub(1))
                .map(|e| Position::new(record.id, e));
            *v = LedgerView::Closed(Box::new(record));
            if let Some(last) = last {
                self.inner.lac.send_if_modified(|lac| {
                    let behind = lac.is_none_or(|p| p < last);
                    if behind {
                        *lac = Some(last);
                    }
                    behind
                });
            }
        }
    }

    /// Applies the records of ledgers that moved on past sealing (offloaded, deleted locally,
    /// expired) since this view was made.
    pub(crate) fn catch_up(&self, records: Vec<LedgerRecord>) {
        for r in records {
            if matches!(
                r.state,
                LedgerState::Offloaded | LedgerState::Deleted | LedgerState::Expired
            ) {
                self.set_record(r);
            }
        }
    }
}
