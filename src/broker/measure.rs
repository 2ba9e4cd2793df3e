//! What the broker measures per loaded topic partition and subscription, for `GET /metrics`,
//! topic stats and the two early warnings:
//! - **hot partitions** (DS-FAIL-12): a partition whose share of its topic's in-rate over the
//!   rate window exceeds `hot_share_factor` × an even share; a Key_Shared consumer likewise
//!   among its subscription's consumers;
//! - **lag spirals** (DS-FAIL-03): a subscription whose backlog grew across a whole lag window.
//!
//! Producers' connections, the owner and the subscription tasks record into these (atomics and
//! small locks, never an `.await`) and mark the topic changed ([`super::activity`]); the
//! broker's stats tick samples the rates of the changed topics until they are quiet again and
//! evaluates the warnings ([`super::Broker::sample_measures`]); a scrape reads them into rows.
//!
//! Invariants:
//! - [`TopicMeasures::subscriptions`] holds the measures of exactly the subscriptions the
//!   owner has (the owner adds and removes them); [`TopicMeasures::publishers`] those of
//!   exactly its producers.
//! - With `metrics.enabled` off nothing is recorded (the rates read 0).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::MetricsConfig;
use crate::ledger::{LedgerInfo, LedgerState, Position};
use crate::metrics::meter::{mono_ms, Buckets, Meter, ENTRY_SIZE_BYTES, WRITE_LATENCY_US};
use crate::metrics::pulsar::{SubscriptionRow, TopicRow};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The settings measures follow (from `[metrics]`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// Record at all.
    pub enabled: bool,
    /// Series per topic on `/metrics` (else per namespace).
    pub topic_level: bool,
    /// Rate window, ms.
    pub rate_window_ms: u64,
    /// Hot when the share exceeds this multiple of an even share.
    pub hot_share_factor: f64,
    /// No hot flag below this many messages per second.
    pub hot_min_rate: f64,
    /// Lag window, ms.
    pub lag_window_ms: u64,
}

impl From<&MetricsConfig> for Settings {
    fn from(c: &MetricsConfig) -> Self {
        Settings {
            enabled: c.enabled,
            topic_level: c.expose_topic_level,
            rate_window_ms: c.rate_window.as_millis() as u64,
            hot_share_factor: c.hot_share_factor,
            hot_min_rate: c.hot_min_rate,
            lag_window_ms: c.lag_window.as_millis() as u64,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::from(&MetricsConfig::default())
    }
}

/// The share above which one of `n` is hot: `hot_share_factor` × an even share, capped
/// half-way between an even share and everything, so the flag stays reachable when `n` is
/// small (2 partitions, factor 2: 0.75 rather than an impossible 1.0).
pub(crate) fn hot_threshold(s: &Settings, n: usize) -> f64 {
    let even = 1.0 / n as f64;
    (s.hot_share_factor * even).min((1.0 + even) / 2.0)
}

/// Whether `share` of a total `rate` split `n` ways is hot. The one flagged must itself
/// carry `hot_min_rate`: over 10,000 partitions at 2 msg/s each, a partition at 5 msg/s is
/// above twice an even share, but that is noise, not a hot spot.
pub(crate) fn is_hot(s: &Settings, share: f64, n: usize, rate: f64) -> bool {
    n > 1 && share * rate >= s.hot_min_rate && share > hot_threshold(s, n)
}

/// Measures of one loaded topic partition.
#[derive(Debug)]
pub(crate) struct TopicMeasures {
    pub settings: Settings,
    /// Messages and bytes appended.
    pub msg_in: Meter,
    /// Append latency, µs (SEND queued to the owner → durable).
    pub write_latency: Buckets<9>,
    /// Entry sizes, bytes.
    pub entry_size: Buckets<8>,
    /// Invariant: while the owner runs, the registrations of exactly its producers, oldest
    /// first (the owner sets them whenever its producers change; a stopped topic is out of
    /// the broker's index).
    publishers: Mutex<Vec<Arc<super::publisher::PublisherMeasure>>>,
    /// The size backlog quota in force (-1: none), kept by the owner.
    pub quota_limit: AtomicI64,
    /// The age backlog quota in force, seconds (-1: none).
    pub quota_limit_time: AtomicI64,
    /// This partition's share of its topic's in-rate, as `f64` bits (set by the stats tick).
    share_bits: AtomicU64,
    /// Flagged hot (set by the stats tick).
    pub hot: AtomicBool,
    /// The declared partition count of its partitioned topic (0: not a partition); set at
    /// load and when the count is raised.
    pub partitions: std::sync::atomic::AtomicU32,
    /// Invariant: the measures of exactly the owner's subscriptions.
    pub subscriptions: Mutex<Vec<Arc<SubscriptionMeasures>>>,
    /// Tells the stats tick that something here changed.
    pub marker: Arc<super::activity::Marker>,
}

impl TopicMeasures {
    pub fn new(settings: Settings, marker: Arc<super::activity::Marker>) -> Self {
        TopicMeasures {
            marker,
            settings,
            msg_in: Meter::default(),
            write_latency: Buckets::new(&WRITE_LATENCY_US),
            entry_size: Buckets::new(&ENTRY_SIZE_BYTES),
            publishers: Mutex::new(Vec::new()),
            quota_limit: AtomicI64::new(-1),
            quota_limit_time: AtomicI64::new(-1),
            share_bits: AtomicU64::new(1f64.to_bits()),
            hot: AtomicBool::new(false),
            partitions: std::sync::atomic::AtomicU32::new(0),
            subscriptions: Mutex::new(Vec::new()),
        }
    }

