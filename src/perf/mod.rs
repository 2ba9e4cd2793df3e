//! Load generators behind `ledgerlake perf`, and the physical baseline they are compared with.
//!
//! - [`disk`]: the limit of the disk as our tool sees it: sequential writes + `fdatasync` of a
//!   plain file (bandwidth with large writes; latency of one small write + `fdatasync`).
//! - [`log_load`]: the log driven in-process by N writers (each a topic with a window of
//!   in-flight appends, like a Pulsar producer's pending-message queue), optionally rate-limited.
//!
//! - [`pulsar_load`]: `perf produce|consume` against a running service over the Pulsar protocol.
//! - [`offload_bench`]: offload throughput (sealed entries → committed Iceberg snapshot) beside
//!   plain parquet-rs encoding of the same rows.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

pub mod disk;
pub mod log_load;
pub mod offload_bench;
pub mod produce;
pub mod pulsar_load;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Maximum.
    pub max_us: u64,
    /// Mean.
    pub mean_us: f64,
}

impl Latency {
    /// Percentiles of a histogram recorded in microseconds.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        Latency {
            count: h.len(),
            p50_us: h.value_at_quantile(0.50),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            mean_us: h.mean(),
        }
    }
}

/// A histogram for latencies from 1 µs to 60 s with 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    #[allow(clippy::expect_used)]
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant histogram bounds are valid")
}

/// Records a duration in microseconds (clamped to the histogram's range).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = (d.as_micros() as u64).clamp(1, 60_000_000);
    let _ = h.record(us);
}

/// Deterministic incompressible bytes (xorshift), for payloads that do not flatter compression.
pub fn pseudo_random_bytes(len: usize) -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// User + system CPU seconds of this process so far, from `/proc/self/stat` (Linux; 0 where
/// it cannot be read). Ticks are `USER_HZ`, which Linux fixes at 100 for user space.
pub(crate) fn process_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start at field 3 (`state`);
    // utime and stime are fields 14 and 15.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}
