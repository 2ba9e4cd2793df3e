//! The copies this bookie holds of ledgers other nodes write (ADR 0010).
//!
//! A replicated ledger's writer sends each entry to every replica of its ensemble
//! ([`crate::protocol::bookie::BookieRequest::AddEntry`]). The replica appends it to its own
//! journal, like its own entries (same record format, same group commit), keeps where each
//! entry landed in memory while the ledger is open, and writes an index file once it learns the
//! seal (from the writer, or from the metadata store at its next start or collection pass).
//!
//! What a replica knows of each copy is in a small registry file per ledger
//! (`<ledger dir>/replicas/<ledger>.rep`, [`RegistryRecord`], written durably before the copy's
//! first entry is): the segment its first entry went to, and once sealed, the last segment and
//! the entry count. Recovery, segment reclamation and stale-index removal read it, since the
//! metadata store's `first_segment` is the writer's. A fence a recovering owner sets here is
//! written beside it (`<ledger>.fence`, [`fences`], ADR 0014) before it is answered, so it
//! outlives a restart.
//!
//! Invariants:
//! - A copy's entries are dense from 0: an add whose entry is not the next one is refused. In
//!   a striped ledger (ADR 0017) a copy holds its place's stripe: the next entry is the next
//!   of its stripe, and the entries between stand [`IndexEntry::ABSENT`] in its index.
//! - A copy is served only up to what its journal confirmed, and once sealed only up to the
//!   sealed count; entries past it (sent but never confirmed by the writer) are never served.
//! - A copy is dropped (registry and index file removed, segments reclaimed) only once the
//!   metadata store no longer lists this bookie for a live ledger.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::error::{AppendError, LifecycleError, ReadError};
use super::index::{index_path, write_index_file, IndexEntry};
use super::journal::{AppendRequest, Reply};
use super::metadata::{LedgerId, LedgerRecord, LedgerState};
use super::open_ledger::{OpenLedger, Written};
use super::replica::FencedCopy;
use super::{Log, LogShared, Position};

mod fences;
mod registry;

pub(crate) use registry::{read_fences, read_registry, register_own, RegistryRecord};
use registry::{registry_path, write_registry};

/// One copy held.
#[derive(Debug, Clone)]
enum Copy {
    /// Being written: entries so far (served up to what the journal confirmed).
    Open(Arc<OpenLedger>),
    /// Sealed: its index file is durable.
    Sealed { last_segment: u32, count: u64 },
}

/// The copies this bookie holds of other writers' ledgers.
#[derive(Debug)]
pub(crate) struct Replicas {
    pub dir: PathBuf,
    /// Invariant: a ledger is here iff its registry file exists.
    held: Mutex<BTreeMap<LedgerId, (u32, Copy)>>,
    /// Serialises registry writes and copy creation.
    create: tokio::sync::Mutex<()>,
    /// Ledgers fenced by a recovering owner (adds refused from then on), copy or not: those
    /// fenced since start and those whose fence file was read at open.
    /// Invariant: only grows while the process runs; across a restart the fence files carry
    /// it ([`fences`]) until the copy is sealed or the store no longer holds the ledger open.
    fenced: Mutex<std::collections::HashSet<LedgerId>>,
    /// The ledgers whose fence file exists. Invariant: see [`fences`].
    pub(crate) fence_files: fences::FenceFiles,
    /// Copies autorecovery is making of sealed ledgers ([`super::recopy`]), by first segment:
    /// their registry file exists, the store does not list this bookie yet.
    /// Invariant: a ledger here is never dropped by [`collect`] (it may be in `held` as well,
    /// complete, between its seal and the store's compare-and-set).
    pub(super) copying: Mutex<HashMap<LedgerId, u32>>,
    /// Seals of one ledger's copy run one at a time (the writer's word, a reader, collection
    /// and autorecovery may seal it at once; they write the same files): stripe `ledger % N`.
    sealing: Vec<tokio::sync::Mutex<()>>,
}

/// Stripes of [`Replicas::sealing`].
const SEAL_STRIPES: usize = 64;

