//! Taking over an open striped ledger (ADR 0017) whose writer is gone, or which this node
//! wrote before it restarted. Its replicas hold stripes, so the longest copy is not the
//! ledger: the end is decided per write set.
//!
//! Invariants:
//! - Every write set (the writer's bookie and `WQ − 1` replica places) has at least
//!   `WQ − AQ + 1` members among the fence answers; the writer's bookie answers only when it
//!   is this node, restarted, and then counts in every write set. An acknowledged entry was
//!   durable on `AQ` members of its write set, so an answered member holds it.
//! - The ledger ends at the first entry no answered member holds. Entries are acknowledged in
//!   order, so every acknowledged entry is below that end; entries past it were never
//!   acknowledged and are left out.
//! - Each answered copy (a stripe, or the restarted writer's whole copy) is completed up to
//!   the end with recovery adds before the seal, or nothing is sealed (an answered copy may be
//!   the only one holding some acknowledged entries). The seal (one compare-and-set on the
//!   ledger's state, as for whole copies) keeps every replica place, [`VACANT`] where the
//!   copy did not answer (short of its stripe: autorecovery fills it). A restarted writer's
//!   copy must be complete, and stays the ledger's `bookie`; without it the seal
//!   names no bookie as holding the ledger whole ([`VACANT`]): autorecovery rebuilds a
//!   whole copy on a spare bookie, readers merge the stripes meanwhile
//!   ([`super::super::replica::read_merged`]), and a writer that comes back holds nothing of it.

use std::sync::Arc;

use super::super::metadata::{LedgerRecord, LedgerTransition, PlacedSeal, SealInfo, VACANT};
use super::super::open_ledger::Written;
use super::super::replica::{read_merged, ReplicaSource};
use super::super::stripe::Stripe;
use super::super::{now_ms, Log};
use super::TakeoverError;

/// Entries read per step while completing the copies.
const STEP: u64 = 1024;

/// One fenced copy.
struct Answer {
    /// Its replica place; `None` for the writer's bookie (this node, restarted).
    place: Option<usize>,
    bookie: String,
    /// The entries it gets.
    stripe: Stripe,
    /// One past the last entry it holds.
    count: u64,
}

impl Answer {
    fn holds(&self, entry: u64) -> bool {
        entry < self.count && self.stripe.holds(entry)
    }
}

impl Log {
    /// Fences, recovers and seals striped `ledger` of topic `name`.
    pub(super) async fn take_over_striped(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        name: &str,
        ledger: &LedgerRecord,
    ) -> Result<LedgerRecord, TakeoverError> {
        let answers = self.fence_places(remote, name, ledger).await?;
        let own = answers.iter().find(|a| a.place.is_none());
        if self.shared.writes(ledger) && own.is_none() {
            return Err(TakeoverError::WriterCopy {
                ledger: ledger.id,
                why: "it did not answer its own fence".into(),
            });
        }
        let longest = answers.iter().map(|a| a.count).max().unwrap_or(0);
        let end = (0..longest)
            .find(|e| !answers.iter().any(|a| a.holds(*e)))
            .unwrap_or(longest);
        let meta = &self.shared.meta;
        if end == 0 {
            let empty = Written::default().seal_info(ledger.first_segment);
            meta.transition_ledger(ledger.id, LedgerTransition::Seal(empty), now_ms())
                .await?;
            return Ok(meta
                .transition_ledger(ledger.id, LedgerTransition::Delete, now_ms())
                .await?);
        }
        let mut seal = self
            .complete_copies(remote, name, ledger, &answers, end)
            .await?;
        let answered: Vec<String> = answers.iter().map(|a| a.bookie.clone()).collect();
        let mut first_segment = ledger.first_segment;
        let mut bookie = VACANT.to_string();
        if let Some(own) = own {
            // This node's own copy stays the ledger's whole copy: complete, with its segments.
            let now = self.replica_fence(ledger.id).await?;
            if now.seal.entry_count < end {
                return Err(TakeoverError::WriterCopy {
                    ledger: ledger.id,
                    why: format!("it holds {} of {end} entries", now.seal.entry_count),
                });
            }
            first_segment = now.first_segment;
            seal.last_segment = now.seal.last_segment;
            bookie = own.bookie.clone();
        }
        // A place whose copy did not answer is short: vacant. Every answered copy was
        // completed, and together they hold every acknowledged entry.
        let replicas = ledger
            .replicas
            .iter()
            .map(|b| {
                if answered.contains(b) {
                    b.clone()
                } else {
                    VACANT.to_string()
                }
            })
            .collect();
        let placed = LedgerTransition::SealPlaced(Box::new(PlacedSeal {
            seal,
            bookie,
            replicas,
            first_segment,
        }));
        let record = meta.transition_ledger(ledger.id, placed, now_ms()).await?;
        self.tell_sealed(remote, name, ledger.id, end, &answered)
            .await;
        Ok(record)
    }

