//! Backlog quotas and message TTL of one topic partition (Pulsar's `BacklogQuotaManager` and
//! message expiry). Whenever the broker hands the owner its policies (every policy tick and
//! after every policy change) and a quota or TTL is set, the owner starts a check in a task of
//! its own: the check asks the durable subscriptions for their backlog, reads the oldest
//! unacknowledged entry when an age matters (from the log or the lake), moves subscriptions
//! forward for TTL and eviction, and sends its verdict back as a command. The owner never waits
//! on a subscription or on storage for this, so SENDs keep flowing meanwhile.
//!
//! The backlog is the slowest durable subscription's: entries it has not acknowledged, in the
//! local log or only in the lake. Hold and exception close the producers when the quota is
//! first found exceeded, then refuse new producers and SENDs until a check finds the backlog
//! back within the quota.
//!
//! Invariants:
//! - `Owner::blocked` is `Some` exactly while the last verdict on the limits in force found a
//!   hold or exception quota exceeded.
//! - At most one check runs per topic partition (`Owner::check`); one that ended without a
//!   verdict (it panicked) is replaced by the next, and none outlives the owner.
//! - A subscription is never moved backwards, and never past the last durable entry.

use std::sync::Arc;
use std::time::Duration;

use super::Owner;
use crate::broker::backlog::{first_entry_from, position_keeping, BacklogVerdict};
use crate::broker::subscription::{SubscriptionCommand, SubscriptionHandle};
use crate::broker::topic::TopicCommand;
use crate::broker::{BrokerError, BrokerTopic};
use crate::ledger::{now_ms, Position};
use crate::policies::{BacklogLimits, BacklogPolicy};
use crate::replay::EntryReader;

/// The longest a check waits for one subscription or one read; past it, that part is skipped
/// until the next check.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);

impl Owner {
    /// Starts a backlog check beside the owner, unless one runs or nothing is to be checked.
    pub(super) fn start_backlog_check(&mut self) {
        let limits = self.policies.backlog;
        if limits.is_empty() {
            self.unblock();
            return;
        }
        if self.check.as_ref().is_some_and(|c| !c.is_finished()) {
            return;
        }
        let subs: Vec<SubscriptionHandle> = self
            .subscriptions
            .values()
            .filter(|s| s.durable)
            .cloned()
            .collect();
        let topic = self.topic.clone();
        let probe = self.age_probe;
        self.check = Some(tokio::spawn(async move {
            let verdict = check(&topic, &subs, limits, probe).await;
            let _ = topic
                .owner
                .send(TopicCommand::BacklogChecked(Box::new(verdict)))
                .await;
        }));
    }

    /// Acts on a finished check: blocks (closing the producers the first time) or unblocks.
    pub(super) async fn backlog_checked(&mut self, v: BacklogVerdict) {
        self.check = None;
        self.age_probe = v.age_probe;
        if v.limits != self.policies.backlog {
            // The policies changed while it ran: check again under the new ones.
            self.start_backlog_check();
            return;
        }
        match v.exceeded {
            Some((policy, why)) => self.block(policy, why).await,
            None => self.unblock(),
        }
    }

    /// The error a producer or a SEND gets now (`None`: not blocked).
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
            p.close.cancel();
        }
        self.producers_changed();
        // Waiters are refused too (blocked), not left waiting for producers that are gone.
        self.admit_waiting();
    }

    fn unblock(&mut self) {
        if self.blocked.take().is_some() {
            tracing::info!(topic = %self.topic.name, "backlog back within its quota; producers accepted");
        }
    }
}

/// The slowest durable subscription: most backlog bytes, oldest unacknowledged entry.
#[derive(Default)]
struct Slowest {
    bytes: u64,
    oldest: Option<Position>,
}

