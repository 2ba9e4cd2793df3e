//! Consumer admission and the unacknowledged-message limits of a subscription (Pulsar's
//! `maxConsumersPerSubscription`/`…PerTopic` and `maxUnackedMessagesPerConsumer`/
//! `…PerSubscription`): Shared and Key_Shared dispatch skip a consumer holding its limit of
//! unacknowledged messages, and the whole subscription pauses at its limit; each resumes once
//! its count falls to half. Exclusive and Failover subscriptions are never paused (as Pulsar).

use super::{Consumer, ConsumerKey, State};
use crate::broker::limits::Refusal;
use crate::broker::BrokerError;
use crate::ledger::Position;
use crate::protocol::proto::command_subscribe::SubType;

impl State {
    /// Attaches `c` unless the subscription's or the topic's consumer limit is reached.
    pub(super) fn admit(&mut self, c: Consumer) -> Result<(), BrokerError> {
        match self.topic.limits.reserve(self.consumers.len()) {
            Ok(()) => {
                self.consumers.push(c);
                Ok(())
            }
            Err(Refusal::Topic(max)) => Err(BrokerError::ConsumerBusy(format!(
                "Topic reached max consumers limit ({max})"
            ))),
            Err(Refusal::Subscription(max)) => Err(BrokerError::ConsumerBusy(format!(
                "Subscription reached max consumers limit ({max})"
            ))),
        }
    }

    /// The unacked limits that apply to this subscription: (per consumer, per subscription);
    /// 0 = none.
    pub(super) fn unacked_limits(&self) -> (u32, u32) {
        match self.sub_type {
            SubType::Shared | SubType::KeyShared => (
                self.topic.limits.unacked_per_consumer(),
                self.topic.limits.unacked_per_subscription(),
            ),
            SubType::Exclusive | SubType::Failover => (0, 0),
        }
    }

    /// Whether consumer `idx` may be sent another entry: under the unacked limits, and its
    /// connection writable (a client that does not read is skipped, not waited for).
    pub(super) fn may_receive(&self, idx: usize) -> bool {
        let (per_consumer, per_sub) = self.unacked_limits();
        let c = &self.consumers[idx];
        !self.gate.blocked(per_sub) && !c.gate.blocked(per_consumer) && c.out.writable()
    }

    /// Permits of the consumers that may be sent to now (the read budget).
    pub(super) fn eligible_permits(&self) -> i64 {
        (0..self.consumers.len())
            .filter(|&i| self.may_receive(i))
            .map(|i| self.consumers[i].permits.max(0))
            .sum()
    }

    /// Consumers paused by their unacked limit.
    pub(super) fn blocked_consumers(&self) -> usize {
        let per_consumer = self.unacked_limits().0;
        self.consumers
            .iter()
            .filter(|c| c.gate.blocked(per_consumer))
            .count()
    }

    /// Counts entry `pos` of `count` messages as sent to consumer `idx`.
    pub(super) fn note_delivered(&mut self, idx: usize, pos: Position, count: u32) {
        let (per_consumer, per_sub) = self.unacked_limits();
        self.pending_msgs.insert(pos, count);
        self.consumers[idx].gate.add(u64::from(count), per_consumer);
        self.gate.add(u64::from(count), per_sub);
    }

    /// Counts pending entry `pos` of consumer `owner` as no longer out (acknowledged, skipped
    /// or taken back for redelivery).
    pub(super) fn note_settled(&mut self, owner: ConsumerKey, pos: Position) {
        let (per_consumer, per_sub) = self.unacked_limits();
        let count = u64::from(self.pending_msgs.remove(&pos).unwrap_or(1));
        if let Some(c) = self.consumers.iter_mut().find(|c| c.key == owner) {
            c.gate.remove(count, per_consumer);
        }
        self.gate.remove(count, per_sub);
    }
}