    /// Counts one durable append of `publisher` (and marks the topic changed even with
    /// measures off: the tick also saves deduplication snapshots of topics that appended).
    pub fn appended(
        &self,
        publisher: &super::publisher::PublisherMeasure,
        messages: u64,
        bytes: u64,
        took_us: u64,
    ) {
        self.marker.touch();
        if !self.settings.enabled {
            return;
        }
        self.msg_in.record(messages, bytes);
        publisher.appended.record(messages, bytes);
        self.write_latency.record(took_us);
        self.entry_size.record(bytes);
    }

    /// Publishes the backlog quotas in force.
    pub fn set_quotas(&self, limits: &crate::policies::BacklogLimits) {
        let size = limits.storage.map_or(-1, |q| q.limit_size);
        let time = limits.age.map_or(-1, |q| i64::from(q.limit_time));
        self.quota_limit.store(size, Ordering::Relaxed);
        self.quota_limit_time.store(time, Ordering::Relaxed);
    }

    /// The partition's share of its topic's in-rate.
    pub fn share(&self) -> f64 {
        f64::from_bits(self.share_bits.load(Ordering::Relaxed))
    }

    pub fn set_share(&self, share: f64) {
        self.share_bits.store(share.to_bits(), Ordering::Relaxed);
    }

    /// Starts tracking a subscription.
    pub fn add_subscription(&self, m: Arc<SubscriptionMeasures>) {
        let mut subs = lock(&self.subscriptions);
        subs.retain(|s| s.name != m.name);
        subs.push(m);
    }

    /// Stops tracking a subscription (if `m` is still the one of its name).
    pub fn remove_subscription(&self, m: &Arc<SubscriptionMeasures>) {
        lock(&self.subscriptions).retain(|s| !Arc::ptr_eq(s, m));
    }

    /// The subscriptions' measures now.
    pub fn subscriptions(&self) -> Vec<Arc<SubscriptionMeasures>> {
        lock(&self.subscriptions).clone()
    }

    /// The owner's producers now (`all`, in any order).
    pub fn set_publishers(&self, mut all: Vec<Arc<super::publisher::PublisherMeasure>>) {
        all.sort_by(|a, b| (a.since, &a.name).cmp(&(b.since, &b.name)));
        *lock(&self.publishers) = all;
    }

    /// The owner's producers, oldest registration first.
    pub fn publishers(&self) -> Vec<Arc<super::publisher::PublisherMeasure>> {
        lock(&self.publishers).clone()
    }
}

/// A subscription's cursor as its task last published it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CursorView {
    pub first_unacked: Position,
    /// Entries acknowledged after `first_unacked`.
    pub acked_after: u64,
    pub read_position: Position,
    pub unacked_messages: u64,
    pub blocked: bool,
    pub consumers: u64,
}

/// The lag window of a subscription.
#[derive(Debug, Clone, Copy, Default)]
struct LagWindow {
    /// When the current window began and the backlog then (`None` until the first
    /// observation: a subscription loaded with a backlog has not grown yet).
    start_ms: u64,
    start_backlog: Option<u64>,
    /// The backlog grew across the last whole window.
    growing: bool,
}

