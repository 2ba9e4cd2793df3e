//! A namespace's persistence policy (Pulsar's `/persistence`): the ensemble, write quorum
//! and ack quorum of the ledgers its topics open from then on, and which combinations are
//! refused (ADR 0017: a write quorum below the ensemble stripes each ledger).

use serde::{Deserialize, Serialize};

/// Pulsar's `PersistencePolicies`, as its admin API reads and writes them. A write quorum
/// below the ensemble stripes the ledger (ADR 0017): each entry goes to the writer's bookie
/// and to `write quorum − 1` of the other bookies, in turn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistencePolicies {
    /// Bookies per ledger.
    pub bookkeeper_ensemble: i32,
    /// Bookies each entry is written to, the writer's included (at most the ensemble).
    pub bookkeeper_write_quorum: i32,
    /// Bookies that make an entry durable before it is acknowledged.
    pub bookkeeper_ack_quorum: i32,
    /// Accepted for compatibility; cursor positions are saved on their own schedule.
    #[serde(default)]
    pub managed_ledger_max_mark_delete_rate: f64,
}

impl Eq for PersistencePolicies {}

impl PersistencePolicies {
    /// Why these quorums cannot be used, if they cannot.
    pub fn invalid(&self) -> Option<String> {
        let (e, w, a) = (
            self.bookkeeper_ensemble,
            self.bookkeeper_write_quorum,
            self.bookkeeper_ack_quorum,
        );
        if !(1..=16).contains(&e) || !(1..=16).contains(&w) || !(1..=16).contains(&a) {
            return Some("ensemble, write quorum and ack quorum must be between 1 and 16".into());
        }
        if !(e >= w && w >= a) {
            return Some(format!(
                "Bookkeeper Ensemble ({e}) >= WriteQuorum ({w}) >= AckQuoru ({a}) must hold"
            ));
        }
        if w == 1 && e > 1 {
            return Some(format!(
                "a write quorum of 1 with an ensemble of {e}: the writer's bookie is in every \
                 write set (ADR 0017), so the other bookies would get nothing; use an ensemble \
                 of 1, or a write quorum of 2 or more"
            ));
        }
        None
    }

    /// The replication new ledgers get.
    pub fn replication(&self) -> crate::ledger::Replication {
        let clamp = |v: i32| Some(v.clamp(1, 16) as u8);
        crate::ledger::Replication {
            ensemble: clamp(self.bookkeeper_ensemble),
            ack_quorum: clamp(self.bookkeeper_ack_quorum),
            write_quorum: clamp(self.bookkeeper_write_quorum),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PersistencePolicies;

    fn quorums(e: i32, w: i32, a: i32) -> PersistencePolicies {
        PersistencePolicies {
            bookkeeper_ensemble: e,
            bookkeeper_write_quorum: w,
            bookkeeper_ack_quorum: a,
            managed_ledger_max_mark_delete_rate: 0.0,
        }
    }

    #[test]
    fn accepts_whole_copies_and_stripes_refuses_the_rest() {
        for (e, w, a) in [(1, 1, 1), (3, 3, 2), (3, 2, 2), (4, 3, 2), (16, 16, 16)] {
            assert_eq!(quorums(e, w, a).invalid(), None, "{e}/{w}/{a}");
        }
        for (e, w, a) in [
            (0, 0, 0),
            (17, 3, 2),
            (2, 3, 2),
            (3, 3, 4),
            (3, 1, 1),
            (2, 1, 1),
        ] {
            assert!(quorums(e, w, a).invalid().is_some(), "{e}/{w}/{a}");
        }
    }

    #[test]
    fn replication_clamps_to_the_bookie_range() {
        let r = quorums(4, 3, 2).replication();
        assert_eq!(
            (r.ensemble, r.write_quorum, r.ack_quorum),
            (Some(4), Some(3), Some(2))
        );
        let r = quorums(40, 0, -1).replication();
        assert_eq!(
            (r.ensemble, r.write_quorum, r.ack_quorum),
            (Some(16), Some(1), Some(1))
        );
    }
}
