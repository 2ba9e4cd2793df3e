//! Pulsar's topic and subscription families (`pulsar_rate_in`, `pulsar_msg_backlog`,
//! `pulsar_subscription_back_log`, `pulsar_storage_write_latency_le_*`, ...) with Pulsar's
//! names, labels (`cluster`, `namespace` "t/ns", `topic` "persistent://…", `subscription`) and
//! types (every family a gauge), so dashboards made for Pulsar read them unchanged; plus
//! ledgerlake's per-topic families (offload lag, hot partitions, lag spirals).
//!
//! The rows are read from the live counters at scrape time and dropped after encoding: a
//! scrape keeps nothing per topic.

use std::collections::BTreeMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;

use super::meter::{BucketCounts, ENTRY_SIZE_BYTES, WRITE_LATENCY_US};

/// One topic partition (or non-partitioned topic) as a scrape reads it.
#[derive(Debug, Clone, Default)]
pub struct TopicRow {
    /// `tenant/namespace`.
    pub namespace: String,
    /// `persistent://tenant/namespace/topic[-partition-N]`.
    pub topic: String,
    /// Messages and bytes per second in (published) and out (dispatched).
    pub rate_in: f64,
    /// Bytes per second in.
    pub throughput_in: f64,
    /// Messages per second out.
    pub rate_out: f64,
    /// Bytes per second out.
    pub throughput_out: f64,
    /// Messages published since the topic was loaded.
    pub in_messages: u64,
    /// Bytes published since the topic was loaded.
    pub in_bytes: u64,
    /// Messages dispatched since the topic was loaded.
    pub out_messages: u64,
    /// Bytes dispatched since the topic was loaded.
    pub out_bytes: u64,
    /// Producers connected.
    pub producers: u64,
    /// Consumers connected.
    pub consumers: u64,
    /// Subscriptions loaded.
    pub subscriptions: u64,
    /// Bytes in the local log.
    pub storage_size: u64,
    /// Bytes in the lake.
    pub offloaded_size: u64,
    /// Entries of the subscriptions' backlogs, summed (as Pulsar counts `msgBacklog`).
    pub msg_backlog: u64,
    /// Bytes of the slowest durable subscription's backlog.
    pub backlog_size: u64,
    /// Age of its oldest message, seconds.
    pub backlog_age_seconds: u64,
    /// The size backlog quota (-1: none).
    pub backlog_quota_limit: i64,
    /// The age backlog quota, seconds (-1: none).
    pub backlog_quota_limit_time: i64,
    /// SENDs throttled by the topic's publish rate.
    pub publish_rate_limit_times: u64,
    /// Append latency (µs) buckets.
    pub write_latency: BucketCounts,
    /// Entry size (bytes) buckets.
    pub entry_size: BucketCounts,
    /// Bytes in the log not yet in the lake.
    pub offload_lag_bytes: u64,
    /// Age of the oldest of them, seconds.
    pub offload_lag_seconds: f64,
    /// This partition's share of its topic's in-rate (1 for a non-partitioned topic).
    pub in_rate_share: f64,
    /// Flagged hot.
    pub hot: bool,
    /// Its subscriptions.
    pub subscriptions_rows: Vec<SubscriptionRow>,
}

/// One subscription as a scrape reads it.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionRow {
    /// Subscription name.
    pub name: String,
    /// Entries not acknowledged (`msgBacklog`).
    pub back_log: u64,
    /// Bytes of them.
    pub backlog_size: u64,
    /// Age of the oldest, seconds.
    pub backlog_age_seconds: u64,
    /// Messages dispatched and not acknowledged.
    pub unacked_messages: u64,
    /// Dispatch paused by `maxUnackedMessagesPerSubscription`.
    pub blocked_on_unacked: bool,
    /// Messages and bytes per second dispatched.
    pub rate_out: f64,
    /// Bytes per second dispatched.
    pub throughput_out: f64,
    /// Acknowledged entries per second.
    pub ack_rate: f64,
    /// Entries per second expired (message TTL) or evicted (backlog quota).
    pub rate_expired: f64,
    /// Consumers connected.
    pub consumers: u64,
    /// Its next entry is in the lake (it replays from the lake).
    pub reading_lake: bool,
    /// The backlog grew across the last whole lag window.
    pub lag_growing: bool,
    /// Key_Shared consumers flagged hot.
    pub hot_consumers: u64,
}

