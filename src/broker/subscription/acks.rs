//! Acknowledgement bookkeeping of a subscription: individual, cumulative and batch-index
//! acks against `pending`, `redeliver`, `acked` and `partial`, the oldest unacknowledged
//! entry they leave (the mark-delete position is the entry before it), and skipping forward
//! (message TTL, backlog eviction).

use super::{ConsumerKey, CursorRequest, State};
use crate::broker::backlog::{backlog, end_position, positions_from};
use crate::ledger::Position;

impl State {
    /// Applies an ACK command and counts it for the ack rate (a cumulative ack counts the
    /// entries it took out of the backlog).
    pub(super) fn acknowledge(
        &mut self,
        positions: Vec<(Position, Option<Vec<i64>>)>,
        cumulative: bool,
    ) {
        let pending_before = self.pending.len() + self.acked.len();
        let individual = positions.len() as u64;
        self.apply_acks(positions, cumulative);
        if self.topic.measures.settings.enabled {
            let settled = if cumulative {
                pending_before.saturating_sub(self.pending.len() + self.acked.len()) as u64
            } else {
                individual
            };
            self.measures.settled(settled.max(1));
        }
    }

    /// [`Self::skip_to`], counted as expired entries.
    pub(super) fn skip_counted(&mut self, to: Position) -> u64 {
        let skipped = self.skip_to(to);
        if self.topic.measures.settings.enabled {
            self.measures.skipped(skipped);
        }
        skipped
    }

    /// The n-th (0-based) unacknowledged entry, passing over entries acknowledged individually.
    fn nth_unacked(&self, ledgers: &[crate::ledger::LedgerInfo], n: u64) -> Option<Position> {
        positions_from(ledgers, self.first_unacked())
            .filter(|p| !self.acked.contains(p))
            .nth(usize::try_from(n).ok()?)
    }

    /// Answers an admin read or move of the cursor.
    pub(super) fn cursor_request(&mut self, request: CursorRequest) {
        let ledgers = self.topic.log.ledgers();
        match request {
            CursorRequest::NthUnacked(n, reply) => {
                let _ = reply.send(self.nth_unacked(&ledgers, n));
            }
            CursorRequest::SkipEntries(n, reply) => {
                let to = match n.checked_sub(1) {
                    None => self.first_unacked(),
                    Some(last) => self.nth_unacked(&ledgers, last).map_or_else(
                        || end_position(&ledgers),
                        |p| Position::new(p.ledger, p.entry + 1),
                    ),
                };
                let _ = reply.send(self.skip_counted(to));
            }
        }
    }
    /// Applies acknowledgements of `positions` (with their `ack_set` when a batch was
    /// acknowledged in part).
    pub(super) fn apply_acks(
        &mut self,
        positions: Vec<(Position, Option<Vec<i64>>)>,
        cumulative: bool,
    ) {
        for (p, ack_set) in positions {
            tracing::debug!(topic = %self.topic.name, position = %p, cumulative,
                redeliver = self.redeliver.len(), "ack");
            let Some(p) = self.acked_position(p, cumulative) else {
                continue;
            };
            if !cumulative {
                if let Some(remaining) = ack_set.filter(|w| w.iter().any(|x| *x != 0)) {
                    // Part of a batch acknowledged: keep the entry pending with the
                    // indices still unacknowledged (intersected with earlier acks).
                    let merged = match self.partial.remove(&p) {
                        Some(prev) => prev
                            .iter()
                            .zip(remaining.iter().chain(std::iter::repeat(&0)))
                            .map(|(a, b)| a & b)
                            .collect::<Vec<i64>>(),
                        None => remaining,
                    };
                    if merged.iter().any(|x| *x != 0) {
                        self.partial.insert(p, merged);
                        self.dirty = true;
                        continue;
                    }
                }
            }
            self.partial.remove(&p);
            if cumulative {
                let acked: Vec<Position> = self.pending.range(..=p).map(|(pos, _)| *pos).collect();
                for a in acked {
                    self.take_pending(a);
                    self.redelivery_count.remove(&a);
                }
                self.redeliver.retain(|r| *r > p);
            } else {
                self.take_pending(p);
                self.redeliver.remove(&p);
                self.redelivery_count.remove(&p);
                self.acked.insert(p);
            }
        }
        self.prune_acked();
    }

    /// Acknowledges every entry before `to` (nothing when the subscription is already there);
    /// returns how many unacknowledged entries that took out of the backlog.
    pub(super) fn skip_to(&mut self, to: Position) -> u64 {
        let first = self.first_unacked();
        if to <= first {
            return 0;
        }
        let ledgers = self.topic.log.ledgers();
        let before = backlog(&ledgers, first, self.acked.len() as u64, self.read_position).0;
        let skipped: Vec<Position> = self.pending.range(..to).map(|(p, _)| *p).collect();
        for p in skipped {
            self.take_pending(p);
        }
        self.redeliver.retain(|p| *p >= to);
        self.redelivery_count.retain(|p, _| *p >= to);
        self.partial.retain(|p, _| *p >= to);
        self.read_position = self.read_position.max(to);
        self.prune_acked();
        let now = self.first_unacked();
        let after = backlog(&ledgers, now, self.acked.len() as u64, self.read_position).0;
        tracing::debug!(topic = %self.topic.name, subscription = %self.name, from = %first,
            to = %now, entries = before.saturating_sub(after), "subscription skipped forward");
        before.saturating_sub(after)
    }

    /// The entry an ack names. A client acknowledges "everything before a batch that starts
    /// ledger L" as entry -1 of L, which arrives as `u64::MAX`: it means the position before
    /// (L, 0), not the end of L. `None` when nothing is acknowledged.
    fn acked_position(&self, p: Position, cumulative: bool) -> Option<Position> {
        if p.entry != u64::MAX {
            return Some(p);
        }
        if !cumulative {
            return None;
        }
        self.topic.log.position_before(Position::new(p.ledger, 0))
    }

    /// The oldest entry not acknowledged (the next to read when all are).
    pub(super) fn first_unacked(&self) -> Position {
        let mut first = self.read_position;
        if let Some(p) = self.pending.keys().next() {
            first = first.min(*p);
        }
        if let Some(p) = self.redeliver.iter().next() {
            first = first.min(*p);
        }
        first
    }

    /// Drops acknowledged positions that are no longer after the oldest unacknowledged entry.
    pub(super) fn prune_acked(&mut self) {
        let first = self.first_unacked();
        self.acked = self.acked.split_off(&first);
        self.acked.remove(&first);
        self.dirty = true;
    }

    /// Forgets a pending entry (acknowledged or requeued), releasing its key hash.
    pub(super) fn take_pending(&mut self, pos: Position) -> Option<ConsumerKey> {
        let owner = self.pending.remove(&pos)?;
        self.note_settled(owner, pos);
        if let Some(h) = self.pending_hash.remove(&pos) {
            if let Some((_, n)) = self.in_flight.get_mut(&h) {
                *n -= 1;
                if *n == 0 {
                    self.in_flight.remove(&h);
                }
            }
        }
        Some(owner)
    }
}
