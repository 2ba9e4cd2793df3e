//! The building blocks of per-topic measures: [`Meter`] (message and byte counters with a rate
//! over a sliding window) and [`Buckets`] (Pulsar's fixed-bound histograms, exposed as one
//! `…_le_*` gauge per bucket).
//!
//! Recording is lock-free (atomics); only taking a rate sample locks, a few times per window.
//! A meter is about 250 bytes and holds nothing else, so an idle topic's measures cost nothing
//! but memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Milliseconds since the first call (a monotonic clock for rate windows).
pub fn mono_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Samples a window holds: a rate covers between `SLOTS - 1` and `SLOTS` sample steps.
const SLOTS: usize = 8;

/// The time between two samples of a meter whose rates cover `window_ms`: a meter needs one
/// sample a step for exact windows ([`Meter::sample`]).
pub fn step_ms(window_ms: u64) -> u64 {
    (window_ms / (SLOTS as u64 - 1)).max(1)
}

/// A cumulative sample of a meter's counters.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    at_ms: u64,
    msgs: u64,
    bytes: u64,
}

/// The samples of the last window, oldest first once full.
#[derive(Debug)]
struct Ring {
    /// Invariant: `samples[..len]` are in time order starting at `start`, modulo `SLOTS`.
    samples: [Sample; SLOTS],
    start: usize,
    len: usize,
}

/// Messages and bytes counted since creation, and their rate over the last window.
#[derive(Debug)]
pub struct Meter {
    msgs: AtomicU64,
    bytes: AtomicU64,
    ring: Mutex<Ring>,
}

impl Default for Meter {
    fn default() -> Self {
        let mut samples = [Sample::default(); SLOTS];
        samples[0].at_ms = mono_ms();
        Self {
            msgs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            ring: Mutex::new(Ring {
                samples,
                start: 0,
                len: 1,
            }),
        }
    }
}

/// A rate in messages and bytes per second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rate {
    /// Messages per second.
    pub msgs: f64,
    /// Bytes per second.
    pub bytes: f64,
}

impl Meter {
    /// Counts `msgs` messages of `bytes` bytes.
    pub fn record(&self, msgs: u64, bytes: u64) {
        self.msgs.fetch_add(msgs, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Messages and bytes counted since creation.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.msgs.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    /// Takes a sample if a step (`window / (SLOTS - 1)`) has passed since the last one, so the
    /// ring spans about one window. Call it at least once a step for exact windows; calling
    /// more often is harmless. Returns when the next sample is due ([`mono_ms`]): a step after
    /// the last one taken.
    pub fn sample(&self, window_ms: u64) -> u64 {
        let now = mono_ms();
        let (msgs, bytes) = self.totals();
        let step = step_ms(window_ms);
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let last = ring.samples[(ring.start + ring.len - 1) % SLOTS];
        if now.saturating_sub(last.at_ms) < step {
            return last.at_ms + step;
        }
        let s = Sample {
            at_ms: now,
            msgs,
            bytes,
        };
        if ring.len < SLOTS {
            let i = (ring.start + ring.len) % SLOTS;
            ring.samples[i] = s;
            ring.len += 1;
        } else {
            let i = ring.start;
            ring.samples[i] = s;
            ring.start = (ring.start + 1) % SLOTS;
        }
        now + step
    }

    /// The rate from the oldest sample still within `window_ms` (or the oldest kept) to now.
    pub fn rate(&self, window_ms: u64) -> Rate {
        let now = mono_ms();
        let (msgs, bytes) = self.totals();
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut oldest = ring.samples[ring.start];
        for k in 0..ring.len {
            let s = ring.samples[(ring.start + k) % SLOTS];
            if now.saturating_sub(s.at_ms) <= window_ms {
                oldest = s;
                break;
            }
            oldest = s;
        }
        drop(ring);
        let span_ms = now.saturating_sub(oldest.at_ms);
        if span_ms == 0 {
            return Rate::default();
        }
        let secs = span_ms as f64 / 1000.0;
        Rate {
            msgs: msgs.saturating_sub(oldest.msgs) as f64 / secs,
            bytes: bytes.saturating_sub(oldest.bytes) as f64 / secs,
        }
    }
}

/// Pulsar's `pulsar_storage_write_latency_le_*` bounds, in microseconds, with the suffix each
/// bucket's gauge carries.
pub const WRITE_LATENCY_US: [(u64, &str); 9] = [
    (500, "0_5"),
    (1_000, "1"),
    (5_000, "5"),
    (10_000, "10"),
    (20_000, "20"),
    (50_000, "50"),
    (100_000, "100"),
    (200_000, "200"),
    (1_000_000, "1000"),
];

/// Pulsar's `pulsar_entry_size_le_*` bounds, in bytes.
pub const ENTRY_SIZE_BYTES: [(u64, &str); 8] = [
    (128, "128"),
    (512, "512"),
    (1024, "1_kb"),
    (2048, "2_kb"),
    (4096, "4_kb"),
    (16 * 1024, "16_kb"),
    (100 * 1024, "100_kb"),
    (1024 * 1024, "1_mb"),
];

/// A histogram with fixed bounds as Pulsar exposes it: each bucket counts the values above the
/// previous bound and at most its own (not cumulative), the last counts the overflow.
#[derive(Debug)]
pub struct Buckets<const N: usize> {
    bounds: &'static [(u64, &'static str); N],
    /// Invariant: `N + 1` counters, the last for values above every bound.
    counts: Vec<AtomicU64>,
    sum: AtomicU64,
}

