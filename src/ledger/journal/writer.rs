//! The writer thread: collects queued appends into a batch, encodes and writes it to the active
//! segment (rolling segments as needed) and hands it to the sync pipeline.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::oneshot;

use super::sync::{Pipeline, Placed, WrittenBatch};
use super::{AppendRequest, Command, JournalSettings};
use crate::config::SyncPolicy;
use crate::ledger::error::AppendError;
use crate::ledger::index::IndexEntry;
use crate::ledger::record::{encode_record, RECORD_OVERHEAD, SEGMENT_HEADER_LEN};
use crate::ledger::segment::{create_segment, write_clean_marker};

type BarrierReply = oneshot::Sender<Result<(), AppendError>>;

pub(super) struct Writer {
    pub settings: JournalSettings,
    pub rx: Receiver<Command>,
    pub file: Arc<File>,
    pub segment: u32,
    /// Invariant: bytes `[0, offset)` of `file` hold the header and whole records.
    pub offset: u64,
    pub current_segment: Arc<AtomicU32>,
    /// Set when bytes were written but not yet fdatasync'ed by this thread (interval/never).
    pub dirty_since: Option<Instant>,
    pub buf: Vec<u8>,
    pub pipeline: Pipeline,
    pub syncers: Vec<JoinHandle<()>>,
}

impl Writer {
    pub fn run(mut self) {
        loop {
            let Some(first) = self.next_command() else {
                // Every sender is gone: the log was dropped without shutdown. Make what was
                // written durable and stop.
                let _ = self.stop_syncers();
                let _ = self.file.sync_data();
                return;
            };
            let mut batch: Vec<AppendRequest> = Vec::new();
            let mut barriers: Vec<BarrierReply> = Vec::new();
            let mut shutdown = None;
            let mut bytes = 0usize;
            let mut next = first;
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
            self.process(batch, barriers, shutdown.is_some());
            if let Some(tx) = shutdown {
                let _ = tx.send(self.shutdown());
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
        batch: Vec<AppendRequest>,
        barriers: Vec<BarrierReply>,
        force_sync: bool,
    ) {
        if let Some(err) = self.pipeline.failed() {
            fail_requests(batch, barriers, &err);
            return;
        }
        let placed = match self.write(batch) {
            Ok(p) => p,
            Err((e, unacked)) => {
                let msg: Arc<str> = format!("write to segment {}: {e}", self.segment).into();
                self.pipeline.fail(msg.clone());
                fail_requests(unacked, barriers, &msg);
                return;
            }
        };
        record_locations(&placed);
        let written = WrittenBatch { placed, barriers };
        if self.settings.sync == SyncPolicy::Always {
            self.pipeline.register(written, false);
            return;
        }
        let due = self
            .dirty_since
            .is_some_and(|t| t.elapsed() >= self.settings.sync_interval);
        let need_sync = force_sync
            || !written.barriers.is_empty()
            || (self.settings.sync == SyncPolicy::IntervalMs && due);
        if need_sync {
            if let Err(e) = self.sync() {
                let msg: Arc<str> = format!("fdatasync of segment {}: {e}", self.segment).into();
                self.pipeline.fail(msg.clone());
                written.fail(&msg);
                return;
            }
        }
        self.pipeline.register(written, true);
    }

    fn sync(&mut self) -> std::io::Result<()> {
        if self.dirty_since.take().is_some() {
            super::fdatasync(&self.file)?;
        }
        Ok(())
    }

    /// Encodes and writes the batch, rolling segments as needed. On error returns every request
    /// of the batch (none is acknowledged).
    fn write(
        &mut self,
        batch: Vec<AppendRequest>,
    ) -> Result<Vec<Placed>, (std::io::Error, Vec<AppendRequest>)> {
        let mut placed: Vec<Placed> = Vec::with_capacity(batch.len());
        self.buf.clear();
        let mut buf_start = self.offset;
        let mut pending = batch.into_iter();
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

    /// Seals the active segment (fsync, trim the preallocated tail) and opens the next one.
    /// Everything registered so far lives in this or earlier (already synced) segments, so after
    /// the fsync it is all durable.
    fn roll(&mut self) -> std::io::Result<()> {
        super::fdatasync(&self.file)?;
        self.dirty_since = None;
        self.pipeline.mark_all_durable();
        self.file.set_len(self.offset)?;
        self.file.sync_all()?;
        let next = self.segment + 1;
        let prealloc = if self.settings.preallocate {
            self.settings.segment_size
        } else {
            0
        };
        self.file = Arc::new(create_segment(&self.settings.dir, next, prealloc)?);
        self.pipeline.set_file(self.file.clone());
        self.segment = next;
        self.offset = SEGMENT_HEADER_LEN;
        self.current_segment.store(next, Ordering::Release);
        Ok(())
    }

    fn stop_syncers(&mut self) -> Result<(), Arc<str>> {
        let drained = self.pipeline.drain_and_stop();
        for s in self.syncers.drain(..) {
            let _ = s.join();
        }
        drained
    }

    /// Clean shutdown: waits for every batch to be durable, trims the active segment, fsyncs it
    /// and records the durable end in the clean-shutdown marker, so recovery treats any bad byte
    /// before it as corruption rather than a torn tail. Fails anything that raced in after the
    /// shutdown request.
    fn shutdown(&mut self) -> Result<(), AppendError> {
        while let Ok(cmd) = self.rx.try_recv() {
            match cmd {
                Command::Append(r) => r.answer(Err(AppendError::Closed)),
                Command::Barrier(b) | Command::Shutdown(b) => {
                    let _ = b.send(Err(AppendError::Closed));
                }
            }
        }
        self.stop_syncers().map_err(AppendError::JournalFailed)?;
        let finish = || -> std::io::Result<()> {
            self.file.sync_data()?;
            self.file.set_len(self.offset)?;
            self.file.sync_all()?;
            write_clean_marker(&self.settings.dir, self.segment, self.offset)
        };
        finish().map_err(|e| AppendError::JournalFailed(format!("clean shutdown: {e}").into()))
    }
}

/// Records where each entry landed in its ledger's in-memory index (one lock per ledger run).
fn record_locations(placed: &[Placed]) {
    let mut i = 0;
    while i < placed.len() {
        let ledger = &placed[i].req.ledger;
        let mut w = ledger.written();
        while i < placed.len() && Arc::ptr_eq(&placed[i].req.ledger, ledger) {
            let p = &placed[i];
            w.push_at(p.req.entry_id, p.at, p.req.payload.len(), p.crc);
            i += 1;
        }
    }
}

fn fail_requests(batch: Vec<AppendRequest>, barriers: Vec<BarrierReply>, err: &Arc<str>) {
    WrittenBatch {
        placed: Vec::new(),
        barriers,
    }
    .fail(err);
    for r in batch {
        r.answer(Err(AppendError::JournalFailed(err.clone())));
    }
}
