//! Replacing a replica that fails during writes (ADR 0016): the writer keeps its open ledger
//! and puts another bookie in the failed one's place for the following entries, as
//! BookKeeper changes a ledger's ensemble, instead of rolling to a new ledger.
//!
//! The order of the steps keeps every acknowledged entry recoverable by a new owner, which
//! fences and reads the bookies the ledger's record lists ([`super::super::takeover`]):
//! 1. The bookies left (the journal and the replicas that did not fail) hold every confirmed
//!    entry at the ack quorum ([`Quorum::survivors_hold_confirmed`]); from the failure on, the
//!    failed replica's answers confirm nothing.
//! 2. The ledger record names the new bookie in the failed one's place, by a compare-and-set
//!    fenced by the writer's epoch ([`super::super::MetadataStore::change_ensemble`]): a new
//!    owner fences the topic's writers before it reads the ensemble, so it sees the last one.
//! 3. The new member joins the quorum ([`Quorum::join`]) and gets every earlier entry from
//!    this journal's copy, then the entries queued for it meanwhile, then the later ones
//!    directly, all in id order (a replica takes a copy's entries only densely from 0). Its
//!    answers count from then on; until it holds the ledger, the others carry the ack quorum.
//!
//! A failure at any step leaves the failed replica out, and the ledger rolls at its next
//! entry, as it did before ensemble changes (ADR 0010).

use std::sync::Arc;
use std::time::Duration;

use super::super::metadata::EnsembleChange;
use super::super::open_ledger::OpenLedger;
use super::super::quorum::{Failure, MemberId, Quorum};
use super::super::read::read_located;
use super::TopicLog;

/// Payload bytes read from this journal per step while a new replica catches up.
const CATCH_UP_BUDGET: u64 = 4 << 20;
/// Entries read per step while a new replica catches up.
const CATCH_UP_ENTRIES: usize = 4096;
/// Longest wait for the bookies left to hold the confirmed entries, and for a new replica
/// to make one step of its catch-up durable.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest time one replacement takes, every step and every bookie tried included.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(120);

/// Why one bookie did not take a failed replica's place.
struct NotReplaced {
    /// The member it joined as, when it joined the quorum before failing (another bookie may
    /// take its place then).
    joined: Option<MemberId>,
    why: String,
}

impl From<String> for NotReplaced {
    fn from(why: String) -> Self {
        NotReplaced { joined: None, why }
    }
}

impl From<&str> for NotReplaced {
    fn from(why: &str) -> Self {
        NotReplaced::from(why.to_string())
    }
}

/// Counts a replacement's outcome (`ledgerlake_ensemble_changes_total`).
fn count(outcome: &'static str) {
    crate::metrics::node()
        .ensemble_changes
        .get_or_create(&crate::metrics::node::OutcomeLabel { outcome })
        .inc();
}

/// Ends a replacement when dropped ([`Quorum::replacement_ended`]).
struct ReplacementEnded(Arc<Quorum>);

impl Drop for ReplacementEnded {
    fn drop(&mut self) {
        self.0.replacement_ended();
    }
}