/// Measures of one subscription.
#[derive(Debug)]
pub(crate) struct SubscriptionMeasures {
    pub name: String,
    pub durable: bool,
    /// Messages and bytes dispatched.
    pub out: Meter,
    /// Acknowledgements (entries).
    pub acks: Meter,
    /// Entries expired (TTL) or skipped (eviction, admin).
    pub expired: Meter,
    /// Invariant: as the subscription task last published it.
    cursor: Mutex<CursorView>,
    lag: Mutex<LagWindow>,
    /// Key_Shared consumers flagged hot (set by the subscription task).
    pub hot_consumers: AtomicU64,
    /// Its topic's: what a subscription records marks the topic changed.
    marker: Arc<super::activity::Marker>,
}

impl SubscriptionMeasures {
    /// Measures of a subscription whose cursor starts at `start`, of the topic `marker` marks.
    pub fn new(
        name: String,
        durable: bool,
        start: Position,
        marker: Arc<super::activity::Marker>,
    ) -> Self {
        SubscriptionMeasures {
            marker,
            name,
            durable,
            out: Meter::default(),
            acks: Meter::default(),
            expired: Meter::default(),
            cursor: Mutex::new(CursorView {
                first_unacked: start,
                acked_after: 0,
                read_position: start,
                unacked_messages: 0,
                blocked: false,
                consumers: 0,
            }),
            lag: Mutex::new(LagWindow::default()),
            hot_consumers: AtomicU64::new(0),
        }
    }

    /// Counts messages dispatched.
    pub fn dispatched(&self, messages: u64, bytes: u64) {
        self.out.record(messages, bytes);
        self.marker.touch();
    }

    /// Counts entries acknowledged.
    pub fn settled(&self, entries: u64) {
        self.acks.record(entries, 0);
        self.marker.touch();
    }

    /// Counts entries expired or skipped.
    pub fn skipped(&self, entries: u64) {
        self.expired.record(entries, 0);
        self.marker.touch();
    }

    pub fn publish(&self, view: CursorView) {
        *lock(&self.cursor) = view;
    }

    pub fn cursor(&self) -> CursorView {
        *lock(&self.cursor)
    }

    /// Feeds the backlog now into the lag window; returns `Some(growing)` when a window just
    /// ended and its verdict changed.
    pub fn note_backlog(&self, backlog: u64, window_ms: u64) -> Option<bool> {
        let now = mono_ms();
        let mut w = lock(&self.lag);
        let Some(start) = w.start_backlog.filter(|_| backlog > 0) else {
            // First observation, or no backlog: a new window starts here.
            let was = w.growing;
            *w = LagWindow {
                start_ms: now,
                start_backlog: Some(backlog),
                growing: false,
            };
            return was.then_some(false);
        };
        if now.saturating_sub(w.start_ms) < window_ms {
            return None;
        }
        let growing = backlog > start;
        let changed = growing != w.growing;
        *w = LagWindow {
            start_ms: now,
            start_backlog: Some(backlog),
            growing,
        };
        changed.then_some(growing)
    }

    pub fn lag_growing(&self) -> bool {
        lock(&self.lag).growing
    }
}

/// Backlog of a cursor over `ledgers`: entries, bytes, age (s), and whether the next read is
/// in the lake.
pub(crate) fn backlog_of(ledgers: &[LedgerInfo], c: &CursorView) -> (u64, u64, u64, bool) {
    let (entries, bytes, age, tier) =
        super::backlog::backlog(ledgers, c.first_unacked, c.acked_after, c.read_position);
    (entries, bytes, age, tier == crate::replay::Tier::Lake)
}

/// Local bytes, offloaded bytes, offload lag bytes and the age of the oldest message not yet
/// in the lake (s).
fn storage_of(ledgers: &[LedgerInfo]) -> (u64, u64, u64, f64) {
    let (mut local, mut lake, mut lag) = (0, 0, 0);
    let mut oldest: Option<i64> = None;
    for l in ledgers {
        match l.state {
            LedgerState::Open | LedgerState::Sealed => {
                local += l.size_bytes;
                lag += l.size_bytes;
                if oldest.is_none() && l.entry_count > 0 {
                    oldest = l.min_publish_ms;
                }
            }
            LedgerState::Offloaded => {
                local += l.size_bytes;
                lake += l.size_bytes;
            }
            _ => lake += l.size_bytes,
        }
    }
    let age = oldest.map_or(0.0, |t| {
        (crate::ledger::now_ms().saturating_sub(t)).max(0) as f64 / 1000.0
    });
    (local, lake, lag, age)
}

