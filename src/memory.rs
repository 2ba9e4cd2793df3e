//! Giving freed memory back to the system. The binary decides how — it alone may call the
//! allocator's unsafe functions (the library forbids `unsafe`), and it configures malloc to keep
//! freed memory for reuse, which the offload's buffers need — and installs that with
//! [`set_release`]. The library calls [`release`] after it freed much at once (idle topics
//! unloaded), on the blocking pool and at most once per [`MIN_INTERVAL`] (callers debounce),
//! and a large short-lived buffer (a `/metrics` text) holds a [`ReleaseOnDrop`]. Maps whose
//! entries come and go with topics give their room back with [`shrink_sparse`].
//!
//! Invariant: without an installed release (tests, other binaries), [`release`] does nothing.

use std::sync::OnceLock;
use std::time::Duration;

/// Shortest time between two releases.
pub const MIN_INTERVAL: Duration = Duration::from_secs(30);

static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Installs how freed memory is handed back (once; later calls are ignored).
pub fn set_release(f: fn()) {
    let _ = RELEASE.set(f);
}

/// Hands freed memory back to the system, on the blocking pool (it walks the allocator's
/// heaps). Does nothing when no release is installed.
pub async fn release() {
    if let Some(f) = RELEASE.get().copied() {
        let _ = tokio::task::spawn_blocking(f).await;
    }
}

/// When a release last started (shared by [`ReleaseOnDrop`] guards).
static LAST: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

/// Hands freed memory back when dropped, at most once per [`MIN_INTERVAL`] across guards: held
/// by a large buffer that lives briefly (a `/metrics` text of many topics), so the memory its
/// making took does not stay with the process. Outside a tokio runtime it does nothing.
#[derive(Debug, Default)]
pub struct ReleaseOnDrop;

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let now = std::time::Instant::now();
        {
            let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| now.duration_since(t) < MIN_INTERVAL) {
                return;
            }
            *last = Some(now);
        }
        runtime.spawn(release());
    }
}

/// Gives back most of a map's room once it holds under a quarter of what it has room for (a
/// map keeps its peak's room after removals: 100,000 topics unloaded left megabytes per map).
/// Shrinking rehashes, but only after the map lost three quarters of its room's worth of
/// entries since it grew, so its cost is spread over those removals.
pub fn shrink_sparse<K: std::hash::Hash + Eq, V, S: std::hash::BuildHasher>(
    map: &mut std::collections::HashMap<K, V, S>,
) {
    const SMALL: usize = 1024;
    if map.capacity() > SMALL && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

/// Drops the entries of `map` that `keep` refuses once the map has doubled since the last
/// such sweep (and holds at least 1,024), then gives its room back: a map whose dead entries
/// are found only by looking (weak references, locks nobody holds) is swept at an amortised
/// constant cost per insertion instead of on every one. `next` holds the size that triggers
/// the next sweep (0 at first).
pub fn sweep_when_doubled<K: std::hash::Hash + Eq, V>(
    map: &mut std::collections::HashMap<K, V>,
    next: &mut usize,
    keep: impl FnMut(&K, &mut V) -> bool,
) {
    if map.len() >= (*next).max(1024) {
        map.retain(keep);
        shrink_sparse(map);
        *next = map.len() * 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_map_gives_its_room_back() {
        let mut map: std::collections::HashMap<u32, u32> = (0..100_000).map(|i| (i, i)).collect();
        let peak = map.capacity();
        for i in 0..99_000 {
            map.remove(&i);
            shrink_sparse(&mut map);
        }
        assert!(map.capacity() < peak / 16, "{} of {peak}", map.capacity());
        assert_eq!(map.len(), 1_000);
        assert!((99_000..100_000).all(|i| map.get(&i) == Some(&i)));
        let small = map.capacity();
        shrink_sparse(&mut map);
        assert_eq!(
            map.capacity(),
            small,
            "a map at a quarter or more keeps its room"
        );
    }

    #[test]
    fn a_sweep_waits_until_the_map_doubled() {
        let mut map: std::collections::HashMap<u32, bool> = std::collections::HashMap::new();
        let mut next = 0;
        for i in 0..1023 {
            map.insert(i, i % 2 == 0);
            sweep_when_doubled(&mut map, &mut next, |_, live| *live);
        }
        assert_eq!(map.len(), 1023, "no sweep below 1,024");
        map.insert(1023, false);
        sweep_when_doubled(&mut map, &mut next, |_, live| *live);
        assert_eq!(map.len(), 512, "the dead half went");
        assert_eq!(next, 1024);
    }
}
