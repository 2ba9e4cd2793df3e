//! Caches that keep reads off the disk: the tail cache (recent entries of each topic, so live
//! consumers rarely touch disk) and the index cache (indexes of sealed ledgers).
//!
//! Invariant: the bytes held by all tail caches together never exceed the broker-wide budget;
//! each topic's cache also stays under its own cap.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::index::IndexEntry;
use super::metadata::LedgerId;
use super::Position;

/// Accounting overhead charged per cached entry besides its payload.
const ENTRY_OVERHEAD: usize = 64;

/// Broker-wide byte budget shared by every topic's tail cache.
#[derive(Debug)]
pub(crate) struct CacheBudget {
    used: AtomicUsize,
    limit: usize,
}

impl CacheBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicUsize::new(0),
            limit,
        })
    }

    fn try_reserve(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u + n <= self.limit).then_some(u + n)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes currently charged.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

#[derive(Debug)]
struct Cached {
    pos: Position,
    publish_time_ms: i64,
    payload: Bytes,
}

/// Recent entries of one topic, in position order.
#[derive(Debug)]
pub(crate) struct TailCache {
    /// Invariant: sorted by position, strictly increasing.
    entries: VecDeque<Cached>,
    bytes: usize,
    max_bytes: usize,
    budget: Arc<CacheBudget>,
}

impl TailCache {
    pub fn new(max_bytes: usize, budget: Arc<CacheBudget>) -> Self {
        Self {
            entries: VecDeque::new(),
            bytes: 0,
            max_bytes,
            budget,
        }
    }

    /// Caches an entry just appended (positions must increase). Evicts the oldest entries of
    /// this topic to make room; skips caching when the broker-wide budget is exhausted.
    pub fn insert(&mut self, pos: Position, publish_time_ms: i64, payload: Bytes) {
        let cost = payload.len() + ENTRY_OVERHEAD;
        if cost > self.max_bytes {
            return;
        }
        if self.entries.back().is_some_and(|b| b.pos >= pos) {
            self.clear();
        }
        while self.bytes + cost > self.max_bytes {
            self.evict_front();
        }
        while !self.budget.try_reserve(cost) {
            if self.entries.is_empty() {
                return;
            }
            self.evict_front();
        }
        self.bytes += cost;
        self.entries.push_back(Cached {
            pos,
            publish_time_ms,
            payload,
        });
    }

    fn evict_front(&mut self) {
        if let Some(c) = self.entries.pop_front() {
            let cost = c.payload.len() + ENTRY_OVERHEAD;
            self.bytes -= cost;
            self.budget.release(cost);
        }
    }

    /// The cached entry at `pos`, if any.
    pub fn get(&self, pos: Position) -> Option<(i64, Bytes)> {
        let i = self.entries.binary_search_by_key(&pos, |c| c.pos).ok()?;
        let c = &self.entries[i];
        Some((c.publish_time_ms, c.payload.clone()))
    }

    /// Drops every cached entry.
    pub fn clear(&mut self) {
        while !self.entries.is_empty() {
            self.evict_front();
        }
    }
}

impl Drop for TailCache {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Cached indexes plus their insertion order.
type IndexMap = (HashMap<LedgerId, Arc<[IndexEntry]>>, VecDeque<LedgerId>);

/// Indexes of sealed ledgers, bounded by count (oldest-inserted evicted first).
#[derive(Debug)]
pub(crate) struct IndexCache {
    capacity: usize,
    /// Invariant: the deque lists exactly the map's keys, oldest first.
    inner: Mutex<IndexMap>,
}

impl IndexCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    pub fn get(&self, id: LedgerId) -> Option<Arc<[IndexEntry]>> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .get(&id)
            .cloned()
    }

    pub fn insert(&self, id: LedgerId, index: Arc<[IndexEntry]>) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *g;
        if map.insert(id, index).is_none() {
            order.push_back(id);
        }
        while map.len() > self.capacity {
            match order.pop_front() {
                Some(old) => {
                    map.remove(&old);
                }
                None => break,
            }
        }
    }

    pub fn remove(&self, id: LedgerId) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0.remove(&id);
        g.1.retain(|l| *l != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_cache_respects_topic_cap_and_global_budget() {
        let budget = CacheBudget::new(1000);
        let mut a = TailCache::new(600, budget.clone());
        let mut b = TailCache::new(600, budget.clone());
        for i in 0..10 {
            a.insert(Position::new(1, i), 0, Bytes::from(vec![1u8; 100]));
        }
        assert!(a.bytes <= 600);
        assert!(a.get(Position::new(1, 9)).is_some());
        assert!(a.get(Position::new(1, 0)).is_none());
        for i in 0..10 {
            b.insert(Position::new(2, i), 0, Bytes::from(vec![2u8; 100]));
        }
        assert!(budget.used() <= 1000, "budget exceeded: {}", budget.used());
        drop(a);
        drop(b);
        assert_eq!(budget.used(), 0);
    }
}