type TopicGet = fn(&TopicRow) -> f64;
/// A bucket family: name prefix, help, the buckets read, the bucket suffixes.
type BucketFamily = (
    &'static str,
    &'static str,
    fn(&TopicRow) -> &BucketCounts,
    Vec<&'static str>,
);
type SubGet = fn(&SubscriptionRow) -> f64;

fn b(v: bool) -> f64 {
    if v {
        1.0
    } else {
        0.0
    }
}

/// Topic families: name, help, value.
const TOPIC_FAMILIES: &[(&str, &str, TopicGet)] = &[
    ("pulsar_rate_in", "Messages per second published", |r| {
        r.rate_in
    }),
    ("pulsar_rate_out", "Messages per second dispatched", |r| {
        r.rate_out
    }),
    ("pulsar_throughput_in", "Bytes per second published", |r| {
        r.throughput_in
    }),
    (
        "pulsar_throughput_out",
        "Bytes per second dispatched",
        |r| r.throughput_out,
    ),
    ("pulsar_in_messages_total", "Messages published", |r| {
        r.in_messages as f64
    }),
    ("pulsar_in_bytes_total", "Bytes published", |r| {
        r.in_bytes as f64
    }),
    ("pulsar_out_messages_total", "Messages dispatched", |r| {
        r.out_messages as f64
    }),
    ("pulsar_out_bytes_total", "Bytes dispatched", |r| {
        r.out_bytes as f64
    }),
    ("pulsar_producers_count", "Producers connected", |r| {
        r.producers as f64
    }),
    ("pulsar_consumers_count", "Consumers connected", |r| {
        r.consumers as f64
    }),
    ("pulsar_subscriptions_count", "Subscriptions", |r| {
        r.subscriptions as f64
    }),
    ("pulsar_storage_size", "Bytes in the local log", |r| {
        r.storage_size as f64
    }),
    (
        "pulsar_storage_offloaded_size",
        "Bytes offloaded to the lake",
        |r| r.offloaded_size as f64,
    ),
    (
        "pulsar_msg_backlog",
        "Entries in the subscriptions' backlogs, summed",
        |r| r.msg_backlog as f64,
    ),
    (
        "pulsar_storage_backlog_size",
        "Bytes of that backlog",
        |r| r.backlog_size as f64,
    ),
    (
        "pulsar_storage_backlog_age_seconds",
        "Age of the oldest unacknowledged message",
        |r| r.backlog_age_seconds as f64,
    ),
    (
        "pulsar_storage_backlog_quota_limit",
        "Backlog size quota in bytes (-1: none)",
        |r| r.backlog_quota_limit as f64,
    ),
    (
        "pulsar_storage_backlog_quota_limit_time",
        "Backlog age quota in seconds (-1: none)",
        |r| r.backlog_quota_limit_time as f64,
    ),
    (
        "pulsar_publish_rate_limit_times",
        "SENDs throttled by the publish rate",
        |r| r.publish_rate_limit_times as f64,
    ),
    ("pulsar_storage_write_latency_count", "Appends timed", |r| {
        r.write_latency.count as f64
    }),
    (
        "pulsar_storage_write_latency_sum",
        "Sum of append latencies, ms",
        |r| r.write_latency.sum as f64 / 1000.0,
    ),
    ("pulsar_entry_size_count", "Entries appended", |r| {
        r.entry_size.count as f64
    }),
    ("pulsar_entry_size_sum", "Sum of entry sizes, bytes", |r| {
        r.entry_size.sum as f64
    }),
    (
        "ledgerlake_offload_lag_bytes",
        "Bytes in the log not yet in the lake",
        |r| r.offload_lag_bytes as f64,
    ),
    (
        "ledgerlake_offload_lag_seconds",
        "Age of the oldest message not yet in the lake",
        |r| r.offload_lag_seconds,
    ),
    (
        "ledgerlake_partition_in_rate_share",
        "Share of its topic's in-rate (0..1)",
        |r| r.in_rate_share,
    ),
    (
        "ledgerlake_partition_hot",
        "1 when the partition is flagged hot",
        |r| b(r.hot),
    ),
];

