//! The journal: a dedicated writer thread owns the active segment file and writes the appends of
//! every topic in arrival order; a small pool of syncer threads makes them durable with
//! pipelined group commit: while one `fdatasync` runs, the writer keeps writing and a second
//! syncer can start an `fdatasync` covering the newer bytes, so an append rarely waits for a sync
//! that started before it was written.
//!
//! Invariants:
//! - Appends are written in the order they were submitted; an append is acknowledged only after
//!   every earlier append is acknowledged.
//! - With `sync = "always"` an append is acknowledged only after an `fdatasync` that covers it.
//! - After any I/O error the journal fails-stop: the error is reported to every pending and later
//!   append; nothing written after the error is ever acknowledged.
//! - Acknowledgements leave in write order, whichever syncer finished first (an `fdatasync`
//!   started after batch k was written covers every batch up to k).
//! - No async worker thread ever blocks on this file: async callers talk to the threads through
//!   a channel and oneshot replies.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::error::AppendError;
use super::open_ledger::OpenLedger;
use super::record::SEGMENT_HEADER_LEN;
use super::segment::create_segment;
use super::Position;
use crate::config::SyncPolicy;

mod sync;
mod writer;

/// Syncer threads: two let one `fdatasync` start while another is in flight.
const SYNCERS: usize = 2;

/// One append handed to the journal.
pub(crate) struct AppendRequest {
    pub ledger: Arc<OpenLedger>,
    pub entry_id: u64,
    pub publish_time_ms: i64,
    pub payload: Bytes,
    pub reply: Reply,
    /// Backpressure: released when the request is done.
    pub _permit: OwnedSemaphorePermit,
}

/// Who learns the outcome of an append.
pub(crate) enum Reply {
    /// The appender (an unreplicated ledger's producer, or a writer waiting on a replica).
    Direct(oneshot::Sender<Result<Position, AppendError>>),
    /// A replicated ledger this node writes: success reaches its quorum through
    /// [`OpenLedger::confirm`]; a failure breaks the quorum, so that receipts waiting on this
    /// journal fail instead of waiting forever.
    Quorum,
}

impl AppendRequest {
    /// Tells whoever waits on this append how it ended.
    pub fn answer(self, result: Result<Position, AppendError>) {
        match self.reply {
            Reply::Direct(tx) => {
                let _ = tx.send(result);
            }
            Reply::Quorum => {
                if let (Err(e), Some(q)) = (result, &self.ledger.quorum) {
                    q.journal_failed(&e.to_string());
                }
            }
        }
    }
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
    /// The sync pipeline, kept to report a failure (fail-stop) to health checks.
    pipeline: sync::Pipeline,
}

impl Journal {
    /// Starts the journal writing into a new segment `first_segment`.
    pub fn start(settings: JournalSettings, first_segment: u32) -> std::io::Result<Journal> {
        let prealloc = if settings.preallocate {
            settings.segment_size
        } else {
            0
        };
        let file = Arc::new(create_segment(&settings.dir, first_segment, prealloc)?);
        let (tx, rx) = mpsc::channel();
        let current_segment = Arc::new(AtomicU32::new(first_segment));
        let pipeline = sync::Pipeline::new(file.clone());
        let mut syncers = Vec::new();
        if settings.sync == SyncPolicy::Always {
            for i in 0..SYNCERS {
                let p = pipeline.clone();
                syncers.push(
                    std::thread::Builder::new()
                        .name(format!("ledger-sync-{i}"))
                        .spawn(move || p.run_syncer())?,
                );
            }
        }
        let writer = writer::Writer {
            settings,
            rx,
            file,
            segment: first_segment,
            offset: SEGMENT_HEADER_LEN,
            current_segment: current_segment.clone(),
            dirty_since: None,
            buf: Vec::new(),
            pipeline: pipeline.clone(),
            syncers,
        };
        let thread = std::thread::Builder::new()
            .name("ledger-journal".into())
            .spawn(move || writer.run())?;
        Ok(Journal {
            tx,
            current_segment,
            thread: Mutex::new(Some(thread)),
            pipeline,
        })
    }

    /// The I/O error that stopped the journal (fail-stop until restart), if any.
    pub fn failure(&self) -> Option<Arc<str>> {
        self.pipeline.failed()
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

/// `fdatasync` of a segment; every journal sync goes through here (the `journal.fdatasync`
/// failpoint makes it fail, as a failing disk would).
pub(super) fn fdatasync(file: &std::fs::File) -> std::io::Result<()> {
    crate::failpoint::io_error("journal.fdatasync")?;
    file.sync_data()
}
