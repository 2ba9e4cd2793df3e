//! Fences that outlive a restart (ADR 0014). A recovering owner fences a ledger on its
//! replicas so that the old writer can add nothing more; a replica that forgot the fence when
//! it restarted could still take the old writer's adds and, with the writer's own copy, make
//! up an ack quorum for an entry recovery already decided against. So the fence is written to
//! a file (`<ledger>.fence` beside the registry) before it is answered, and read back at open.
//!
//! Invariants:
//! - `Replicas::fence_files` names exactly the fence files that exist (written by
//!   [`persist_fence`], read at open, removed only by [`release_fences`]).
//! - A fence file is removed only once the fence cannot matter across a restart: this
//!   bookie's copy is sealed (a sealed copy refuses adds itself), or it has no copy and the
//!   store no longer holds the ledger open (a new copy needs an open ledger). The fence in
//!   memory stays for the rest of the process.

use std::collections::HashSet;
use std::sync::Arc;

use super::registry::{remove_fence, write_fence};
use super::{Copy, Replicas};
use crate::ledger::error::{LifecycleError, ReadError};
use crate::ledger::metadata::{LedgerId, LedgerState};
use crate::ledger::LogShared;

impl Replicas {
    /// Ledgers with a fence file.
    pub(crate) fn fence_files(&self) -> std::sync::MutexGuard<'_, HashSet<LedgerId>> {
        self.fence_files.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes `ledger`'s fence durably (before the fence is answered).
pub(super) async fn persist_fence(
    shared: &Arc<LogShared>,
    ledger: LedgerId,
) -> Result<(), ReadError> {
    let dir = shared.replicas.dir.clone();
    let written = tokio::task::spawn_blocking(move || write_fence(&dir, ledger))
        .await
        .map_err(|_| ReadError::Cancelled)?;
    written.map_err(|source| ReadError::Io {
        path: super::registry::fence_path(&shared.replicas.dir, ledger),
        offset: 0,
        source,
    })?;
    shared.replicas.fence_files().insert(ledger);
    Ok(())
}

/// Removes the fence files no longer needed (module invariants); how many.
pub(crate) async fn release_fences(shared: &Arc<LogShared>) -> Result<usize, LifecycleError> {
    let files: Vec<LedgerId> = shared.replicas.fence_files().iter().copied().collect();
    let mut released = 0;
    for ledger in files {
        let copy = shared.replicas.lock().get(&ledger).map(|(_, c)| c.clone());
        let needed = match copy {
            Some(Copy::Sealed { .. }) => false,
            Some(Copy::Open(_)) => true,
            None if shared.replicas.copying().contains_key(&ledger) => true,
            None => shared
                .meta
                .get_ledger(ledger)
                .await?
                .is_some_and(|r| r.state == LedgerState::Open),
        };
        if needed {
            continue;
        }
        let dir = shared.replicas.dir.clone();
        super::super::blocking(move || {
            remove_fence(&dir, ledger).map_err(|source| LifecycleError::Io {
                path: super::registry::fence_path(&dir, ledger),
                source,
            })
        })
        .await?;
        shared.replicas.fence_files().remove(&ledger);
        released += 1;
        tracing::debug!(ledger, "released a fence file");
    }
    Ok(released)
}
