//! ledgerlake's own node-wide families: the journal, the offload engine, the lake, replay and
//! SQL record into [`node()`], one set per process (as a JVM's metrics are per broker).
//!
//! Invariant: every family is registered in [`NodeMetrics::registry`] once, at first use, under
//! the name `GET /metrics` shows; recording never allocates (label values are fixed strings).

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The node-wide families.
#[derive(Debug)]
pub struct NodeMetrics {
    /// Seconds each journal `fdatasync` took.
    pub journal_fsync_seconds: Histogram,
    /// Appends (write batches) one `fdatasync` made durable.
    pub journal_group_commit_batches: Histogram,
    /// Seconds each lake commit (write Parquet + catalog commit) took.
    pub lake_commit_seconds: Histogram,
    /// Lake commits (offload passes of a table) that failed.
    pub lake_commit_failures: Counter,
    /// Entries subscriptions and readers read, by the tier that served them.
    pub replay_entries: Family<TierLabel, Counter>,
    /// Bytes of those entries.
    pub replay_bytes: Family<TierLabel, Counter>,
    /// SQL queries by outcome.
    pub sql_queries: Family<OutcomeLabel, Counter>,
    /// Seconds SQL queries took, by outcome.
    pub sql_query_seconds: Family<OutcomeLabel, Histogram>,
    /// SQL queries running now (planned and not yet finished, cancelled or timed out).
    pub sql_queries_running: Gauge,
    /// Topic partitions loaded in the broker now.
    pub topics_loaded: Gauge,
    /// Loaded topic partitions the stats tick samples now (those that changed lately; an idle
    /// loaded topic is not among them).
    pub topics_watched: Gauge,
    /// Topic logs the log holds in memory: those of loaded topics, and of unloaded ones still
    /// held (a seal being tried again or failed for good, a manual offload's).
    pub topic_logs: Gauge,
    /// Seconds each topic load took (claim, log, deduplication state, subscriptions).
    pub topic_load_seconds: Histogram,
    /// Topic partitions unloaded because they were idle.
    pub topics_unloaded_idle: Counter,
    /// Topic owners that failed (panicked): their clients were closed and the topic loads
    /// anew on its next lookup.
    pub topic_owner_failures: Counter,
    /// Open ledgers of writers that were gone, fenced, recovered and sealed here.
    pub ledgers_taken_over: Counter,
    /// Replacements of failed replicas of open ledgers this node writes (ADR 0016): the
    /// replica replaced in the ledger's ensemble, or not (an open ledger then rolls).
    pub ensemble_changes: Family<OutcomeLabel, Counter>,
    /// Sealed ledgers with fewer live copies than their write quorum (as far as live bookies
    /// allow), as this node's last autorecovery audit found them (every node audits the whole
    /// cluster: the figure is the cluster's, not a share to be summed).
    pub ledgers_under_replicated: Gauge,
    /// Copies of under-replicated ledgers this node made and recorded.
    pub ledgers_rereplicated: Counter,
    /// Payload bytes of those copies.
    pub rereplicated_bytes: Counter,
    /// Copies this node started and dropped (unreadable, mismatched, or another copy won).
    pub rereplication_failures: Counter,
    /// Sessions of peers this node found gone (both listeners refusing) and ended.
    pub peer_sessions_ended: Counter,
    registry: Registry,
}

/// `tier="local|lake"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    /// `local` or `lake`.
    pub tier: &'static str,
}

/// `outcome="ok|error|timeout|cancelled"` (SQL), `outcome="replaced|not_replaced"` (ensemble changes).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `ok`, `error`, `timeout` or `cancelled`; `replaced` or `not_replaced`.
    pub outcome: &'static str,
}

