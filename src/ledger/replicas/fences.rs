//! Fences that outlive a restart (ADR 0014). A recovering owner fences a ledger on its
//! replicas so that the old writer can add nothing more; a replica that forgot the fence when
//! it restarted could still take the old writer's adds and, with the writer's own copy, make
//! up an ack quorum for an entry recovery already decided against. So the fence is written to
//! a file (`<ledger>.fence` beside the registry) before it is answered, and read back at open.
//!
//! Invariants:
//! - [`FenceFiles`] lists every fence file that exists (a ledger is listed before its file is
//!   written, so a write that failed half-way is still listed and removed later).
//! - A fence file is removed only when its owner says the fence cannot matter across a
//!   restart any more (the collection pass: this bookie's copy is sealed, or it has no copy and
//!   the store no longer holds the ledger open).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use super::registry::{remove_fence, write_fence};
use crate::ledger::metadata::LedgerId;

/// The fence files of one bookie's replica directory.
#[derive(Debug)]
pub(crate) struct FenceFiles {
    dir: PathBuf,
    /// Invariant: see the module.
    files: Mutex<HashSet<LedgerId>>,
}

impl FenceFiles {
    /// The fence files in `dir`, `found` at open.
    pub fn new(dir: PathBuf, found: impl IntoIterator<Item = LedgerId>) -> Self {
        FenceFiles {
            dir,
            files: Mutex::new(found.into_iter().collect()),
        }
    }

    fn files(&self) -> MutexGuard<'_, HashSet<LedgerId>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ledgers with a fence file.
    pub fn listed(&self) -> Vec<LedgerId> {
        self.files().iter().copied().collect()
    }

    /// Whether there is no fence file.
    pub fn is_empty(&self) -> bool {
        self.files().is_empty()
    }

    /// Writes `ledger`'s fence file durably; where it is, on failure.
    pub async fn persist(&self, ledger: LedgerId) -> Result<(), (PathBuf, std::io::Error)> {
        self.files().insert(ledger);
        let dir = self.dir.clone();
        self.on_disk(ledger, move || write_fence(&dir, ledger))
            .await
    }

    /// Removes `ledger`'s fence file (a missing one is fine); where it is, on failure.
    pub async fn release(&self, ledger: LedgerId) -> Result<(), (PathBuf, std::io::Error)> {
        let dir = self.dir.clone();
        self.on_disk(ledger, move || remove_fence(&dir, ledger))
            .await?;
        self.files().remove(&ledger);
        tracing::debug!(ledger, "released a fence file");
        Ok(())
    }

    /// Runs `io` on the blocking pool.
    async fn on_disk(
        &self,
        ledger: LedgerId,
        io: impl FnOnce() -> std::io::Result<()> + Send + 'static,
    ) -> Result<(), (PathBuf, std::io::Error)> {
        let path = super::registry::fence_path(&self.dir, ledger);
        match tokio::task::spawn_blocking(io).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err((path, e)),
            Err(e) => Err((
                path,
                std::io::Error::other(format!("blocking task failed: {e}")),
            )),
        }
    }
}