/// Reads a loaded topic partition into a scrape row.
pub(crate) fn topic_row(topic: &super::BrokerTopic) -> TopicRow {
    let m = &topic.measures;
    let window = m.settings.rate_window_ms;
    let ledgers = topic.log.ledgers();
    let (storage_size, offloaded_size, offload_lag_bytes, offload_lag_seconds) =
        storage_of(&ledgers);
    let rate_in = m.msg_in.rate(window);
    let (in_messages, in_bytes) = m.msg_in.totals();
    let mut row = TopicRow {
        namespace: topic.name.namespace.to_string(),
        topic: topic.name.to_string(),
        rate_in: rate_in.msgs,
        throughput_in: rate_in.bytes,
        in_messages,
        in_bytes,
        producers: lock(&m.publishers).len() as u64,
        storage_size,
        offloaded_size,
        backlog_quota_limit: m.quota_limit.load(Ordering::Relaxed),
        backlog_quota_limit_time: m.quota_limit_time.load(Ordering::Relaxed),
        publish_rate_limit_times: topic.throttle.throttled(),
        write_latency: m.write_latency.snapshot(),
        entry_size: m.entry_size.snapshot(),
        offload_lag_bytes,
        offload_lag_seconds,
        in_rate_share: m.share(),
        hot: m.hot.load(Ordering::Relaxed),
        ..TopicRow::default()
    };
    for s in m.subscriptions() {
        let c = s.cursor();
        let (back_log, backlog_size, backlog_age_seconds, reading_lake) = backlog_of(&ledgers, &c);
        let out = s.out.rate(window);
        let (out_messages, out_bytes) = s.out.totals();
        row.rate_out += out.msgs;
        row.throughput_out += out.bytes;
        row.out_messages += out_messages;
        row.out_bytes += out_bytes;
        row.consumers += c.consumers;
        row.subscriptions += 1;
        // Pulsar sums the subscriptions' backlogs; size and age are the slowest cursor's.
        row.msg_backlog += back_log;
        if s.durable && backlog_size >= row.backlog_size {
            row.backlog_size = backlog_size;
            row.backlog_age_seconds = backlog_age_seconds;
        }
        row.subscriptions_rows.push(SubscriptionRow {
            name: s.name.clone(),
            back_log,
            backlog_size,
            backlog_age_seconds,
            unacked_messages: c.unacked_messages,
            blocked_on_unacked: c.blocked,
            rate_out: out.msgs,
            throughput_out: out.bytes,
            ack_rate: s.acks.rate(window).msgs,
            rate_expired: s.expired.rate(window).msgs,
            consumers: c.consumers,
            reading_lake,
            lag_growing: s.lag_growing(),
            hot_consumers: s.hot_consumers.load(Ordering::Relaxed),
        });
    }
    row
}

/// Samples the rates of `topic`, its producers and its subscriptions and feeds the
/// subscriptions' backlogs into the lag
/// windows (logging a warning when a subscription starts spiralling). Returns when the topic
/// is next due ([`crate::metrics::meter::mono_ms`]) if nothing changes meanwhile: when every
/// one of its meters is due a sample again (so that they all sample together from then on).
pub(crate) fn sample(topic: &super::BrokerTopic) -> u64 {
    let m = &topic.measures;
    let window = m.settings.rate_window_ms;
    if !m.settings.enabled {
        return u64::MAX;
    }
    let mut next = m.msg_in.sample(window);
    for p in m.publishers() {
        next = next.max(p.appended.sample(window));
    }
    let subs = m.subscriptions();
    if subs.is_empty() {
        return next;
    }
    let ledgers = topic.log.ledgers();
    let in_rate = m.msg_in.rate(window).msgs;
    for s in subs {
        for meter in [&s.out, &s.acks, &s.expired] {
            next = next.max(meter.sample(window));
        }
        let c = s.cursor();
        let (backlog, bytes, age, lake) = backlog_of(&ledgers, &c);
        match s.note_backlog(backlog, m.settings.lag_window_ms) {
            Some(true) => tracing::warn!(topic = %topic.name, subscription = %s.name,
                backlog_entries = backlog, backlog_bytes = bytes, backlog_age_seconds = age,
                in_rate = in_rate, out_rate = s.out.rate(window).msgs, reading_lake = lake,
                window_seconds = m.settings.lag_window_ms / 1000,
                "lag spiral: the subscription's backlog grew across the whole lag window"),
            Some(false) => tracing::info!(topic = %topic.name, subscription = %s.name,
                backlog_entries = backlog, "lag spiral over: the backlog stopped growing"),
            None => {}
        }
    }
    next
}

