//! The replicated side of a topic's writer (ADR 0010): the namespace's replication setting,
//! where a new ledger's copies go, sending each entry to the replicas, and the seal of a
//! replicated ledger at what its quorum confirmed.

use std::sync::Arc;

use bytes::Bytes;

use super::super::error::{AppendError, LifecycleError};
use super::super::metadata::{LedgerId, LedgerRecord, LedgerTransition, PlacedSeal, VACANT};
use super::super::open_ledger::OpenLedger;
use super::super::quorum::{MemberId, Quorum, Receipt, Routed};
use super::super::seal::{discard_empty, seal_ledger_as};
use super::{lock, TopicLog};

/// How a topic's ledgers are replicated (Pulsar's persistence policy; ADR 0010). Unless the
/// write quorum is below the ensemble, every bookie of a ledger gets every entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replication {
    /// Bookies per ledger, the writer's included; `None`: up to [`DEFAULT_ENSEMBLE`], as many
    /// as are live (a single node writes unreplicated ledgers).
    pub ensemble: Option<u8>,
    /// Bookies that make an entry durable before it is acknowledged; `None`: up to
    /// [`DEFAULT_ACK_QUORUM`], at most the ensemble.
    pub ack_quorum: Option<u8>,
    /// Bookies each entry goes to, the writer's included. `None`, or not below the ensemble a
    /// ledger gets: every one of them. Below it, the ledger is striped (ADR 0017: the
    /// writer's bookie gets every entry, each replica a stripe).
    pub write_quorum: Option<u8>,
}

/// Where a new ledger's copies go ([`TopicLog::placement`]).
pub(super) struct Placed {
    pub replicas: Vec<String>,
    pub ack_quorum: u8,
    /// The ensemble asked for, even when fewer bookies are live (autorecovery restores it).
    pub write_quorum: u8,
    /// [`crate::ledger::LedgerRecord::stripe_width`].
    pub stripe_width: u8,
}

/// Ensemble of a ledger when the namespace sets none (fewer when fewer bookies are live).
pub const DEFAULT_ENSEMBLE: u8 = 3;
/// Ack quorum of a ledger when the namespace sets none (at most its ensemble).
pub const DEFAULT_ACK_QUORUM: u8 = 2;
/// How long a seal waits for replicas that did not fail but have not answered for every
/// confirmed entry yet, before leaving them out of the sealed ledger's bookies.
const SEAL_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

impl TopicLog {
    /// Registers entry `entry` (id, publish time) of replicated ledger `ledger` with its
    /// quorum, which answers `reply` once its ack quorum holds it, and sends it to each replica
    /// the quorum routes it to now. Called in entry order, under the writer's lock.
    pub(super) fn replicate(
        &self,
        ledger: &Arc<OpenLedger>,
        (entry, publish_time_ms): (u64, i64),
        payload: &Bytes,
        reply: Receipt,
    ) {
        let Some(q) = &ledger.quorum else {
            return;
        };
        let targets = q.register(entry, reply, publish_time_ms, payload);
        let topic: Arc<str> = Arc::from(self.inner.name.as_str());
        for (member, bookie) in targets {
            let routed = (entry, publish_time_ms, payload.clone());
            self.send_to_replica(&topic, ledger, (member, &bookie), routed);
        }
    }

    /// Sends one entry of `ledger` to member `member` (bookie `bookie`): its answer confirms
    /// the entry there, or fails the member (which may start its replacement).
    pub(super) fn send_to_replica(
        &self,
        topic: &Arc<str>,
        ledger: &Arc<OpenLedger>,
        (member, bookie): (MemberId, &str),
        (entry, publish_time_ms, payload): Routed,
    ) {
        let Some(remote) = self.inner.shared.remote.get() else {
            return;
        };
        let add = super::super::replica::ReplicaAdd {
            topic: topic.clone(),
            ledger: ledger.id,
            entry,
            publish_time_ms,
            payload,
            recovery: false,
        };
        let (copy, writer) = (ledger.clone(), self.clone());
        remote.add(
            bookie,
            add,
            Box::new(move |done| match done {
                Ok(()) => copy.confirm_on_replica(member, entry),
                Err(why) => writer.replica_failed(&copy, member, &why),
            }),
        );
    }

    /// Puts `replication` in force for the ledgers this topic opens from now on.
    pub fn set_replication(&self, replication: Replication) {
        *lock(&self.inner.replication) = replication;
    }

