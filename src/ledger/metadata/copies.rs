//! Moving a sealed ledger's copies ([`CopyChange`], ADR 0011): the one rule every store
//! applies under its compare-and-set, so that autorecovery's changes mean the same on etcd,
//! SQLite and in memory.

use super::{LedgerRecord, LedgerState, MetadataError, VACANT};

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
    /// When the writer's bookie is among `lost`, or a striped ledger's new copy takes the
    /// writer's place: the bookie taking it (`add`, or for whole copies a listed replica not
    /// lost) with the first and last segment of its journal holding its copy, recorded as the
    /// ledger's `first_segment` and its seal's `last_segment` (both always describe
    /// `bookie`'s copy). `None` otherwise.
    pub writer: Option<(String, (u32, u32))>,
    /// A striped ledger (ADR 0017) gaining a copy: the place ([`LedgerRecord::places`]) the
    /// new copy takes, vacant or held by a bookie in `lost`: 0, the writer's (a whole copy),
    /// or `i + 1`, replica `i`'s (that place's stripe). `None` otherwise.
    pub place: Option<usize>,
}

impl CopyChange {
    /// The one rule every store applies, under its compare-and-set:
    /// - the ledger is sealed, or offloaded when nothing is added (the lake holds it);
    /// - it lists every bookie in `lost`, and not `add`;
    /// - a copy is added only while the bookies left number fewer than its write quorum (two
    ///   copies made at once never both land);
    /// - whole copies: the writer's place goes to `writer` exactly when the writer's bookie is
    ///   lost (that bookie then offloads the ledger and deletes its local copies);
    /// - a striped ledger's places stay where they are (each is a stripe): a lost bookie's
    ///   place becomes [`VACANT`], and a new copy fills the one vacant place it names.
    pub(crate) fn apply(&self, l: &mut LedgerRecord) -> Result<(), MetadataError> {
        let id = l.id;
        let refuse = |why: String| Err(MetadataError::Conflict(format!("ledger {id}: {why}")));
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
            if l.bookies().any(|x| x == add) || add == VACANT {
                return refuse(format!("it lists bookie {add} already"));
            }
            if left.len() >= l.wanted_copies() {
                return refuse(format!("it has its {} copies", l.wanted_copies()));
            }
        }
        // A record from before the write quorum was recorded wants as many copies as it
        // listed: pinned now, before the list changes.
        l.write_quorum = u8::try_from(l.wanted_copies()).unwrap_or(u8::MAX);
        if l.is_striped() {
            return self.apply_striped(l);
        }
        if self.place.is_some() {
            return refuse("it is not striped: a copy takes no place".into());
        }
        let writer_lost = self.lost.contains(&l.bookie);
        let (bookie, first_segment, last_segment) = match (&self.writer, writer_lost) {
            (None, false) => (l.bookie.clone(), l.first_segment, None),
            (Some((w, (first, last))), true)
                if self.add.as_ref() == Some(w) || (left.contains(w) && *w != l.bookie) =>
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
        l.replicas = left
            .into_iter()
            .chain(self.add.clone())
            .filter(|b| *b != bookie)
            .collect();
        l.bookie = bookie;
        l.first_segment = first_segment;
        if let (Some(seal), Some(last)) = (&mut l.seal, last_segment) {
            seal.last_segment = last;
        }
        Ok(())
    }

    /// [`CopyChange::apply`] for a striped ledger, once the common checks passed.
    fn apply_striped(&self, l: &mut LedgerRecord) -> Result<(), MetadataError> {
        let id = l.id;
        let refuse = |why: String| Err(MetadataError::Conflict(format!("ledger {id}: {why}")));
        let filled =
            match (&self.add, self.place) {
                (None, None) if self.writer.is_none() => None,
                (Some(add), Some(place)) => {
                    let Some(at) = l.places().nth(place) else {
                        return refuse(format!("it has no place {place}"));
                    };
                    if at != VACANT && !self.lost.iter().any(|b| b == at) {
                        return refuse(format!("its place {place} is held by bookie {at}"));
                    }
                    let writer = self.writer.as_ref();
                    match (place, writer) {
                        (0, Some((w, segments))) if w == add => Some((add, place, Some(*segments))),
                        (0, _) => return refuse("a new copy takes the writer's place only".into()),
                        (_, None) => Some((add, place, None)),
                        (_, Some(_)) => {
                            return refuse("its writer's place goes to a whole copy only".into())
                        }
                    }
                }
                _ => return refuse(
                    "it is striped: a new copy takes one named place, and a lost bookie's place \
                     becomes vacant"
                        .into(),
                ),
            };
        for b in std::iter::once(&mut l.bookie).chain(l.replicas.iter_mut()) {
            if self.lost.contains(b) {
                *b = VACANT.to_string();
            }
        }
        match filled {
            Some((add, 0, Some((first, last)))) => {
                l.bookie = add.clone();
                l.first_segment = first;
                if let Some(seal) = &mut l.seal {
                    seal.last_segment = last;
                }
            }
            Some((add, place, _)) => l.replicas[place - 1] = add.clone(),
            None => {}
        }
        Ok(())
    }
}
