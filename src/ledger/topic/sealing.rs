//! Sealing the topic's open ledger on demand (unload, deletion, hand-over and planned moves,
//! an offload request) and at its age deadline ([`crate::ledger::aging`]); a ledger that never
//! got an entry is discarded instead.

use super::{lock, LedgerView, TopicLog};
use crate::ledger::error::LifecycleError;
use crate::ledger::metadata::{LedgerId, LedgerRecord};
use crate::ledger::open_ledger::OpenLedger;
use crate::ledger::seal::discard_empty;

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
            self.discard_empty(&old).await?;
            return Ok(None);
        }
        self.seal(old).await.map(Some)
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
    /// a deadline (its next ledger queues one). A seal that fails leaves its ledger open to
    /// recovery, as a roll's failed seal does.
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
