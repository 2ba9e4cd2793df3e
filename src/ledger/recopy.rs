//! Autorecovery's part in the log (issue 19, ADR 0011): making a new copy of a sealed,
//! under-replicated ledger on this bookie from the bookies that still hold it, and recording
//! it in the store.
//!
//! The copy goes into this bookie's journal like a replica's copy (same records, group commit
//! and registry file) and is checked against the ledger's seal (entry count, bytes, publish
//! times and the chained record checksum) before it is sealed here. Only then is the store
//! told, in one compare-and-set ([`super::metadata::CopyChange`]), that this bookie holds it
//! and which lost bookies the ledger no longer lists.
//!
//! Invariants:
//! - The store lists this bookie for a ledger only once its copy is complete, checked and
//!   sealed here (index file and registry durable).
//! - A copy that fails, does not match the seal, or loses the compare-and-set (a concurrent
//!   copy, an offload, a deletion) is dropped again; a crash mid-copy leaves a registry entry
//!   that recovery drops, since the store does not list this bookie. A copy whose recording
//!   is in doubt (the store's answer lost) is kept, sealed, for the next collection to decide.
//! - A copy is recorded only while the ledger is short of its write quorum (the store's rule,
//!   [`CopyChange::apply`]), and asked before copying: stale plans copy nothing.
//! - Until the store lists this bookie, no reader uses the copy (`Replicas::holds`).

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::error::{AppendError, LifecycleError, ReadError};
use super::journal::{AppendRequest, Reply};
use super::metadata::{CopyChange, LedgerId, LedgerRecord, LedgerState, MetadataError, SealInfo};
use super::open_ledger::{OpenLedger, Written};
use super::replicas::{drop_replica, replica_seal};
use super::{Log, LogShared, Position, ReplicaSource};

/// Entries handed to the journal and not yet durable, at most, while copying.
const IN_FLIGHT: usize = 256;

/// Entries merged from a striped ledger's stripes per step, while copying it whole.
const MERGED_STEP: u64 = 1024;

/// Why a ledger could not be copied here.
#[derive(Debug, thiserror::Error)]
pub enum RecopyError {
    /// This node reads no other bookies (not a member of a cluster).
    #[error("this node has no bookie client: it is not part of a cluster")]
    NoCluster,
    /// The ledger does not exist (any more).
    #[error("ledger {0} does not exist")]
    NotFound(LedgerId),
    /// Only sealed ledgers are copied (an open one is taken over, an offloaded one is in the
    /// lake).
    #[error("ledger {ledger} is {state}: only sealed ledgers are copied")]
    NotSealed {
        /// Ledger id.
        ledger: LedgerId,
        /// Its state.
        state: LedgerState,
    },
    /// This bookie holds (or is making) a copy already.
    #[error("ledger {0}: this bookie holds or is making a copy already")]
    AlreadyHeld(LedgerId),
    /// This bookie holds no sealed copy to take a lost writer's place with.
    #[error("ledger {0}: this bookie holds no sealed copy of it")]
    NotHeld(LedgerId),
    /// No bookie left holding it could serve every entry.
    #[error("ledger {ledger}: no surviving copy could be read: {why}")]
    Unreadable {
        /// Ledger id.
        ledger: LedgerId,
        /// The last failure.
        why: String,
    },
    /// What was copied differs from what the ledger was sealed with.
    #[error("ledger {ledger}: the copy does not match the seal ({why})")]
    Mismatch {
        /// Ledger id.
        ledger: LedgerId,
        /// Which figure differs.
        why: String,
    },
    /// This bookie's journal refused an entry.
    #[error("ledger {ledger}: {source}")]
    Append {
        /// Ledger id.
        ledger: LedgerId,
        /// The refusal.
        #[source]
        source: AppendError,
    },
    /// Sealing the copy here failed.
    #[error("ledger {ledger}: sealing the copy: {source}")]
    Seal {
        /// Ledger id.
        ledger: LedgerId,
        /// Why.
        #[source]
        source: ReadError,
    },
    /// The registry or dropping a failed copy failed.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// The store failed or refused the change (another copy or an offload came first).
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

/// A copy made ([`Log::recopy_ledger`]).
#[derive(Debug, Clone)]
pub struct Recopied {
    /// The ledger as the store records it now.
    pub record: LedgerRecord,
    /// Entries copied.
    pub entries: u64,
    /// Payload bytes copied.
    pub bytes: u64,
}

/// Whether `record` shows `change` applied: no lost bookie listed, the new copy and the new
/// writer in place.
fn shows(change: &CopyChange, record: &LedgerRecord) -> bool {
    !change.lost.iter().any(|b| record.bookies().any(|x| x == b))
        && change
            .add
            .as_ref()
            .is_none_or(|a| record.bookies().any(|x| x == a))
        && change
            .writer
            .as_ref()
            .is_none_or(|(w, _)| *w == record.bookie)
}

/// Takes the ledger out of `copying` however the copy ends.
struct Copying<'a>(&'a LogShared, LedgerId);