    /// Fences every replica of `ledger`, and this node's own copy when it wrote the ledger:
    /// the answers, when each write set has enough of them.
    async fn fence_places(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        name: &str,
        ledger: &LedgerRecord,
    ) -> Result<Vec<Answer>, TakeoverError> {
        let own = self.shared.writes(ledger).then_some((None, &ledger.bookie));
        let places = ledger
            .replicas
            .iter()
            .enumerate()
            .map(|(place, b)| (Some(place), b));
        let fences = own.into_iter().chain(places).map(|(place, b)| async move {
            let fenced = if b == VACANT {
                Err(super::super::ReadError::Remote {
                    ledger: ledger.id,
                    bookie: b.clone(),
                })
            } else if *b == self.shared.bookie {
                self.replica_fence(ledger.id).await
            } else {
                remote.fence(b, name, ledger.id).await
            };
            (place, b.clone(), fenced)
        });
        let stripes = ledger.stripes();
        let mut answers = Vec::new();
        let mut why = String::new();
        for (place, bookie, fenced) in futures::future::join_all(fences).await {
            match fenced {
                Ok(copy) => answers.push(Answer {
                    place,
                    bookie,
                    stripe: place.map_or_else(Stripe::whole, |p| stripes.stripe(p)),
                    count: copy.seal.entry_count,
                }),
                Err(e) if why.is_empty() => why = format!("{bookie}: {e}"),
                Err(_) => {}
            }
        }
        let write_quorum = stripes.width() + 1;
        let needed = (write_quorum + 1)
            .saturating_sub(usize::from(ledger.ack_quorum.max(1)))
            .max(1);
        let own_answered = usize::from(answers.iter().any(|a| a.place.is_none()));
        for residue in 0..stripes.positions() as u64 {
            let answered = own_answered
                + stripes
                    .write_set(residue)
                    .filter(|p| answers.iter().any(|a| a.place == Some(*p)))
                    .count();
            if answered < needed {
                return Err(TakeoverError::TooFewAnswers {
                    ledger: ledger.id,
                    answered: answers.len(),
                    replicas: ledger.replicas.len() + 1,
                    needed,
                    why: format!(
                        "the write set of entries {residue} mod {} has {answered} answers; \
                         first refusal: {why}",
                        stripes.positions()
                    ),
                });
            }
        }
        Ok(answers)
    }

    /// Reads entries `0..end` (from this node's own copy as far as it goes, else merged from
    /// the stripes), completes each answered copy up to `end` with recovery adds, and returns
    /// the seal of those entries. A copy that could not be completed fails the takeover
    /// ([`TakeoverError::Incomplete`]): it may be the only answered copy holding some
    /// acknowledged entries, so its place may not be recorded vacant.
    async fn complete_copies(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        name: &str,
        ledger: &LedgerRecord,
        answers: &[Answer],
        end: u64,
    ) -> Result<SealInfo, TakeoverError> {
        let own = answers
            .iter()
            .find(|a| a.place.is_none())
            .map_or(0, |a| a.count);
        let topic: Arc<str> = Arc::from(name);
        let mut written = Written::default();
        let mut pending: Vec<Vec<super::Durable>> = answers.iter().map(|_| Vec::new()).collect();
        let mut failed: Vec<Option<String>> = answers.iter().map(|_| None).collect();
        let mut next = 0;
        while next < end {
            let last = (end - 1).min(next + STEP - 1);
            let entries = if next < own {
                self.serve_read(name, ledger.id, next, last.min(own - 1), super::COPY_BUDGET)
                    .await?
            } else {
                read_merged(&**remote, name, ledger, next, last).await?
            };
            let unreadable = |why: String| TakeoverError::Unreadable {
                ledger: ledger.id,
                why,
            };
            if entries.is_empty() {
                return Err(unreadable(format!("no copy served entry {next}")));
            }
            for e in entries {
                let id = e.position.entry;
                if id != next {
                    return Err(unreadable(format!(
                        "entry {id} served where {next} was asked"
                    )));
                }
                written.push_read(ledger.id, &e, ledger.first_segment);
                for (i, a) in answers.iter().enumerate() {
                    if a.holds(id) || !a.stripe.holds(id) || failed[i].is_some() {
                        continue;
                    }
                    let add = self.recovery_add(remote, &topic, ledger.id, &a.bookie, e.clone());
                    match add.await {
                        Ok(rx) => pending[i].push(rx),
                        Err(why) => failed[i] = Some(why),
                    }
                }
                next = id + 1;
            }
        }
        for (i, a) in answers.iter().enumerate() {
            for rx in pending[i].drain(..) {
                let why = match rx.await {
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "the add was dropped".to_string(),
                };
                failed[i].get_or_insert(why);
            }
            if let Some(why) = failed[i].take() {
                return Err(TakeoverError::Incomplete {
                    ledger: ledger.id,
                    bookie: a.bookie.clone(),
                    why,
                });
            }
        }
        Ok(written.seal_info(ledger.first_segment))
    }
}