/// Whether the stats tick may stop sampling `topic` until it changes again: every rate reads
/// zero over the rate window, and no warning it raised (hot, lag spiral) is still up. Its
/// producers' rates are not read: each append is in the topic's meter too.
pub(crate) fn is_quiet(topic: &super::BrokerTopic) -> bool {
    let m = &topic.measures;
    let window = m.settings.rate_window_ms;
    let zero = |meter: &Meter| meter.rate(window).msgs == 0.0;
    !m.hot.load(Ordering::Relaxed)
        && zero(&m.msg_in)
        && m.subscriptions()
            .iter()
            .all(|s| zero(&s.out) && zero(&s.acks) && zero(&s.expired) && !s.lag_growing())
}

/// Sets the in-rate shares and hot flags of the loaded partitions of one partitioned topic
/// (an unloaded partition counts as taking no traffic), logging a warning when one turns hot.
pub(crate) fn evaluate_partitions(loaded: &[Arc<super::BrokerTopic>]) {
    let Some(first) = loaded.first() else { return };
    let partitions = loaded
        .iter()
        .map(|t| t.measures.partitions.load(Ordering::Relaxed) as usize)
        .max()
        .unwrap_or(0);
    let s = first.measures.settings;
    let rates: Vec<f64> = loaded
        .iter()
        .map(|t| t.measures.msg_in.rate(s.rate_window_ms).msgs)
        .collect();
    let total: f64 = rates.iter().sum();
    let n = partitions.max(loaded.len());
    for (t, rate) in loaded.iter().zip(&rates) {
        let share = if total > 0.0 { rate / total } else { 0.0 };
        t.measures.set_share(share);
        let hot = is_hot(&s, share, n, total);
        let was = t.measures.hot.swap(hot, Ordering::Relaxed);
        if hot && !was {
            tracing::warn!(topic = %t.name, share = format!("{:.3}", share),
                threshold = format!("{:.3}", hot_threshold(&s, n)), partition_rate = rate,
                topic_rate = total, partitions = n, factor = s.hot_share_factor,
                "hot partition: its share of the topic's in-rate exceeds the factor times an \
                 even share; add partitions (POST .../partitions) to spread new traffic");
        } else if was && !hot {
            tracing::info!(topic = %t.name, share = format!("{:.3}", share),
                "partition no longer hot");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_needs_skew_above_the_factor_and_enough_traffic() {
        let s = Settings::default();
        assert!(is_hot(&s, 0.9, 4, 100.0));
        assert!(!is_hot(&s, 0.4, 4, 100.0), "0.4 < 2 x 0.25");
        assert!(!is_hot(&s, 0.9, 4, 1.0), "a trickle is not hot");
        assert!(!is_hot(&s, 1.0, 1, 100.0), "one partition takes everything");
        assert!(is_hot(&s, 0.9, 2, 100.0), "reachable with two");
        assert!(!is_hot(&s, 0.7, 2, 100.0));
        assert!(
            !is_hot(&s, 0.00025, 10_000, 20_000.0),
            "5 msg/s is over twice an even share of 10,000, but a trickle"
        );
        assert!(
            is_hot(&s, 0.001, 10_000, 20_000.0),
            "20 msg/s of 20,000 over 10,000"
        );
        assert_eq!(hot_threshold(&s, 8), 0.25);
    }

    #[test]
    fn lag_window_flags_growth_across_a_whole_window() {
        let marker = super::super::activity::Marker::new("t", &Default::default());
        let m = SubscriptionMeasures::new("s".into(), true, Position::new(0, 0), marker);
        let pause = || std::thread::sleep(std::time::Duration::from_millis(60));
        assert_eq!(
            m.note_backlog(1_000, 50),
            None,
            "the first look is the baseline"
        );
        pause();
        assert_eq!(m.note_backlog(500, 50), None, "draining is not a spiral");
        pause();
        assert_eq!(m.note_backlog(600, 50), Some(true));
        assert!(m.lag_growing());
        pause();
        assert_eq!(m.note_backlog(550, 50), Some(false), "it shrank");
        pause();
        assert_eq!(m.note_backlog(700, 50), Some(true));
        assert_eq!(m.note_backlog(0, 50), Some(false), "drained");
    }
}