impl Drop for Copying<'_> {
    fn drop(&mut self) {
        self.0.replicas.copying().remove(&self.1);
    }
}

/// Whether the store took a change whose answer was lost.
enum Landed {
    /// It did: the ledger as recorded now.
    Yes(LedgerRecord),
    /// It did not (refused, or the ledger is gone).
    No(RecopyError),
    /// Unknown: the store could not be asked.
    Unknown(RecopyError),
}

impl Log {
    /// Makes a copy of sealed `ledger` on this bookie from the bookies that hold it (those in
    /// `lost` excepted), checks it against the seal, seals it here and records it in the
    /// store, dropping `lost` from the ledger's bookies in the same step. Refused before
    /// anything is copied when the store would refuse the change (the ledger no longer short
    /// of copies, a lost bookie no longer listed, this bookie listed already). A striped
    /// ledger's copy fills `place` ([`CopyChange::place`]): the writer's with a whole copy, a
    /// replica's with that place's stripe.
    pub async fn recopy_ledger(
        &self,
        ledger: LedgerId,
        lost: &[String],
        place: Option<usize>,
    ) -> Result<Recopied, RecopyError> {
        let shared = &self.shared;
        let remote = shared.remote.get().cloned().ok_or(RecopyError::NoCluster)?;
        let record = shared
            .meta
            .get_ledger(ledger)
            .await?
            .ok_or(RecopyError::NotFound(ledger))?;
        let seal = match (record.state, record.seal) {
            (LedgerState::Sealed, Some(seal)) => seal,
            (state, _) => return Err(RecopyError::NotSealed { ledger, state }),
        };
        if shared.holds(&record) {
            return Err(RecopyError::AlreadyHeld(ledger));
        }
        let change = |segments| CopyChange {
            lost: lost.to_vec(),
            add: Some(shared.bookie.clone()),
            writer: match place {
                Some(p) => p == 0,
                None => lost.contains(&record.bookie),
            }
            .then(|| (shared.bookie.clone(), segments)),
            place,
        };
        // The plan may be stale (another copy landed meanwhile): ask before copying.
        change((0, 0)).apply(&mut record.clone())?;
        let topic = shared
            .meta
            .get_topic_by_id(record.topic_id)
            .await?
            .ok_or(RecopyError::NotFound(ledger))?
            .name;
        let sources: Vec<String> = record
            .bookies()
            .filter(|b| !lost.iter().any(|l| l == b) && *b != shared.bookie)
            .map(str::to_string)
            .collect();
        let first_segment = shared.journal.current_segment();
        if !shared.replicas.start_copy(ledger, first_segment).await? {
            return Err(RecopyError::AlreadyHeld(ledger));
        }
        let copying = Copying(shared, ledger);
        let made = self
            .make_copy(
                &*remote,
                &sources,
                &topic,
                (&record, place),
                seal,
                first_segment,
            )
            .await;
        let landed = match made {
            Ok((bytes, last_segment)) => {
                match self
                    .record_change(ledger, &change((first_segment, last_segment)))
                    .await
                {
                    Landed::Yes(record) => Ok(Recopied {
                        record,
                        entries: seal.entry_count,
                        bytes,
                    }),
                    Landed::No(e) => Err((e, true)),
                    // The copy stays; the next collection keeps it if the store lists this
                    // bookie, and drops it otherwise.
                    Landed::Unknown(e) => Err((e, false)),
                }
            }
            Err(e) => Err((e, true)),
        };
        match landed {
            Ok(done) => Ok(done),
            Err((e, drop_copy)) => {
                if drop_copy {
                    self.drop_failed_copy(ledger, copying).await;
                }
                Err(e)
            }
        }
    }