fn seconds_histogram() -> Histogram {
    // 100 µs .. ~3.3 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

impl NodeMetrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let m = NodeMetrics {
            journal_fsync_seconds: seconds_histogram(),
            journal_group_commit_batches: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            lake_commit_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            lake_commit_failures: Counter::default(),
            replay_entries: Family::default(),
            replay_bytes: Family::default(),
            sql_queries: Family::default(),
            sql_query_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 18))
            }),
            sql_queries_running: Gauge::default(),
            topics_loaded: Gauge::default(),
            topics_watched: Gauge::default(),
            topic_logs: Gauge::default(),
            topic_load_seconds: seconds_histogram(),
            topics_unloaded_idle: Counter::default(),
            topic_owner_failures: Counter::default(),
            ledgers_taken_over: Counter::default(),
            ensemble_changes: Family::default(),
            ledgers_under_replicated: Gauge::default(),
            ledgers_rereplicated: Counter::default(),
            rereplicated_bytes: Counter::default(),
            rereplication_failures: Counter::default(),
            peer_sessions_ended: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "ledgerlake_journal_fsync_seconds",
            "Seconds each journal fdatasync took",
            m.journal_fsync_seconds.clone(),
        );
        registry.register(
            "ledgerlake_journal_group_commit_batches",
            "Write batches one journal fdatasync made durable (group commit size)",
            m.journal_group_commit_batches.clone(),
        );
        registry.register(
            "ledgerlake_lake_commit_seconds",
            "Seconds each lake commit (Parquet files written and the catalog commit) took",
            m.lake_commit_seconds.clone(),
        );
        registry.register(
            "ledgerlake_lake_commit_failures",
            "Lake commits (offload passes of a table) that failed",
            m.lake_commit_failures.clone(),
        );
        registry.register(
            "ledgerlake_replay_entries",
            "Entries read for subscriptions and readers, by the tier that served them",
            m.replay_entries.clone(),
        );
        registry.register(
            "ledgerlake_replay_bytes",
            "Bytes of entries read for subscriptions and readers, by tier",
            m.replay_bytes.clone(),
        );
        registry.register(
            "ledgerlake_sql_queries",
            "SQL queries by outcome",
            m.sql_queries.clone(),
        );
        registry.register(
            "ledgerlake_sql_query_seconds",
            "Seconds SQL queries took, by outcome",
            m.sql_query_seconds.clone(),
        );
        registry.register(
            "ledgerlake_sql_queries_running",
            "SQL queries running now",
            m.sql_queries_running.clone(),
        );
        registry.register(
            "ledgerlake_topics_loaded",
            "Topic partitions loaded in the broker now",
            m.topics_loaded.clone(),
        );
        registry.register(
            "ledgerlake_topics_watched",
            "Loaded topic partitions whose rates the stats tick samples now (changed lately)",
            m.topics_watched.clone(),
        );
        registry.register(
            "ledgerlake_topic_logs_in_memory",
            "Topic logs held in memory: loaded topics', and unloaded ones' still held (a seal being tried again or failed for good, a manual offload's)",
            m.topic_logs.clone(),
        );
        registry.register(
            "ledgerlake_topic_load_seconds",
            "Seconds each topic partition load took",
            m.topic_load_seconds.clone(),
        );
        registry.register(
            "ledgerlake_topics_unloaded_idle",
            "Topic partitions unloaded because they were idle (broker.unload_idle_after)",
            m.topics_unloaded_idle.clone(),
        );
        registry.register(
            "ledgerlake_topic_owner_failures",
            "Topic owners that failed (a defect): their clients were closed and the topic loads anew on its next lookup",
            m.topic_owner_failures.clone(),
        );
        registry.register(
            "ledgerlake_ledgers_taken_over",
            "Open ledgers of writers that were gone, fenced on their replicas, recovered and sealed by this node",
            m.ledgers_taken_over.clone(),
        );
        registry.register(
            "ledgerlake_ensemble_changes",
            "Replicas that failed during writes of open ledgers written here: outcome=replaced (another bookie took the place in the same ledger, after others that failed while catching up) or not_replaced (left out: too few bookies left, another replacement under way, the limit of 3 per ledger reached, no spare bookie, a step failed, the ledger was sealed meanwhile or the node stopped; an open ledger then rolls)",
            m.ensemble_changes.clone(),
        );
        registry.register(
            "ledgerlake_ledgers_under_replicated",
            "Sealed ledgers with fewer live copies than their write quorum, at this node's last autorecovery audit (cluster-wide)",
            m.ledgers_under_replicated.clone(),
        );
        registry.register(
            "ledgerlake_ledgers_rereplicated",
            "Copies of under-replicated ledgers this node made, checked against the seal and recorded",
            m.ledgers_rereplicated.clone(),
        );
        registry.register(
            "ledgerlake_rereplicated_bytes",
            "Payload bytes of the ledger copies autorecovery made on this node",
            m.rereplicated_bytes.clone(),
        );
        registry.register(
            "ledgerlake_rereplication_failures",
            "Ledger copies autorecovery started on this node and dropped",
            m.rereplication_failures.clone(),
        );
        registry.register(
            "ledgerlake_peer_sessions_ended",
            "Sessions of peer nodes this node found gone (bookie and Pulsar addresses refusing connections) and ended, so their topics moved before their leases ran out",
            m.peer_sessions_ended.clone(),
        );
        NodeMetrics { registry, ..m }
    }

    /// The registry of these families (for encoding).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records entries read from `tier` (`local` or `lake`).
    pub fn replay_read(&self, tier: &'static str, entries: u64, bytes: u64) {
        let label = TierLabel { tier };
        self.replay_entries.get_or_create(&label).inc_by(entries);
        self.replay_bytes.get_or_create(&label).inc_by(bytes);
    }

    /// Records one SQL query's outcome and duration.
    pub fn sql_query(&self, outcome: &'static str, took: Duration) {
        let label = OutcomeLabel { outcome };
        self.sql_queries.get_or_create(&label).inc();
        self.sql_query_seconds
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }
}

/// Space on the volume of the log's directory, read at scrape time.
#[derive(Debug, Clone, Copy)]
pub struct DataDir {
    /// Bytes available to the service.
    pub available_bytes: u64,
    /// Size of the volume.
    pub size_bytes: u64,
}

impl prometheus_client::collector::Collector for DataDir {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType;
        for (name, help, v) in [
            (
                "ledgerlake_data_dir_available_bytes",
                "Bytes available on the volume of the log's directory",
                self.available_bytes,
            ),
            (
                "ledgerlake_data_dir_size_bytes",
                "Size of the volume of the log's directory",
                self.size_bytes,
            ),
        ] {
            encoder
                .encode_descriptor(name, help, None, MetricType::Gauge)?
                .encode_gauge(&v)?;
        }
        Ok(())
    }
}

/// The process's node-wide families.
pub fn node() -> &'static NodeMetrics {
    static NODE: OnceLock<NodeMetrics> = OnceLock::new();
    NODE.get_or_init(NodeMetrics::new)
}
