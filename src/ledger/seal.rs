//! How a ledger is closed: sealed (its index file written and fsynced, then the seal recorded in
//! the metadata store), or discarded when it holds no entry (sealed empty and deleted, no index
//! file, nothing for the lake) — one at a time when a topic rolls or closes, and many at once
//! when recovery closes every ledger a crash left open (their index files made durable in
//! batches, with two syncs per batch rather than two per file).
//!
//! Invariant: a ledger is recorded sealed only after its index file is durable, so every sealed
//! ledger this bookie holds can be read by (ledger, entry) without a scan.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;

use super::error::{LifecycleError, OpenError};
use super::index::{write_index_file, write_index_files, IndexEntry};
use super::metadata::{LedgerId, LedgerRecord, LedgerTransition, MetadataError, SealInfo};
use super::open_ledger::Written;
use super::{now_ms, LogShared};

/// Ledgers recovery records at once: their metadata writes meet in the store's group commits.
const RECOVERY_CONCURRENCY: usize = 64;

/// Ledgers whose index files recovery makes durable together (one blocking task, two syncs).
const RECOVERY_BATCH: usize = 4096;

/// Writes the index file and records the seal (open → sealed).
pub(crate) async fn seal_ledger(
    shared: &Arc<LogShared>,
    ledger: LedgerId,
    entries: Vec<IndexEntry>,
    info: SealInfo,
) -> Result<LedgerRecord, LifecycleError> {
    seal_ledger_as(shared, ledger, entries, LedgerTransition::Seal(info)).await
}

/// [`seal_ledger`] with the seal transition given (a replicated ledger's seal records where
/// its copies are in the same step: [`LedgerTransition::SealPlaced`]).
pub(crate) async fn seal_ledger_as(
    shared: &Arc<LogShared>,
    ledger: LedgerId,
    entries: Vec<IndexEntry>,
    seal: LedgerTransition,
) -> Result<LedgerRecord, LifecycleError> {
    let dir = shared.index_dir.clone();
    let entries: Arc<[IndexEntry]> = entries.into();
    let to_write = entries.clone();
    tokio::task::spawn_blocking(move || write_index_file(&dir, ledger, &to_write))
        .await
        .map_err(|_| LifecycleError::Cancelled)??;
    crate::failpoint::hit("ledger.seal.after_index");
    record_seal(shared, ledger, entries, seal).await
}

/// Records the seal of `ledger`, whose index file is durable, and caches its index.
async fn record_seal(
    shared: &LogShared,
    ledger: LedgerId,
    entries: Arc<[IndexEntry]>,
    seal: LedgerTransition,
) -> Result<LedgerRecord, LifecycleError> {
    store_failpoint("ledger.seal.record")?;
    let record = shared
        .meta
        .transition_ledger(ledger, seal, now_ms())
        .await?;
    store_failpoint("ledger.seal.answer")?;
    crate::failpoint::hit("ledger.seal.after_record");
    shared.index_cache.insert(ledger, entries);
    Ok(record)
}

/// Failpoint `name` armed to fail (debug builds only) as the store's transition failing.
fn store_failpoint(name: &str) -> Result<(), MetadataError> {
    crate::failpoint::io_error(name).map_err(|source| MetadataError::Backend {
        op: "transition_ledger",
        source: Box::new(source),
    })
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

/// Closes every ledger recovery found open (`first_segments`: id → its first segment), in
/// batches: the index files of a batch's ledgers with entries are made durable together, then
/// their seals are recorded, and the empty ones discarded. Any failure stops the recovery (the
/// ledgers not yet closed stay open and the next start closes them).
pub(super) async fn seal_recovered(
    shared: &Arc<LogShared>,
    ledgers: BTreeMap<LedgerId, Written>,
    first_segments: &BTreeMap<LedgerId, u32>,
) -> Result<Recovered, OpenError> {
    let failed = |id: LedgerId, e: &dyn std::fmt::Display| {
        OpenError::Journal(format!("sealing recovered ledger {id}: {e}"))
    };
    let mut done = Recovered::default();
    let mut ledgers = ledgers.into_iter().peekable();
    while ledgers.peek().is_some() {
        let batch: Vec<(LedgerId, SealInfo, Arc<[IndexEntry]>)> = ledgers
            .by_ref()
            .take(RECOVERY_BATCH)
            .map(|(id, written)| {
                let first = first_segments.get(&id).copied().unwrap_or(0);
                (id, written.seal_info(first), written.entries.into())
            })
            .collect();
        let files: Vec<(LedgerId, Arc<[IndexEntry]>)> = batch
            .iter()
            .filter(|(_, info, _)| info.entry_count > 0)
            .map(|(id, _, entries)| (*id, entries.clone()))
            .collect();
        if let Some((first, _)) = files.first() {
            let first = *first;
            let dir = shared.index_dir.clone();
            tokio::task::spawn_blocking(move || write_index_files(&dir, &files))
                .await
                .map_err(|e| failed(first, &e))?
                .map_err(|e| failed(first, &e))?;
            crate::failpoint::hit("ledger.seal.after_index");
        }
        let mut closing = futures::stream::iter(batch)
            .map(|(id, info, entries)| async move {
                let closed = if info.entry_count == 0 {
                    discard_empty(shared, id, info).await
                } else {
                    record_seal(shared, id, entries, LedgerTransition::Seal(info)).await
                };
                closed.map(|_| info.entry_count).map_err(|e| failed(id, &e))
            })
            .buffer_unordered(RECOVERY_CONCURRENCY);
        while let Some(closed) = closing.next().await {
            done.entries += closed?;
            done.ledgers += 1;
            crate::failpoint::hit("ledger.recovery.after_seal");
        }
    }
    Ok(done)
}