    /// Drops the lost bookies in `lost` from `ledger` (sealed or offloaded) without adding a
    /// copy: the ledger has as many copies as live bookies allow, or is in the lake. When its
    /// writer is lost, this bookie takes the writer's place with its own sealed copy (and then
    /// offloads the ledger and deletes the local copies after the lag); in a striped ledger
    /// (ADR 0017) the lost bookies' places become vacant instead.
    pub async fn drop_lost_copies(
        &self,
        ledger: LedgerId,
        lost: &[String],
    ) -> Result<LedgerRecord, RecopyError> {
        let shared = &self.shared;
        let record = shared
            .meta
            .get_ledger(ledger)
            .await?
            .ok_or(RecopyError::NotFound(ledger))?;
        let writer = if lost.contains(&record.bookie) && !record.is_striped() {
            if shared.replicas.open(ledger).is_some() {
                let count = record.seal.map_or(0, |s| s.entry_count);
                replica_seal(shared, ledger, count)
                    .await
                    .map_err(|source| RecopyError::Seal { ledger, source })?;
            }
            let segments = shared
                .replicas
                .sealed_segments(ledger)
                .ok_or(RecopyError::NotHeld(ledger))?;
            Some((shared.bookie.clone(), segments))
        } else {
            None
        };
        let change = CopyChange {
            lost: lost.to_vec(),
            add: None,
            writer,
            place: None,
        };
        match self.record_change(ledger, &change).await {
            Landed::Yes(record) => Ok(record),
            Landed::No(e) | Landed::Unknown(e) => Err(e),
        }
    }

    /// Records `change` in the store; when the answer is an error other than a refusal (it
    /// may have landed all the same), reads the ledger back to learn whether it did. A change
    /// that landed is shown to the loaded topic's view.
    async fn record_change(&self, ledger: LedgerId, change: &CopyChange) -> Landed {
        let meta = &self.shared.meta;
        let landed = match meta.move_ledger_copies(ledger, change).await {
            Ok(record) => Landed::Yes(record),
            Err(e @ (MetadataError::Conflict(_) | MetadataError::LedgerNotFound(_))) => {
                Landed::No(e.into())
            }
            // The change may still land after this read (a transaction the client gave up on):
            // not shown yet is not "refused".
            Err(e) => match meta.get_ledger(ledger).await {
                Ok(Some(r)) if shows(change, &r) => Landed::Yes(r),
                _ => Landed::Unknown(e.into()),
            },
        };
        if let Landed::Yes(r) = &landed {
            self.transitions
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Some(t) = self.loaded_topic(r.topic_id) {
                t.set_record(r.clone());
            }
        }
        landed
    }

    /// Removes a copy that failed or was not recorded, then reclaims its segments; a failure
    /// here is logged (the copy's registry entry is dropped at the next start, its segments at
    /// the next reclamation).
    async fn drop_failed_copy(&self, ledger: LedgerId, copying: Copying<'_>) {
        // Dropped while still marked as copying (no reader sees it meanwhile), then unmarked
        // so that reclamation frees its segments.
        let dropped = drop_replica(&self.shared, ledger).await;
        drop(copying);
        if let Err(e) = dropped {
            tracing::warn!(ledger, error = %e, "dropping a failed ledger copy");
            return;
        }
        if let Err(e) = super::reclaim::reclaim(&self.shared).await {
            tracing::warn!(ledger, error = %e, "reclaiming a failed copy's segments");
        }
    }