impl Replicas {
    /// The sealed copies recovery kept (open ones are [`Replicas::restore`]d after the scan)
    /// and the ledgers whose fence files it read.
    pub fn new(
        dir: PathBuf,
        sealed: Vec<RegistryRecord>,
        open: Vec<(u32, OpenLedger)>,
        fenced: Vec<LedgerId>,
    ) -> Self {
        let mut held = BTreeMap::new();
        for r in sealed {
            if let Some((last_segment, count)) = r.sealed {
                held.insert(
                    r.ledger,
                    (
                        r.first_segment,
                        Copy::Sealed {
                            last_segment,
                            count,
                        },
                    ),
                );
            }
        }
        for (first, ledger) in open {
            held.insert(ledger.id, (first, Copy::Open(Arc::new(ledger))));
        }
        Replicas {
            held: Mutex::new(held),
            create: tokio::sync::Mutex::new(()),
            fenced: Mutex::new(fenced.iter().copied().collect()),
            fence_files: fences::FenceFiles::new(dir.clone(), fenced),
            dir,
            copying: Mutex::new(HashMap::new()),
            sealing: (0..SEAL_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<LedgerId, (u32, Copy)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds the open copies recovery rebuilt from the journal.
    pub fn restore(&self, copies: Vec<(u32, OpenLedger)>) {
        let mut held = self.lock();
        for (first, ledger) in copies {
            held.insert(ledger.id, (first, Copy::Open(Arc::new(ledger))));
        }
    }

    pub(crate) fn is_fenced(&self, ledger: LedgerId) -> bool {
        self.fenced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&ledger)
    }

    /// Whether this bookie holds a copy of `ledger` (a copy autorecovery is still making is
    /// not one yet: no reader uses it before the store lists it).
    pub fn holds(&self, ledger: LedgerId) -> bool {
        let held = self.lock().contains_key(&ledger);
        held && !self.copying().contains_key(&ledger)
    }

    /// The open copy of `ledger`, if it is being written (not one autorecovery is making).
    pub fn open(&self, ledger: LedgerId) -> Option<Arc<OpenLedger>> {
        if self.copying().contains_key(&ledger) {
            return None;
        }
        match self.lock().get(&ledger) {
            Some((_, Copy::Open(o))) => Some(o.clone()),
            _ => None,
        }
    }

    /// The first and last segment of this bookie's sealed copy of `ledger`, if it has one.
    pub(super) fn sealed_segments(&self, ledger: LedgerId) -> Option<(u32, u32)> {
        match self.lock().get(&ledger) {
            Some((first, Copy::Sealed { last_segment, .. })) => Some((*first, *last_segment)),
            _ => None,
        }
    }

    /// Segment ranges the copies occupy (`u32::MAX`: still growing), for reclamation.
    pub fn segment_ranges(&self) -> Vec<(u32, u32)> {
        let copying: Vec<(u32, u32)> = self
            .copying()
            .values()
            .map(|first| (*first, u32::MAX))
            .collect();
        self.lock()
            .values()
            .map(|(first, c)| match c {
                Copy::Open(_) => (*first, u32::MAX),
                Copy::Sealed { last_segment, .. } => (*first, *last_segment),
            })
            .chain(copying)
            .collect()
    }

    pub(super) fn copying(&self) -> MutexGuard<'_, HashMap<LedgerId, u32>> {
        self.copying.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ledgers held.
    pub fn ledgers(&self) -> Vec<LedgerId> {
        self.lock().keys().copied().collect()
    }

    /// Starts a copy of sealed `ledger` for autorecovery, its entries to go to the journal
    /// from `first_segment` on: recorded in `copying` and, durably, in the registry (so a
    /// crash leaves a copy recovery drops, since the store does not list this bookie).
    /// `false` when this bookie holds or is making a copy already.
    pub(super) async fn start_copy(
        &self,
        ledger: LedgerId,
        first_segment: u32,
    ) -> Result<bool, LifecycleError> {
        let _creating = self.create.lock().await;
        let held = self.lock().contains_key(&ledger);
        if held || self.copying().contains_key(&ledger) {
            return Ok(false);
        }
        self.copying().insert(ledger, first_segment);
        let reg = RegistryRecord {
            ledger,
            first_segment,
            sealed: None,
        };
        let dir = self.dir.clone();
        let written = super::blocking(move || {
            write_registry(&dir, &reg).map_err(|source| LifecycleError::Io {
                path: registry_path(&dir, ledger),
                source,
            })
        })
        .await;
        if written.is_err() {
            self.copying().remove(&ledger);
        }
        written.map(|()| true)
    }

    /// Holds the complete copy autorecovery made of `ledger` (still in `copying` until the
    /// store lists this bookie), to be sealed like any other.
    pub(super) fn adopt(&self, ledger: LedgerId, first_segment: u32, copy: Arc<OpenLedger>) {
        self.lock()
            .insert(ledger, (first_segment, Copy::Open(copy)));
    }
}

/// Why an add from a writer was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaAddError {
    /// The entry is not the next one of the copy (or the copy is sealed).
    #[error("ledger {ledger}: {why}")]
    OutOfOrder {
        /// Ledger id.
        ledger: LedgerId,
        /// What was wrong.
        why: String,
    },
    /// The metadata store does not list this bookie as a replica of an open ledger.
    #[error("ledger {0} is not an open ledger replicated to this bookie")]
    NotReplica(LedgerId),
    /// The log refused the append.
    #[error(transparent)]
    Append(#[from] AppendError),
    /// The store or the registry failed.
    #[error("{0}")]
    Storage(String),
    /// A new owner fenced the ledger to recover it: its writer may add nothing more.
    #[error("ledger {0} is fenced: a new owner is recovering it")]
    Fenced(LedgerId),
}

impl Log {
    /// Stores entry `entry` of `ledger`, which another node writes and replicates here (or,
    /// with `recovery`, which a node taking the ledger over copies here to complete a fenced
    /// copy). The returned receiver resolves once the entry is durable in this journal.
    pub async fn replica_add(
        &self,
        ledger: LedgerId,
        entry: u64,
        publish_time_ms: i64,
        payload: Bytes,
        recovery: bool,
    ) -> Result<oneshot::Receiver<Result<Position, AppendError>>, ReplicaAddError> {
        let shared = &self.shared;
        if let Some(e) = shared.journal.failure() {
            return Err(AppendError::JournalFailed(e).into());
        }
        // Admission first: once the copy takes the entry id, the entry must be written.
        let permit = shared.admit(payload.len()).await?;
        // The first entry of any stripe is below the most replica places. A later entry with
        // no copy here, or an add refused by a fence, is answered below without the store.
        let unfenced = recovery || !shared.replicas.is_fenced(ledger);
        if entry < super::stripe::MAX_REPLICA_PLACES && unfenced && !shared.replicas.holds(ledger) {
            match self.new_replica_copy(ledger, entry, recovery).await {
                // Not the ledger's first entry: a copy this bookie no longer has (as before
                // stripes: out of order, for this ledger alone).
                Err(ReplicaAddError::NotReplica(_)) if entry != 0 => {}
                done => done?,
            }
        }
        let (tx, rx) = oneshot::channel();
        // The fence check, the entry id and the hand-over to the journal happen under the
        // copies' lock, which fencing takes too: an add is either in the journal before the
        // fence's barrier or refused, and adds of one copy reach the journal in id order.
        let held = shared.replicas.lock();
        if !recovery && shared.replicas.is_fenced(ledger) {
            return Err(ReplicaAddError::Fenced(ledger));
        }
        let out_of_order = |why: String| ReplicaAddError::OutOfOrder { ledger, why };
        let copy = match held.get(&ledger) {
            Some((_, Copy::Open(o))) => o.clone(),
            Some((_, Copy::Sealed { count, .. })) => {
                return Err(out_of_order(format!(
                    "the copy is sealed with {count} entries"
                )))
            }
            None => {
                return Err(out_of_order(format!(
                    "entry {entry} of a ledger this bookie has no copy of"
                )))
            }
        };
        let next = copy.next_entry();
        if entry != next {
            return Err(out_of_order(format!(
                "entry {entry} where {next} was expected"
            )));
        }
        copy.take_entry(entry);
        shared.journal.submit(AppendRequest {
            ledger: copy,
            entry_id: entry,
            publish_time_ms,
            payload,
            reply: Reply::Direct(tx),
            _permit: permit,
        })?;
        drop(held);
        Ok(rx)
    }

    /// Registers a new, empty copy of `ledger` (after checking the store lists this bookie
    /// and that `entry` is the first of its stripe), durably, before its first entry is
    /// written. A copy fenced meanwhile is not made (its registry file is removed again).
    async fn new_replica_copy(
        &self,
        ledger: LedgerId,
        entry: u64,
        recovery: bool,
    ) -> Result<(), ReplicaAddError> {
        let replicas = &self.shared.replicas;
        let _creating = replicas.create.lock().await;
        if replicas.holds(ledger) {
            return Ok(());
        }
        let record = self
            .shared
            .meta
            .get_ledger(ledger)
            .await
            .map_err(|e| ReplicaAddError::Storage(e.to_string()))?;
        let stripe = match record {
            Some(r)
                if r.state == LedgerState::Open && r.bookies().any(|b| b == self.shared.bookie) =>
            {
                r.stripe_of(&self.shared.bookie)
            }
            _ => return Err(ReplicaAddError::NotReplica(ledger)),
        };
        let first = stripe.nth(0);
        if entry != first {
            return Err(ReplicaAddError::OutOfOrder {
                ledger,
                why: format!("entry {entry} of a new copy whose first entry is {first}"),
            });
        }
        let first_segment = self.shared.journal.current_segment();
        let reg = RegistryRecord {
            ledger,
            first_segment,
            sealed: None,
        };
        let dir = replicas.dir.clone();
        tokio::task::spawn_blocking(move || write_registry(&dir, &reg))
            .await
            .map_err(|e| ReplicaAddError::Storage(e.to_string()))?
            .map_err(|e| ReplicaAddError::Storage(format!("writing the replica registry: {e}")))?;
        let copy = Arc::new(OpenLedger::replica(
            ledger,
            first_segment,
            Written::default(),
            stripe,
        ));
        {
            let mut held = replicas.lock();
            if recovery || !replicas.is_fenced(ledger) {
                held.insert(ledger, (first_segment, Copy::Open(copy)));
                tracing::debug!(ledger, "holding a new replica copy");
                return Ok(());
            }
        }
        let path = registry_path(&replicas.dir, ledger);
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(path)).await;
        Err(ReplicaAddError::Fenced(ledger))
    }

    /// Fences this bookie's copy of `ledger` for a new owner recovering it: every later add
    /// is refused; returns what the copy durably holds (nothing when it has no copy). A
    /// ledger this bookie writes itself is refused: its writer's word does not count.
    pub async fn replica_fence(&self, ledger: LedgerId) -> Result<FencedCopy, ReadError> {
        let shared = &self.shared;
        // No copy is being made meanwhile, and no add is between its check and the journal.
        let _creating = shared.replicas.create.lock().await;
        let copy = {
            let held = shared.replicas.lock();
            shared
                .replicas
                .fenced
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(ledger);
            held.get(&ledger).cloned()
        };
        // Refused from now on in memory; durably (below) before the fence is answered.
        let (first_segment, open) = match copy {
            None => {
                let writes = shared
                    .meta
                    .get_ledger(ledger)
                    .await?
                    .is_some_and(|r| shared.writes(&r));
                if writes {
                    return Err(ReadError::Remote {
                        ledger,
                        bookie: shared.bookie.clone(),
                    });
                }
                persist_fence(shared, ledger).await?;
                let first = shared.journal.current_segment();
                let seal = Written::default().seal_info(first);
                return Ok(FencedCopy {
                    first_segment: first,
                    seal,
                });
            }
            Some((_, Copy::Sealed { count, .. })) => {
                return Err(ReadError::NoSuchEntry {
                    ledger,
                    entry: count,
                    available: count,
                })
            }
            Some((first, Copy::Open(o))) => (first, o),
        };
        persist_fence(shared, ledger).await?;
        // Adds handed to the journal before the fence: durable (and located) first.
        shared
            .journal
            .barrier()
            .await
            .map_err(|_| ReadError::Cancelled)?;
        let seal = {
            let w = open.written();
            w.seal_info_upto(first_segment, open.confirmed())
        };
        tracing::info!(ledger, entries = seal.entry_count, "fenced a replica copy");
        Ok(FencedCopy {
            first_segment,
            seal,
        })
    }

    /// Seals this bookie's copy of `ledger` at `count` entries (the writer sealed it so):
    /// writes its index file, records the seal in the registry. Returns the entries kept;
    /// fails when the copy holds fewer than `count` confirmed entries.
    pub async fn replica_seal(&self, ledger: LedgerId, count: u64) -> Result<u64, ReadError> {
        replica_seal(&self.shared, ledger, count).await
    }

    /// Drops the copies the metadata store no longer lists for a live ledger (offloaded and
    /// deleted by the writer, expired, or dropped from the ensemble), seals those it recorded
    /// sealed meanwhile, and reclaims the segments freed. Returns the copies dropped.
    pub async fn collect_replicas(&self) -> Result<usize, LifecycleError> {
        collect(&self.shared).await
    }
}

/// [`Log::collect_replicas`].
pub(crate) async fn collect(shared: &Arc<LogShared>) -> Result<usize, LifecycleError> {
    let mut dropped = 0;
    let held = shared.replicas.ledgers();
    let ledgers: Vec<LedgerId> = {
        let copying = shared.replicas.copying();
        held.into_iter()
            .filter(|l| !copying.contains_key(l))
            .collect()
    };
    // One batched read for every copy (a node holds one per replicated ledger it serves).
    let mut records: HashMap<LedgerId, LedgerRecord> = shared
        .meta
        .get_ledgers(&ledgers)
        .await?
        .into_iter()
        .map(|r| (r.id, r))
        .collect();
    for ledger in ledgers {
        if shared.replicas.copying().contains_key(&ledger) {
            continue;
        }
        let record = records.remove(&ledger);
        let listed = record
            .as_ref()
            .is_some_and(|r| r.bookies().any(|b| b == shared.bookie));
        match record {
            Some(r)
                if listed && matches!(r.state, LedgerState::Sealed | LedgerState::Offloaded) =>
            {
                let count = r.seal.map_or(0, |s| s.entry_count);
                if let Err(e) = replica_seal(shared, ledger, count).await {
                    tracing::error!(ledger, error = %e, "sealing a replica copy failed");
                }
            }
            Some(r) if listed && r.state == LedgerState::Open => {}
            _ => {
                // Read again before anything goes: the batch may predate a write that lists
                // this bookie (a copy whose recording had an unknown outcome, landing late).
                let now = shared.meta.get_ledger(ledger).await?;
                if now.is_some_and(|r| r.bookies().any(|b| b == shared.bookie)) {
                    continue;
                }
                drop_replica(shared, ledger).await?;
                dropped += 1;
            }
        }
    }
    if dropped > 0 {
        super::reclaim::reclaim(shared).await?;
    }
    release_fences(shared).await?;
    Ok(dropped)
}

/// Writes `ledger`'s fence file ([`fences`]).
async fn persist_fence(shared: &Arc<LogShared>, ledger: LedgerId) -> Result<(), ReadError> {
    let persisted = shared.replicas.fence_files.persist(ledger).await;
    persisted.map_err(|(path, source)| ReadError::Io {
        path,
        offset: 0,
        source,
    })
}

/// Removes the fence files no longer needed: this bookie's copy is sealed (a sealed copy
/// refuses adds itself), or it holds no copy, makes none, and the store no longer holds the
/// ledger open (a copy is begun only for a ledger the store holds open, autorecovery's copies
/// of sealed ledgers aside). How many.
async fn release_fences(shared: &Arc<LogShared>) -> Result<usize, LifecycleError> {
    let mut released = 0;
    for ledger in shared.replicas.fence_files.listed() {
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
        if !needed {
            let released_one = shared.replicas.fence_files.release(ledger).await;
            released_one.map_err(|(path, source)| LifecycleError::Io { path, source })?;
            released += 1;
        }
    }
    Ok(released)
}

/// Removes the copy of `ledger`: registry entry, index file, cached index.
pub(super) async fn drop_replica(
    shared: &Arc<LogShared>,
    ledger: LedgerId,
) -> Result<(), LifecycleError> {
    shared.replicas.lock().remove(&ledger);
    shared.index_cache.remove(ledger);
    let (rep, idx) = (
        registry_path(&shared.replicas.dir, ledger),
        index_path(&shared.index_dir, ledger),
    );
    super::blocking(move || {
        for path in [idx, rep] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(LifecycleError::Io { path, source }),
            }
        }
        Ok(())
    })
    .await?;
    tracing::info!(ledger, "dropped a replica copy");
    Ok(())
}