/// Subscription families: name, help, value.
const SUBSCRIPTION_FAMILIES: &[(&str, &str, SubGet)] = &[
    (
        "pulsar_subscription_back_log",
        "Entries not acknowledged",
        |s| s.back_log as f64,
    ),
    (
        "pulsar_subscription_back_log_size",
        "Bytes not acknowledged",
        |s| s.backlog_size as f64,
    ),
    (
        "pulsar_subscription_backlog_age_seconds",
        "Age of the oldest unacknowledged message",
        |s| s.backlog_age_seconds as f64,
    ),
    (
        "pulsar_subscription_unacked_messages",
        "Messages dispatched, not acknowledged",
        |s| s.unacked_messages as f64,
    ),
    (
        "pulsar_subscription_blocked_on_unacked_messages",
        "1 when dispatch is paused",
        |s| b(s.blocked_on_unacked),
    ),
    (
        "pulsar_subscription_msg_rate_out",
        "Messages per second dispatched",
        |s| s.rate_out,
    ),
    (
        "pulsar_subscription_msg_throughput_out",
        "Bytes per second dispatched",
        |s| s.throughput_out,
    ),
    (
        "pulsar_subscription_msg_ack_rate",
        "Entries per second acknowledged",
        |s| s.ack_rate,
    ),
    (
        "pulsar_subscription_msg_rate_expired",
        "Entries per second expired or evicted",
        |s| s.rate_expired,
    ),
    (
        "pulsar_subscription_consumers_count",
        "Consumers connected",
        |s| s.consumers as f64,
    ),
    (
        "ledgerlake_subscription_reading_lake",
        "1 when the next entry is read from the lake",
        |s| b(s.reading_lake),
    ),
    (
        "ledgerlake_subscription_lag_growing",
        "1 when the backlog grew across the lag window",
        |s| b(s.lag_growing),
    ),
    (
        "ledgerlake_subscription_hot_consumers",
        "Key_Shared consumers flagged hot",
        |s| s.hot_consumers as f64,
    ),
];

/// The Pulsar families of one scrape.
#[derive(Debug)]
pub struct PulsarFamilies {
    /// The `cluster` label.
    pub cluster: String,
    /// The rows read.
    pub rows: Vec<TopicRow>,
    /// Series per topic (else summed per namespace).
    pub topic_level: bool,
}

fn encode_all<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    series: &[(L, &TopicRow)],
) -> Result<(), std::fmt::Error> {
    for (name, help, get) in TOPIC_FAMILIES {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, row) in series {
            family.encode_family(labels)?.encode_gauge(&get(row))?;
        }
    }
    let buckets: [BucketFamily; 2] = [
        (
            "pulsar_storage_write_latency_le_",
            "Appends whose latency (ms) fell in this bucket",
            |r| &r.write_latency,
            WRITE_LATENCY_US.iter().map(|(_, s)| *s).collect(),
        ),
        (
            "pulsar_entry_size_le_",
            "Entries whose size fell in this bucket",
            |r| &r.entry_size,
            ENTRY_SIZE_BYTES.iter().map(|(_, s)| *s).collect(),
        ),
    ];
    for (prefix, help, get, suffixes) in &buckets {
        let names = suffixes
            .iter()
            .map(|s| format!("{prefix}{s}"))
            .chain(std::iter::once(format!("{prefix}overflow")));
        for (i, name) in names.enumerate() {
            let mut family = encoder.encode_descriptor(&name, help, None, MetricType::Gauge)?;
            for (labels, row) in series {
                let v = get(row).counts.get(i).copied().unwrap_or(0);
                family.encode_family(labels)?.encode_gauge(&v)?;
            }
        }
    }
    Ok(())
}

