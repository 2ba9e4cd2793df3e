//! The journal: one dedicated OS thread that owns the active segment file, writes the appends of
//! every topic in arrival order and makes them durable with group commit (one `fdatasync` for
//! everything that queued up while the previous one ran).
//!
//! Invariants:
//! - Appends are written in the order they were submitted; an append is acknowledged only after
//!   every earlier append is acknowledged.
//! - With `sync = "always"` an append is acknowledged only after an `fdatasync` that covers it.
//! - After any I/O error the journal fails-stop: the error is reported to every pending and later
//!   append; nothing written after the error is ever acknowledged.
//! - No async worker thread ever blocks on this file: async callers talk to the thread through a
//!   channel and oneshot replies.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::error::AppendError;
use super::index::IndexEntry;
use super::open_ledger::OpenLedger;
use super::record::{encode_record, RECORD_OVERHEAD, SEGMENT_HEADER_LEN};
use super::segment::{create_segment, write_clean_marker};
use super::Position;
use crate::config::SyncPolicy;

/// One append handed to the journal.
pub(crate) struct AppendRequest {
    pub ledger: Arc<OpenLedger>,
    pub entry_id: u64,
    pub publish_time_ms: i64,
    pub payload: Bytes,
    pub reply: oneshot::Sender<Result<Position, AppendError>>,
    /// Backpressure: released when the request is done.
    pub _permit: OwnedSemaphorePermit,
}

pub(crate) enum Command {
    Append(AppendRequest),
    /// Replies once everything submitted before it is durable.
    Barrier(oneshot::Sender<Result<(), AppendError>>),
    /// Flushes, fsyncs and stops the thread.
    Shutdown(oneshot::Sender<Result<(), AppendError>>),
}

/// Settings of the journal thread.
#[derive(Debug, Clone)]
pub(crate) struct JournalSettings {
    pub dir: PathBuf,
    pub segment_size: u64,
    pub preallocate: bool,
    pub sync: SyncPolicy,
    pub sync_interval: Duration,
    pub group_commit_max_bytes: usize,
}

