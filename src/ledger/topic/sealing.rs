//! Sealing the topic's open ledger on demand (unload, deletion, hand-over and planned moves,
//! an offload request), when it rolls, and at its age deadline ([`crate::ledger::aging`]); a
//! ledger that never got an entry is discarded instead.
//!
//! A seal (or an empty ledger's discard) that fails for a reason that may pass (the store
//! unreachable, an index file that could not be written) is tried again in the background,
//! waiting [`RESEAL_FIRST`] and then about twice as long each time up to [`RESEAL_MAX`], until
//! the ledger is closed, the failure is one that will not pass, or the log stops (recovery at
//! the next start closes it then). Each try asks the store first, so a try that landed with
//! its answer lost, or another node's takeover, is taken as it stands. Before, such a ledger
//! stayed open until a restart: it pinned the journal's segments, was never offloaded and
//! kept its topic from being deleted or forgotten.
//!
//! Invariants:
//! - The ledger being tried again stays the topic's open view ([`LedgerView::Open`]) until
//!   it is closed, so readers keep reading it and the log does not forget the topic.
//! - Each ledger has one closer: it reaches [`TopicLog::seal_or_retry`] (or the discard)
//!   once, taken out of the writer's current ledger under the writer's lock.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{lock, LedgerView, TopicLog};
use crate::ledger::error::LifecycleError;
use crate::ledger::metadata::{LedgerId, LedgerRecord, LedgerTransition, MetadataError};
use crate::ledger::open_ledger::OpenLedger;
use crate::ledger::seal::discard_empty;
use crate::ledger::{now_ms, LedgerState};

impl TopicLog {
    /// Seals the open ledger now, so that everything appended so far is in sealed ledgers; an
    /// open ledger without entries is discarded instead (sealed empty and marked deleted in one
    /// go, as recovery does, with no index file and nothing for the lake). The next append
    /// opens a new ledger. Returns the sealed ledger, `None` when there was none with entries.
    pub async fn seal_current(&self) -> Result<Option<LedgerRecord>, LifecycleError> {
        self.seal_current_if(None).await
    }

    /// [`TopicLog::seal_current`], only if the open ledger is still `expected` (when given).
    async fn seal_current_if(
        &self,
        expected: Option<LedgerId>,
    ) -> Result<Option<LedgerRecord>, LifecycleError> {
        let _guard = self.inner.roll_lock.lock().await;
        let (old, empty) = {
            let mut w = lock(&self.inner.writer);
            if expected.is_some_and(|id| w.current.as_ref().is_none_or(|c| c.id != id)) {
                return Ok(None);
            }
            let Some(old) = w.current.take() else {
                return Ok(None);
            };
            let empty = w.next_entry == 0;
            w.next_entry = 0;
            w.bytes = 0;
            (old, empty)
        };
        if empty {
            return match self.discard_empty(&old).await {
                Ok(()) => Ok(None),
                Err(e) => Err(self.after_failed_close(old, e).await),
            };
        }
        self.seal_or_retry(old).await.map(Some)
    }

    /// First step of deleting the topic: refuses appends from now on and seals the open
    /// ledger, so that every ledger of the topic ends up sealed (then deleted by the caller).
    /// A deletion that fails from here on calls [`TopicLog::deletion_failed`].
    pub(crate) async fn close_for_deletion(&self) -> Result<(), LifecycleError> {
        self.inner.deleted.store(true, Ordering::Release);
        self.seal_current().await?;
        Ok(())
    }

    /// A deletion that [`TopicLog::close_for_deletion`] began failed, at whatever step: the
    /// topic stays and takes appends again (in a new ledger; a seal that failed is tried again
    /// meanwhile), so that it is not left refusing its producers until it is read anew.
    pub(crate) fn deletion_failed(&self) {
        self.inner.deleted.store(false, Ordering::Release);
    }

    /// Closes `old`, which never got an entry (see [`discard_empty`]).
    async fn discard_empty(&self, old: &OpenLedger) -> Result<(), LifecycleError> {
        let info = old.written().seal_info(old.first_segment);
        let record = discard_empty(&self.inner.shared, old.id, info).await?;
        lock(&self.inner.ledgers).insert(record.id, LedgerView::Closed(Box::new(record)));
        tracing::debug!(topic = %self.inner.name, ledger = old.id, "discarded empty ledger");
        Ok(())
    }

