//! The space guard of the log's volume: appends are refused with a retriable error
//! ([`AppendError::NoSpace`]) while the volume is nearly full (`ledger.max_disk_usage`, or less
//! room than two segments) or the journal's segment files pass the local-disk budget
//! (`ledger.max_local_size`).
//!
//! Why: the journal writes into preallocated segments, so the only write that can meet a full
//! disk is the creation of the next segment, and a failed journal write stops the journal until
//! restart (fail-stop: the state of a half-written segment is unknown). Refusing appends before
//! they get an entry id, while there is still room for a segment and for index files, keeps a
//! full disk a retriable condition: producers get SEND_ERROR, nothing acknowledged is touched,
//! and appends resume by themselves once space returns (a check every
//! `ledger.disk_check_interval`). Something else filling the volume faster than one check
//! interval can still reach the journal; then it fails-stop as designed.
//!
//! Invariant: `refusal` holds the reason of the last check that found a limit passed, and is
//! `None` after a check that found none (or before the first check).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::error::AppendError;
use crate::config::LedgerConfig;

/// The limits and the last check's verdict.
#[derive(Debug)]
pub(crate) struct DiskGuard {
    segments_dir: PathBuf,
    max_usage: f64,
    /// Free bytes always kept: two segments (the next one, and room for indexes and metadata).
    reserve: u64,
    /// `None`: no local-disk budget.
    budget: Option<u64>,
    refusal: Mutex<Option<Arc<str>>>,
    /// Invariant: equals `refusal.is_some()` (read without the lock on every append).
    refusing: AtomicBool,
    /// Bytes appends may still take before the next check: the room the last check found
    /// under every limit, less what was admitted since (so a burst between two checks cannot
    /// overrun the reserve). `u64::MAX` before the first check.
    headroom: AtomicU64,
}

/// What one check measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DiskUsage {
    pub volume_size: u64,
    pub volume_free: u64,
    pub segment_bytes: u64,
}

impl DiskGuard {
    pub fn new(segments_dir: &Path, config: &LedgerConfig) -> Self {
        let budget = config.max_local_size.as_u64();
        Self {
            segments_dir: segments_dir.to_path_buf(),
            max_usage: config.max_disk_usage,
            reserve: config.segment_size.as_u64().saturating_mul(2),
            budget: (budget > 0).then_some(budget),
            refusal: Mutex::new(None),
            refusing: AtomicBool::new(false),
            headroom: AtomicU64::new(u64::MAX),
        }
    }

