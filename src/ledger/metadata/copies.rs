//! Moving a sealed ledger's copies ([`CopyChange`], ADR 0011): the one rule every store
//! applies under its compare-and-set, so that autorecovery's changes mean the same on etcd,
//! SQLite and in memory.

use super::{LedgerRecord, LedgerState, MetadataError};

/// A change of where a ledger's copies are ([`MetadataStore::move_ledger_copies`], ADR 0011):
/// autorecovery drops the bookies in `lost` and, for a sealed ledger short of copies, adds the
/// new copy on `add`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyChange {
    /// Bookies the ledger no longer lists (gone past the recovery delay); each must be listed.
    pub lost: Vec<String>,
    /// The bookie holding a new, complete copy, not listed yet (`None`: bookies are dropped
    /// only).
    pub add: Option<String>,
    /// When the writer's bookie is among `lost`: the bookie taking its place (`add`, or a
    /// listed replica not lost) with the first and last segment of its journal holding its
    /// copy, recorded as the ledger's `first_segment` and its seal's `last_segment` (both
    /// always describe `bookie`'s copy). `None` otherwise.
    pub writer: Option<(String, (u32, u32))>,
}

impl CopyChange {
    /// The one rule every store applies, under its compare-and-set:
    /// - the ledger is sealed, or offloaded when nothing is added (the lake holds it);
    /// - it lists every bookie in `lost`, and not `add`;
    /// - a copy is added only while the bookies left number fewer than its write quorum (two
    ///   copies made at once never both land);
    /// - the writer's place goes to `writer` exactly when the writer's bookie is lost (that
    ///   bookie then offloads the ledger and deletes its local copies); in a striped ledger
    ///   (ADR 0017) only to the bookie of a new copy (`add`), since its replicas hold stripes;
    /// - a striped ledger's replicas keep their places (each is a stripe): a new copy of one
    ///   lost replica's stripe takes that replica's place, and no replica is dropped.
    pub(crate) fn apply(&self, l: &mut LedgerRecord) -> Result<(), MetadataError> {
        let refuse = |why: String| Err(MetadataError::Conflict(format!("ledger {}: {why}", l.id)));
        match (l.state, &self.add) {
            (LedgerState::Sealed, _) | (LedgerState::Offloaded, None) => {}
            (state, _) => return refuse(format!("it is {state}: its copies are not moved")),
        }
        if let Some(b) = self
            .lost
            .iter()
            .find(|b| !l.bookies().any(|x| x == b.as_str()))
        {
            return refuse(format!("it does not list bookie {b}"));
        }
        let left: Vec<String> = l
            .bookies()
            .filter(|b| !self.lost.iter().any(|x| x == b))
            .map(str::to_string)
            .collect();
        if let Some(add) = &self.add {
            if l.bookies().any(|x| x == add) {
                return refuse(format!("it lists bookie {add} already"));
            }
            if left.len() >= l.wanted_copies() {
                return refuse(format!("it has its {} copies", l.wanted_copies()));
            }
        }
        let writer_lost = self.lost.contains(&l.bookie);
        // A striped ledger's replicas keep their places (each place is a stripe, ADR 0017): a
        // new, whole copy takes a lost writer's place, or a new copy of one lost replica's
        // stripe takes that replica's place.
        let writer_rebuilt = self.lost.iter().all(|b| *b == l.bookie)
            && self.add.is_some()
            && self.writer.as_ref().map(|w| &w.0) == self.add.as_ref();
        let stripe_rebuilt = self.writer.is_none()
            && self.add.is_some()
            && matches!(self.lost.as_slice(), [one] if *one != l.bookie);
        if l.is_striped() && !writer_rebuilt && !stripe_rebuilt {
            return refuse("it is striped: its replicas keep their places".into());
        }
        let (bookie, first_segment, last_segment) = match (&self.writer, writer_lost) {
            (None, false) => (l.bookie.clone(), l.first_segment, None),
            // A striped ledger's replicas hold stripes (ADR 0017): only a new, whole copy
            // takes the writer's place.
            (Some((w, (first, last))), true)
                if self.add.as_ref() == Some(w)
                    || (left.contains(w) && *w != l.bookie && !l.is_striped()) =>
            {
                (w.clone(), *first, Some(*last))
            }
            (Some((w, _)), true) => {
                return refuse(format!(
                    "bookie {w} holds no copy to take the writer's place"
                ))
            }
            (Some(_), false) => return refuse("its writer is not lost".into()),
            (None, true) => return refuse("its writer is lost and none takes its place".into()),
        };
        // A record from before the write quorum was recorded wants as many copies as it
        // listed: pinned now, before the list changes.
        l.write_quorum = u8::try_from(l.wanted_copies()).unwrap_or(u8::MAX);
        l.replicas = match &self.add {
            Some(add) if l.is_striped() && stripe_rebuilt => l
                .replicas
                .iter()
                .map(|b| if self.lost.contains(b) { add } else { b })
                .cloned()
                .collect(),
            _ => left
                .into_iter()
                .chain(self.add.clone())
                .filter(|b| *b != bookie)
                .collect(),
        };
        l.bookie = bookie;
        l.first_segment = first_segment;
        if let (Some(seal), Some(last)) = (&mut l.seal, last_segment) {
            seal.last_segment = last;
        }
        Ok(())
    }
}
