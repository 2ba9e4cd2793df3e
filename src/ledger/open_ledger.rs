//! The in-memory state of an open ledger, shared by its topic (which assigns entry ids), the
//! journal thread (which records where each entry landed and when it became durable) and readers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use super::index::IndexEntry;
use super::metadata::{LedgerId, SealInfo};
use super::Position;

/// Where the entries of an open ledger landed, plus running seal statistics.
#[derive(Debug, Default)]
pub(crate) struct Written {
    /// Invariant: `entries[i]` is entry `i`; pushed only by the journal thread, in order.
    pub entries: Vec<IndexEntry>,
    pub size_bytes: u64,
    /// CRC32C chained over the record CRCs of every written entry.
    pub checksum: u32,
    pub min_publish_ms: Option<i64>,
    pub max_publish_ms: Option<i64>,
    pub last_segment: Option<u32>,
}

impl Written {
    /// Records one more entry.
    pub fn push(&mut self, at: IndexEntry, payload_len: usize, record_crc: u32) {
        self.entries.push(at);
        self.size_bytes += payload_len as u64;
        self.checksum = crc32c::crc32c_append(self.checksum, &record_crc.to_le_bytes());
        let t = at.publish_time_ms;
        self.min_publish_ms = Some(self.min_publish_ms.map_or(t, |m| m.min(t)));
        self.max_publish_ms = Some(self.max_publish_ms.map_or(t, |m| m.max(t)));
        self.last_segment = Some(at.segment);
    }

    /// The seal information for the entries written so far.
    pub fn seal_info(&self, first_segment: u32) -> SealInfo {
        SealInfo {
            entry_count: self.entries.len() as u64,
            size_bytes: self.size_bytes,
            min_publish_ms: self.min_publish_ms,
            max_publish_ms: self.max_publish_ms,
            last_segment: self.last_segment.unwrap_or(first_segment),
            checksum: self.checksum,
        }
    }
}

/// An open ledger.
#[derive(Debug)]
pub(crate) struct OpenLedger {
    pub id: LedgerId,
    pub first_segment: u32,
    written: Mutex<Written>,
    /// Invariant: entries `0..confirmed` are durable (per the sync policy) and readable;
    /// `confirmed <= written.entries.len()`.
    confirmed: AtomicU64,
    /// The owning topic's last confirmed position, advanced by the journal thread.
    pub topic_lac: Arc<watch::Sender<Option<Position>>>,
}

impl OpenLedger {
    pub fn new(
        id: LedgerId,
        first_segment: u32,
        topic_lac: Arc<watch::Sender<Option<Position>>>,
    ) -> Self {
        Self {
            id,
            first_segment,
            written: Mutex::new(Written::default()),
            confirmed: AtomicU64::new(0),
            topic_lac,
        }
    }

    pub fn written(&self) -> MutexGuard<'_, Written> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of confirmed (readable) entries.
    pub fn confirmed(&self) -> u64 {
        self.confirmed.load(Ordering::Acquire)
    }

    /// Called by the journal thread once entry `entry_id` is durable.
    pub fn confirm(&self, entry_id: u64) {
        self.confirmed.store(entry_id + 1, Ordering::Release);
        self.topic_lac
            .send_replace(Some(Position::new(self.id, entry_id)));
    }

    /// Locations of confirmed entries `first..=last` (clipped to what is confirmed).
    pub fn locate_range(&self, first: u64, last: u64) -> Vec<IndexEntry> {
        let end = (last.saturating_add(1)).min(self.confirmed()) as usize;
        let w = self.written();
        if (first as usize) >= end {
            return Vec::new();
        }
        w.entries[first as usize..end.min(w.entries.len())].to_vec()
    }
}
