//! Startup recovery: rebuild the indexes of ledgers left open by a crash by scanning the segments
//! that may hold their entries, and truncate a torn tail of the newest segment.
//!
//! Rules:
//! - Only the newest segment can hold a torn write (older ones were fsynced before the next was
//!   created). Its first invalid or incomplete record, or a run of zeros, ends the log there: the
//!   file is trimmed to that point and fsynced, so stale bytes can never reappear later.
//! - Invalid bytes anywhere else are corruption: recovery stops with the file and offset rather
//!   than serve a state it cannot vouch for.
//! - Entries of an open ledger must appear with dense ids from 0; anything else is corruption.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

use super::error::OpenError;
use super::index::IndexEntry;
use super::metadata::LedgerId;
use super::open_ledger::Written;
use super::record::{
    check_segment_header, decode_record, Decoded, InvalidRecord, RECORD_HEADER_LEN,
    SEGMENT_HEADER_LEN,
};
use super::segment::{list_segments, segment_path, sync_dir};
use super::stripe::Stripe;

const SCAN_CHUNK: usize = 8 << 20;

/// What the scan found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Id for the segment the journal writes next.
    pub next_segment: u32,
    /// Rebuilt state of every ledger that was open, by id.
    pub ledgers: BTreeMap<LedgerId, Written>,
    /// Segment and offset where a torn tail was cut, with the bytes dropped.
    pub truncated: Option<(u32, u64, u64)>,
    /// Records that failed their checksum but whose framing was intact (skipped, reported).
    pub corrupt_records: Vec<(u32, u64)>,
    /// The stripes of striped replica copies among them (ADR 0017); every other ledger is
    /// whole.
    stripes: HashMap<LedgerId, Stripe>,
}

/// Scans `dir` for the entries of the open ledgers (`open`: id → first segment; `stripes`:
/// those of striped replica copies, whose entries of other stripes are absent).
/// `durable_floor(last_segment)` gives the offset below which the newest segment is known to be
/// durable (end of sealed ledgers' entries in it, or a clean-shutdown marker): bad bytes below it
/// are corruption, never a torn tail.
pub(crate) fn scan(
    dir: &Path,
    open: &BTreeMap<LedgerId, u32>,
    stripes: HashMap<LedgerId, Stripe>,
    max_body: usize,
    durable_floor: impl Fn(u32) -> Result<u64, OpenError>,
) -> Result<Scan, OpenError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OpenError::Io { path, source }
    };
    let segments = list_segments(dir).map_err(io_err(dir))?;
    let mut result = Scan {
        next_segment: segments.last().map_or(1, |l| l + 1),
        ledgers: open.keys().map(|id| (*id, Written::default())).collect(),
        truncated: None,
        corrupt_records: Vec::new(),
        stripes,
    };
    let Some(&last) = segments.last() else {
        return Ok(result);
    };
    let start = open.values().min().copied().unwrap_or(last);
    let floor = durable_floor(last)?;
    for &segment in segments.iter().filter(|s| **s >= start || **s == last) {
        let tail = (segment == last).then_some(floor);
        scan_segment(dir, segment, tail, max_body, &mut result)?;
    }
    Ok(result)
}