impl TopicLog {
    /// Member `member` of replicated ledger `ledger` failed (`why`): it gets nothing more,
    /// and when its quorum says so, another bookie is put in its place in the background.
    pub(super) fn replica_failed(&self, ledger: &Arc<OpenLedger>, member: MemberId, why: &str) {
        let Some(q) = ledger.quorum.clone() else {
            return;
        };
        match q.replica_failed(member, why) {
            Failure::Replace => {}
            Failure::LeftOut => return count("not_replaced"),
            // Not news, or the replacement under way deals with it.
            Failure::Known | Failure::Joining => return,
        }
        // However the attempt ends (a panic, or the task dropped unpolled, included), the
        // ledger may roll again after.
        let ended = ReplacementEnded(q.clone());
        let (writer, ledger) = (self.clone(), ledger.clone());
        self.inner.shared.tasks.spawn(async move {
            let _ended = ended;
            let topic = writer.inner.name.clone();
            let stop = writer.inner.shared.stop.clone();
            let attempt =
                tokio::time::timeout(ATTEMPT_TIMEOUT, writer.replace_member(&ledger, &q, member));
            let outcome = tokio::select! {
                done = attempt => done.unwrap_or_else(|_| {
                    Err(format!("the replacement took longer than {ATTEMPT_TIMEOUT:?}"))
                }),
                () = stop.cancelled() => Err("the node is stopping".to_string()),
            };
            match outcome {
                Ok(bookie) => {
                    tracing::info!(
                        topic,
                        ledger = ledger.id,
                        bookie,
                        "a replica that failed was replaced; the ledger goes on"
                    );
                    count("replaced");
                }
                Err(why) => {
                    tracing::warn!(
                        topic,
                        ledger = ledger.id,
                        why,
                        "a replica that failed was not replaced; an open ledger rolls"
                    );
                    count("not_replaced");
                }
            }
        });
    }

    /// Puts another bookie in failed member `failed`'s place, and when the bookie put there
    /// fails while it catches up, another in its place, while the quorum allows
    /// ([`Quorum::replace_again`]); the bookie that took the place.
    async fn replace_member(
        &self,
        ledger: &Arc<OpenLedger>,
        q: &Quorum,
        mut failed: MemberId,
    ) -> Result<String, String> {
        loop {
            match self.change_ensemble(ledger, q, failed).await {
                Ok(bookie) => return Ok(bookie),
                Err(NotReplaced {
                    joined: Some(member),
                    why,
                }) if q.replace_again() => {
                    tracing::warn!(
                        topic = self.inner.name,
                        ledger = ledger.id,
                        why,
                        "the bookie put in a failed replica's place failed; trying another"
                    );
                    failed = member;
                }
                Err(NotReplaced { why, .. }) => return Err(why),
            }
        }
    }

    /// Puts a live bookie outside the ledger's ensemble in failed member `failed`'s place
    /// (the module's steps); the bookie chosen.
    async fn change_ensemble(
        &self,
        ledger: &Arc<OpenLedger>,
        q: &Quorum,
        failed: MemberId,
    ) -> Result<String, NotReplaced> {
        let shared = &self.inner.shared;
        let remote = shared
            .remote
            .get()
            .cloned()
            .ok_or_else(|| NotReplaced::from("this node reaches no other bookie"))?;
        let from = q
            .bookie_of(failed)
            .ok_or_else(|| NotReplaced::from("the failed replica left already"))?;
        let taken = q.bookies();
        let spare = remote
            .choose(&shared.bookie, usize::MAX)
            .await
            .into_iter()
            .find(|b| !taken.contains(b))
            .ok_or_else(|| NotReplaced::from("no live bookie is outside the ensemble"))?;
        let held = tokio::time::timeout(STEP_TIMEOUT, q.survivors_hold_confirmed()).await;
        if !held.unwrap_or(false) {
            return Err("the bookies left did not come to hold every confirmed entry".into());
        }
        self.still_written(ledger).map_err(NotReplaced::from)?;
        let change = EnsembleChange {
            from,
            to: spare.clone(),
        };
        shared
            .meta
            .change_ensemble(ledger.id, &change, self.writer_epoch())
            .await
            .map_err(|e| NotReplaced::from(format!("recording the new ensemble: {e}")))?;
        let (member, upto) = q
            .join(failed, spare.clone())
            .ok_or_else(|| NotReplaced::from("the ledger's quorum broke"))?;
        if let Err(e) = self
            .send_earlier_entries(ledger, q, (member, &spare), upto)
            .await
        {
            // Its catch-up ended short either way; only its own failure lets another try (a
            // step that timed out because the ledger rolled meanwhile is not).
            q.replica_failed(member, &e.why);
            let joined = e.joined.filter(|_| self.still_written(ledger).is_ok());
            return Err(NotReplaced {
                joined,
                why: format!("{spare} joined and its catch-up ended: {}", e.why),
            });
        }
        Ok(spare)
    }

