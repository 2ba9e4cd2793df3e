//! Reads of a topic partition's entries by ledger and entry id: from the tail cache, this
//! bookie's segments, another bookie's copy (or a striped ledger's stripes), or an answer of
//! [`ReadError::Deleted`] that sends the reader to the lake. The [`TopicLog`] methods that read
//! one ledger without changing it (beyond recording a deletion they find).

use super::{lock, LedgerView, TopicLog};
use crate::ledger::error::ReadError;
use crate::ledger::index::IndexEntry;
use crate::ledger::metadata::{LedgerId, LedgerRecord, LedgerState};
use crate::ledger::read::{moved_meanwhile, read_located, read_one};
use crate::ledger::{Entry, Position};

impl TopicLog {
    /// For a ledger another bookie holds and has not offloaded: that bookie and the entries
    /// this view reads of it.
    /// For a sealed replicated ledger, every bookie holding a copy (the writer's first); for
    /// an open one, its writer's (only the writer knows what its quorum confirmed).
    pub(in crate::ledger) fn foreign(&self, ledger: LedgerId) -> Option<(Vec<String>, u64)> {
        let shared = &self.inner.shared;
        match lock(&self.inner.ledgers).get(&ledger) {
            Some(LedgerView::Closed(r)) => match r.state {
                LedgerState::Sealed if !shared.holds_whole(r) => Some((
                    r.bookies().map(str::to_string).collect(),
                    r.seal.map_or(0, |s| s.entry_count),
                )),
                LedgerState::Open if !shared.writes(r) => Some((
                    vec![r.bookie.clone()],
                    self.inner.foreign_open.get(&ledger).copied().unwrap_or(0),
                )),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether `ledger`'s entries are read from the lake here: deleted locally, or offloaded
    /// while this log does not hold it whole (another bookie's, or a striped ledger's;
    /// [`TopicLog::read_entries`] answers [`ReadError::Deleted`] for both).
    pub fn read_from_lake(&self, ledger: LedgerId) -> bool {
        match lock(&self.inner.ledgers).get(&ledger) {
            Some(LedgerView::Closed(r)) => self.lake_holds_for_this_log(r),
            _ => false,
        }
    }

    /// [`TopicLog::read_from_lake`] of a closed ledger's record.
    pub(super) fn lake_holds_for_this_log(&self, r: &LedgerRecord) -> bool {
        r.state == LedgerState::Deleted
            || (r.state == LedgerState::Offloaded && !self.inner.shared.holds_whole(r))
    }

    /// The record of `ledger` when it is sealed and striped (ADR 0017): read from its
    /// replicas' stripes when its writer's bookie cannot serve it.
    pub(in crate::ledger) fn sealed_striped(&self, ledger: LedgerId) -> Option<LedgerRecord> {
        match lock(&self.inner.ledgers).get(&ledger) {
            Some(LedgerView::Closed(r)) if r.state == LedgerState::Sealed && r.is_striped() => {
                Some((**r).clone())
            }
            _ => None,
        }
    }

    pub(super) fn view(&self, ledger: LedgerId) -> Result<LedgerView, ReadError> {
        lock(&self.inner.ledgers)
            .get(&ledger)
            .cloned()
            .ok_or_else(|| ReadError::UnknownLedger {
                topic: self.inner.name.clone(),
                ledger,
            })
    }

    /// Locations of entries `first..=last` of `ledger`, clipped to what exists.
    pub(crate) async fn locate(
        &self,
        ledger: LedgerId,
        first: u64,
        last: u64,
    ) -> Result<Vec<IndexEntry>, ReadError> {
        match self.view(ledger)? {
            LedgerView::Open(o) => {
                let located = o.locate_range(first, last);
                if located.is_empty() {
                    return Err(ReadError::NoSuchEntry {
                        ledger,
                        entry: first,
                        available: o.confirmed(),
                    });
                }
                Ok(located)
            }
            LedgerView::Closed(r) => {
                // Another bookie's ledger: the lake copy is read like a deleted ledger's.
                if self.lake_holds_for_this_log(&r) {
                    return Err(ReadError::Deleted(ledger));
                }
                if !self.inner.shared.holds_whole(&r) {
                    return Err(ReadError::Remote {
                        ledger,
                        bookie: r.bookie.clone(),
                    });
                }
                let count = r.seal.map_or(0, |s| s.entry_count);
                if first >= count {
                    return Err(ReadError::NoSuchEntry {
                        ledger,
                        entry: first,
                        available: count,
                    });
                }
                let index = self.inner.shared.held_sealed_index(&r).await?;
                let end = last.saturating_add(1).min(count).min(index.len() as u64);
                Ok(index[first as usize..end as usize].to_vec())
            }
        }
    }

    /// Reads one durable entry.
    pub async fn read_entry(&self, pos: Position) -> Result<Entry, ReadError> {
        if let Some((publish_time_ms, payload)) = lock(&self.inner.cache).get(pos) {
            if self.last_confirmed().is_some_and(|lac| pos <= lac) && self.confirmed_in_ledger(pos)
            {
                return Ok(Entry {
                    position: pos,
                    publish_time_ms,
                    payload,
                });
            }
        }
        if self.foreign(pos.ledger).is_some() {
            return self.read_foreign_one(pos).await;
        }
        let read = match self.locate(pos.ledger, pos.entry, pos.entry).await {
            Ok(located) => read_one(&self.inner.shared, pos, located[0]).await,
            Err(e) => Err(e),
        };
        match self.or_moved(pos.ledger, read).await {
            // The view learnt that the bookies holding the ledger are elsewhere now.
            Err(_) if self.foreign(pos.ledger).is_some() => self.read_foreign_one(pos).await,
            read => read,
        }
    }

    /// Entry `pos` of a ledger other bookies hold ([`TopicLog::foreign`]).
    async fn read_foreign_one(&self, pos: Position) -> Result<Entry, ReadError> {
        let mut one = self.read_foreign(pos.ledger, pos.entry, pos.entry).await?;
        one.pop().ok_or(ReadError::NoSuchEntry {
            ledger: pos.ledger,
            entry: pos.entry,
            available: 0,
        })
    }

    /// Whether `pos` is confirmed in its own ledger (a replicated ledger may end short of
    /// entries this node cached: those its quorum never confirmed).
    fn confirmed_in_ledger(&self, pos: Position) -> bool {
        match lock(&self.inner.ledgers).get(&pos.ledger) {
            Some(LedgerView::Open(o)) => pos.entry < o.confirmed(),
            Some(LedgerView::Closed(r)) => r.seal.is_some_and(|s| pos.entry < s.entry_count),
            None => false,
        }
    }

    /// `read` of `ledger`, with a local copy that went missing because the ledger moved on
    /// meanwhile (see [`moved_meanwhile`]): the store's record is recorded in this log, so that
    /// its readers (the lake stream too, which goes by the ledgers' states) read the ledger
    /// where it is now, and the read fails with [`ReadError::Deleted`] when that is the lake.
    /// When it is other bookies ([`TopicLog::foreign`] answers now), the caller reads again.
    pub(super) async fn or_moved<T>(
        &self,
        ledger: LedgerId,
        read: Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        let Err(e) = read else { return read };
        match moved_meanwhile(&self.inner.shared, ledger, &e).await {
            Some(record) => {
                self.set_record(record);
                if self.read_from_lake(ledger) {
                    return Err(ReadError::Deleted(ledger));
                }
                Err(e)
            }
            None => Err(e),
        }
    }

    /// Reads the durable entries `first..=last` of `ledger` in order (fewer if the ledger ends
    /// sooner). Neighbouring records are fetched with one read.
    pub async fn read_entries(
        &self,
        ledger: LedgerId,
        first: u64,
        last: u64,
    ) -> Result<Vec<Entry>, ReadError> {
        self.read_range(ledger, first, last, true).await
    }

    /// As [`TopicLog::read_entries`], but always from the segments, never the tail cache: for
    /// checks of what the disk holds (`verify`).
    pub async fn read_entries_stored(
        &self,
        ledger: LedgerId,
        first: u64,
        last: u64,
    ) -> Result<Vec<Entry>, ReadError> {
        self.read_range(ledger, first, last, false).await
    }

    /// Entries `first..=last` of `ledger`, from the tail cache when `cached` and it holds the
    /// whole range, otherwise from the segments.
    async fn read_range(
        &self,
        ledger: LedgerId,
        first: u64,
        last: u64,
        cached: bool,
    ) -> Result<Vec<Entry>, ReadError> {
        if last < first {
            return Ok(Vec::new());
        }
        if self.foreign(ledger).is_some() {
            return self.read_foreign(ledger, first, last).await;
        }
        let local = self.read_local(ledger, first, last, cached).await;
        match self.or_moved(ledger, local).await {
            // The view learnt that the bookies holding the ledger are elsewhere now.
            Err(_) if self.foreign(ledger).is_some() => {
                self.read_foreign(ledger, first, last).await
            }
            read => read,
        }
    }

    /// [`TopicLog::read_range`] of a ledger this log holds whole: from the tail cache when
    /// `cached` and it holds the whole range, otherwise from the segments.
    async fn read_local(
        &self,
        ledger: LedgerId,
        first: u64,
        last: u64,
        cached: bool,
    ) -> Result<Vec<Entry>, ReadError> {
        let located = self.locate(ledger, first, last).await?;
        // Fault tests: the disk under this topic's entries fails (before the cache, so that
        // every read sees it).
        if let Err(source) = crate::failpoint::io_error_at("ledger.read", self.name()) {
            return Err(ReadError::Io {
                path: std::path::PathBuf::from("<failpoint>"),
                offset: 0,
                source,
            });
        }
        if cached {
            let cache = lock(&self.inner.cache);
            let hit: Option<Vec<Entry>> = (0..located.len() as u64)
                .map(|i| {
                    let pos = Position::new(ledger, first + i);
                    cache.get(pos).map(|(t, p)| Entry {
                        position: pos,
                        publish_time_ms: t,
                        payload: p,
                    })
                })
                .collect();
            if let Some(entries) = hit {
                return Ok(entries);
            }
        }
        read_located(&self.inner.shared, ledger, first, located).await
    }
}