    /// At one of the topic's age deadlines ([`crate::ledger::aging`]): seals the open ledger if
    /// it is older than the rollover age (idle topics; one that never got an entry is
    /// discarded), queues the deadline of a younger one, and otherwise leaves the topic without
    /// a deadline (its next ledger queues one). A seal that fails is tried again in the
    /// background, as a roll's failed seal is.
    pub(crate) async fn at_age_deadline(&self) -> Result<(), LifecycleError> {
        let shared = &self.inner.shared;
        let age = shared.config.rollover_age;
        let due = {
            let mut w = lock(&self.inner.writer);
            match w.current.as_ref().map(|c| c.id) {
                Some(id) if w.opened_at.elapsed() >= age => {
                    w.age_armed = false;
                    Some(id)
                }
                Some(_) => {
                    w.age_armed = shared.aging.queue(&self.inner.age_token, w.opened_at, age);
                    None
                }
                None => {
                    w.age_armed = false;
                    None
                }
            }
        };
        let Some(id) = due else { return Ok(()) };
        self.seal_current_if(Some(id)).await.map(|_| ())
    }
}

/// First wait before a failed seal is tried again (each wait gets up to half again, at random,
/// so that the ledgers of one outage do not all try at the same moments).
pub(crate) const RESEAL_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between two tries.
pub(crate) const RESEAL_MAX: Duration = Duration::from_secs(60);

impl TopicLog {
    /// Seals `old`; when that fails for a reason that may pass, tries again in the background
    /// (see the module's docs) and returns the first failure.
    pub(super) async fn seal_or_retry(
        &self,
        old: Arc<OpenLedger>,
    ) -> Result<LedgerRecord, LifecycleError> {
        match self.seal(old.clone()).await {
            Ok(record) => Ok(record),
            Err(e) => Err(self.after_failed_close(old, e).await),
        }
    }

    /// After a first try at closing `old` failed with `e`: tries again in the background when
    /// `e` may pass, else takes what the store holds (another node may have closed it).
    /// Returns `e`.
    async fn after_failed_close(&self, old: Arc<OpenLedger>, e: LifecycleError) -> LifecycleError {
        if may_pass(&e) && !self.inner.shared.stop.is_cancelled() {
            tracing::warn!(topic = %self.inner.name, ledger = old.id, error = %e,
                "closing a ledger failed; trying again");
            let topic = self.clone();
            let closing = self.closing_in_background();
            self.inner.shared.tasks.spawn(async move {
                topic.close_again(old).await;
                drop(closing);
            });
        } else {
            tracing::error!(topic = %self.inner.name, ledger = old.id, error = %e,
                "closing a ledger failed; recovery closes it at the next start");
            self.take_stored_close(&old).await;
        }
        e
    }

    /// Tries to close `old` again until it is closed, the failure will not pass, or the log
    /// stops; at most [`RESEALS_AT_ONCE`] tries run at once in the log.
    async fn close_again(&self, old: Arc<OpenLedger>) {
        let shared = &self.inner.shared;
        let mut wait = RESEAL_FIRST;
        for attempt in 2u32.. {
            let jitter = rand::random_range(0..=wait.as_millis() as u64 / 2);
            tokio::select! {
                () = shared.stop.cancelled() => return,
                () = tokio::time::sleep(wait + Duration::from_millis(jitter)) => {}
            }
            if !self.is_open_view(&old) {
                return;
            }
            let Ok(_permit) = shared.reseals.acquire().await else {
                return;
            };
            match self.close_once_more(&old).await {
                Ok(()) => {
                    tracing::info!(topic = %self.inner.name, ledger = old.id, attempt,
                        "closed a ledger whose seal had failed");
                    return;
                }
                Err(e) if may_pass(&e) => {
                    tracing::warn!(topic = %self.inner.name, ledger = old.id, attempt,
                        error = %e, "closing a ledger failed again; trying again");
                }
                Err(e) => {
                    tracing::error!(topic = %self.inner.name, ledger = old.id, attempt,
                        error = %e, "closing a ledger failed for good");
                    self.take_stored_close(&old).await;
                    return;
                }
            }
            wait = (wait * 2).min(RESEAL_MAX);
        }
    }