    /// The replicas, ack quorum, write quorum and stripe width of the next ledger: none on a
    /// single node. The write quorum is the ensemble the namespace asks for (by default up to
    /// [`DEFAULT_ENSEMBLE`]), even when fewer bookies are live: autorecovery restores it.
    pub(super) async fn placement(&self) -> Result<Placed, AppendError> {
        let r = *lock(&self.inner.replication);
        let shared = &self.inner.shared;
        // The namespace policy allows up to 16 (a stripe's first entry is then below
        // MAX_REPLICA_PLACES).
        let want = r.ensemble.unwrap_or(DEFAULT_ENSEMBLE).clamp(1, 16);
        let Some(remote) = shared.remote.get().filter(|_| want > 1) else {
            return Ok(Placed {
                replicas: Vec::new(),
                ack_quorum: 1,
                write_quorum: 1,
                stripe_width: 0,
            });
        };
        let replicas = remote.choose(&shared.bookie, usize::from(want) - 1).await;
        let ensemble = replicas.len() + 1;
        let ack = match r.ack_quorum {
            // An ensemble smaller than asked still takes writes while its ack quorum can be
            // met (the ledger is under-replicated, as after a bookie failure).
            Some(ack) if usize::from(ack) > ensemble => {
                return Err(AppendError::Quorum {
                    ledger: 0,
                    why: format!(
                        "the namespace asks for an ack quorum of {ack} and {ensemble} bookies \
                         are live"
                    )
                    .into(),
                });
            }
            Some(ack) => ack.max(1),
            None => DEFAULT_ACK_QUORUM.clamp(1, ensemble as u8),
        };
        // Striped when each entry goes to fewer than the bookies placed (never below the ack
        // quorum, and to one replica at least: a write quorum of 1 gets whole copies).
        let stripe_width = match r.write_quorum.map(|w| w.max(ack)) {
            Some(w) if w >= 2 && usize::from(w) < ensemble => w - 1,
            _ => 0,
        };
        if r.ensemble.is_some() && ensemble < usize::from(want) {
            tracing::warn!(topic = %self.inner.name, want, live = ensemble,
                "fewer bookies live than the namespace's ensemble: the ledger is under-replicated");
        }
        Ok(Placed {
            replicas,
            ack_quorum: ack,
            write_quorum: want,
            stripe_width,
        })
    }

    /// Seals replicated ledger `old` (its journal writes are durable): at what its quorum
    /// confirmed, with the replicas holding every entry as its placement, in one step.
    pub(super) async fn seal_replicated(
        &self,
        old: &OpenLedger,
        quorum: &Quorum,
    ) -> Result<LedgerRecord, LifecycleError> {
        let shared = &self.inner.shared;
        // Entries that failed were refused to their producers and are left out (this journal
        // may hold them).
        let submitted = old.written().entries.len() as u64;
        let (count, complete) = quorum.settled_complete(submitted, SEAL_GRACE).await;
        let (entries, info) = {
            let w = old.written();
            (
                w.entries[..count as usize].to_vec(),
                w.seal_info_upto(old.first_segment, count),
            )
        };
        if count == 0 {
            return discard_empty(shared, old.id, info).await;
        }
        // Only bookies holding every entry stay listed (readers may go to any of them),
        // recorded with the seal in one step: a writer that lost the ledger to a takeover
        // finds it sealed and changes nothing. A striped ledger keeps every place (ADR 0017):
        // one whose replica is short of its stripe is recorded vacant, for autorecovery to
        // fill.
        let replicas = match quorum.places() {
            Some(places) => places
                .into_iter()
                .map(|b| {
                    if complete.contains(&b) {
                        b
                    } else {
                        VACANT.to_string()
                    }
                })
                .collect(),
            None => complete.clone(),
        };
        let seal = LedgerTransition::SealPlaced(Box::new(PlacedSeal {
            seal: info,
            bookie: shared.bookie.clone(),
            replicas,
            first_segment: old.first_segment,
        }));
        let record = seal_ledger_as(shared, old.id, entries, seal).await?;
        self.notify_sealed(&complete, old.id, count);
        Ok(record)
    }

    /// Tells the replicas holding every entry of sealed ledger `ledger` its count (in the
    /// background: a replica that misses it learns the seal from the store later).
    fn notify_sealed(&self, replicas: &[String], ledger: LedgerId, count: u64) {
        let Some(remote) = self.inner.shared.remote.get().cloned() else {
            return;
        };
        let (replicas, topic) = (replicas.to_vec(), self.inner.name.clone());
        self.inner.shared.tasks.spawn(async move {
            for bookie in replicas {
                if let Err(e) = remote.sealed(&bookie, &topic, ledger, count).await {
                    tracing::warn!(ledger, bookie, error = %e,
                        "telling a replica its ledger is sealed failed");
                }
            }
        });
    }
}
