//! Reclaiming local storage: segment files no live ledger or replica copy may reference,
//! and index files of ledgers no longer held (left by a crash mid-deletion).
//!
//! Invariant: a segment is removed only when no ledger this bookie wrote and still holds
//! (open, sealed, offloaded) and no replica copy it holds may have entries in it.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use super::error::{LifecycleError, OpenError};
use super::index;
use super::metadata::LedgerState;
use super::segment::{list_segments, segment_path, sync_dir};
use super::{blocking, LogShared};

/// The states of ledgers whose entries the log holds (their segments and index files stay).
pub(super) const HELD_LOCALLY: [LedgerState; 3] = [
    LedgerState::Open,
    LedgerState::Sealed,
    LedgerState::Offloaded,
];

/// Deletes segment files that no live ledger or replica copy may reference
/// ([`Log::reclaim_segments`]).
pub(crate) async fn reclaim(shared: &Arc<LogShared>) -> Result<Vec<u32>, LifecycleError> {
    // Read the current segment first: a ledger created after this point starts at or after it.
    let current = shared.journal.current_segment();
    let live = shared.meta.ledgers_in_states(&HELD_LOCALLY).await?;
    let mut ranges: Vec<(u32, u32)> = live
        .iter()
        .filter(|l| shared.writes(l))
        .map(|l| match (l.state, l.seal) {
            (LedgerState::Open, _) | (_, None) => (l.first_segment, u32::MAX),
            (_, Some(s)) => (l.first_segment, s.last_segment),
        })
        .collect();
    // Copies of other writers' ledgers: their segments are this journal's, not the writer's.
    ranges.extend(shared.replicas.segment_ranges());
    // Directory listing, removal and the directory fsync run on the blocking pool.
    let shared = shared.clone();
    blocking(move || {
        let dir = shared.segments.dir().to_path_buf();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LifecycleError::Io { path, source }
        };
        let segments = list_segments(&dir).map_err(io(&dir))?;
        let mut removed = Vec::new();
        for s in segments.into_iter().filter(|s| *s < current) {
            if ranges.iter().any(|(lo, hi)| *lo <= s && s <= *hi) {
                continue;
            }
            shared.segments.forget(s);
            let path = segment_path(&dir, s);
            std::fs::remove_file(&path).map_err(io(&path))?;
            removed.push(s);
        }
        if !removed.is_empty() {
            crate::failpoint::hit("ledger.reclaim.before_sync");
            sync_dir(&dir).map_err(io(&dir))?;
            tracing::info!(segments = ?removed, "reclaimed segments");
        }
        Ok(removed)
    })
    .await
}

/// Removes the index files of ledgers not held locally any more (recovery only: no ledger
/// is sealed concurrently). Returns how many.
pub(super) async fn remove_stale_index_files(shared: &LogShared) -> Result<usize, OpenError> {
    let live: HashSet<u64> = shared
        .meta
        .ledgers_in_states(&HELD_LOCALLY)
        .await?
        .into_iter()
        .filter(|l| shared.writes(l))
        .map(|l| l.id)
        .chain(shared.replicas.ledgers())
        .collect();
    let dir = shared.index_dir.clone();
    let removed = tokio::task::spawn_blocking(move || {
        index::remove_stale_index_files(&dir, &live).map_err(|source| OpenError::Io {
            path: dir.clone(),
            source,
        })
    })
    .await
    .map_err(|e| OpenError::Journal(e.to_string()))??;
    if !removed.is_empty() {
        tracing::info!(ledgers = ?removed, "removed index files of ledgers no longer held locally");
    }
    Ok(removed.len())
}
