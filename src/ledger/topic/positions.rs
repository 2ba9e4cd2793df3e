//! Reads and searches of a topic partition's log by position and publish time, and its
//! durable subscriptions' stored cursors: the [`TopicLog`] methods that go across ledgers
//! without changing them.

use std::sync::Arc;

use super::{LedgerInfo, LedgerView, TopicLog};
use crate::ledger::error::ReadError;
use crate::ledger::index::IndexEntry;
use crate::ledger::metadata::{LedgerState, MetadataError};
use crate::ledger::{Entry, Position};

impl TopicLog {
    /// Reads up to `max` durable entries from `from` (inclusive) onward, crossing ledger
    /// boundaries and skipping empty ledgers. Empty when nothing is durable there yet;
    /// [`ReadError::Deleted`] when the range was offloaded and deleted locally.
    pub async fn read_from(&self, from: Position, max: usize) -> Result<Vec<Entry>, ReadError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let ledgers = self.ledgers();
        let newest = ledgers.last().map(|l| l.id);
        for l in ledgers.into_iter().filter(|l| l.id >= from.ledger) {
            let start = if l.id == from.ledger { from.entry } else { 0 };
            if start >= l.entry_count {
                if l.state == LedgerState::Open && Some(l.id) == newest {
                    // Nothing newer can exist beyond the open ledger's confirmed entries.
                    return Ok(Vec::new());
                }
                continue;
            }
            if l.state == LedgerState::Deleted {
                return Err(ReadError::Deleted(l.id));
            }
            let last = (start + max as u64 - 1).min(l.entry_count - 1);
            return self.read_entries(l.id, start, last).await;
        }
        Ok(Vec::new())
    }

    /// Saves the state of durable subscription `name` in the metadata store; refused
    /// (`Fenced`) once a later owner fenced the topic above this writer's epoch.
    pub async fn save_cursor(&self, name: &str, state: &[u8]) -> Result<(), MetadataError> {
        let epoch = self.writer_epoch();
        self.inner
            .shared
            .meta
            .save_cursor(self.inner.id, name, state, crate::ledger::now_ms(), epoch)
            .await
    }

    /// The stored cursors of this topic: (subscription, state).
    pub async fn cursors(&self) -> Result<Vec<(String, Vec<u8>)>, MetadataError> {
        self.inner.shared.meta.topic_cursors(self.inner.id).await
    }

    /// Removes the stored cursor of `name`.
    pub async fn delete_cursor(&self, name: &str) -> Result<(), MetadataError> {
        self.inner
            .shared
            .meta
            .delete_cursor(self.inner.id, name, self.writer_epoch())
            .await
    }

    /// The first entry of ledger `l` published at or after `publish_time_ms`, if any (the
    /// replay reader's seek asks each ledger in turn; publish times of a topic are expected to
    /// be non-decreasing, as in Pulsar): skipped
    /// by its publish-time range where it can be, otherwise a binary search of its index where
    /// this log holds it whole, or of its entries read one at a time where it does not
    /// (another bookie's copy, or a striped ledger's stripes: a stripe's index has no publish
    /// time for the entries other replicas hold). [`ReadError::Deleted`] when the ledger is
    /// read from the lake here ([`TopicLog::read_from_lake`]).
    pub async fn first_published_at_or_after(
        &self,
        l: &LedgerInfo,
        publish_time_ms: i64,
    ) -> Result<Option<u64>, ReadError> {
        if l.entry_count == 0 || l.max_publish_ms.is_some_and(|m| m < publish_time_ms) {
            return Ok(None);
        }
        if self.read_from_lake(l.id) {
            return Err(ReadError::Deleted(l.id));
        }
        if self.foreign(l.id).is_some() {
            let (mut low, mut high) = (0, l.entry_count);
            while low < high {
                let mid = low + (high - low) / 2;
                let entry = self.read_entry(Position::new(l.id, mid)).await?;
                if entry.publish_time_ms < publish_time_ms {
                    low = mid + 1;
                } else {
                    high = mid;
                }
            }
            return Ok((low < l.entry_count).then_some(low));
        }
        let index: Result<Arc<[IndexEntry]>, ReadError> = match self.view(l.id)? {
            LedgerView::Open(o) => Ok(o.written().entries.clone().into()),
            LedgerView::Closed(r) => self.inner.shared.held_sealed_index(&r).await,
        };
        let index = match self.or_moved(l.id, index).await {
            // The view learnt that the bookies holding the ledger are elsewhere now.
            Err(_) if self.foreign(l.id).is_some() => {
                return Box::pin(self.first_published_at_or_after(l, publish_time_ms)).await
            }
            index => index?,
        };
        let count = (l.entry_count as usize).min(index.len());
        let i = index[..count].partition_point(|e| e.publish_time_ms < publish_time_ms);
        Ok((i < count).then_some(i as u64))
    }

    /// The position just before `pos` in this topic (across ledgers), if any.
    pub fn position_before(&self, pos: Position) -> Option<Position> {
        if pos.entry > 0 {
            return Some(Position::new(pos.ledger, pos.entry - 1));
        }
        self.ledgers()
            .into_iter()
            .rev()
            .find(|l| l.id < pos.ledger && l.entry_count > 0)
            .map(|l| Position::new(l.id, l.entry_count - 1))
    }

    /// Position of the topic's first entry; `(0, 0)` (before any ledger) when it has none.
    pub fn first_position(&self) -> Position {
        self.ledgers()
            .into_iter()
            .find(|l| l.entry_count > 0)
            .map_or(Position::new(0, 0), |l| Position::new(l.id, 0))
    }
}
