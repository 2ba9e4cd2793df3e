//! Positional reads of records from segment files, verified before they are returned.
//!
//! All file access runs on the blocking pool. Neighbouring records of a range (same segment,
//! within [`COALESCE_WINDOW`]) are fetched with a single `pread`, which keeps sequential reads
//! (consumers catching up, the offloader) close to disk bandwidth even though topics interleave
//! in the segments.

use std::sync::Arc;

use super::error::ReadError;
use super::index::{IndexEntry, IndexFileError};
use super::metadata::{LedgerId, LedgerRecord, LedgerState};
use bytes::Bytes;

use super::record::{decode_record_shared, Decoded};
use super::segment::segment_path;
use super::{Entry, LogShared, Position};

/// Largest single read used to fetch several neighbouring records.
pub const COALESCE_WINDOW: u64 = 1 << 20;

/// Decodes and verifies the record of `pos` found in `bytes` (the entry's payload is a slice of
/// them, not a copy).
fn verify(
    shared: &LogShared,
    pos: Position,
    at: IndexEntry,
    bytes: &Bytes,
) -> Result<Entry, ReadError> {
    let corrupt = |reason: String| ReadError::Corrupt {
        ledger: pos.ledger,
        entry: pos.entry,
        path: segment_path(shared.segments.dir(), at.segment),
        offset: u64::from(at.offset),
        reason,
    };
    match decode_record_shared(bytes, shared.max_record_body) {
        Decoded::Record { record, len, .. } => {
            if len != at.len as usize {
                return Err(corrupt(format!(
                    "record length {len} differs from the index ({})",
                    at.len
                )));
            }
            if record.ledger_id != pos.ledger || record.entry_id != pos.entry {
                return Err(corrupt(format!(
                    "record holds entry {}:{}",
                    record.ledger_id, record.entry_id
                )));
            }
            Ok(Entry {
                position: pos,
                publish_time_ms: record.publish_time_ms,
                payload: record.payload,
            })
        }
        Decoded::Invalid { reason } => Err(corrupt(reason.to_string())),
        Decoded::End => Err(corrupt("zeros where a record was expected".into())),
        Decoded::NeedMore { .. } => Err(corrupt("record is truncated".into())),
    }
}

fn io_error(
    shared: &LogShared,
    pos: Position,
    at: IndexEntry,
    source: std::io::Error,
) -> ReadError {
    let path = segment_path(shared.segments.dir(), at.segment);
    let offset = u64::from(at.offset);
    if source.kind() == std::io::ErrorKind::UnexpectedEof {
        // The index points past the end of the file: the segment was truncated.
        return ReadError::Corrupt {
            ledger: pos.ledger,
            entry: pos.entry,
            path,
            offset,
            reason: "segment file ends before the record (truncated)".into(),
        };
    }
    ReadError::Io {
        path,
        offset,
        source,
    }
}

/// The store's record of `ledger` when `error` is a missing local copy (index or segment file)
/// because the ledger moved on after the reader took its state: deleted locally (a read view
/// made from the store earlier, e.g. SQL's view of a topic this node has not loaded, does not
/// see housekeeping's deletion), or no longer this bookie's to hold whole (autorecovery gave
/// its place to another bookie while this node was away, and reclaim removed the copy);
/// `None` for any other error.
pub(crate) async fn moved_meanwhile(
    shared: &LogShared,
    ledger: LedgerId,
    error: &ReadError,
) -> Option<LedgerRecord> {
    let missing = match error {
        ReadError::Index(IndexFileError::Io { source, .. }) | ReadError::Io { source, .. } => {
            source.kind() == std::io::ErrorKind::NotFound
        }
        _ => false,
    };
    if !missing {
        return None;
    }
    match shared.meta.get_ledger(ledger).await {
        Ok(Some(r)) if r.state == LedgerState::Deleted || !shared.holds_whole(&r) => Some(r),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(ledger, error = %e, "ledger state could not be checked after a missing file");
            None
        }
    }
}

/// Reads and verifies one entry.
pub(crate) async fn read_one(
    shared: &Arc<LogShared>,
    pos: Position,
    at: IndexEntry,
) -> Result<Entry, ReadError> {
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || {
        let bytes = shared
            .segments
            .read_at(at.segment, u64::from(at.offset), at.len as usize)
            .map_err(|e| io_error(&shared, pos, at, e))?;
        verify(&shared, pos, at, &Bytes::from(bytes))
    })
    .await
    .map_err(|_| ReadError::Cancelled)?
}

/// Reads and verifies entries `first, first+1, …` located at `located`, leaving out those
/// the copy does not hold ([`IndexEntry::ABSENT`]: another stripe's, ADR 0017).
pub(crate) async fn read_located(
    shared: &Arc<LogShared>,
    ledger: LedgerId,
    first: u64,
    located: Vec<IndexEntry>,
) -> Result<Vec<Entry>, ReadError> {
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::with_capacity(located.len());
        let mut i = 0;
        while i < located.len() {
            if located[i].is_absent() {
                i += 1;
                continue;
            }
            // Extend the run while records stay in one segment, in order, inside the window.
            let start = located[i];
            let mut j = i + 1;
            let mut end = u64::from(start.offset) + u64::from(start.len);
            while j < located.len() {
                let next = located[j];
                let next_end = u64::from(next.offset) + u64::from(next.len);
                if next.is_absent()
                    || next.segment != start.segment
                    || u64::from(next.offset) < end
                    || next_end - u64::from(start.offset) > COALESCE_WINDOW
                {
                    break;
                }
                end = next_end;
                j += 1;
            }
            let base = u64::from(start.offset);
            let bytes = Bytes::from(
                shared
                    .segments
                    .read_at(start.segment, base, (end - base) as usize)
                    .map_err(|e| {
                        io_error(&shared, Position::new(ledger, first + i as u64), start, e)
                    })?,
            );
            for (k, at) in located[i..j].iter().enumerate() {
                let rel = (u64::from(at.offset) - base) as usize;
                let pos = Position::new(ledger, first + (i + k) as u64);
                out.push(verify(
                    &shared,
                    pos,
                    *at,
                    &bytes.slice(rel..rel + at.len as usize),
                )?);
            }
            i = j;
        }
        Ok(out)
    })
    .await
    .map_err(|_| ReadError::Cancelled)?
}
