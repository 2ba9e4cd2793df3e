//! A cache of stored records by key, for the stores that keep records in the metadata store
//! and read them on hot paths (namespace policies, tenants, namespaces, grants).
//!
//! Invariants:
//! - Every forgetting (before and after each write, and for each change another node made,
//!   reported by the metadata store's policies feed) bumps one generation. A reader that
//!   loaded a record from the store before a forgetting cannot put it back afterwards: it
//!   fills only at the generation it saw (so a revoked grant cannot come back from a slow
//!   reader).
//! - Forgetting everything is always safe: the next reader asks the store.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Records by key with a generation; see the module docs.
#[derive(Debug)]
pub(crate) struct Cached<K, V>(RwLock<(u64, HashMap<K, Arc<V>>)>);

impl<K: std::hash::Hash + Eq, V> Cached<K, V> {
    /// An empty cache.
    pub(crate) fn new() -> Self {
        Cached(RwLock::new((0, HashMap::new())))
    }

    /// The cached record of `key`, or the generation to pass to [`Cached::fill`] after loading
    /// it from the store.
    pub(crate) fn get(&self, key: &K) -> Result<Arc<V>, u64> {
        let c = self.0.read().unwrap_or_else(|p| p.into_inner());
        c.1.get(key).cloned().ok_or(c.0)
    }

    /// Caches `value` loaded at generation `seen`, unless a write or a forgetting happened
    /// since (then the value is returned uncached).
    pub(crate) fn fill(&self, key: K, value: V, seen: u64) -> Arc<V> {
        let v = Arc::new(value);
        let mut c = self.0.write().unwrap_or_else(|p| p.into_inner());
        if c.0 == seen {
            c.1.insert(key, v.clone());
        }
        v
    }

    /// Forgets `key` and bumps the generation: before and after a write of `key` to the store
    /// (a write interrupted after the store changed leaves nothing stale behind, and a reader
    /// that loaded the old record meanwhile cannot cache it), or when the store reports that
    /// another node changed it. What was written is not cached as written: another node may
    /// have written over it already, and its report may have come first.
    pub(crate) fn invalidate(&self, key: &K) {
        let mut c = self.0.write().unwrap_or_else(|p| p.into_inner());
        c.0 += 1;
        c.1.remove(key);
    }

    /// Drops what is cached of `key` to save memory, without bumping the generation: nothing
    /// changed, so a reader that loaded the record meanwhile may still cache it. The map gives
    /// its room back once mostly empty.
    pub(crate) fn evict(&self, key: &K) {
        let mut c = self.0.write().unwrap_or_else(|p| p.into_inner());
        c.1.remove(key);
        crate::memory::shrink_sparse(&mut c.1);
    }

    /// Forgets every record and bumps the generation (the store's feed of changes ended, so
    /// changes may have been missed).
    pub(crate) fn invalidate_all(&self) {
        let mut c = self.0.write().unwrap_or_else(|p| p.into_inner());
        c.0 += 1;
        c.1.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_overtaken_by_a_forgetting_is_not_cached() {
        let c: Cached<&str, u32> = Cached::new();
        let seen = c.get(&"a").expect_err("empty");
        c.invalidate(&"b");
        assert_eq!(
            *c.fill("a", 1, seen),
            1,
            "the loaded value is still answered"
        );
        let seen = c
            .get(&"a")
            .expect_err("but not cached: a change came between");
        c.fill("a", 2, seen);
        assert_eq!(c.get(&"a").map(|v| *v), Ok(2));
        let seen_before = c.get(&"x").expect_err("absent");
        c.invalidate_all();
        assert!(c.get(&"a").is_err(), "forgotten");
        c.fill("x", 3, seen_before);
        assert!(
            c.get(&"x").is_err(),
            "a load from before forgetting all is not cached"
        );
    }

    #[test]
    fn an_eviction_is_not_a_change() {
        let c: Cached<&str, u32> = Cached::new();
        let seen = c.get(&"a").expect_err("empty");
        c.fill("a", 1, seen);
        let seen_b = c.get(&"b").expect_err("absent");
        c.evict(&"a");
        let seen_a = c.get(&"a").expect_err("evicted");
        assert_eq!(seen_a, seen, "the generation stays");
        c.fill("b", 2, seen_b);
        assert_eq!(
            c.get(&"b").ok().map(|v| *v),
            Some(2),
            "a load from before is cached"
        );
    }

    #[test]
    fn evictions_give_the_room_back() {
        let c: Cached<u32, u32> = Cached::new();
        for k in 0..10_000 {
            let seen = c.get(&k).expect_err("absent");
            c.fill(k, k, seen);
        }
        let room = |c: &Cached<u32, u32>| c.0.read().map(|g| g.1.capacity()).unwrap_or(0);
        let peak = room(&c);
        for k in 0..9_900 {
            c.evict(&k);
        }
        assert!(room(&c) < peak / 8, "{} of {peak}", room(&c));
        assert_eq!(
            c.get(&9_950).ok().map(|v| *v),
            Some(9_950),
            "the rest stays cached"
        );
    }

    #[test]
    fn a_slow_reader_cannot_put_back_what_a_write_replaced() {
        let c: Cached<String, u32> = Cached::new();
        let key = "k".to_string();
        let seen = c.get(&key).expect_err("nothing cached yet");
        // A writer changes the record (forgetting it before and after) while the reader is
        // loading the old one.
        c.invalidate(&key);
        let seen_during = c.get(&key).expect_err("forgotten");
        c.invalidate(&key);
        assert_eq!(
            *c.fill(key.clone(), 1, seen),
            1,
            "the reader still gets what it read"
        );
        c.fill(key.clone(), 1, seen_during);
        assert!(c.get(&key).is_err(), "but neither load is cached");
        let seen = c.get(&key).expect_err("not cached");
        c.fill(key.clone(), 2, seen);
        assert_eq!(
            c.get(&key).ok().map(|v| *v),
            Some(2),
            "a load after the write is"
        );
    }
}