impl<const N: usize> Buckets<N> {
    /// Empty buckets with these bounds.
    pub fn new(bounds: &'static [(u64, &'static str); N]) -> Self {
        Self {
            bounds,
            counts: (0..=N).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    /// Counts one value.
    pub fn record(&self, value: u64) {
        let i = self
            .bounds
            .iter()
            .position(|(b, _)| value <= *b)
            .unwrap_or(N);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// The counts now: per bucket (the last is the overflow), their total and the sum.
    pub fn snapshot(&self) -> BucketCounts {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        BucketCounts {
            count: counts.iter().sum(),
            counts,
            sum: self.sum.load(Ordering::Relaxed),
        }
    }

    /// The bucket suffixes, in order.
    pub fn suffixes(&self) -> impl Iterator<Item = &'static str> {
        self.bounds.iter().map(|(_, s)| *s)
    }
}

/// What [`Buckets::snapshot`] read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketCounts {
    /// Per bucket, the overflow last.
    pub counts: Vec<u64>,
    /// Values counted.
    pub count: u64,
    /// Sum of the values.
    pub sum: u64,
}

impl BucketCounts {
    /// Adds `other` (same bounds) into this one.
    pub fn add(&mut self, other: &BucketCounts) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_each_value_once_in_its_bucket() {
        let b = Buckets::new(&WRITE_LATENCY_US);
        for v in [0, 500, 501, 1_000, 999_999, 1_000_001, 5_000_000] {
            b.record(v);
        }
        let s = b.snapshot();
        assert_eq!(s.counts, vec![2, 2, 0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(s.count, 7);
        assert_eq!(s.sum, 500 + 501 + 1_000 + 999_999 + 1_000_001 + 5_000_000);
    }

    #[test]
    fn rate_covers_the_window_and_drops_older_traffic() {
        let m = Meter::default();
        m.record(1_000, 10_000);
        std::thread::sleep(std::time::Duration::from_millis(60));
        // A window of 40 ms: the sample taken now starts it, so the old burst is out of it.
        m.sample(1);
        std::thread::sleep(std::time::Duration::from_millis(50));
        m.record(10, 100);
        let r = m.rate(40);
        assert!(r.msgs > 0.0 && r.msgs < 1_000.0, "{r:?}");
        // A long window still sees the burst.
        let r = m.rate(10_000);
        assert!(r.msgs > 1_000.0, "{r:?}");
        assert_eq!(m.totals(), (1_010, 10_100));
    }
}
