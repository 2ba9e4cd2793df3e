//! Key_Shared dispatch: an entry goes to the consumer owning its key's hash range (ranges split
//! evenly among consumers in join order), and never while another consumer still holds
//! unacknowledged entries of the same key, so each key's entries arrive in order.

use super::State;
use crate::ledger::{Entry, Position};
use crate::protocol::frame::entry_routing_key;

/// Most entries held back for their key's consumer before no new entry is read.
const MAX_HELD: usize = 10_000;

/// Hash of an entry's routing key in Key_Shared's 0..65536 range.
fn key_hash(entry: &Entry) -> u16 {
    (crc32c::crc32c(&entry_routing_key(&entry.payload)) % 65536) as u16
}

impl State {
    /// Key_Shared: the consumer that may receive an entry of key hash `h` now: the owner of
    /// the hash range (ranges split evenly among consumers in join order), provided it has
    /// permits and no other consumer still holds unacknowledged entries of that hash.
    fn key_target(&self, h: u16) -> Option<usize> {
        let n = self.consumers.len();
        if n == 0 {
            return None;
        }
        let idx = usize::from(h) * n / 65536;
        if !self.may_receive(idx) {
            return None;
        }
        let c = &self.consumers[idx];
        if let Some((holder, _)) = self.in_flight.get(&h) {
            if *holder != c.key {
                return None;
            }
        }
        (c.permits > 0).then_some(idx)
    }

    /// Key_Shared dispatch: entries go to the owner of their key's hash range; an entry whose
    /// key is held elsewhere (or whose owner has no permits) waits, and so does every later
    /// entry of the same key. Returns true when it stopped for lack of entries.
    pub(super) async fn dispatch_key_shared(&mut self) -> bool {
        loop {
            // Nobody may receive (no permits, or paused at an unacked limit): read nothing,
            // or every entry read would only pile up in `redeliver`.
            if self.eligible_permits() <= 0 {
                return false;
            }
            if self.dispatch_allowance().is_none() {
                return false;
            }
            let mut progressed = false;
            let mut blocked: std::collections::HashSet<u16> = std::collections::HashSet::new();
            let held: Vec<Position> = self.redeliver.iter().copied().collect();
            for p in held {
                if self.backing_off() {
                    // A dispatch rate went into debt: the rest waits (in order).
                    return false;
                }
                let entry = match self.reader.read_entry(p).await {
                    Ok(e) => e,
                    Err(e) => {
                        self.read_failed(&e);
                        return false;
                    }
                };
                let h = key_hash(&entry);
                if blocked.contains(&h) {
                    continue;
                }
                match self.key_target(h) {
                    Some(idx) => {
                        self.redeliver.remove(&p);
                        // Not sent (requeued): the key's later entries wait behind it.
                        if self.deliver(idx, entry, Some(h)).await {
                            progressed = true;
                        } else {
                            blocked.insert(h);
                        }
                    }
                    None => {
                        blocked.insert(h);
                    }
                }
            }
            if self.redeliver.len() >= MAX_HELD {
                // Entries of keys whose consumer cannot take them pile up: read no further
                // until some of them went out (Pulsar's look-ahead limit).
                return false;
            }
            // What the held entries spent is no longer available.
            let Some(allowed) = self.dispatch_allowance() else {
                return false;
            };
            let budget = self.eligible_permits();
            let entries = match self
                .reader
                .read_from(
                    self.read_position,
                    (budget.clamp(1, 256) as usize).min(allowed),
                )
                .await
            {
                Ok(e) => e,
                Err(e) => {
                    self.read_failed(&e);
                    return false;
                }
            };
            if entries.is_empty() {
                return !progressed && self.redeliver.is_empty();
            }
            for entry in entries {
                let pos = entry.position;
                self.read_position = Position::new(pos.ledger, pos.entry + 1);
                if self.acked.contains(&pos) {
                    continue;
                }
                let h = key_hash(&entry);
                match (blocked.contains(&h), self.key_target(h)) {
                    (false, Some(idx)) if !self.backing_off() => {
                        if self.deliver(idx, entry, Some(h)).await {
                            progressed = true;
                        } else {
                            blocked.insert(h);
                        }
                    }
                    // A dispatch rate is in debt: it waits, and so does the rest of the read.
                    (false, Some(_)) => {
                        self.redeliver.insert(pos);
                    }
                    _ => {
                        blocked.insert(h);
                        self.redeliver.insert(pos);
                    }
                }
            }
            if !progressed {
                return false;
            }
        }
    }
}