    /// Sends new member `member` (bookie `bookie`) the entries of its stripe below `upto` from
    /// this journal's copy, then the entries queued for it meanwhile, until it is live. An error says `joined`
    /// when the new bookie failed, none when this side did (the journal, the ledger rolling).
    async fn send_earlier_entries(
        &self,
        ledger: &Arc<OpenLedger>,
        q: &Quorum,
        (member, bookie): (MemberId, &str),
        upto: u64,
    ) -> Result<(), NotReplaced> {
        let theirs = |why: String| NotReplaced {
            joined: Some(member),
            why,
        };
        let topic: Arc<str> = Arc::from(self.inner.name.as_str());
        let journal = tokio::time::timeout(STEP_TIMEOUT, q.holds(0, upto)).await;
        if !journal.unwrap_or(false) {
            return Err("this journal did not make the earlier entries durable".into());
        }
        let stripe = q
            .stripe_of(member)
            .ok_or_else(|| theirs("it is no longer a member".into()))?;
        let mut next = 0;
        while next < upto {
            self.still_written(ledger).map_err(NotReplaced::from)?;
            let located: Vec<_> = {
                let w = ledger.written();
                let end = (upto as usize).min(w.entries.len());
                let mut bytes = 0u64;
                w.entries[(next as usize).min(end)..end]
                    .iter()
                    .take(CATCH_UP_ENTRIES)
                    .take_while(|at| {
                        let fits = bytes == 0 || bytes + u64::from(at.len) <= CATCH_UP_BUDGET;
                        bytes += u64::from(at.len);
                        fits
                    })
                    .copied()
                    .collect()
            };
            if located.is_empty() {
                return Err(format!("this journal has no entry {next} of the ledger").into());
            }
            let entries = read_located(&self.inner.shared, ledger.id, next, located)
                .await
                .map_err(|e| {
                    NotReplaced::from(format!("reading entry {next} from this journal: {e}"))
                })?;
            for e in entries {
                next = e.position.entry + 1;
                if stripe.holds(e.position.entry) {
                    let routed = (e.position.entry, e.publish_time_ms, e.payload);
                    self.send_to_replica(&topic, ledger, (member, bookie), routed);
                }
            }
            let step = tokio::time::timeout(STEP_TIMEOUT, q.holds(member, next)).await;
            if !step.unwrap_or(false) {
                return Err(theirs(format!(
                    "it did not make entries up to {next} durable"
                )));
            }
        }
        loop {
            let queued = q
                .take_queued(member)
                .ok_or_else(|| theirs("it failed while catching up".into()))?;
            if queued.is_empty() {
                return Ok(());
            }
            // Paced as the earlier entries are (a step's bytes, then its answers), so that
            // what queued while it caught up does not pile up in the bookie's stream.
            let mut bytes = 0u64;
            for routed in queued {
                let entry = routed.0;
                bytes += routed.2.len() as u64;
                self.send_to_replica(&topic, ledger, (member, bookie), routed);
                if bytes >= CATCH_UP_BUDGET {
                    bytes = 0;
                    self.still_written(ledger).map_err(NotReplaced::from)?;
                    let step = tokio::time::timeout(STEP_TIMEOUT, q.holds(member, entry + 1));
                    if !step.await.unwrap_or(false) {
                        return Err(theirs(format!(
                            "it did not make entries up to {entry} durable"
                        )));
                    }
                }
            }
        }
    }

    /// Whether `ledger` is still the one this topic writes (a ledger rolled meanwhile is
    /// sealed with the replicas complete by then: catching one up is of no use).
    fn still_written(&self, ledger: &Arc<OpenLedger>) -> Result<(), String> {
        let w = super::lock(&self.inner.writer);
        match &w.current {
            Some(c) if Arc::ptr_eq(c, ledger) => Ok(()),
            _ => Err("the ledger rolled meanwhile".into()),
        }
    }
}
