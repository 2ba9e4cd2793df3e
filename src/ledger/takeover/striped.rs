//! Taking over an open striped ledger (ADR 0017) whose writer is gone. Its replicas hold
//! stripes, so the longest copy is not the ledger: the end is decided per write set.
//!
//! Invariants:
//! - Every write set has at least `WQ − AQ + 1` of its replicas among the fence answers. An
//!   acknowledged entry was durable on `AQ` bookies of its write set, at most one of them the
//!   writer's, so on at least `AQ − 1` of its `WQ − 1` replicas: an answered one holds it.
//! - The ledger ends at the first entry no answered replica holds. Entries are acknowledged in
//!   order, so every acknowledged entry is below that end; entries past it were never
//!   acknowledged and are left out.
//! - Each answered replica's stripe is completed up to the end with recovery adds before the
//!   seal; the seal (one compare-and-set on the ledger's state, as for whole copies) keeps
//!   every replica place and the lost writer's bookie, whose whole copy autorecovery rebuilds
//!   on a spare bookie; readers merge the stripes meanwhile ([`super::super::merged`]).

use std::sync::Arc;

use super::super::index::IndexEntry;
use super::super::merged::read_merged;
use super::super::metadata::{LedgerRecord, LedgerTransition, PlacedSeal, SealInfo};
use super::super::open_ledger::Written;
use super::super::record::encode_record;
use super::super::replica::ReplicaSource;
use super::super::{now_ms, Log};
use super::TakeoverError;

/// Entries merged from the stripes per step while completing them.
const STEP: u64 = 1024;

impl Log {
    /// Fences, recovers and seals striped `ledger` of topic `name`, whose writer is gone.
    pub(super) async fn take_over_striped(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        name: &str,
        ledger: &LedgerRecord,
    ) -> Result<LedgerRecord, TakeoverError> {
        let answers = self.fence_places(remote, name, ledger).await?;
        let stripes = ledger.stripes();
        let holds = |e: u64| {
            answers
                .iter()
                .any(|(place, _, count)| e < *count && stripes.stripe(*place).holds(e))
        };
        let longest = answers.iter().map(|a| a.2).max().unwrap_or(0);
        let end = (0..longest).find(|e| !holds(*e)).unwrap_or(longest);
        let meta = &self.shared.meta;
        if end == 0 {
            let empty = Written::default().seal_info(ledger.first_segment);
            meta.transition_ledger(ledger.id, LedgerTransition::Seal(empty), now_ms())
                .await?;
            return Ok(meta
                .transition_ledger(ledger.id, LedgerTransition::Delete, now_ms())
                .await?);
        }
        let (seal, completed) = self
            .complete_stripes(remote, name, ledger, &answers, end)
            .await?;
        let placed = LedgerTransition::SealPlaced(Box::new(PlacedSeal {
            seal,
            bookie: ledger.bookie.clone(),
            replicas: ledger.replicas.clone(),
            first_segment: ledger.first_segment,
        }));
        let record = meta.transition_ledger(ledger.id, placed, now_ms()).await?;
        self.tell_sealed(remote, name, ledger.id, end, &completed)
            .await;
        Ok(record)
    }

    /// Fences every replica of `ledger`: the answers (place, bookie, end of its copy), when
    /// each write set has enough of them.
    async fn fence_places(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        name: &str,
        ledger: &LedgerRecord,
    ) -> Result<Vec<(usize, String, u64)>, TakeoverError> {
        let fences = ledger
            .replicas
            .iter()
            .enumerate()
            .map(|(place, b)| async move {
                let fenced = if *b == self.shared.bookie {
                    self.replica_fence(ledger.id).await
                } else {
                    remote.fence(b, name, ledger.id).await
                };
                (place, b.clone(), fenced)
            });
        let mut answers = Vec::new();
        let mut why = String::new();
        for (place, bookie, fenced) in futures::future::join_all(fences).await {
            match fenced {
                Ok(copy) => answers.push((place, bookie, copy.seal.entry_count)),
                Err(e) if why.is_empty() => why = format!("{bookie}: {e}"),
                Err(_) => {}
            }
        }
        let stripes = ledger.stripes();
        let write_quorum = stripes.width() + 1;
        let needed = (write_quorum + 1)
            .saturating_sub(usize::from(ledger.ack_quorum.max(1)))
            .max(1);
        for residue in 0..stripes.positions() as u64 {
            let answered = stripes
                .write_set(residue)
                .filter(|p| answers.iter().any(|a| a.0 == *p))
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

    /// Reads entries `0..end` merged from the stripes, completes each answered replica's
    /// stripe up to `end` with recovery adds, and returns the seal of those entries and the
    /// replicas completed (one that could not be stays listed, short of its stripe).
    async fn complete_stripes(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        name: &str,
        ledger: &LedgerRecord,
        answers: &[(usize, String, u64)],
        end: u64,
    ) -> Result<(SealInfo, Vec<String>), TakeoverError> {
        let stripes = ledger.stripes();
        let topic: Arc<str> = Arc::from(name);
        let mut written = Written::default();
        let mut pending: Vec<Vec<super::Durable>> = answers.iter().map(|_| Vec::new()).collect();
        let mut failed: Vec<Option<String>> = answers.iter().map(|_| None).collect();
        let mut next = 0;
        while next < end {
            let last = (end - 1).min(next + STEP - 1);
            for e in read_merged(&**remote, name, ledger, next, last).await? {
                let id = e.position.entry;
                let mut record = Vec::new();
                let crc = encode_record(&mut record, ledger.id, id, e.publish_time_ms, &e.payload);
                let at = IndexEntry {
                    segment: ledger.first_segment,
                    offset: 0,
                    len: record.len() as u32,
                    publish_time_ms: e.publish_time_ms,
                };
                written.push(at, e.payload.len(), crc);
                for (i, (place, bookie, count)) in answers.iter().enumerate() {
                    if id < *count || !stripes.stripe(*place).holds(id) || failed[i].is_some() {
                        continue;
                    }
                    match self
                        .recovery_add(remote, &topic, ledger.id, bookie, e.clone())
                        .await
                    {
                        Ok(rx) => pending[i].push(rx),
                        Err(why) => failed[i] = Some(why),
                    }
                }
                next = id + 1;
            }
        }
        let mut completed = Vec::new();
        for (i, (_, bookie, _)) in answers.iter().enumerate() {
            for rx in pending[i].drain(..) {
                match rx.await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => failed[i] = failed[i].take().or(Some(e.to_string())),
                    Err(_) => failed[i] = failed[i].take().or(Some("the add was dropped".into())),
                }
            }
            match &failed[i] {
                None => completed.push(bookie.clone()),
                Some(why) => tracing::warn!(
                    ledger = ledger.id,
                    bookie,
                    why,
                    "could not complete a fenced stripe; the ledger is short of it"
                ),
            }
        }
        Ok((written.seal_info(ledger.first_segment), completed))
    }
}
