//! The in-memory state of an open ledger, shared by its topic (which assigns entry ids), the
//! journal thread (which records where each entry landed and when it became durable) and readers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use super::index::IndexEntry;
use super::metadata::{LedgerId, SealInfo};
use super::quorum::Quorum;
use super::stripe::Stripe;
use super::Position;

/// Where the entries of an open ledger landed, plus running seal statistics.
#[derive(Debug, Default)]
pub(crate) struct Written {
    /// Invariant: `entries[i]` is entry `i`; pushed only by the journal thread, in order. In
    /// a striped replica's copy (ADR 0017) the entries of other stripes are
    /// [`IndexEntry::ABSENT`].
    pub entries: Vec<IndexEntry>,
    pub size_bytes: u64,
    /// CRC32C chained over the record CRCs of every written entry (absent ones count for
    /// nothing).
    pub checksum: u32,
    pub min_publish_ms: Option<i64>,
    pub max_publish_ms: Option<i64>,
    pub last_segment: Option<u32>,
    /// Invariant: `crcs[i]` is entry `i`'s record CRC, 0 for an absent one (a replicated
    /// ledger may be sealed short of what this journal wrote, and its seal checksum covers
    /// only that prefix).
    pub crcs: Vec<u32>,
}

impl Written {
    /// Records entry `entry`, after an [`IndexEntry::ABSENT`] for each entry between the last
    /// one recorded and it (those of other stripes: the caller took `entry` in its stripe's
    /// order, [`OpenLedger::take_entry`]).
    pub fn push_at(&mut self, entry: u64, at: IndexEntry, payload_len: usize, record_crc: u32) {
        self.absent_upto(entry);
        self.push(at, payload_len, record_crc);
    }

    /// Records [`IndexEntry::ABSENT`] for every entry from the next one up to `end`.
    pub fn absent_upto(&mut self, end: u64) {
        while (self.entries.len() as u64) < end {
            self.entries.push(IndexEntry::ABSENT);
            self.crcs.push(0);
        }
    }

    /// Records one more entry.
    pub fn push(&mut self, at: IndexEntry, payload_len: usize, record_crc: u32) {
        self.entries.push(at);
        self.crcs.push(record_crc);
        self.size_bytes += payload_len as u64;
        self.checksum = crc32c::crc32c_append(self.checksum, &record_crc.to_le_bytes());
        let t = at.publish_time_ms;
        self.min_publish_ms = Some(self.min_publish_ms.map_or(t, |m| m.min(t)));
        self.max_publish_ms = Some(self.max_publish_ms.map_or(t, |m| m.max(t)));
        self.last_segment = Some(at.segment);
    }

    /// Records entry `e` of `ledger`, read from another copy, for its seal figures only (the
    /// location is not this journal's: `segment`, offset 0).
    pub fn push_read(&mut self, ledger: LedgerId, e: &super::Entry, segment: u32) {
        let mut record = Vec::new();
        let entry = e.position.entry;
        let crc =
            super::record::encode_record(&mut record, ledger, entry, e.publish_time_ms, &e.payload);
        let at = IndexEntry {
            segment,
            offset: 0,
            len: record.len() as u32,
            publish_time_ms: e.publish_time_ms,
        };
        self.push(at, e.payload.len(), crc);
    }

    /// The seal information of the first `count` entries (all of them when `count` is not
    /// below what was written).
    pub fn seal_info_upto(&self, first_segment: u32, count: u64) -> SealInfo {
        if count as usize >= self.entries.len() {
            return self.seal_info(first_segment);
        }
        let mut prefix = Written::default();
        for (at, crc) in self.entries.iter().zip(&self.crcs).take(count as usize) {
            if at.is_absent() {
                prefix.absent_upto(prefix.entries.len() as u64 + 1);
                continue;
            }
            // Payload length = record length minus the framing.
            prefix.push(*at, at.len as usize - super::record::RECORD_OVERHEAD, *crc);
        }
        prefix.seal_info(first_segment)
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
    /// For a replicated ledger this node writes: its bookies' progress; entries are confirmed
    /// when their ack quorum holds them, not when this journal does.
    pub quorum: Option<Arc<Quorum>>,
    /// For a replica's copy: one past the last entry id taken by an add.
    taken: AtomicU64,
    /// The entries this copy holds: every one, but in a striped ledger's replica copy
    /// (ADR 0017).
    pub stripe: Stripe,
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
            quorum: None,
            taken: AtomicU64::new(0),
            stripe: Stripe::whole(),
        }
    }

    /// The entry id a replica's next add must carry: the next of its stripe.
    pub fn next_entry(&self) -> u64 {
        self.stripe.next_from(self.taken.load(Ordering::Acquire))
    }

    /// Takes entry id `entry` ([`OpenLedger::next_entry`]) for a replica's copy.
    pub fn take_entry(&self, entry: u64) {
        self.taken.fetch_max(entry + 1, Ordering::AcqRel);
    }

    /// A replicated ledger this node writes.
    pub fn replicated(
        id: LedgerId,
        first_segment: u32,
        topic_lac: Arc<watch::Sender<Option<Position>>>,
        quorum: Arc<Quorum>,
    ) -> Self {
        Self {
            quorum: Some(quorum),
            ..Self::new(id, first_segment, topic_lac)
        }
    }

    /// A replica's copy of another writer's ledger holding `stripe`, rebuilt from `written`
    /// (recovery) or empty: every entry written is confirmed.
    pub fn replica(id: LedgerId, first_segment: u32, written: Written, stripe: Stripe) -> Self {
        let confirmed = written.entries.len() as u64;
        let ledger = Self {
            stripe,
            ..Self::new(id, first_segment, Arc::new(watch::channel(None).0))
        };
        *ledger.written() = written;
        ledger.confirmed.store(confirmed, Ordering::Release);
        ledger.taken.store(confirmed, Ordering::Release);
        ledger
    }

    pub fn written(&self) -> MutexGuard<'_, Written> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of confirmed (readable) entries.
    pub fn confirmed(&self) -> u64 {
        self.confirmed.load(Ordering::Acquire)
    }

    /// Called by the journal thread once entry `entry_id` is durable here. A replicated
    /// ledger's entries are confirmed when their ack quorum holds them ([`Quorum`]).
    pub fn confirm(&self, entry_id: u64) {
        match &self.quorum {
            None => self.publish(entry_id + 1),
            Some(q) => {
                if let Some(count) = q.local_durable(entry_id) {
                    self.publish(count);
                }
            }
        }
    }

    /// Member `member` of this replicated ledger's ensemble made entries `0..=entry_id`
    /// durable.
    pub fn confirm_on_replica(&self, member: super::quorum::MemberId, entry_id: u64) {
        if let Some(count) = self
            .quorum
            .as_ref()
            .and_then(|q| q.replica_durable(member, entry_id))
        {
            self.publish(count);
        }
    }

    /// Entries `0..count` are confirmed: readable, and the topic's last confirmed position.
    /// (The journal thread and replica answers may call it at once: neither moves back.)
    fn publish(&self, count: u64) {
        if count == 0 || self.confirmed.fetch_max(count, Ordering::AcqRel) >= count {
            return;
        }
        let at = Some(Position::new(self.id, count - 1));
        self.topic_lac.send_if_modified(|lac| {
            let newer = *lac < at;
            if newer {
                *lac = at;
            }
            newer
        });
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
