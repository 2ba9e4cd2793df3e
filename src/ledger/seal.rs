//! How a ledger is closed: sealed (its index file written and fsynced, then the seal recorded in
//! the metadata store), or discarded when it holds no entry (sealed empty and deleted, no index
//! file, nothing for the lake) — one at a time when a topic rolls or closes, and many at once
//! when recovery closes every ledger a crash left open.
//!
//! Invariant: a ledger is recorded sealed only after its index file is durable, so every sealed
//! ledger this bookie holds can be read by (ledger, entry) without a scan.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;

use super::error::{LifecycleError, OpenError};
use super::index::{write_index_file, IndexEntry};
use super::metadata::{LedgerId, LedgerRecord, LedgerTransition, SealInfo};
use super::open_ledger::Written;
use super::{now_ms, LogShared};

/// Ledgers recovery closes at once: their index files are written on as many blocking threads
/// and their metadata writes meet in the store's group commits.
const RECOVERY_CONCURRENCY: usize = 64;

/// Writes the index file and records the seal (open → sealed).
pub(crate) async fn seal_ledger(
    shared: &Arc<LogShared>,
    ledger: LedgerId,
    entries: Vec<IndexEntry>,
    info: SealInfo,
) -> Result<LedgerRecord, LifecycleError> {
    let dir = shared.index_dir.clone();
    let entries: Arc<[IndexEntry]> = entries.into();
    let to_write = entries.clone();
    tokio::task::spawn_blocking(move || write_index_file(&dir, ledger, &to_write))
        .await
        .map_err(|_| LifecycleError::Cancelled)??;
    crate::failpoint::hit("ledger.seal.after_index");
    let record = shared
        .meta
        .transition_ledger(ledger, LedgerTransition::Seal(info), now_ms())
        .await?;
    crate::failpoint::hit("ledger.seal.after_record");
    shared.index_cache.insert(ledger, entries);
    Ok(record)
}

/// Closes `ledger`, which holds no entry (`info` says so): sealed empty, then deleted. It
/// holds nothing in any tier, so it needs no index file and the lake never sees it.
pub(crate) async fn discard_empty(
    shared: &LogShared,
    ledger: LedgerId,
    info: SealInfo,
) -> Result<LedgerRecord, LifecycleError> {
    debug_assert_eq!(info.entry_count, 0);
    shared
        .meta
        .transition_ledger(ledger, LedgerTransition::Seal(info), now_ms())
        .await?;
    Ok(shared
        .meta
        .transition_ledger(ledger, LedgerTransition::Delete, now_ms())
        .await?)
}

/// What closing the recovered ledgers did.
#[derive(Debug, Default)]
pub(super) struct Recovered {
    /// Ledgers sealed or discarded.
    pub ledgers: usize,
    /// Entries in them.
    pub entries: u64,
}

/// Closes every ledger recovery found open (`first_segments`: id → its first segment), many at
/// once: the ones with entries are sealed, the empty ones discarded. Any failure stops the
/// recovery (the ledgers not yet closed stay open and the next start closes them).
pub(super) async fn seal_recovered(
    shared: &Arc<LogShared>,
    ledgers: BTreeMap<LedgerId, Written>,
    first_segments: &BTreeMap<LedgerId, u32>,
) -> Result<Recovered, OpenError> {
    let mut closing = futures::stream::iter(ledgers)
        .map(|(id, written)| {
            let first = first_segments.get(&id).copied().unwrap_or(0);
            let info = written.seal_info(first);
            async move {
                let closed = if info.entry_count == 0 {
                    discard_empty(shared, id, info).await
                } else {
                    seal_ledger(shared, id, written.entries, info).await
                };
                closed
                    .map(|_| info.entry_count)
                    .map_err(|e| OpenError::Journal(format!("sealing recovered ledger {id}: {e}")))
            }
        })
        .buffer_unordered(RECOVERY_CONCURRENCY);
    let mut done = Recovered::default();
    while let Some(closed) = closing.next().await {
        done.entries += closed?;
        done.ledgers += 1;
        crate::failpoint::hit("ledger.recovery.after_seal");
    }
    Ok(done)
}