/// [`Log::replica_seal`].
pub(crate) async fn replica_seal(
    shared: &Arc<LogShared>,
    ledger: LedgerId,
    count: u64,
) -> Result<u64, ReadError> {
    let not_held = || ReadError::Remote {
        ledger,
        bookie: shared.bookie.clone(),
    };
    let _sealing = shared.replicas.sealing[(ledger % SEAL_STRIPES as u64) as usize]
        .lock()
        .await;
    let (first_segment, copy) = shared
        .replicas
        .lock()
        .get(&ledger)
        .cloned()
        .ok_or_else(not_held)?;
    let open = match copy {
        Copy::Sealed { count: kept, .. } => return Ok(kept),
        Copy::Open(o) => o,
    };
    // Entries the journal is still writing must be durable (and located) first.
    shared.journal.barrier().await.map_err(|_| not_held())?;
    let entries: Vec<IndexEntry> = {
        let w = open.written();
        let have = (w.entries.len() as u64).min(open.confirmed());
        // A striped copy holds every entry below `count` when none of its stripe is missing.
        if open.stripe.next_from(have) < count {
            return Err(ReadError::NoSuchEntry {
                ledger,
                entry: have,
                available: have,
            });
        }
        let mut entries = w.entries[..(count.min(have)) as usize].to_vec();
        entries.resize(count as usize, IndexEntry::ABSENT);
        entries
    };
    let last_segment = entries
        .iter()
        .rev()
        .find(|e| !e.is_absent())
        .map_or(first_segment, |e| e.segment);
    let reg = RegistryRecord {
        ledger,
        first_segment,
        sealed: Some((last_segment, count)),
    };
    let (index_dir, reg_dir) = (shared.index_dir.clone(), shared.replicas.dir.clone());
    let to_write: Arc<[IndexEntry]> = entries.into();
    let file = to_write.clone();
    tokio::task::spawn_blocking(move || -> Result<(), ReadError> {
        if !file.is_empty() {
            write_index_file(&index_dir, ledger, &file)?;
        }
        let path = registry_path(&reg_dir, ledger);
        write_registry(&reg_dir, &reg).map_err(|source| ReadError::Io {
            path,
            offset: 0,
            source,
        })
    })
    .await
    .map_err(|_| ReadError::Cancelled)??;
    shared.index_cache.insert(ledger, to_write);
    shared.replicas.lock().insert(
        ledger,
        (
            first_segment,
            Copy::Sealed {
                last_segment,
                count,
            },
        ),
    );
    tracing::debug!(ledger, count, "sealed a replica copy");
    Ok(count)
}

