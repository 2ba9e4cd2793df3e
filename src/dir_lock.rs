//! One process per data directory: a service holds an exclusive advisory lock (`flock`) on
//! `<data_dir>/lock` for as long as it runs; a second process started on the same directory
//! is refused at once, before it opens anything else there.
//!
//! The kernel drops the lock when the process dies, however it dies, so a node restarted after
//! a crash never waits for it; and a process that holds it knows every earlier process of the
//! directory (of its bookie id) is gone, which lets a restarted node end its predecessor's
//! coordination session at once ([`crate::cluster::membership::Membership::join`]).
//!
//! Limit: `flock` is per host. A directory shared between hosts (a network file system) or
//! cloned to another host is not protected; neither is supported.

use std::fs::File;
use std::path::{Path, PathBuf};

/// Name of the lock file in the data directory.
pub const FILE: &str = "lock";

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirLockError {
    /// Another live process holds it.
    #[error("data directory {} is in use by another ledgerlake process (it holds {})", dir.display(), dir.join(FILE).display())]
    InUse {
        /// The data directory.
        dir: PathBuf,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock {}: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DirLock {
    /// Invariant: holds an exclusive `flock` on `<dir>/lock` while this value lives.
    _file: File,
}

/// Takes the lock of `dir` (which exists), or says who holds it. Blocking but brief.
pub fn lock(dir: &Path) -> Result<DirLock, DirLockError> {
    let path = dir.join(FILE);
    let io = |source| DirLockError::Io {
        path: path.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(DirLock { _file: file }),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(DirLockError::InUse {
            dir: dir.to_path_buf(),
        }),
        Err(e) => Err(io(e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_goes() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let first = lock(dir.path())?;
        assert!(matches!(lock(dir.path()), Err(DirLockError::InUse { .. })));
        drop(first);
        let _again = lock(dir.path())?;
        Ok(())
    }
}
