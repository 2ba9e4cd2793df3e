//! Dispatch: reading entries (redeliveries first, then from the read position) and sending
//! them to consumers with permits whose connections are writable, never waiting on one that is
//! not (Key_Shared routing is in `key_shared`).
//!
//! Invariant: Exclusive and Failover consumers receive entries in position order: once an entry
//! of a read is put back, so is the rest of that read.

use tokio::sync::mpsc::error::TrySendError;

use super::State;
use crate::broker::outbox::Outbox;
use crate::ledger::{Entry, Position};
use crate::protocol::command;
use crate::protocol::frame::entry_message_count;
use crate::protocol::proto::command_subscribe::SubType;
use crate::replay::ReplayError;

impl State {
    /// Sends one entry to consumer `idx` without waiting; false (and the entry requeued) if
    /// its connection is not writable any more or gone.
    pub(super) async fn deliver(&mut self, idx: usize, entry: Entry, hash: Option<u16>) -> bool {
        let pos = entry.position;
        let count = entry_message_count(&entry.payload);
        let bytes = entry.payload.len() as u64;
        let redeliveries = self.redelivery_count.get(&pos).copied().unwrap_or(0);
        let id = command::message_id(pos.ledger, pos.entry, self.topic.partition, None);
        let ack_set = self.partial.get(&pos).cloned().unwrap_or_default();
        let consumer = &mut self.consumers[idx];
        let msg = command::message(consumer.key.1, id, redeliveries, ack_set, entry.payload);
        match consumer.out.try_deliver(msg) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                // Another frame took the last room: the consumer waits for its writer.
                self.redeliver.insert(pos);
                return false;
            }
            Err(TrySendError::Closed(_)) => {
                self.redeliver.insert(pos);
                consumer.permits = 0;
                return false;
            }
        }
        consumer.permits -= i64::from(count);
        if self.topic.measures.settings.enabled {
            consumer.sent.record(u64::from(count), bytes);
            self.measures.dispatched(u64::from(count), bytes);
        }
        let key = consumer.key;
        self.charge_dispatch(u64::from(count), bytes);
        self.pending.insert(pos, key);
        self.note_delivered(idx, pos, count);
        if let Some(h) = hash {
            self.pending_hash.insert(pos, h);
            self.in_flight.entry(h).or_insert((key, 0)).1 += 1;
        }
        true
    }

    /// The queues of consumers with permits that are skipped because their connection is
    /// not writable.
    pub(super) fn stalled_outboxes(&self) -> Vec<Outbox> {
        self.consumers
            .iter()
            .filter(|c| c.permits > 0 && !c.out.writable() && !c.out.is_closed())
            .map(|c| c.out.clone())
            .collect()
    }

    /// Index of the consumer that gets the next entry, if any has permits.
    pub(super) fn pick_consumer(&mut self) -> Option<usize> {
        match self.sub_type {
            SubType::Shared => {
                let n = self.consumers.len();
                for i in 0..n {
                    let idx = (self.next_shared + i) % n;
                    if self.consumers[idx].permits > 0 && self.may_receive(idx) {
                        self.next_shared = idx + 1;
                        return Some(idx);
                    }
                }
                None
            }
            // Failover: the active consumer (the one told ACTIVE_CONSUMER_CHANGE), not the
            // first to join.
            SubType::Failover => {
                let active = self.active?;
                self.consumers
                    .iter()
                    .position(|c| c.key == active && c.permits > 0 && c.out.writable())
            }
            _ => self
                .consumers
                .first()
                .and_then(|c| (c.permits > 0 && c.out.writable()).then_some(0)),
        }
    }

    /// Sends entries while consumers have permits. Returns true when it stopped for lack of
    /// entries (so the task should wait for new ones).
    pub(super) async fn dispatch(&mut self) -> bool {
        if self.backing_off() {
            return false;
        }
        if self.sub_type == SubType::KeyShared {
            return self.dispatch_key_shared().await;
        }
        loop {
            let Some(_) = self.pick_consumer() else {
                return false;
            };
            let Some(allowed) = self.dispatch_allowance() else {
                return false;
            };
            let budget = self.eligible_permits();
            let max = (budget.clamp(1, 256) as usize).min(allowed);
            let entries = match self.next_entries(max).await {
                Ok(e) => e,
                Err(e) => {
                    self.read_failed(&e);
                    return false;
                }
            };
            if entries.is_empty() {
                tracing::debug!(topic = %self.topic.name, read = %self.read_position,
                    redeliver = self.redeliver.len(), "caught up");
                return true;
            }
            // Exclusive and Failover deliver in order: once one entry of the read is put back
            // (the consumer's connection stopped being writable meanwhile, say), so is the rest
            // of it, or a later entry could overtake it (and a cumulative ack of that one
            // would drop it).
            let ordered = self.sub_type != SubType::Shared;
            let mut held = false;
            for entry in entries {
                if self.acked.contains(&entry.position) {
                    // Acknowledged before a restart: never deliver it again.
                    continue;
                }
                if held {
                    self.redeliver.insert(entry.position);
                    continue;
                }
                let Some(idx) = self.pick_consumer().filter(|_| !self.backing_off()) else {
                    // No permits left, or a dispatch rate is in debt: put it back for later.
                    self.redeliver.insert(entry.position);
                    held = ordered;
                    continue;
                };
                // A failed send (connection not writable, or gone) requeues the entry; the
                // connection removes a consumer that is gone.
                if !self.deliver(idx, entry, None).await {
                    held = ordered;
                }
            }
        }
    }

    /// Tracks how long reads have waited on the lake and warns once when it is long, with
    /// what the reader waits on (a stalled replay must be visible, never silent).
    pub(super) fn note_wait(&mut self, read: &Result<Vec<Entry>, ReplayError>) {
        let pending = matches!(read, Err(ReplayError::Pending));
        if let Some(waited) = self.lake_wait.note(pending) {
            tracing::warn!(topic = %self.topic.name, subscription = %self.name,
                read_position = %self.read_position, ?waited,
                reader = %self.reader.describe_wait(),
                "subscription has waited on the lake without receiving an entry");
        }
    }

    /// Up to `max` entries: redeliveries first, then new entries from the read position.
    pub(super) async fn next_entries(&mut self, max: usize) -> Result<Vec<Entry>, ReplayError> {
        if let Some(&p) = self.redeliver.iter().next() {
            let entry = self.reader.read_entry(p).await?;
            self.redeliver.remove(&p);
            return Ok(vec![entry]);
        }
        let read = self.reader.read_from(self.read_position, max).await;
        self.note_wait(&read);
        let entries = read?;
        if let Some(last) = entries.last() {
            self.read_position = Position::new(last.position.ledger, last.position.entry + 1);
        }
        Ok(entries)
    }
}