/// What recovery does with the copies the registry lists.
#[derive(Debug, Default)]
pub(crate) struct ReplicaPlan {
    /// Unsealed copies of live ledgers, to rebuild from the journal: id → first segment.
    pub scan: BTreeMap<LedgerId, u32>,
    /// Sealed copies of live ledgers, kept as they are.
    pub sealed: Vec<RegistryRecord>,
    /// Copies of ledgers no longer live or no longer listed for this bookie.
    drop: Vec<LedgerId>,
    /// Rebuilt copies whose ledger was sealed meanwhile: seal them at that count.
    seal_at: Vec<(LedgerId, u64)>,
    /// Ledgers fenced here before the restart (their fence files).
    pub fenced: Vec<LedgerId>,
    /// The stripes of the striped copies in `scan` (ADR 0017); the others are whole.
    pub stripes: HashMap<LedgerId, super::stripe::Stripe>,
}

/// Reads the registry in `dir` and the records of the ledgers it lists.
pub(crate) async fn replicas_to_recover(
    dir: &Path,
    meta: &Arc<dyn super::MetadataStore>,
    bookie: &str,
) -> Result<ReplicaPlan, super::OpenError> {
    let d = dir.to_path_buf();
    let (registry, fenced) = tokio::task::spawn_blocking(move || {
        Ok::<_, std::io::Error>((read_registry(&d)?, read_fences(&d)?))
    })
    .await
    .map_err(|e| super::OpenError::Journal(e.to_string()))?
    .map_err(|source| super::OpenError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut records = HashMap::new();
    for r in &registry {
        if let Some(l) = meta.get_ledger(r.ledger).await? {
            records.insert(r.ledger, l);
        }
    }
    let (scan, drop) = plan_recovery(&registry, &records, bookie);
    let seal_at = scan
        .keys()
        .filter_map(|id| {
            let l = records.get(id)?;
            (l.state != LedgerState::Open).then(|| (*id, l.seal.map_or(0, |s| s.entry_count)))
        })
        .collect();
    let sealed = registry
        .into_iter()
        .filter(|r| r.sealed.is_some() && !drop.contains(&r.ledger))
        .collect();
    let stripes = scan
        .keys()
        .filter_map(|id| Some((*id, records.get(id)?.stripe_of(bookie))))
        .filter(|(_, stripe)| !stripe.is_whole())
        .collect();
    Ok(ReplicaPlan {
        scan,
        sealed,
        drop,
        seal_at,
        fenced,
        stripes,
    })
}

impl ReplicaPlan {
    /// After the scan: drops the copies no longer wanted, seals those sealed meanwhile (a copy
    /// short of the sealed count is dropped: it cannot serve the ledger).
    pub async fn finish(&self, shared: &Arc<LogShared>) -> Result<(), super::OpenError> {
        let failed = |e: &dyn std::fmt::Display| super::OpenError::Journal(e.to_string());
        let mut drop = self.drop.clone();
        for (ledger, count) in &self.seal_at {
            if let Err(e) = replica_seal(shared, *ledger, *count).await {
                tracing::error!(ledger, count, error = %e,
                    "a replica copy is short of its ledger's sealed count; dropping it");
                drop.push(*ledger);
            }
        }
        for ledger in drop {
            drop_replica(shared, ledger).await.map_err(|e| failed(&e))?;
        }
        Ok(())
    }
}

/// What recovery does with the registry: copies to rebuild from the journal (`scan`: id →
/// first segment), and those to drop, given each ledger's record.
pub(crate) fn plan_recovery(
    registry: &[RegistryRecord],
    records: &HashMap<LedgerId, LedgerRecord>,
    bookie: &str,
) -> (BTreeMap<LedgerId, u32>, Vec<LedgerId>) {
    let mut scan = BTreeMap::new();
    let mut drop = Vec::new();
    for r in registry {
        let live = records.get(&r.ledger).is_some_and(|l| {
            matches!(
                l.state,
                LedgerState::Open | LedgerState::Sealed | LedgerState::Offloaded
            ) && l.bookies().any(|b| b == bookie)
        });
        if !live {
            drop.push(r.ledger);
        } else if r.sealed.is_none() {
            scan.insert(r.ledger, r.first_segment);
        }
    }
    (scan, drop)
}