    /// Copies sealed `record` from `sources` into this journal, checks what it read against
    /// `seal`, and seals the copy here. The copy is whole, except at a striped ledger's
    /// replica `place`: then that place's stripe (ADR 0017). Returns the payload
    /// bytes copied and the last segment of this journal holding the copy.
    async fn make_copy(
        &self,
        remote: &dyn ReplicaSource,
        sources: &[String],
        topic: &str,
        (record, place): (&LedgerRecord, Option<usize>),
        seal: SealInfo,
        first_segment: u32,
    ) -> Result<(u64, u32), RecopyError> {
        let shared = &self.shared;
        let ledger = record.id;
        let stripe = place.map_or_else(crate::ledger::stripe::Stripe::whole, |p| {
            record.stripe_at(p)
        });
        let copy = Arc::new(OpenLedger::replica(
            ledger,
            first_segment,
            Written::default(),
            stripe.clone(),
        ));
        // Every entry read, for the check against the seal (a stripe's copy holds some).
        let mut read = Written::default();
        let mut pending: VecDeque<oneshot::Receiver<Result<Position, AppendError>>> =
            VecDeque::new();
        let (mut next, mut bytes) = (0u64, 0u64);
        while next < seal.entry_count {
            let entries = self
                .read_to_copy(remote, sources, topic, record, next, seal.entry_count - 1)
                .await?;
            for e in entries {
                if e.position.entry != next {
                    return Err(RecopyError::Unreadable {
                        ledger,
                        why: format!("entry {} served where {next} was asked", e.position.entry),
                    });
                }
                if !stripe.is_whole() {
                    read.push_read(ledger, &e, first_segment);
                }
                if !stripe.holds(next) {
                    next += 1;
                    continue;
                }
                let append = |source| RecopyError::Append { ledger, source };
                let permit = shared.admit(e.payload.len()).await.map_err(append)?;
                bytes += e.payload.len() as u64;
                let (tx, rx) = oneshot::channel();
                copy.take_entry(next);
                shared
                    .journal
                    .submit(AppendRequest {
                        ledger: copy.clone(),
                        entry_id: next,
                        publish_time_ms: e.publish_time_ms,
                        payload: e.payload,
                        reply: Reply::Direct(tx),
                        _permit: permit,
                    })
                    .map_err(append)?;
                pending.push_back(rx);
                if pending.len() >= IN_FLIGHT {
                    durable(ledger, pending.pop_front()).await?;
                }
                next += 1;
            }
        }
        while let Some(rx) = pending.pop_front() {
            durable(ledger, Some(rx)).await?;
        }
        let mut made = copy
            .written()
            .seal_info_upto(first_segment, seal.entry_count);
        if !stripe.is_whole() {
            // A stripe's figures are not the ledger's: what was read is checked instead.
            made = SealInfo {
                last_segment: made.last_segment,
                ..read.seal_info(first_segment)
            };
        }
        check_against_seal(ledger, &made, &seal)?;
        shared.replicas.adopt(ledger, first_segment, copy);
        replica_seal(&self.shared, ledger, seal.entry_count)
            .await
            .map_err(|source| RecopyError::Seal { ledger, source })?;
        Ok((bytes, made.last_segment))
    }
}

impl Log {
    /// Entries from `first` on (up to `last`) of sealed `record` to copy: from the first of
    /// `sources` that serves them; for a striped ledger (ADR 0017) from its writer's bookie
    /// when it is a source and serves, else merged from the stripes, a step at a time.
    async fn read_to_copy(
        &self,
        remote: &dyn ReplicaSource,
        sources: &[String],
        topic: &str,
        record: &LedgerRecord,
        first: u64,
        last: u64,
    ) -> Result<Vec<super::Entry>, RecopyError> {
        let ledger = record.id;
        if !record.is_striped() {
            return read_any(remote, sources, topic, ledger, first, last).await;
        }
        let last = last.min(first + MERGED_STEP - 1);
        if sources.first() == Some(&record.bookie) {
            if let Ok(got) = read_any(remote, &sources[..1], topic, ledger, first, last).await {
                return Ok(got);
            }
        }
        super::replica::read_merged(remote, topic, record, first, last)
            .await
            .map_err(|e| RecopyError::Unreadable {
                ledger,
                why: format!("merging the stripes from entry {first}: {e}"),
            })
    }
}