/// Handle to the journal thread.
#[derive(Debug)]
pub(crate) struct Journal {
    tx: Sender<Command>,
    /// Invariant: the id of the segment new appends go to (only grows).
    current_segment: Arc<AtomicU32>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Journal {
    /// Starts the journal writing into a new segment `first_segment`.
    pub fn start(settings: JournalSettings, first_segment: u32) -> std::io::Result<Journal> {
        let prealloc = if settings.preallocate {
            settings.segment_size
        } else {
            0
        };
        let file = create_segment(&settings.dir, first_segment, prealloc)?;
        let (tx, rx) = mpsc::channel();
        let current_segment = Arc::new(AtomicU32::new(first_segment));
        let writer = Writer {
            settings,
            rx,
            file,
            segment: first_segment,
            offset: SEGMENT_HEADER_LEN,
            current_segment: current_segment.clone(),
            failed: None,
            dirty_since: None,
            buf: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("ledger-journal".into())
            .spawn(move || writer.run())?;
        Ok(Journal {
            tx,
            current_segment,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The segment new appends go to (a lower bound for entries appended from now on).
    pub fn current_segment(&self) -> u32 {
        self.current_segment.load(Ordering::Acquire)
    }

    /// Submits an append. Errors only if the journal thread is gone.
    pub fn submit(&self, req: AppendRequest) -> Result<(), AppendError> {
        self.tx
            .send(Command::Append(req))
            .map_err(|_| AppendError::Closed)
    }

    /// Waits until everything submitted before this call is durable.
    pub async fn barrier(&self) -> Result<(), AppendError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Barrier(tx))
            .map_err(|_| AppendError::Closed)?;
        rx.await.map_err(|_| AppendError::Closed)?
    }

    /// Flushes, fsyncs and stops the thread; later appends fail with [`AppendError::Closed`].
    pub async fn shutdown(&self) -> Result<(), AppendError> {
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send(Command::Shutdown(tx)).is_ok();
        let result = if sent {
            rx.await.unwrap_or(Err(AppendError::Closed))
        } else {
            Ok(())
        };
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            // Joining blocks; the thread has already replied, so this returns at once.
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        result
    }
}

/// One located record of the batch being written.
struct Placed {
    req: AppendRequest,
    at: IndexEntry,
    crc: u32,
}

struct Writer {
    settings: JournalSettings,
    rx: Receiver<Command>,
    file: File,
    segment: u32,
    /// Invariant: bytes `[0, offset)` of `file` hold the header and whole records.
    offset: u64,
    current_segment: Arc<AtomicU32>,
    failed: Option<Arc<str>>,
    /// Set when bytes were written but not yet fdatasync'ed (interval/never policies).
    dirty_since: Option<Instant>,
    buf: Vec<u8>,
}

impl Writer {
    fn run(mut self) {
        let mut batch: Vec<AppendRequest> = Vec::new();
        let mut barriers: Vec<oneshot::Sender<Result<(), AppendError>>> = Vec::new();
        loop {
            let first = match self.next_command() {
                Some(cmd) => cmd,
                None => {
                    // All senders dropped: the log was dropped without shutdown.
                    let _ = self.sync();
                    return;
                }
            };
            let mut shutdown = None;
            let mut bytes = 0usize;
            if let Some(first) = first {
                let mut next = Some(first);
                while let Some(cmd) = next.take() {
                    match cmd {
                        Command::Append(r) => {
                            bytes += r.payload.len() + RECORD_OVERHEAD;
                            batch.push(r);
                        }
                        Command::Barrier(tx) => barriers.push(tx),
                        Command::Shutdown(tx) => shutdown = Some(tx),
                    }
                    if bytes < self.settings.group_commit_max_bytes && shutdown.is_none() {
                        next = self.rx.try_recv().ok();
                    }
                }
            }
            self.process(&mut batch, &mut barriers, shutdown.is_some());
            if let Some(tx) = shutdown {
                // Fail anything that raced in after the shutdown request.
                while let Ok(cmd) = self.rx.try_recv() {
                    match cmd {
                        Command::Append(r) => {
                            let _ = r.reply.send(Err(AppendError::Closed));
                        }
                        Command::Barrier(b) | Command::Shutdown(b) => {
                            let _ = b.send(Err(AppendError::Closed));
                        }
                    }
                }
                let result = match &self.failed {
                    Some(e) => Err(AppendError::JournalFailed(e.clone())),
                    None => self.finish_clean().map_err(|e| {
                        AppendError::JournalFailed(format!("clean shutdown: {e}").into())
                    }),
                };
                let _ = tx.send(result);
                return;
            }
        }
    }

    /// Blocks for the next command. `Some(None)` means "time to sync" under the interval policy;
    /// `None` means every sender is gone.
    fn next_command(&mut self) -> Option<Option<Command>> {
        match (self.settings.sync, self.dirty_since) {
            (SyncPolicy::IntervalMs, Some(since)) => {
                let due = since + self.settings.sync_interval;
                let wait = due.saturating_duration_since(Instant::now());
                match self.rx.recv_timeout(wait) {
                    Ok(cmd) => Some(Some(cmd)),
                    Err(RecvTimeoutError::Timeout) => Some(None),
                    Err(RecvTimeoutError::Disconnected) => None,
                }
            }
            _ => self.rx.recv().ok().map(Some),
        }
    }

    fn process(
        &mut self,
        batch: &mut Vec<AppendRequest>,
        barriers: &mut Vec<oneshot::Sender<Result<(), AppendError>>>,
        force_sync: bool,
    ) {
        if let Some(err) = self.failed.clone() {
            for r in batch.drain(..) {
                let _ = r.reply.send(Err(AppendError::JournalFailed(err.clone())));
            }
            for b in barriers.drain(..) {
                let _ = b.send(Err(AppendError::JournalFailed(err.clone())));
            }
            return;
        }
        let placed = match self.write(batch) {
            Ok(p) => p,
            Err((e, unacked)) => {
                self.fail(
                    format!("write to segment {}: {e}", self.segment),
                    unacked,
                    barriers,
                );
                return;
            }
        };
        let need_sync = match self.settings.sync {
            SyncPolicy::Always => !placed.is_empty() || !barriers.is_empty() || force_sync,
            SyncPolicy::IntervalMs => {
                force_sync
                    || !barriers.is_empty()
                    || self
                        .dirty_since
                        .is_some_and(|t| t.elapsed() >= self.settings.sync_interval)
            }
            SyncPolicy::Never => force_sync,
        };
        if need_sync {
            if let Err(e) = self.sync() {
                let unacked = placed.into_iter().map(|p| p.req).collect();
                self.fail(
                    format!("fdatasync of segment {}: {e}", self.segment),
                    unacked,
                    barriers,
                );
                return;
            }
        }
        for p in placed {
            p.req.ledger.confirm(p.req.entry_id);
            let pos = Position::new(p.req.ledger.id, p.req.entry_id);
            let _ = p.req.reply.send(Ok(pos));
        }
        for b in barriers.drain(..) {
            let _ = b.send(Ok(()));
        }
    }

    fn fail(
        &mut self,
        msg: String,
        unacked: Vec<AppendRequest>,
        barriers: &mut Vec<oneshot::Sender<Result<(), AppendError>>>,
    ) {
        tracing::error!(error = %msg, "journal failed; refusing further appends until restart");
        let err: Arc<str> = msg.into();
        self.failed = Some(err.clone());
        for r in unacked {
            let _ = r.reply.send(Err(AppendError::JournalFailed(err.clone())));
        }
        for b in barriers.drain(..) {
            let _ = b.send(Err(AppendError::JournalFailed(err.clone())));
        }
    }

    fn sync(&mut self) -> std::io::Result<()> {
        if self.dirty_since.take().is_some() {
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Encodes and writes the batch, rolling segments as needed, and records each entry's
    /// location in its ledger. On error returns every request of the batch (none is acknowledged).
    fn write(
        &mut self,
        batch: &mut Vec<AppendRequest>,
    ) -> Result<Vec<Placed>, (std::io::Error, Vec<AppendRequest>)> {
        let mut placed: Vec<Placed> = Vec::with_capacity(batch.len());
        self.buf.clear();
        let mut buf_start = self.offset;
        let mut pending = batch.drain(..);
        let unplaced = |placed: Vec<Placed>, rest: &mut dyn Iterator<Item = AppendRequest>| {
            placed
                .into_iter()
                .map(|p| p.req)
                .chain(rest)
                .collect::<Vec<_>>()
        };
        while let Some(req) = pending.next() {
            let len = (RECORD_OVERHEAD + req.payload.len()) as u64;
            let end = buf_start + self.buf.len() as u64;
            if end + len > self.settings.segment_size && end > SEGMENT_HEADER_LEN {
                // Flush what belongs to this segment, then roll.
                if let Err(e) = self.flush_buf(buf_start).and_then(|()| self.roll()) {
                    let mut rest = std::iter::once(req).chain(pending);
                    return Err((e, unplaced(placed, &mut rest)));
                }
                buf_start = self.offset;
            }
            let offset = buf_start + self.buf.len() as u64;
            let crc = encode_record(
                &mut self.buf,
                req.ledger.id,
                req.entry_id,
                req.publish_time_ms,
                &req.payload,
            );
            placed.push(Placed {
                at: IndexEntry {
                    segment: self.segment,
                    offset: offset as u32,
                    len: len as u32,
                    publish_time_ms: req.publish_time_ms,
                },
                crc,
                req,
            });
        }
        if let Err(e) = self.flush_buf(buf_start) {
            return Err((e, unplaced(placed, &mut std::iter::empty())));
        }
        for p in &placed {
            p.req
                .ledger
                .written()
                .push(p.at, p.req.payload.len(), p.crc);
        }
        Ok(placed)
    }

    fn flush_buf(&mut self, at: u64) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.file.write_all_at(&self.buf, at)?;
        self.offset = at + self.buf.len() as u64;
        self.buf.clear();
        if self.dirty_since.is_none() {
            self.dirty_since = Some(Instant::now());
        }
        Ok(())
    }

    /// Clean shutdown: trims the active segment to its written length, fsyncs it and records the
    /// durable end in the clean-shutdown marker, so recovery treats any bad byte before it as
    /// corruption rather than a torn tail.
    fn finish_clean(&mut self) -> std::io::Result<()> {
        self.file.sync_data()?;
        self.dirty_since = None;
        self.file.set_len(self.offset)?;
        self.file.sync_all()?;
        write_clean_marker(&self.settings.dir, self.segment, self.offset)
    }

    /// Seals the active segment (fsync, trim the preallocated tail) and opens the next one.
    fn roll(&mut self) -> std::io::Result<()> {
        self.file.sync_data()?;
        self.dirty_since = None;
        self.file.set_len(self.offset)?;
        self.file.sync_all()?;
        let next = self.segment + 1;
        let prealloc = if self.settings.preallocate {
            self.settings.segment_size
        } else {
            0
        };
        self.file = create_segment(&self.settings.dir, next, prealloc)?;
        self.segment = next;
        self.offset = SEGMENT_HEADER_LEN;
        self.current_segment.store(next, Ordering::Release);
        Ok(())
    }
}
