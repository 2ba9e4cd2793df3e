//! Pipelined group commit: written batches wait here until an `fdatasync` covers them, then are
//! acknowledged strictly in write order.
//!
//! Invariants (under `State`'s lock):
//! - `durable <= claimed <= written` does not hold in general (the writer may mark batches
//!   durable itself when it syncs inline), but `durable <= written` always does, and every batch
//!   with sequence `<= durable` has been acknowledged or is being acknowledged under `ack_lock`.
//! - A syncer that claims target `k` syncs a file handle taken under the lock after batch `k`
//!   was registered, so its `fdatasync` covers every byte of batches `<= k` in that file; bytes
//!   of earlier files were synced when the writer rolled to a new segment.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::AppendRequest;
use crate::ledger::error::AppendError;
use crate::ledger::index::IndexEntry;
use crate::ledger::Position;

/// A record placed in a segment.
pub(super) struct Placed {
    pub req: AppendRequest,
    pub at: IndexEntry,
    pub crc: u32,
}

/// A batch written to the segment, waiting to be acknowledged.
#[derive(Default)]
pub(super) struct WrittenBatch {
    pub placed: Vec<Placed>,
    pub barriers: Vec<oneshot::Sender<Result<(), AppendError>>>,
}

impl WrittenBatch {
    /// Acknowledges every append (confirming each ledger once, at its last entry) and barrier.
    fn acknowledge(self) {
        let mut i = 0;
        while i < self.placed.len() {
            let ledger = &self.placed[i].req.ledger;
            let mut j = i;
            while j + 1 < self.placed.len() && Arc::ptr_eq(&self.placed[j + 1].req.ledger, ledger) {
                j += 1;
            }
            ledger.confirm(self.placed[j].req.entry_id);
            i = j + 1;
        }
        for p in self.placed {
            let pos = Position::new(p.req.ledger.id, p.req.entry_id);
            p.req.answer(Ok(pos));
        }
        for b in self.barriers {
            let _ = b.send(Ok(()));
        }
    }

    /// Fails every append and barrier of the batch.
    pub fn fail(self, err: &Arc<str>) {
        for p in self.placed {
            p.req.answer(Err(AppendError::JournalFailed(err.clone())));
        }
        for b in self.barriers {
            let _ = b.send(Err(AppendError::JournalFailed(err.clone())));
        }
    }
}

struct State {
    /// Segment file new syncs cover.
    file: Arc<File>,
    /// Batches registered (sequence numbers are `1..=written`).
    written: u64,
    /// Highest target a syncer has started an `fdatasync` for.
    claimed: u64,
    /// Highest batch known durable.
    durable: u64,
    /// Registered, not yet acknowledged batches, ascending.
    pending: VecDeque<(u64, WrittenBatch)>,
    failed: Option<Arc<str>>,
    stopping: bool,
}

struct Inner {
    state: Mutex<State>,
    /// Invariant: true once `state.failed` is set (read without the lock on every append).
    failed: std::sync::atomic::AtomicBool,
    cond: Condvar,
    /// Held while acknowledging, taken before the state lock is released: acks stay in order.
    ack_lock: Mutex<()>,
}

/// Shared between the writer thread and the syncer threads.
#[derive(Clone)]
pub(super) struct Pipeline {
    inner: Arc<Inner>,
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("failed", &self.failed())
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    pub fn new(file: Arc<File>) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    file,
                    written: 0,
                    claimed: 0,
                    durable: 0,
                    pending: VecDeque::new(),
                    failed: None,
                    stopping: false,
                }),
                cond: Condvar::new(),
                ack_lock: Mutex::new(()),
                failed: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// The error that stopped the journal, if any.
    pub fn failed(&self) -> Option<Arc<str>> {
        if !self.inner.failed.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        relock(&self.inner.state).failed.clone()
    }

    /// Registers a fully written batch. `durable_now`: the writer already made it durable (or
    /// the policy does not wait for `fdatasync`), so acknowledge at once.
    pub fn register(&self, batch: WrittenBatch, durable_now: bool) {
        let mut st = relock(&self.inner.state);
        if let Some(err) = st.failed.clone() {
            drop(st);
            batch.fail(&err);
            return;
        }
        st.written += 1;
        let seq = st.written;
        st.pending.push_back((seq, batch));
        if durable_now {
            let _ = self.complete(st, seq);
        } else {
            drop(st);
            self.inner.cond.notify_one();
        }
    }

    /// The writer synced the current file itself: everything registered is durable.
    pub fn mark_all_durable(&self) {
        let st = relock(&self.inner.state);
        let target = st.written;
        let _ = self.complete(st, target);
    }

    /// Switches the file later syncs cover (after the writer synced the old one).
    pub fn set_file(&self, file: Arc<File>) {
        relock(&self.inner.state).file = file;
    }

    /// Marks batches `<= target` durable and acknowledges them in order; returns how many.
    fn complete(&self, mut st: MutexGuard<'_, State>, target: u64) -> usize {
        if target <= st.durable {
            return 0;
        }
        st.durable = target;
        let mut done = Vec::new();
        while st.pending.front().is_some_and(|(seq, _)| *seq <= target) {
            if let Some((_, b)) = st.pending.pop_front() {
                done.push(b);
            }
        }
        let ack = relock(&self.inner.ack_lock);
        drop(st);
        let n = done.len();
        for b in done {
            b.acknowledge();
        }
        drop(ack);
        self.inner.cond.notify_all();
        n
    }

    /// Stops the journal: every pending and later batch fails with `msg`.
    pub fn fail(&self, msg: Arc<str>) {
        let mut st = relock(&self.inner.state);
        if st.failed.is_none() {
            tracing::error!(error = %msg, "journal failed; refusing further appends until restart");
        }
        let err = st.failed.get_or_insert(msg).clone();
        self.inner
            .failed
            .store(true, std::sync::atomic::Ordering::Release);
        let pending: Vec<_> = st.pending.drain(..).map(|(_, b)| b).collect();
        let ack = relock(&self.inner.ack_lock);
        drop(st);
        for b in pending {
            b.fail(&err);
        }
        drop(ack);
        self.inner.cond.notify_all();
    }

    /// Waits until every registered batch is durable (or the journal failed), then lets the
    /// syncers exit.
    pub fn drain_and_stop(&self) -> Result<(), Arc<str>> {
        let mut st = relock(&self.inner.state);
        st.stopping = true;
        self.inner.cond.notify_all();
        while st.failed.is_none() && st.durable < st.written {
            st = self.inner.cond.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        match &st.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Body of a syncer thread.
    pub fn run_syncer(self) {
        let mut st = relock(&self.inner.state);
        loop {
            if st.failed.is_some() || (st.stopping && st.claimed >= st.written) {
                return;
            }
            if st.written > st.claimed && st.written > st.durable {
                let target = st.written;
                st.claimed = target;
                let file = st.file.clone();
                drop(st);
                let started = std::time::Instant::now();
                let result = super::fdatasync(&file);
                let metrics = crate::metrics::node();
                metrics
                    .journal_fsync_seconds
                    .observe(started.elapsed().as_secs_f64());
                st = relock(&self.inner.state);
                match result {
                    Ok(()) => {
                        let batches = self.complete(st, target);
                        if batches > 0 {
                            metrics.journal_group_commit_batches.observe(batches as f64);
                        }
                        st = relock(&self.inner.state);
                    }
                    Err(e) => {
                        drop(st);
                        self.fail(format!("fdatasync: {e}").into());
                        st = relock(&self.inner.state);
                    }
                }
            } else {
                st = self.inner.cond.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}