/// Entries from `first` on (up to `last`) from the first of `sources` that serves them.
async fn read_any(
    remote: &dyn ReplicaSource,
    sources: &[String],
    topic: &str,
    ledger: LedgerId,
    first: u64,
    last: u64,
) -> Result<Vec<super::Entry>, RecopyError> {
    let mut why = String::from("no bookie left holding it");
    for bookie in sources {
        match remote.read(bookie, topic, ledger, first, last).await {
            Ok(entries) if !entries.is_empty() => return Ok(entries),
            Ok(_) => why = format!("bookie {bookie} served no entry from {first}"),
            Err(e) => why = format!("bookie {bookie}: {e}"),
        }
    }
    Err(RecopyError::Unreadable { ledger, why })
}

/// Waits until one copied entry is durable here.
async fn durable(
    ledger: LedgerId,
    rx: Option<oneshot::Receiver<Result<Position, AppendError>>>,
) -> Result<(), RecopyError> {
    let Some(rx) = rx else { return Ok(()) };
    match rx.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(source)) => Err(RecopyError::Append { ledger, source }),
        Err(_) => Err(RecopyError::Append {
            ledger,
            source: AppendError::Closed,
        }),
    }
}

/// The copy must hold what the ledger was sealed with (its last segment is this journal's).
fn check_against_seal(
    ledger: LedgerId,
    made: &SealInfo,
    seal: &SealInfo,
) -> Result<(), RecopyError> {
    let differs = |what: &str, got: String, want: String| RecopyError::Mismatch {
        ledger,
        why: format!("{what} {got}, sealed with {want}"),
    };
    if made.entry_count != seal.entry_count {
        return Err(differs(
            "entries",
            made.entry_count.to_string(),
            seal.entry_count.to_string(),
        ));
    }
    if made.size_bytes != seal.size_bytes {
        return Err(differs(
            "bytes",
            made.size_bytes.to_string(),
            seal.size_bytes.to_string(),
        ));
    }
    if (made.min_publish_ms, made.max_publish_ms) != (seal.min_publish_ms, seal.max_publish_ms) {
        return Err(differs(
            "publish times",
            format!("{:?}..{:?}", made.min_publish_ms, made.max_publish_ms),
            format!("{:?}..{:?}", seal.min_publish_ms, seal.max_publish_ms),
        ));
    }
    if made.checksum != seal.checksum {
        return Err(differs(
            "checksum",
            format!("{:08x}", made.checksum),
            format!("{:08x}", seal.checksum),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_differing_from_the_seal_in_any_figure_is_refused() {
        let seal = SealInfo {
            entry_count: 4,
            size_bytes: 40,
            min_publish_ms: Some(1),
            max_publish_ms: Some(9),
            last_segment: 3,
            checksum: 0xabcd,
        };
        // The last segment is this journal's own: it may differ.
        let same = SealInfo {
            last_segment: 8,
            ..seal
        };
        assert!(check_against_seal(1, &same, &seal).is_ok());
        for bad in [
            SealInfo {
                entry_count: 3,
                ..seal
            },
            SealInfo {
                size_bytes: 41,
                ..seal
            },
            SealInfo {
                min_publish_ms: Some(2),
                ..seal
            },
            SealInfo {
                max_publish_ms: None,
                ..seal
            },
            SealInfo {
                checksum: 0xabce,
                ..seal
            },
        ] {
            assert!(matches!(
                check_against_seal(1, &bad, &seal),
                Err(RecopyError::Mismatch { ledger: 1, .. })
            ));
        }
    }
}
