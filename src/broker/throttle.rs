//! Rate limits: token buckets of messages and bytes that refill continuously ([`RateLimiter`]).
//!
//! Publish rates, as Pulsar throttles producers: every SEND takes its messages and bytes (it is
//! never refused or dropped), and while a bucket is in debt the producer's connection is not
//! read (Pulsar's `setAutoRead(false)`), so the client's own pending queue absorbs the excess.
//! Two kinds of limiter apply to a topic partition: its own (`publishRate` of the topic, else of
//! its namespace) and its namespace's resource group's (shared by every topic partition of
//! every namespace attached to the group: the tenant quota). A SEND takes from both; the
//! connection waits for the later of the two.
//!
//! Dispatch rates ([`DispatchThrottle`]), as Pulsar's dispatchers: before a subscription reads
//! entries to dispatch it asks every limiter in force how many messages it may send now (the
//! topic's `dispatchRate`, shared by its subscriptions; the subscription's own
//! `subscriptionDispatchRate`; the resource group's dispatch quota); in debt, it waits until
//! the debt is repaid; each entry sent takes its messages and bytes.
//!
//! Subscribe rates ([`SubscribeGate`]): SUBSCRIBEs per consumer and period, counted per topic
//! partition.
//!
//! Invariants:
//! - A bucket holds at most a tenth of a second of its rate (at least one message's worth), so
//!   a producer idle for a while cannot then exceed its rate by more than that.
//! - A bucket's debt is at most [`MAX_DEBT`] of its rate, so no connection stays unread longer
//!   than that (clients' keepalives are 30 s and more; an AUTH_RESPONSE is read in time) and
//!   no single SEND (a client may claim any message count) can stall everyone sharing the
//!   limiter. A batch bigger than that much of the rate is let through after the pause.
//! - Every time a SEND leaves a bucket in debt counts once in `throttled`
//!   (`publishRateLimitedTimes`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

/// The longest a bucket's debt can make its senders wait.
pub const MAX_DEBT: Duration = Duration::from_secs(5);

/// A rate in messages and bytes per period; `None` = unlimited in that dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rate {
    /// Messages per period.
    pub msgs: Option<u64>,
    /// Bytes per period.
    pub bytes: Option<u64>,
    /// The period in seconds (0 is taken as 1).
    pub period_secs: u32,
}

impl Rate {
    /// A rate per second from Pulsar's numbers (≤ 0 = unlimited).
    pub fn from_pulsar(msgs: i64, bytes: i64) -> Rate {
        Rate::per_period(msgs, bytes, 1)
    }

    /// A rate per `period_secs` seconds from Pulsar's numbers (≤ 0 = unlimited), e.g. a
    /// `DispatchRate` with `ratePeriodInSecond`.
    pub fn per_period(msgs: i64, bytes: i64, period_secs: u32) -> Rate {
        let positive = |v: i64| u64::try_from(v).ok().filter(|v| *v > 0);
        Rate {
            msgs: positive(msgs),
            bytes: positive(bytes),
            period_secs: period_secs.max(1),
        }
    }

    fn per_second(&self, amount: u64) -> f64 {
        amount as f64 / f64::from(self.period_secs.max(1))
    }

    /// Whether nothing is limited.
    pub fn is_unlimited(&self) -> bool {
        self.msgs.is_none() && self.bytes.is_none()
    }
}

/// One bucket: `tokens` may go negative (debt), refilled at `rate` per second up to `burst`.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
}

impl Bucket {
    /// A full bucket refilled at `rate` per second.
    fn new(rate: f64) -> Bucket {
        let burst = (rate / 10.0).max(1.0);
        Bucket {
            rate,
            burst,
            tokens: burst,
        }
    }

    /// Refills for `elapsed`, takes `n`; how long until the debt is repaid (zero if none).
    fn take(&mut self, elapsed: Duration, n: u64) -> Duration {
        self.refill(elapsed);
        self.tokens = (self.tokens - n as f64).max(-self.rate * MAX_DEBT.as_secs_f64());
        self.until(0.0)
    }

    fn refill(&mut self, elapsed: Duration) {
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(self.burst);
    }

    /// How long until the bucket holds `level` tokens (zero if it does).
    fn until(&self, level: f64) -> Duration {
        if self.tokens >= level {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((level - self.tokens) / self.rate)
        }
    }
}

#[derive(Debug)]
struct Buckets {
    msgs: Option<Bucket>,
    bytes: Option<Bucket>,
    last: Instant,
}

