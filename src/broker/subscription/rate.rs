//! Dispatch rate limits of a subscription (Pulsar's `dispatchRate`,
//! `subscriptionDispatchRate` and resource-group dispatch quotas): before each read the
//! subscription asks every limiter in force how many messages it may send, reads no more
//! entries than that, and waits (a timer, not a busy loop) while any limiter is in debt; every
//! entry sent takes its messages and bytes from all of them.

use std::sync::Arc;

use tokio::time::Instant;

use super::State;
use crate::broker::throttle::RateLimiter;

impl State {
    /// How many entries dispatch may read now (`None`: it must wait; `retry_at` is set to
    /// when).
    pub(super) fn dispatch_allowance(&mut self) -> Option<usize> {
        let limits = self.topic.dispatch.limits();
        let own_rate = limits.subscription;
        if self.own_dispatch.as_ref().map(|l| l.rate()) != Some(own_rate) {
            self.own_dispatch = (!own_rate.is_unlimited()).then(|| RateLimiter::new(own_rate));
        }
        self.rate_limiters = [limits.topic, limits.group, self.own_dispatch.clone()]
            .into_iter()
            .flatten()
            .collect::<Vec<Arc<RateLimiter>>>();
        let now = Instant::now();
        let mut allowed = usize::MAX;
        for l in &self.rate_limiters {
            match l.ready(now) {
                Err(resume) => {
                    self.retry_at = Some(resume);
                    return None;
                }
                Ok(Some(n)) => allowed = allowed.min(usize::try_from(n.max(1)).unwrap_or(1)),
                Ok(None) => {}
            }
        }
        Some(allowed)
    }

    /// Takes one dispatched entry of `msgs` messages and `bytes` bytes from the limiters; when
    /// that leaves one in debt, dispatch waits (`retry_at`) and sends nothing more until then.
    pub(super) fn charge_dispatch(&mut self, msgs: u64, bytes: u64) {
        if self.rate_limiters.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut resume: Option<Instant> = None;
        for l in &self.rate_limiters {
            resume = resume.max(l.acquire(msgs, bytes, now));
        }
        if resume.is_some() {
            self.retry_at = resume.max(self.retry_at);
        }
    }
}
