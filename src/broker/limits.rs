//! Consumer-side limits of one topic partition (Pulsar's `maxConsumersPerTopic`,
//! `maxConsumersPerSubscription`, `maxUnackedMessagesPerConsumer` and
//! `…PerSubscription`): the values the owner resolved from the policies, and the live counter
//! of consumers attached to the partition's subscriptions.
//!
//! The values are atomics in [`super::BrokerTopic`] because every subscription task reads them
//! on each attach and dispatch; only the owner writes them. A consumer is admitted by
//! [`ConsumerLimits::reserve`], which counts it against the topic's limit atomically, so two
//! subscriptions admitting consumers at once never exceed it.
//!
//! Invariant: `attached` equals the number of consumers attached to the partition's
//! subscriptions (each subscription reports its own changes, and its remaining consumers when
//! it stops).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// The limits as resolved (0 = no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConsumerLimitValues {
    /// Consumers across the partition's subscriptions.
    pub per_topic: u32,
    /// Consumers of one subscription.
    pub per_subscription: u32,
    /// Unacknowledged messages a Shared or Key_Shared consumer may hold.
    pub unacked_per_consumer: u32,
    /// Unacknowledged messages a Shared or Key_Shared subscription may have out.
    pub unacked_per_subscription: u32,
}

/// The limits in force and the attached-consumer count.
#[derive(Debug, Default)]
pub(crate) struct ConsumerLimits {
    per_topic: AtomicU32,
    per_subscription: AtomicU32,
    unacked_per_consumer: AtomicU32,
    unacked_per_subscription: AtomicU32,
    /// Invariant: consumers attached to the partition's subscriptions.
    attached: AtomicUsize,
}

/// Why a consumer was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The topic's limit (Pulsar: "Topic reached max consumers limit").
    Topic(u32),
    /// The subscription's limit ("Subscription reached max consumers limit").
    Subscription(u32),
}

impl ConsumerLimits {
    /// Puts `v` in force (the owner, on a policy change).
    pub fn set(&self, v: ConsumerLimitValues) {
        self.per_topic.store(v.per_topic, Ordering::Relaxed);
        self.per_subscription
            .store(v.per_subscription, Ordering::Relaxed);
        self.unacked_per_consumer
            .store(v.unacked_per_consumer, Ordering::Relaxed);
        self.unacked_per_subscription
            .store(v.unacked_per_subscription, Ordering::Relaxed);
    }

    /// Counts one more consumer of a subscription that has `in_subscription` already, unless
    /// a limit is reached.
    pub fn reserve(&self, in_subscription: usize) -> Result<(), Refusal> {
        let per_sub = self.per_subscription.load(Ordering::Relaxed);
        if per_sub > 0 && in_subscription >= per_sub as usize {
            return Err(Refusal::Subscription(per_sub));
        }
        let per_topic = self.per_topic.load(Ordering::Relaxed);
        self.attached
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (per_topic == 0 || n < per_topic as usize).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| Refusal::Topic(per_topic))
    }

    /// Refuses when the topic has its most consumers already (checked before a subscription
    /// is created for a new consumer).
    pub fn room_for_consumer(&self) -> Result<(), super::BrokerError> {
        let per_topic = self.per_topic.load(Ordering::Relaxed);
        if per_topic > 0 && self.attached.load(Ordering::Acquire) >= per_topic as usize {
            return Err(super::BrokerError::ConsumerBusy(format!(
                "Topic reached max consumers limit ({per_topic})"
            )));
        }
        Ok(())
    }

    /// Forgets `n` consumers that left.
    pub fn release(&self, n: usize) {
        if n > 0 {
            self.attached.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Consumers attached now.
    pub fn attached(&self) -> usize {
        self.attached.load(Ordering::Acquire)
    }

    /// The per-consumer unacked limit (0: none).
    pub fn unacked_per_consumer(&self) -> u32 {
        self.unacked_per_consumer.load(Ordering::Relaxed)
    }

    /// The per-subscription unacked limit (0: none).
    pub fn unacked_per_subscription(&self) -> u32 {
        self.unacked_per_subscription.load(Ordering::Relaxed)
    }
}

/// Blocked-on-unacked state with Pulsar's hysteresis: blocked at the limit, unblocked at half.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct UnackedGate {
    /// Unacknowledged messages out.
    pub unacked: u64,
    /// Invariant: set when `unacked` reached the limit, cleared when it fell to half of it (or
    /// the limit was lifted).
    blocked: bool,
}

impl UnackedGate {
    /// Notes `n` more messages out under `limit`.
    pub fn add(&mut self, n: u64, limit: u32) {
        self.unacked += n;
        if limit > 0 && self.unacked >= u64::from(limit) {
            self.blocked = true;
        }
    }

    /// Notes `n` messages acknowledged or taken back.
    pub fn remove(&mut self, n: u64, limit: u32) {
        self.unacked = self.unacked.saturating_sub(n);
        if limit == 0 || self.unacked <= u64::from(limit) / 2 {
            self.blocked = false;
        }
    }

    /// Whether dispatch must wait (always false without a limit). Under a raised limit it
    /// stays paused only while over half of the new one.
    pub fn blocked(&self, limit: u32) -> bool {
        let limit = u64::from(limit);
        limit > 0 && (self.unacked >= limit || (self.blocked && self.unacked > limit / 2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_counts_against_both_limits() {
        let l = ConsumerLimits::default();
        l.set(ConsumerLimitValues {
            per_topic: 2,
            per_subscription: 1,
            ..Default::default()
        });
        assert_eq!(l.reserve(0), Ok(()));
        assert_eq!(l.reserve(1), Err(Refusal::Subscription(1)));
        assert_eq!(l.reserve(0), Ok(()));
        assert_eq!(l.reserve(0), Err(Refusal::Topic(2)));
        l.release(1);
        assert_eq!(l.reserve(0), Ok(()));
        assert_eq!(l.attached(), 2);
    }

    #[test]
    fn gate_blocks_at_the_limit_and_opens_at_half() {
        let mut g = UnackedGate::default();
        g.add(9, 10);
        assert!(!g.blocked(10));
        g.add(1, 10);
        assert!(g.blocked(10));
        g.remove(4, 10);
        assert!(g.blocked(10), "6 unacked: still over half");
        g.remove(1, 10);
        assert!(!g.blocked(10));
        g.add(20, 10);
        assert!(!g.blocked(0), "no limit, never blocked");
    }
}