/// Token buckets of one limit, shared by everything it limits.
#[derive(Debug)]
pub struct RateLimiter {
    rate: Rate,
    state: Mutex<Buckets>,
    /// SENDs that left a bucket in debt.
    throttled: AtomicU64,
}

impl RateLimiter {
    /// A limiter of `rate`, full.
    pub fn new(rate: Rate) -> Arc<RateLimiter> {
        Arc::new(RateLimiter {
            rate,
            state: Mutex::new(Buckets {
                msgs: rate.msgs.map(|m| Bucket::new(rate.per_second(m))),
                bytes: rate.bytes.map(|b| Bucket::new(rate.per_second(b))),
                last: Instant::now(),
            }),
            throttled: AtomicU64::new(0),
        })
    }

    /// Its rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Takes `msgs` messages of `bytes` bytes at `now`; when the sender must wait before
    /// sending more, until when.
    pub fn acquire(&self, msgs: u64, bytes: u64, now: Instant) -> Option<Instant> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = now.saturating_duration_since(s.last);
        s.last = s.last.max(now);
        let wait_msgs = s
            .msgs
            .as_mut()
            .map_or(Duration::ZERO, |b| b.take(elapsed, msgs));
        let wait_bytes = s
            .bytes
            .as_mut()
            .map_or(Duration::ZERO, |b| b.take(elapsed, bytes));
        let wait = wait_msgs.max(wait_bytes);
        if wait.is_zero() {
            return None;
        }
        self.throttled.fetch_add(1, Ordering::Relaxed);
        Some(now + wait)
    }

    /// SENDs that were throttled so far.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// How many messages may be sent at `now` (`None`: no message limit), or until when to
    /// wait: until every bucket holds at least one token (a byte bucket in debt waits too;
    /// a sender charges each item and stops at the first debt, so it overdraws by at most
    /// one item).
    pub fn ready(&self, now: Instant) -> Result<Option<u64>, Instant> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = now.saturating_duration_since(s.last);
        s.last = s.last.max(now);
        let mut wait = Duration::ZERO;
        let Buckets { msgs, bytes, .. } = &mut *s;
        for b in [msgs.as_mut(), bytes.as_mut()].into_iter().flatten() {
            b.refill(elapsed);
            wait = wait.max(b.until(1.0));
        }
        if !wait.is_zero() {
            return Err(now + wait);
        }
        Ok(s.msgs.as_ref().map(|b| b.tokens as u64))
    }
}

/// The dispatch limits in force for one topic partition.
#[derive(Debug, Default, Clone)]
pub struct DispatchLimits {
    /// The topic's `dispatchRate`, shared by its subscriptions.
    pub topic: Option<Arc<RateLimiter>>,
    /// The resource group's dispatch quota, shared by the group's topics.
    pub group: Option<Arc<RateLimiter>>,
    /// `subscriptionDispatchRate`: each subscription has a limiter of this rate.
    pub subscription: Rate,
}

/// The dispatch limits of a topic partition, read by its subscriptions before each read;
/// replaced when policies change.
#[derive(Debug, Default)]
pub struct DispatchThrottle {
    /// Invariant: the limits of the policies in force.
    limits: RwLock<DispatchLimits>,
}

impl DispatchThrottle {
    /// Puts the rates in force (the topic's limiter is kept when its rate is unchanged).
    pub fn set(&self, topic: Rate, subscription: Rate, group: Option<Arc<RateLimiter>>) {
        let mut l = self.limits.write().unwrap_or_else(|p| p.into_inner());
        if !l.topic.as_ref().is_some_and(|c| c.rate() == topic) {
            l.topic = (!topic.is_unlimited()).then(|| RateLimiter::new(topic));
        }
        l.group = group;
        l.subscription = subscription;
    }