/// Scans one segment. `tail` is `Some(durable floor)` for the newest segment, the only one that
/// may end in a torn write (at or after the floor).
fn scan_segment(
    dir: &Path,
    segment: u32,
    tail: Option<u64>,
    max_body: usize,
    result: &mut Scan,
) -> Result<(), OpenError> {
    let is_last = tail.is_some();
    let floor = tail.unwrap_or(u64::MAX);
    let path = segment_path(dir, segment);
    let io_err = |source| OpenError::Io {
        path: path.clone(),
        source,
    };
    let corrupt = |offset: u64, reason: String| OpenError::Corrupt {
        path: path.clone(),
        offset,
        reason,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io_err)?;
    let file_len = file.metadata().map_err(io_err)?.len();
    let mut header = [0u8; SEGMENT_HEADER_LEN as usize];
    let header_ok = file_len >= SEGMENT_HEADER_LEN
        && file.read_exact(&mut header).is_ok()
        && check_segment_header(&header, segment).is_ok();
    if !header_ok {
        if is_last && floor <= SEGMENT_HEADER_LEN {
            // Created but never made durable with its header: nothing in it was acknowledged.
            tracing::warn!(path = %path.display(), "removing segment with incomplete header");
            drop(file);
            fs::remove_file(&path).map_err(io_err)?;
            sync_dir(dir).map_err(io_err)?;
            return Ok(());
        }
        let reason = check_segment_header(&header, segment)
            .err()
            .map_or("file shorter than its header".to_string(), |e| {
                e.to_string()
            });
        return Err(corrupt(0, reason));
    }

    let mut buf: Vec<u8> = Vec::with_capacity(SCAN_CHUNK);
    let mut base = SEGMENT_HEADER_LEN; // file offset of buf[0]
    let mut pos = 0usize; // cursor in buf
    let mut eof = false;
    let mut last_skipped: Option<u64> = None;
    let end = loop {
        // Keep at least one record header, or the needed bytes, in the buffer.
        if !eof && buf.len() - pos < SCAN_CHUNK / 2 {
            buf.drain(..pos);
            base += pos as u64;
            pos = 0;
            eof = fill(&mut file, &mut buf, SCAN_CHUNK).map_err(io_err)?;
        }
        let offset = base + pos as u64;
        if pos == buf.len() && eof {
            break offset;
        }
        match decode_record(&buf[pos..], max_body) {
            Decoded::Record { record, len, crc } => {
                if let Some(w) = result.ledgers.get_mut(&record.ledger_id) {
                    let expected = match result.stripes.get(&record.ledger_id) {
                        Some(stripe) => stripe.next_from(w.entries.len() as u64),
                        None => w.entries.len() as u64,
                    };
                    if record.entry_id != expected {
                        let msg = format!(
                            "ledger {} entry {} found at offset {offset} where entry {expected} \
                             was expected",
                            record.ledger_id, record.entry_id
                        );
                        return Err(match last_skipped {
                            // The missing entry is most likely the corrupt record skipped before.
                            Some(at) => corrupt(at, format!("checksum mismatch; {msg}")),
                            None => corrupt(offset, msg),
                        });
                    }
                    w.push_at(
                        record.entry_id,
                        IndexEntry {
                            segment,
                            offset: offset as u32,
                            len: len as u32,
                            publish_time_ms: record.publish_time_ms,
                        },
                        record.payload.len(),
                        crc,
                    );
                }
                pos += len;
            }
            Decoded::End if offset >= floor => break offset,
            Decoded::End => {
                if is_last {
                    return Err(corrupt(
                        offset,
                        format!("zeros before the durable end ({floor})"),
                    ));
                }
                break offset;
            }
            Decoded::NeedMore { needed } => {
                if eof {
                    if offset >= floor {
                        break offset;
                    }
                    return Err(corrupt(
                        offset,
                        format!("record of {needed} bytes cut short"),
                    ));
                }
                // Grow the buffer for a record larger than what is loaded.
                let missing = needed.saturating_sub(buf.len() - pos);
                eof = fill(&mut file, &mut buf, missing.max(SCAN_CHUNK)).map_err(io_err)?;
            }
            Decoded::Invalid { reason } => {
                // A record whose framing is intact but whose body fails its checksum, followed
                // by a valid record, is a corrupt record in the middle: skip it and report it
                // (reads of it fail; a gap in an open ledger fails the dense check below).
                if let InvalidRecord::ChecksumMismatch { .. } = reason {
                    let len = record_len(&buf[pos..]);
                    let next = buf
                        .get(pos + len..)
                        .map(|rest| decode_record(rest, max_body));
                    if matches!(next, Some(Decoded::Record { .. })) {
                        tracing::error!(path = %path.display(), offset, %reason,
                            "corrupt record skipped during recovery");
                        result.corrupt_records.push((segment, offset));
                        last_skipped = Some(offset);
                        pos += len;
                        continue;
                    }
                }
                if offset >= floor {
                    break offset;
                }
                return Err(corrupt(offset, reason.to_string()));
            }
        }
    };
    if is_last && file_len > end {
        // Drop the torn tail (or the preallocated zeros) for good.
        let dropped = written_len(&file, end, file_len).map_err(io_err)?;
        file.set_len(end).map_err(io_err)?;
        file.sync_all().map_err(io_err)?;
        if dropped > 0 {
            tracing::warn!(path = %path.display(), offset = end, dropped,
                "truncated torn tail of the journal");
            result.truncated = Some((segment, end, dropped));
        }
    }
    Ok(())
}

/// Total length declared by the record header at the start of `buf` (which holds a header).
fn record_len(buf: &[u8]) -> usize {
    RECORD_HEADER_LEN + u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize
}

/// Reads up to `want` more bytes onto `buf`; returns true at end of file.
fn fill(file: &mut File, buf: &mut Vec<u8>, want: usize) -> io::Result<bool> {
    let start = buf.len();
    buf.resize(start + want, 0);
    let mut got = 0;
    while got < want {
        match file.read(&mut buf[start + got..])? {
            0 => {
                buf.truncate(start + got);
                return Ok(true);
            }
            n => got += n,
        }
    }
    Ok(false)
}

/// Non-zero bytes between `from` and `to` (what a truncation really drops), read in chunks.
fn written_len(file: &File, from: u64, to: u64) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut chunk = vec![0u8; 1 << 20];
    let mut last_nonzero = from;
    let mut at = from;
    while at < to {
        let n = ((to - at) as usize).min(chunk.len());
        file.read_exact_at(&mut chunk[..n], at)?;
        if let Some(i) = chunk[..n].iter().rposition(|b| *b != 0) {
            last_nonzero = at + i as u64 + 1;
        }
        at += n as u64;
    }
    Ok(last_nonzero - from)
}
