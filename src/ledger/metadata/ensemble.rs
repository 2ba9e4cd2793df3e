//! Ensemble changes of an open ledger (ADR 0016): its writer replaces a replica that failed
//! during writes with another bookie, so the following entries keep their write quorum without
//! rolling to a new ledger.
//!
//! Invariants (every store applies [`EnsembleChange::apply`] under its compare-and-set, together
//! with the writer-epoch fence of [`super::MetadataStore::change_ensemble`]):
//! - Only an `Open` ledger's replicas change here; the writer's bookie never does (a sealed
//!   ledger's copies move by [`super::CopyChange`]).
//! - Once a new owner fenced the topic's writers at a higher epoch, no change of the writer it
//!   fenced lands: the owner reads the ensemble after its fence, so the bookies it fences and
//!   recovers from are the ledger's last ensemble.

use super::{LedgerRecord, LedgerState, MetadataError};

/// Replace replica `from` of an open ledger with bookie `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsembleChange {
    /// The replica that failed; it must be listed among the ledger's replicas.
    pub from: String,
    /// The bookie taking its place; it must not be listed yet.
    pub to: String,
}

impl EnsembleChange {
    /// The one rule every store applies: the ledger is open, lists `from` as a replica and does
    /// not list `to`; `to` takes `from`'s place in the replicas.
    pub(crate) fn apply(&self, l: &mut LedgerRecord) -> Result<(), MetadataError> {
        let refuse = |why: String| Err(MetadataError::Conflict(format!("ledger {}: {why}", l.id)));
        if l.state != LedgerState::Open {
            return refuse(format!("it is {}: its ensemble no longer changes", l.state));
        }
        if l.bookies().any(|b| b == self.to) {
            return refuse(format!("it lists bookie {} already", self.to));
        }
        let Some(place) = l.replicas.iter().position(|b| *b == self.from) else {
            return refuse(format!("bookie {} is not one of its replicas", self.from));
        };
        l.replicas[place] = self.to.clone();
        Ok(())
    }
}
