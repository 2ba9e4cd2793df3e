//! Backlog quotas and message TTL of one topic partition, enforced by its owner (Pulsar's
//! `BacklogQuotaManager` and message expiry): checked whenever the broker hands the owner its
//! policies (every policy tick and after every policy change) and before a producer registers.
//!
//! The backlog is the slowest durable subscription's: entries it has not acknowledged, in the
//! local log or only in the lake. Eviction and expiry move subscriptions forward (they
//! acknowledge what they skip); hold and exception close the producers and refuse new ones
//! until the backlog is back within the quota.
//!
//! Invariants:
//! - `Owner::blocked` is `Some` exactly while the last check found a hold or exception quota
//!   exceeded; producers registered meanwhile are refused with that policy's error.
//! - A subscription is never moved backwards, and never past the last durable entry.

use super::Owner;
use crate::broker::backlog::{first_entry_from, position_keeping};
use crate::broker::subscription::{SubscriptionCommand, SubscriptionHandle};
use crate::broker::BrokerError;
use crate::ledger::{now_ms, Position};
use crate::policies::BacklogPolicy;
use crate::protocol::command;
use crate::replay::EntryReader;

/// What a check found about the slowest durable subscription.
struct Slowest {
    /// Most backlog bytes of any durable subscription.
    bytes: u64,
    /// Oldest unacknowledged entry of any durable subscription (`None`: no backlog).
    oldest: Option<Position>,
}

impl Owner {
    /// Applies message TTL and the backlog quotas in force: expires, evicts, or blocks the
    /// producers (closing those connected when the quota is first found exceeded).
    pub(super) async fn enforce_backlog(&mut self) {
        let limits = self.policies.backlog;
        if limits.is_empty() {
            self.unblock();
            return;
        }
        let subs: Vec<SubscriptionHandle> = self
            .subscriptions
            .values()
            .filter(|s| s.durable)
            .cloned()
            .collect();
        if let Some(ttl) = limits.ttl_seconds {
            let before = now_ms() - i64::from(ttl) * 1000;
            self.expire_before(&subs, before, "message TTL").await;
        }
        let mut exceeded: Option<(BacklogPolicy, String)> = None;
        if let Some(q) = limits.storage {
            let limit = q.limit_size.max(0) as u64;
            let bytes = self.slowest(&subs).await.bytes;
            if bytes > limit {
                if q.policy == BacklogPolicy::ConsumerBacklogEviction {
                    // As Pulsar: down to 90 % of the limit, so eviction does not run again at
                    // the next message.
                    let to = position_keeping(&self.topic.log.ledgers(), limit / 10 * 9);
                    skip_all(&subs, to, &self.topic.name.to_string(), "backlog size").await;
                } else {
                    let why = format!("backlog of {bytes} bytes exceeds the quota of {limit}");
                    exceeded = Some((q.policy, why));
                }
            }
        }
        if let Some(q) = limits.age {
            let limit_ms = i64::from(q.limit_time) * 1000;
            if let Some(age_ms) = self.oldest_age_ms(&subs).await {
                if age_ms > limit_ms {
                    if q.policy == BacklogPolicy::ConsumerBacklogEviction {
                        self.expire_before(&subs, now_ms() - limit_ms, "backlog age")
                            .await;
                    } else if exceeded.is_none() {
                        let why = format!(
                            "oldest unacknowledged message is {} s old, over the quota of {} s",
                            age_ms / 1000,
                            q.limit_time
                        );
                        exceeded = Some((q.policy, why));
                    }
                }
            }
        }
        match exceeded {
            Some((policy, why)) => self.block(policy, why).await,
            None => self.unblock(),
        }
    }

    /// The error a producer registering now gets (`None`: not blocked).
    pub(super) fn blocked_error(&self) -> Option<BrokerError> {
        let msg = "Cannot create producer on topic with backlog quota exceeded".to_string();
        match self.blocked? {
            BacklogPolicy::ProducerRequestHold => Some(BrokerError::QuotaHold(msg)),
            BacklogPolicy::ProducerException => Some(BrokerError::QuotaException(msg)),
            BacklogPolicy::ConsumerBacklogEviction => None,
        }
    }

    async fn block(&mut self, policy: BacklogPolicy, why: String) {
        let first = self.blocked.is_none();
        self.blocked = Some(policy);
        if !first {
            return;
        }
        tracing::warn!(topic = %self.topic.name, ?policy, producers = self.producers.len(),
            "backlog quota exceeded ({why}); producers are closed and refused until it drains");
        for (_, p) in self.producers.drain() {
            let _ = p.out.send(command::close_producer(p.producer_id)).await;
        }
    }

    fn unblock(&mut self) {
        if self.blocked.take().is_some() {
            tracing::info!(topic = %self.topic.name, "backlog back within its quota; producers accepted");
        }
    }

    /// Moves every durable subscription past the entries published before `before_ms`.
    async fn expire_before(&mut self, subs: &[SubscriptionHandle], before_ms: i64, why: &str) {
        if subs.is_empty() {
            return;
        }
        let reader = EntryReader::new(self.topic.log.clone(), self.topic.lake.clone());
        match reader.find_by_publish_time(before_ms).await {
            Ok(to) => skip_all(subs, to, &self.topic.name.to_string(), why).await,
            Err(e) => tracing::warn!(topic = %self.topic.name, error = %e,
                "finding the expiry position failed ({why}); retried at the next check"),
        }
    }

    async fn slowest(&self, subs: &[SubscriptionHandle]) -> Slowest {
        let mut out = Slowest {
            bytes: 0,
            oldest: None,
        };
        for s in subs {
            let Some(st) = s.ask(SubscriptionCommand::Stats).await else {
                continue;
            };
            out.bytes = out.bytes.max(st.backlog_size);
            if st.msg_backlog > 0 {
                let first = st.first_unacked;
                out.oldest = Some(out.oldest.map_or(first, |o: Position| o.min(first)));
            }
        }
        out
    }

    /// Age of the oldest unacknowledged message of any durable subscription (`None`: no
    /// backlog, or it could not be read). The entry is read once per oldest position.
    async fn oldest_age_ms(&mut self, subs: &[SubscriptionHandle]) -> Option<i64> {
        let oldest = self.slowest(subs).await.oldest?;
        let at = first_entry_from(&self.topic.log.ledgers(), oldest)?;
        let published = match self.age_probe {
            Some((p, t)) if p == at => t,
            _ => {
                let mut reader = EntryReader::new(self.topic.log.clone(), self.topic.lake.clone());
                match reader.read_entry(at).await {
                    Ok(e) => {
                        self.age_probe = Some((at, e.publish_time_ms));
                        e.publish_time_ms
                    }
                    Err(e) => {
                        tracing::warn!(topic = %self.topic.name, position = %at, error = %e,
                            "reading the oldest unacknowledged entry failed; age quota not checked");
                        return None;
                    }
                }
            }
        };
        Some(now_ms() - published)
    }
}

/// Moves every subscription in `subs` forward to `to` (those already there stay).
async fn skip_all(subs: &[SubscriptionHandle], to: Position, topic: &str, why: &str) {
    let mut total = 0;
    for s in subs {
        total += s
            .ask(|r| SubscriptionCommand::SkipTo(to, r))
            .await
            .unwrap_or(0);
    }
    if total > 0 {
        tracing::info!(topic, to = %to, entries = total, "{why}: subscriptions skipped forward");
    }
}