    /// One more try at closing `old`. The store is asked first: an earlier try may have
    /// landed with its answer lost, or another node closed the ledger; then the view takes
    /// the store's record and nothing is written again. A ledger the store holds sealed with
    /// no entry is an empty one whose discard stopped between its two steps: it is deleted.
    async fn close_once_more(&self, old: &Arc<OpenLedger>) -> Result<(), LifecycleError> {
        let meta = &self.inner.shared.meta;
        match meta.get_ledger(old.id).await? {
            None => Err(LifecycleError::UnknownLedger(old.id)),
            Some(r)
                if r.state == LedgerState::Sealed && r.seal.is_some_and(|s| s.entry_count == 0) =>
            {
                let deleted = meta
                    .transition_ledger(old.id, LedgerTransition::Delete, now_ms())
                    .await?;
                self.set_record(deleted);
                Ok(())
            }
            Some(r) if r.state != LedgerState::Open => {
                self.set_record(r);
                Ok(())
            }
            Some(_) if old.quorum.is_none() && old.written().entries.is_empty() => {
                self.discard_empty(old).await
            }
            Some(_) => self.seal(old.clone()).await.map(|_| ()),
        }
    }

    /// Counts a close of one of this topic's ledgers that runs in the background until the
    /// returned guard is dropped (also when its task panics or is dropped unfinished).
    pub(super) fn closing_in_background(&self) -> ClosingGuard {
        self.inner.retrying.fetch_add(1, Ordering::AcqRel);
        ClosingGuard(self.inner.clone())
    }

    /// Waits until no close of this topic's ledgers runs in the background (a rollover's
    /// seal, a seal tried again; at once if none does): each ends when its ledger is closed,
    /// when the failure will not pass, or when the log stops. `false` when the log stopped
    /// first.
    pub(crate) async fn retries_ended(&self) -> bool {
        let inner = &self.inner;
        loop {
            let ended = inner.retry_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if inner.retrying.load(Ordering::Acquire) == 0 {
                return true;
            }
            tokio::select! {
                () = inner.shared.stop.cancelled() => return false,
                () = ended => {}
            }
        }
    }

    /// Whether `old` is still this view's open ledger (nobody closed it meanwhile).
    fn is_open_view(&self, old: &Arc<OpenLedger>) -> bool {
        LedgerView::is_open(lock(&self.inner.ledgers).get(&old.id), old)
    }

    /// After a close that failed for good: if the store holds the ledger closed (another
    /// node's recovery, or a seal that landed though its answer was lost), the view takes
    /// that record, so the ledger is read, offloaded and forgotten as a closed one.
    async fn take_stored_close(&self, old: &Arc<OpenLedger>) {
        match self.inner.shared.meta.get_ledger(old.id).await {
            Ok(Some(record)) if record.state != LedgerState::Open && self.is_open_view(old) => {
                self.set_record(record);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(topic = %self.inner.name, ledger = old.id, error = %e,
                "reading a ledger whose seal failed"),
        }
    }
}

/// A close running in the background ([`TopicLog::closing_in_background`]): uncounted, and
/// the topic's waiters woken, when dropped.
pub(super) struct ClosingGuard(Arc<super::TopicInner>);

impl Drop for ClosingGuard {
    fn drop(&mut self) {
        self.0.retrying.fetch_sub(1, Ordering::AcqRel);
        self.0.retry_ended.notify_waiters();
    }
}

/// Most closes tried again at once in one log.
pub(crate) const RESEALS_AT_ONCE: usize = 16;

/// Whether a failed close may land if tried again: the store or the disk failed, not the
/// journal (fail-stop until restart) nor the store's verdict on the ledger.
fn may_pass(e: &LifecycleError) -> bool {
    match e {
        LifecycleError::Index(_) => true,
        LifecycleError::Metadata(m) => matches!(m, MetadataError::Backend { .. }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_that_may_pass_are_tried_again() {
        let backend = || MetadataError::Backend {
            op: "transition_ledger",
            source: Box::new(std::io::Error::other("unreachable")),
        };
        assert!(may_pass(&LifecycleError::Metadata(backend())));
        assert!(!may_pass(&LifecycleError::Metadata(
            MetadataError::InvalidTransition {
                ledger: 1,
                from: crate::ledger::LedgerState::Sealed,
                to: crate::ledger::LedgerState::Sealed,
            }
        )));
        assert!(!may_pass(&LifecycleError::Append(
            crate::ledger::AppendError::JournalFailed("fsync".into())
        )));
        assert!(!may_pass(&LifecycleError::Cancelled));
    }
}