    /// Admits an append of `cost` bytes, or refuses it while the last check found a limit
    /// passed or appends since then used the room it found.
    pub fn admit(&self, cost: u64) -> Result<(), AppendError> {
        if self.refusing.load(Ordering::Acquire) {
            if let Some(reason) = &*self.refusal.lock().unwrap_or_else(|p| p.into_inner()) {
                return Err(AppendError::NoSpace(reason.clone()));
            }
        }
        self.headroom
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| h.checked_sub(cost))
            .map(|_| ())
            .map_err(|_| {
                AppendError::NoSpace(
                    "the log's volume or local-disk budget is nearly used up: appends wait for \
                     the next space check"
                        .into(),
                )
            })
    }

    /// Measures the volume and the segments (blocking: statvfs and a directory listing) and
    /// updates the verdict. Returns the measurement.
    pub fn check(&self) -> std::io::Result<DiskUsage> {
        let stat = rustix::fs::statvfs(&self.segments_dir)?;
        let mut segment_bytes = 0;
        for dirent in std::fs::read_dir(&self.segments_dir)? {
            match dirent.and_then(|d| d.metadata()) {
                Ok(m) => segment_bytes += m.len(),
                // Reclaimed between the listing and the look.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let usage = DiskUsage {
            volume_size: stat.f_blocks.saturating_mul(stat.f_frsize),
            volume_free: stat.f_bavail.saturating_mul(stat.f_frsize),
            segment_bytes,
        };
        self.judge(usage);
        Ok(usage)
    }

    /// Updates the verdict from a measurement.
    fn judge(&self, u: DiskUsage) {
        let used = u.volume_size.saturating_sub(u.volume_free);
        let fraction = used as f64 / u.volume_size.max(1) as f64;
        let reason = if u.volume_free < self.reserve {
            Some(format!(
                "the log's volume is full: {} free, {} needed for the next segment \
                 (appends resume when space returns)",
                bytesize::ByteSize::b(u.volume_free),
                bytesize::ByteSize::b(self.reserve)
            ))
        } else if fraction > self.max_usage {
            Some(format!(
                "the log's volume is {:.1} % full, above ledger.max_disk_usage ({:.1} %); \
                 appends resume when space returns",
                fraction * 100.0,
                self.max_usage * 100.0
            ))
        } else {
            match self.budget {
                Some(b) if u.segment_bytes.saturating_add(self.reserve / 2) > b => Some(format!(
                    "the log holds {} locally, its budget (ledger.max_local_size) is {}: \
                     waiting for data to be offloaded to the lake",
                    bytesize::ByteSize::b(u.segment_bytes),
                    bytesize::ByteSize::b(b)
                )),
                _ => None,
            }
        };
        let usage_room = ((self.max_usage * u.volume_size as f64) as u64).saturating_sub(used);
        let budget_room = self.budget.map_or(u64::MAX, |b| {
            b.saturating_sub(u.segment_bytes.saturating_add(self.reserve / 2))
        });
        let room = u
            .volume_free
            .saturating_sub(self.reserve)
            .min(usage_room)
            .min(budget_room);
        self.headroom.store(room, Ordering::Release);
        let mut refusal = self.refusal.lock().unwrap_or_else(|p| p.into_inner());
        match (&*refusal, &reason) {
            (None, Some(r)) => tracing::warn!(reason = %r, "refusing appends"),
            (Some(_), None) => tracing::info!("accepting appends again: disk space returned"),
            _ => {}
        }
        self.refusing.store(reason.is_some(), Ordering::Release);
        *refusal = reason.map(Into::into);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(budget: u64) -> DiskGuard {
        let config = LedgerConfig {
            segment_size: bytesize::ByteSize::mib(1),
            max_disk_usage: 0.9,
            max_local_size: bytesize::ByteSize::b(budget),
            ..LedgerConfig::default()
        };
        DiskGuard::new(Path::new("/nonexistent"), &config)
    }

    const MIB: u64 = 1 << 20;

    fn usage(size: u64, free: u64, segments: u64) -> DiskUsage {
        DiskUsage {
            volume_size: size,
            volume_free: free,
            segment_bytes: segments,
        }
    }

    #[test]
    fn each_limit_refuses_and_space_returning_admits_again() {
        let g = guard(0);
        assert!(g.admit(1).is_ok(), "admits before the first check");
        g.judge(usage(100 * MIB, 50 * MIB, 10 * MIB));
        assert!(g.admit(1).is_ok());
        // Less room than two segments.
        g.judge(usage(100 * MIB, MIB, 10 * MIB));
        let err = g.admit(1).expect_err("volume full");
        assert!(err.to_string().contains("volume is full"), "{err}");
        // Above the usage fraction, with room for segments.
        g.judge(usage(1000 * MIB, 50 * MIB, 10 * MIB));
        let err = g.admit(1).expect_err("above max_disk_usage");
        assert!(err.to_string().contains("max_disk_usage"), "{err}");
        g.judge(usage(1000 * MIB, 500 * MIB, 10 * MIB));
        assert!(g.admit(1).is_ok());
    }

    #[test]
    fn the_local_budget_refuses_before_the_next_segment_would_pass_it() {
        let g = guard(8 * MIB);
        g.judge(usage(1000 * MIB, 900 * MIB, 6 * MIB));
        assert!(g.admit(1).is_ok());
        g.judge(usage(1000 * MIB, 900 * MIB, 7 * MIB + 1));
        let err = g.admit(1).expect_err("over budget");
        assert!(err.to_string().contains("max_local_size"), "{err}");
        g.judge(usage(1000 * MIB, 900 * MIB, 2 * MIB));
        assert!(g.admit(1).is_ok());
    }

    #[test]
    fn a_burst_between_two_checks_cannot_use_more_than_the_room_found() {
        let g = guard(0);
        // 85 of 100 MiB used, 90 % allowed: 5 MiB of appends until the next check (the
        // volume's own room, 15 MiB less the 2 MiB reserve, is larger).
        g.judge(usage(100 * MIB, 15 * MIB, MIB));
        assert!(g.admit(3 * MIB).is_ok());
        assert!(g.admit(2 * MIB).is_ok());
        let err = g.admit(1).expect_err("room used up");
        assert!(err.to_string().contains("next space check"), "{err}");
        g.judge(usage(100 * MIB, 15 * MIB, MIB));
        assert!(g.admit(1).is_ok(), "a check restores the room");
    }

    #[test]
    fn a_real_directory_is_measured() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("00000001.seg"), vec![0u8; 4096])?;
        let config = LedgerConfig::default();
        let g = DiskGuard::new(dir.path(), &config);
        let u = g.check()?;
        assert_eq!(u.segment_bytes, 4096);
        assert!(u.volume_size > 0 && u.volume_free <= u.volume_size);
        Ok(())
    }
}