    /// The limits in force.
    pub fn limits(&self) -> DispatchLimits {
        self.limits
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The topic's own limiter and its namespace's resource group's.
#[derive(Debug, Default)]
struct Limiters {
    own: Option<Arc<RateLimiter>>,
    group: Option<Arc<RateLimiter>>,
}

/// The limiters in force for one topic partition; replaced when policies change.
#[derive(Debug, Default)]
pub struct TopicThrottle {
    /// Invariant: the limiters of the policies in force.
    limiters: RwLock<Limiters>,
    /// Throttled SENDs counted by limiters this topic no longer uses.
    retired: AtomicU64,
}

impl TopicThrottle {
    /// Puts `own` (a new limiter of that rate, unless the current one has it already) and
    /// `group` in force.
    pub fn set(&self, own: Rate, group: Option<Arc<RateLimiter>>) {
        let mut l = self.limiters.write().unwrap_or_else(|p| p.into_inner());
        let keep = l.own.as_ref().is_some_and(|c| c.rate() == own);
        if !keep {
            if let Some(old) = l.own.take() {
                self.retired.fetch_add(old.throttled(), Ordering::Relaxed);
            }
            l.own = (!own.is_unlimited()).then(|| RateLimiter::new(own));
        }
        l.group = group;
    }

    /// Takes one SEND of `msgs` messages and `bytes` bytes from every limiter in force; until
    /// when the connection must not be read, if it must wait.
    pub fn acquire(&self, msgs: u64, bytes: u64) -> Option<Instant> {
        let l = self.limiters.read().unwrap_or_else(|p| p.into_inner());
        if l.own.is_none() && l.group.is_none() {
            return None;
        }
        let now = Instant::now();
        let own = l.own.as_ref().and_then(|x| x.acquire(msgs, bytes, now));
        let group = l.group.as_ref().and_then(|x| x.acquire(msgs, bytes, now));
        own.max(group)
    }

    /// SENDs of this topic partition its own limits throttled (`publishRateLimitedTimes`).
    pub fn throttled(&self) -> u64 {
        let l = self.limiters.read().unwrap_or_else(|p| p.into_inner());
        self.retired.load(Ordering::Relaxed) + l.own.as_ref().map_or(0, |x| x.throttled())
    }
}

/// Pulsar's subscribe rate: each consumer (client host and consumer name) may subscribe to
/// the topic partition at most `rate` times per `period`; beyond, SUBSCRIBE is refused until
/// its period ends.
#[derive(Debug, Default)]
pub struct SubscribeGate {
    /// Invariant: the limit in force and, per consumer, its current period's start and count.
    state: Mutex<SubscribeWindows>,
}

#[derive(Debug, Default)]
struct SubscribeWindows {
    /// Subscribes per period (0: unlimited).
    rate: u32,
    period: Duration,
    windows: std::collections::HashMap<String, (Instant, u32)>,
}

/// Consumers remembered before finished periods are swept out.
const SUBSCRIBE_WINDOWS_SWEEP: usize = 1024;

impl SubscribeGate {
    /// Puts `rate` subscribes per `period` in force (0: unlimited); a change starts afresh.
    pub fn set(&self, rate: u32, period: Duration) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.rate != rate || s.period != period {
            *s = SubscribeWindows {
                rate,
                period,
                windows: Default::default(),
            };
        }
    }

    /// Counts one SUBSCRIBE of `consumer`, unless its period's allowance is used up.
    pub fn admit(&self, consumer: &str) -> Result<(), super::BrokerError> {
        self.admit_at(consumer, Instant::now())
    }

    fn admit_at(&self, consumer: &str, now: Instant) -> Result<(), super::BrokerError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.rate == 0 {
            return Ok(());
        }
        let (rate, period) = (s.rate, s.period);
        if s.windows.len() >= SUBSCRIBE_WINDOWS_SWEEP {
            s.windows
                .retain(|_, (start, _)| now.saturating_duration_since(*start) < period);
        }
        let w = s.windows.entry(consumer.to_string()).or_insert((now, 0));
        if now.saturating_duration_since(w.0) >= period {
            *w = (now, 0);
        }
        if w.1 >= rate {
            return Err(super::BrokerError::SubscribeRateExceeded(format!(
                "Subscribe limited by subscribe rate limit per consumer ({rate} per {} s)",
                period.as_secs()
            )));
        }
        w.1 += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `per_send` messages as fast as the limiter allows for `secs` of simulated time;
    /// messages sent.
    fn drive(l: &RateLimiter, per_send: u64, size: u64, secs: u64) -> u64 {
        let start = Instant::now();
        let end = start + Duration::from_secs(secs);
        let (mut now, mut sent) = (start, 0);
        while now < end {
            sent += per_send;
            if let Some(resume) = l.acquire(per_send, per_send * size, now) {
                now = resume;
            }
        }
        sent
    }

    #[test]
    fn rates_hold_over_time_within_one_burst() {
        for (rate, per_send) in [(100, 1), (1000, 10), (5000, 100)] {
            let l = RateLimiter::new(Rate::from_pulsar(rate, -1));
            let sent = drive(&l, per_send, 10, 10);
            let expected = rate as u64 * 10;
            assert!(
                sent >= expected && sent <= expected + rate as u64 / 10 + 2 * per_send,
                "rate {rate}: {sent} in 10 s"
            );
            assert!(l.throttled() > 0);
        }
        let l = RateLimiter::new(Rate::from_pulsar(-1, 100_000));
        let sent = drive(&l, 1, 1000, 10);
        assert!(
            (1000..=1012).contains(&sent),
            "bytes: {sent} msgs of 1000 B in 10 s"
        );
    }

    #[test]
    fn debt_is_bounded() {
        let l = RateLimiter::new(Rate::from_pulsar(10, -1));
        let t = Instant::now();
        let resume = l.acquire(u32::MAX as u64, 1, t).expect("in debt");
        assert!(resume - t <= MAX_DEBT, "{:?}", resume - t);
        // Once the (bounded) debt is repaid, the limiter serves again.
        assert_eq!(l.acquire(1, 1, resume + Duration::from_millis(200)), None);
    }

    #[test]
    fn unlimited_and_idle_do_not_wait() {
        let l = RateLimiter::new(Rate::from_pulsar(0, -1));
        assert!(Rate::from_pulsar(0, -1).is_unlimited());
        assert_eq!(l.acquire(1_000_000, 1 << 30, Instant::now()), None);
        let l = RateLimiter::new(Rate::from_pulsar(10, -1));
        let t = Instant::now();
        assert_eq!(
            l.acquire(1, 1, t),
            None,
            "a burst of a tenth of a second, at least 1"
        );
        assert!(l.acquire(1, 1, t).is_some());
        // After an idle hour the bucket holds one burst, not an hour's worth.
        let later = t + Duration::from_secs(3600);
        assert_eq!(l.acquire(1, 1, later), None);
        assert!(l.acquire(1, 1, later).is_some());
    }

    #[test]
    fn subscribe_gate_counts_per_consumer_and_period() {
        let gate = SubscribeGate::default();
        let t = Instant::now();
        assert!(gate.admit_at("a", t).is_ok(), "unlimited by default");
        gate.set(2, Duration::from_secs(30));
        assert!(gate.admit_at("a", t).is_ok());
        assert!(gate.admit_at("a", t).is_ok());
        assert!(gate.admit_at("a", t + Duration::from_secs(1)).is_err());
        assert!(
            gate.admit_at("b", t).is_ok(),
            "another consumer has its own allowance"
        );
        assert!(
            gate.admit_at("a", t + Duration::from_secs(30)).is_ok(),
            "a new period"
        );
    }

    #[test]
    fn ready_reports_headroom_and_waits_out_debt() {
        let l = RateLimiter::new(Rate::from_pulsar(100, -1));
        let t = Instant::now();
        assert_eq!(l.ready(t), Ok(Some(10)), "a tenth of a second of burst");
        l.acquire(30, 0, t);
        let resume = l.ready(t).expect_err("in debt");
        assert!(resume - t >= Duration::from_millis(200), "{:?}", resume - t);
        assert!(l.ready(resume + Duration::from_millis(1)).is_ok());
        let bytes_only = RateLimiter::new(Rate::from_pulsar(-1, 1000));
        assert_eq!(bytes_only.ready(t), Ok(None));
    }

    #[test]
    fn a_topic_waits_for_the_later_of_its_limiters_and_keeps_its_counts() {
        let throttle = TopicThrottle::default();
        assert_eq!(throttle.acquire(100, 100), None, "no limits");
        let group = RateLimiter::new(Rate::from_pulsar(1, -1));
        throttle.set(Rate::from_pulsar(1000, -1), Some(group.clone()));
        assert!(
            throttle.acquire(5, 5).is_some(),
            "the group's limit is the lower"
        );
        assert_eq!(group.throttled(), 1);
        assert_eq!(throttle.throttled(), 0, "its own limit was not exceeded");
        throttle.set(Rate::from_pulsar(1, -1), None);
        assert!(throttle.acquire(5, 5).is_some());
        throttle.set(Rate::from_pulsar(1, -1), None);
        assert_eq!(
            throttle.throttled(),
            1,
            "same rate: same limiter, count kept"
        );
        throttle.set(Rate::default(), None);
        assert_eq!(throttle.throttled(), 1, "count kept when the limit goes");
        assert_eq!(throttle.acquire(5, 5), None);
    }
}