async fn slowest(subs: &[SubscriptionHandle]) -> Slowest {
    let mut out = Slowest::default();
    for s in subs {
        let Ok(Some(st)) =
            tokio::time::timeout(STEP_TIMEOUT, s.ask(SubscriptionCommand::Stats)).await
        else {
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

/// Runs one check of `limits` on `topic`: TTL and eviction move subscriptions; the verdict says
/// whether a hold or exception quota is exceeded.
async fn check(
    topic: &Arc<BrokerTopic>,
    subs: &[SubscriptionHandle],
    limits: BacklogLimits,
    probe: Option<(Position, i64)>,
) -> BacklogVerdict {
    let mut v = BacklogVerdict {
        limits,
        exceeded: None,
        age_probe: probe,
    };
    let name = topic.name.to_string();
    let mut reader = EntryReader::new(topic.log.clone(), topic.lake.clone());
    if let Some(ttl) = limits.ttl_seconds {
        let cutoff = now_ms() - i64::from(ttl) * 1000;
        let oldest = slowest(subs).await.oldest;
        if published(&mut reader, &mut v, oldest, &name)
            .await
            .is_some_and(|t| t < cutoff)
        {
            expire_before(&reader, subs, cutoff, &name, "message TTL").await;
        }
    }
    if let Some(q) = limits.storage {
        let limit = q.limit_size.max(0) as u64;
        let bytes = slowest(subs).await.bytes;
        if bytes > limit {
            if q.policy == BacklogPolicy::ConsumerBacklogEviction {
                // As Pulsar: down to 90 % of the limit, so eviction does not run again at the
                // next message.
                let to = position_keeping(&topic.log.ledgers(), limit / 10 * 9);
                skip_all(subs, to, &name, "backlog size").await;
            } else {
                let why = format!("backlog of {bytes} bytes exceeds the quota of {limit}");
                v.exceeded = Some((q.policy, why));
            }
        }
    }
    if let Some(q) = limits.age {
        let limit_ms = i64::from(q.limit_time) * 1000;
        let oldest = slowest(subs).await.oldest;
        if let Some(t) = published(&mut reader, &mut v, oldest, &name).await {
            let age_ms = now_ms() - t;
            if age_ms > limit_ms {
                if q.policy == BacklogPolicy::ConsumerBacklogEviction {
                    expire_before(&reader, subs, now_ms() - limit_ms, &name, "backlog age").await;
                } else if v.exceeded.is_none() {
                    let why = format!(
                        "oldest unacknowledged message is {} s old, over the quota of {} s",
                        age_ms / 1000,
                        q.limit_time
                    );
                    v.exceeded = Some((q.policy, why));
                }
            }
        }
    }
    v
}

/// Publish time of the first entry at or after `oldest` (`None`: no backlog, or it could not
/// be read); the entry is read once per position (`v.age_probe`).
async fn published(
    reader: &mut EntryReader,
    v: &mut BacklogVerdict,
    oldest: Option<Position>,
    topic: &str,
) -> Option<i64> {
    let at = first_entry_from(&reader.log().ledgers(), oldest?)?;
    if let Some((p, t)) = v.age_probe {
        if p == at {
            return Some(t);
        }
    }
    match tokio::time::timeout(STEP_TIMEOUT, reader.read_entry(at)).await {
        Ok(Ok(e)) => {
            v.age_probe = Some((at, e.publish_time_ms));
            Some(e.publish_time_ms)
        }
        Ok(Err(e)) => {
            tracing::debug!(topic, position = %at, error = %e,
                "reading the oldest unacknowledged entry failed; age not checked");
            None
        }
        Err(_) => None,
    }
}

/// Moves every durable subscription past the entries published before `before_ms`.
async fn expire_before(
    reader: &EntryReader,
    subs: &[SubscriptionHandle],
    before_ms: i64,
    topic: &str,
    why: &str,
) {
    match tokio::time::timeout(STEP_TIMEOUT, reader.find_by_publish_time(before_ms)).await {
        Ok(Ok(to)) => skip_all(subs, to, topic, why).await,
        Ok(Err(e)) => tracing::debug!(topic, error = %e,
            "finding the expiry position failed ({why}); retried at the next check"),
        Err(_) => {}
    }
}

/// Moves every subscription in `subs` forward to `to` (those already there stay).
async fn skip_all(subs: &[SubscriptionHandle], to: Position, topic: &str, why: &str) {
    let mut total = 0;
    for s in subs {
        let skipped =
            tokio::time::timeout(STEP_TIMEOUT, s.ask(|r| SubscriptionCommand::SkipTo(to, r))).await;
        total += skipped.ok().flatten().unwrap_or(0);
    }
    if total > 0 {
        tracing::info!(topic, to = %to, entries = total, "{why}: subscriptions skipped forward");
    }
}
