//! The owner's producers: registering and forgetting them, by access mode (Pulsar's
//! `ProducerAccessMode`).
//!
//! - `Shared`: beside other shared producers; refused (`ProducerBusy`) while an exclusive one
//!   is there or `WaitForExclusive` ones wait (so that they are not starved).
//! - `Exclusive` and `ExclusiveWithFencing`: alone, refused (`ProducerFenced`, as Pulsar
//!   does) while any other producer is there or waits. Fencing the others out, as Pulsar's
//!   `ExclusiveWithFencing` does, is not built.
//! - `WaitForExclusive`: alone as well, but while others are there (or wait) it waits its
//!   turn instead of being refused. Its connection is told at once (PRODUCER_SUCCESS with
//!   `producer_ready = false`, so the client's request does not time out). Waiters are
//!   registered one at a time, oldest first, as soon as the last producer goes (Pulsar
//!   promotes them only when an exclusive producer goes, so one waiting behind shared
//!   producers waits for good there).
//!
//! Invariant: `waiting` is empty while `producers` is, on every path that empties it (a
//! producer going, a backlog quota closing them all: the waiters are then refused with the
//! quota's error); a waiter whose client closed it or whose connection went (its reply's
//! receiver dropped) is skipped; the owner stopping drops the waiters, which then retry or
//! report it.

use super::{BrokerError, NewProducer, Owner};
use crate::broker::topic::{GoneProducer, ProducerSlot};

impl Owner {
    /// A producer asks to register: registered, refused, or (`WaitForExclusive` while others
    /// are there) queued.
    pub(super) fn on_add_producer(&mut self, producer: NewProducer) {
        self.last_busy = std::time::Instant::now();
        // Waiters nobody waits for any more (closed, timed out, connection gone) hold nobody.
        self.waiting.retain(|w| !w.reply.is_closed());
        if producer.queued.is_some() && !self.producers.is_empty() {
            return self.queue(producer);
        }
        if !self.waiting.is_empty() {
            // Newcomers do not pass the producers waiting their turn.
            let refused = if producer.slot.exclusive {
                BrokerError::ProducerFenced("WaitForExclusive producers wait for the topic".into())
            } else {
                BrokerError::ProducerBusy("WaitForExclusive producers wait for the topic".into())
            };
            let _ = producer.reply.send(Err(refused));
            return;
        }
        self.register(producer);
    }

    /// A producer went (closed, or its connection did): forgotten if it is still that
    /// connection's producer id; the next waiter is registered once no producer is left.
    pub(super) fn on_remove_producer(&mut self, producer: GoneProducer) {
        let GoneProducer {
            name,
            conn,
            producer_id,
        } = producer;
        self.last_busy = std::time::Instant::now();
        let same = |p: &ProducerSlot| p.conn == conn && p.publisher.producer_id == producer_id;
        if self.producers.get(&name).is_some_and(same) {
            self.producers.remove(&name);
        }
        self.producers_changed();
        self.admit_waiting();
    }

    /// Queues a `WaitForExclusive` producer and tells its connection it waits.
    fn queue(&mut self, mut producer: NewProducer) {
        let name = &producer.slot.publisher.name;
        tracing::debug!(topic = %self.topic.name, producer = %name,
            "a WaitForExclusive producer waits for the topic's producers to go");
        if let Some(queued) = producer.queued.take() {
            let _ = queued.send(());
        }
        self.waiting.push_back(producer);
    }

    /// Registers the oldest waiters in turn until one is registered (the others wait on),
    /// while no producer is there; each refused one (a backlog quota holds the topic) is
    /// answered with why.
    pub(super) fn admit_waiting(&mut self) {
        while self.producers.is_empty() {
            let Some(mut next) = self.waiting.pop_front() else {
                return;
            };
            if next.reply.is_closed() {
                continue;
            }
            next.queued = None;
            self.register(next);
        }
    }

    /// Registers `producer` (or refuses it) and answers it; undone if nobody waits for the
    /// answer any more.
    fn register(&mut self, producer: NewProducer) {
        let NewProducer { slot, reply, .. } = producer;
        let name = slot.publisher.name.to_string();
        let result = self.add_producer(name.clone(), slot);
        let added = result.is_ok();
        if added {
            // A producer registering anew resends what was not acknowledged, in order (a
            // refused one leaves a registered producer of its name fenced).
            self.fenced.remove(name.as_str());
            // Listed before the client hears of it.
            self.producers_changed();
        }
        if reply.send(result).is_err() && added {
            // Whoever asked is gone (its connection closed meanwhile): undo.
            self.producers.remove(&name);
            self.producers_changed();
        }
    }

    /// Registers a producer unless an exclusive one or one of the same name is there.
    fn add_producer(&mut self, name: String, slot: ProducerSlot) -> Result<i64, BrokerError> {
        let held = self.producers.values().any(|v| v.exclusive);
        if self.producers.contains_key(&name) {
            // Its own earlier registration, not yet gone (a reconnect racing the old
            // connection's close): busy, which the client retries, not fenced, which is final.
            return Err(BrokerError::ProducerBusy(
                "a producer with this name is already connected".into(),
            ));
        }
        if slot.exclusive && (held || !self.producers.is_empty()) {
            return Err(BrokerError::ProducerFenced(if held {
                "topic has an exclusive producer".into()
            } else {
                "topic has shared producers".into()
            }));
        }
        if held {
            return Err(BrokerError::ProducerBusy(
                "topic has an exclusive producer".into(),
            ));
        }
        if let Some(e) = self.blocked_error() {
            return Err(e);
        }
        if let Some(max) = self.policies.max_producers {
            if self.producers.len() >= max as usize {
                return Err(BrokerError::ProducerBusy(format!(
                    "Topic reached max producers limit ({max})"
                )));
            }
        }
        if let super::Dedup::Unavailable(reason) = &self.dedup {
            // Its last sequence id is unknown: a producer told -1 would have its resends
            // taken for duplicates once the state is folded.
            return Err(BrokerError::Stopped(format!(
                "deduplication state of {} is unavailable ({reason}); retry",
                self.topic.name
            )));
        }
        let last = match &self.dedup {
            super::Dedup::On { live, .. } => live.last_sequence_id(&name),
            super::Dedup::Off | super::Dedup::Unavailable(_) => -1,
        };
        self.producers.insert(name, slot);
        Ok(last)
    }
}
