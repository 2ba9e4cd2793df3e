//! The disk's physical limit as seen by a plain file: what the log is measured against.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{latency_histogram, record, Latency};

/// Sequential write + fdatasync bandwidth of a plain file.
#[derive(Debug, Clone, Serialize)]
pub struct Bandwidth {
    /// Bytes per write (each followed by `fdatasync`).
    pub write_size: usize,
    /// Bytes written.
    pub bytes: u64,
    /// Elapsed seconds.
    pub seconds: f64,
    /// MB/s (10^6 bytes).
    pub mb_per_s: f64,
}

/// Measures sequential appends of `write_size` bytes, each followed by `fdatasync`, to a new file
/// in `dir` for `duration`. Blocking.
pub fn fsync_bandwidth(
    dir: &Path,
    write_size: usize,
    duration: Duration,
) -> std::io::Result<Bandwidth> {
    let path = dir.join("baseline-bandwidth.dat");
    let mut f = new_file(&path)?;
    let block = super::pseudo_random_bytes(write_size);
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < duration {
        f.write_all(&block)?;
        f.sync_data()?;
        bytes += block.len() as u64;
    }
    let seconds = start.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(Bandwidth {
        write_size,
        bytes,
        seconds,
        mb_per_s: bytes as f64 / seconds / 1e6,
    })
}

/// Latency of one small sequential append + `fdatasync`.
#[derive(Debug, Clone, Serialize)]
pub struct SyncLatency {
    /// Bytes per write.
    pub write_size: usize,
    /// Percentiles.
    pub latency: Latency,
}

/// Measures `write + fdatasync` of `write_size` bytes appended to a new plain file, back to back,
/// for `duration`. Blocking.
pub fn fsync_latency(
    dir: &Path,
    write_size: usize,
    duration: Duration,
) -> std::io::Result<SyncLatency> {
    let path = dir.join("baseline-latency.dat");
    let mut f = new_file(&path)?;
    let block = super::pseudo_random_bytes(write_size);
    let mut h = latency_histogram();
    let start = Instant::now();
    while start.elapsed() < duration {
        let t = Instant::now();
        f.write_all(&block)?;
        f.sync_data()?;
        record(&mut h, t.elapsed());
    }
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(SyncLatency {
        write_size,
        latency: Latency::from_histogram(&h),
    })
}

fn new_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
}