impl Collector for PulsarFamilies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let cluster = self.cluster.as_str();
        if !self.topic_level {
            let by_ns = per_namespace(&self.rows);
            let series: Vec<([(&str, &str); 2], &TopicRow)> = by_ns
                .iter()
                .map(|(ns, (row, _))| ([("cluster", cluster), ("namespace", ns.as_str())], row))
                .collect();
            encode_all(&mut encoder, &series)?;
            return encode_topics_count(&mut encoder, cluster, &by_ns);
        }
        let series: Vec<([(&str, &str); 3], &TopicRow)> = self
            .rows
            .iter()
            .map(|r| {
                let labels = [
                    ("cluster", cluster),
                    ("namespace", r.namespace.as_str()),
                    ("topic", r.topic.as_str()),
                ];
                (labels, r)
            })
            .collect();
        encode_all(&mut encoder, &series)?;
        for (name, help, get) in SUBSCRIPTION_FAMILIES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for r in &self.rows {
                for s in &r.subscriptions_rows {
                    let labels = [
                        ("cluster", cluster),
                        ("namespace", r.namespace.as_str()),
                        ("topic", r.topic.as_str()),
                        ("subscription", s.name.as_str()),
                    ];
                    family.encode_family(&labels)?.encode_gauge(&get(s))?;
                }
            }
        }
        encode_topics_count(&mut encoder, cluster, &per_namespace(&self.rows))
    }
}

/// `pulsar_topics_count` per namespace.
fn encode_topics_count(
    encoder: &mut DescriptorEncoder,
    cluster: &str,
    by_ns: &BTreeMap<String, (TopicRow, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "pulsar_topics_count",
        "Topic partitions loaded",
        None,
        MetricType::Gauge,
    )?;
    for (ns, (_, topics)) in by_ns {
        let labels = [("cluster", cluster), ("namespace", ns.as_str())];
        family.encode_family(&labels)?.encode_gauge(topics)?;
    }
    Ok(())
}

impl TopicRow {
    /// Adds `r` into this sum: rates and counts added, ages, limits and shares their maximum,
    /// hot when either is (namespace sums, a partitioned topic's stats).
    pub fn add(&mut self, r: &TopicRow) {
        self.rate_in += r.rate_in;
        self.throughput_in += r.throughput_in;
        self.rate_out += r.rate_out;
        self.throughput_out += r.throughput_out;
        self.in_messages += r.in_messages;
        self.in_bytes += r.in_bytes;
        self.out_messages += r.out_messages;
        self.out_bytes += r.out_bytes;
        self.producers += r.producers;
        self.consumers += r.consumers;
        self.subscriptions += r.subscriptions;
        self.storage_size += r.storage_size;
        self.offloaded_size += r.offloaded_size;
        self.msg_backlog += r.msg_backlog;
        self.backlog_size += r.backlog_size;
        self.backlog_age_seconds = self.backlog_age_seconds.max(r.backlog_age_seconds);
        self.backlog_quota_limit = self.backlog_quota_limit.max(r.backlog_quota_limit);
        self.backlog_quota_limit_time = self
            .backlog_quota_limit_time
            .max(r.backlog_quota_limit_time);
        self.publish_rate_limit_times += r.publish_rate_limit_times;
        self.write_latency.add(&r.write_latency);
        self.entry_size.add(&r.entry_size);
        self.offload_lag_bytes += r.offload_lag_bytes;
        self.offload_lag_seconds = self.offload_lag_seconds.max(r.offload_lag_seconds);
        self.hot |= r.hot;
        self.in_rate_share = self.in_rate_share.max(r.in_rate_share);
    }
}

/// Rows summed per namespace ([`TopicRow::add`]), with the number of topic partitions summed.
fn per_namespace(rows: &[TopicRow]) -> BTreeMap<String, (TopicRow, u64)> {
    let mut out: BTreeMap<String, (TopicRow, u64)> = BTreeMap::new();
    for r in rows {
        let (s, topics) = out.entry(r.namespace.clone()).or_insert_with(|| {
            let sum = TopicRow {
                backlog_quota_limit: -1,
                backlog_quota_limit_time: -1,
                ..TopicRow::default()
            };
            (sum, 0)
        });
        *topics += 1;
        s.add(r);
    }
    out
}
