//! The typed configuration tree.
//!
//! Layers, later wins: built-in defaults → TOML file (`--config`) → `LEDGERLAKE_*` environment
//! variables (nested keys joined by `__`, e.g. `LEDGERLAKE_LEDGER__SYNC=never`) → command-line
//! flags. Unknown keys are errors naming the key; [`Config::validate`] runs at boot and refuses
//! inconsistent values with a message naming the setting. `deploy/ledgerlake.toml` is the
//! annotated default file and `schemas/config.schema.json` its JSON schema; tests keep both equal
//! to this code.

use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod autorecovery;
mod etcd_url;
mod inactive;
mod lake;
mod load;
mod metrics;
mod replay;
mod server;
mod sql;

pub use lake::{
    CatalogConfig, CatalogKind, LakeConfig, LakePartitioning, LakeTableLayout, PolicyDefaults,
    S3Config,
};

pub use autorecovery::AutoRecoveryConfig;
pub use inactive::{InactiveTopicDeleteMode, InactiveTopicsConfig};
pub use metrics::MetricsConfig;
pub use replay::ReplayConfig;
pub use server::ServerConfig;
pub use sql::SqlConfig;

pub use etcd_url::{EtcdUrl, DEFAULT_PREFIX};

pub use load::{
    load, AuthOverrides, BrokerOverrides, ConfigError, MetadataOverrides, Overrides,
    ServerOverrides, TelemetryOverrides, ENV_PREFIX,
};

/// The whole configuration of a ledgerlake service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Root directory of all local state: `ledger/` (the log), `metadata.db`, `catalog.db` and
    /// `warehouse/` unless configured elsewhere.
    pub data_dir: PathBuf,
    /// Listen addresses.
    pub server: ServerConfig,
    /// The Pulsar-protocol broker.
    pub broker: BrokerConfig,
    /// Logging.
    pub telemetry: TelemetryConfig,
    /// The durable segmented log.
    pub ledger: LedgerConfig,
    /// The metadata store.
    pub metadata: MetadataConfig,
    /// The lake (Iceberg) and the offload engine.
    pub lake: LakeConfig,
    /// Replay of offloaded ranges from the lake.
    pub replay: ReplayConfig,
    /// SQL over topics (PostgreSQL protocol, HTTP `POST /sql`, `ledgerlake sql`).
    pub sql: SqlConfig,
    /// Metrics, rates, hot-partition and lag-spiral warnings.
    pub metrics: MetricsConfig,
    /// Restoring lost copies of sealed ledgers (nodes of a cluster).
    pub autorecovery: AutoRecoveryConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            server: ServerConfig::default(),
            broker: BrokerConfig::default(),
            telemetry: TelemetryConfig::default(),
            ledger: LedgerConfig::default(),
            metadata: MetadataConfig::default(),
            lake: LakeConfig::default(),
            replay: ReplayConfig::default(),
            sql: SqlConfig::default(),
            metrics: MetricsConfig::default(),
            autorecovery: AutoRecoveryConfig::default(),
        }
    }
}

/// The Pulsar-protocol broker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Largest message (a batch with its metadata) accepted, advertised to clients in CONNECTED.
    /// A larger SEND gets a SEND_ERROR; a frame beyond it plus 64 KiB closes the connection.
    #[schemars(with = "String")]
    pub max_message_size: ByteSize,
    /// Create topics on first use by a producer or consumer.
    pub allow_auto_topic_creation: bool,
    /// Broker-side deduplication by producer name and sequence id (Pulsar semantics) for every
    /// namespace and topic that does not set its own (`/admin/v2/namespaces/{t}/{ns}/
    /// deduplication`, `.../{topic}/deduplicationEnabled`). Off by default, as in Pulsar.
    pub deduplication: bool,
    /// `host:port` clients are told to connect to in LOOKUP answers. Empty: `server.pulsar_addr`.
    pub advertised_address: String,
    /// Name of the cluster this service is (`/admin/v2/clusters`; the cluster of the default
    /// tenant `public` and of new namespaces). `standalone`, as Pulsar standalone.
    pub cluster_name: String,
    /// Interval of broker PINGs; a connection silent for twice this long is closed.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub keepalive: Duration,
    /// Client authentication on CONNECT.
    pub authentication: AuthenticationConfig,
    /// How often a durable subscription's acknowledgements are saved to the metadata store.
    /// After a crash, acknowledgements of the last interval may be redelivered (at least once).
    /// Also the broker's tick (quota checks, rate samples): shorter than `metrics.rate_window`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub cursor_persist_interval: Duration,
    /// How often namespaces' retention policies are applied to data nothing else brings up:
    /// without the lake, to the log; with it, to ledgers deleted locally or expired (every
    /// offload pass also applies them to the tables it visits, so new data meets a size
    /// limit at once). Pulsar's `retentionCheckIntervalInSeconds`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retention_check_interval: Duration,
    /// A topic partition with no producer, no consumer and nothing in flight for this long is
    /// unloaded from memory (its open ledger sealed, cursors and deduplication state saved);
    /// the next lookup, producer or consumer loads it again. `0s`: never.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub unload_idle_after: Duration,
    /// Shared and Key_Shared subscriptions stop dispatching to a consumer holding this many
    /// unacknowledged messages, and resume at half (Pulsar's `maxUnackedMessagesPerConsumer`;
    /// a namespace or topic may set its own; 0 = no limit).
    pub max_unacked_messages_per_consumer: u32,
    /// The same for a whole Shared or Key_Shared subscription
    /// (`maxUnackedMessagesPerSubscription`; 0 = no limit).
    pub max_unacked_messages_per_subscription: u32,
    /// The load manager of a cluster node: moves topics off a node well above the cluster's
    /// mean load.
    pub load_balancer: LoadBalancerConfig,
    /// Deleting inactive topics (Pulsar's `brokerDeleteInactiveTopics*`); off by default.
    pub delete_inactive_topics: InactiveTopicsConfig,
}

/// The load manager (Pulsar's load shedding, decentralised: each node sheds its own topics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LoadBalancerConfig {
    /// How often each node reports its load and, if overloaded, moves one topic away. `0s`:
    /// off.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub interval: Duration,
    /// A node is overloaded above the cluster's mean message rate × (1 + this).
    pub overload_threshold: f64,
    /// Below this many messages per second (in + out) a node never sheds.
    pub min_rate: f64,
}

impl Default for LoadBalancerConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            overload_threshold: 0.25,
            min_rate: 100.0,
        }
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            max_message_size: ByteSize::mib(5),
            allow_auto_topic_creation: true,
            deduplication: false,
            advertised_address: String::new(),
            cluster_name: "standalone".into(),
            keepalive: Duration::from_secs(30),
            cursor_persist_interval: Duration::from_secs(1),
            retention_check_interval: Duration::from_secs(120),
            unload_idle_after: Duration::from_secs(600),
            authentication: AuthenticationConfig::default(),
            max_unacked_messages_per_consumer: 50_000,
            max_unacked_messages_per_subscription: 200_000,
            load_balancer: LoadBalancerConfig::default(),
            delete_inactive_topics: InactiveTopicsConfig::default(),
        }
    }
}

/// Client authentication (Pulsar's `token` method: opaque tokens listed here, or JSON Web
/// Tokens checked with a key). Off by default for the embedded config. The same credentials
/// work on the Pulsar protocol, the admin API (`Authorization: Bearer`) and SQL (PostgreSQL
/// password, HTTP Bearer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AuthenticationConfig {
    /// Refuse connections without valid credentials.
    pub enabled: bool,
    /// Accepted opaque tokens and the role each authenticates as (`"<token>" = "<role>"`).
    pub tokens: std::collections::BTreeMap<String, String>,
    /// HS256 secret key for JWTs: a file of raw key bytes (`ledgerlake token
    /// create-secret-key`) or `data:;base64,<key>`.
    pub token_secret_key: Option<String>,
    /// Public key for JWTs signed with a private key: a DER or PEM file (`ledgerlake token
    /// create-key-pair`) or `data:;base64,<der>`.
    pub token_public_key: Option<String>,
    /// Algorithm of `token_public_key`: RS256 (default), RS384, RS512, PS256, PS384, PS512
    /// (one RSA key accepts all six), ES256 or ES384.
    pub token_public_alg: String,
    /// The claim holding the role.
    pub token_auth_claim: String,
    /// When set, JWTs must carry this audience (`aud`).
    pub token_audience: Option<String>,
    /// Roles allowed everything: tenants, clusters, every namespace and topic (Pulsar's
    /// `superUserRoles`). Every other role needs to be a tenant's admin or to be granted
    /// `produce` / `consume` on a namespace or topic.
    pub superuser_roles: Vec<String>,
    /// How often Pulsar connections are checked for expired credentials. An expired one is
    /// asked for fresh credentials (AUTH_CHALLENGE) and closed if none come by the next check,
    /// if they name another role, or if the client cannot refresh.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub refresh_check_interval: Duration,
    /// The token this node presents to the bookie listeners of the other nodes of its cluster
    /// (Pulsar's `brokerClientAuthenticationParameters`): a token of a role in
    /// `superuser_roles`, or `file:PATH` of a file holding one (read at start: restart to
    /// rotate it). With authentication on, a bookie listener serves only connections that
    /// present such a token first, and every node of a cluster needs one; with it off, no
    /// token is sent.
    pub node_token: Option<String>,
}

impl Default for AuthenticationConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            tokens: Default::default(),
            token_secret_key: None,
            token_public_key: None,
            token_public_alg: "RS256".into(),
            token_auth_claim: "sub".into(),
            token_audience: None,
            superuser_roles: Vec::new(),
            refresh_check_interval: Duration::from_secs(60),
            node_token: None,
        }
    }
}

/// Log output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// `human` (readable lines; colours on a terminal) or `json` (one object per line).
    pub log_format: LogFormat,
    /// Filter in `tracing` env-filter syntax, e.g. `info` or `ledgerlake=debug,info`.
    /// `RUST_LOG`, when set, wins.
    pub log_level: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Human,
            log_level: "info".into(),
        }
    }
}

/// Format of log lines.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// When appends are made durable.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum SyncPolicy {
    /// `fdatasync` before acknowledging (group commit shares one call between many appends).
    Always,
    /// Acknowledge after `write`; `fdatasync` every `sync_interval`. A crash can lose
    /// acknowledged appends of the last interval.
    #[value(name = "interval_ms")]
    IntervalMs,
    /// Never `fdatasync` (except when a segment rolls and at shutdown). UNSAFE: a power loss
    /// loses acknowledged appends. For benchmarks only.
    Never,
}

/// The durable segmented log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LedgerConfig {
    /// Size of one segment file of the journal (all topics share segments). At most 4 GiB.
    #[schemars(with = "String")]
    pub segment_size: ByteSize,
    /// Reserve each segment's space when it is created, so that `fdatasync` need not update the
    /// file size on every group commit.
    pub preallocate: bool,
    /// A ledger rolls over (is sealed, a new one opened) once it holds this many payload bytes.
    #[schemars(with = "String")]
    pub rollover_size: ByteSize,
    /// ... or this many entries.
    pub rollover_entries: u64,
    /// ... or when it has been open this long since its first entry (checked on append and at
    /// that deadline).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub rollover_age: Duration,
    /// Durability policy: `always` (default), `interval_ms`, or `never` (unsafe, benchmarks only).
    pub sync: SyncPolicy,
    /// Interval between `fdatasync` calls under `sync = "interval_ms"`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub sync_interval: Duration,
    /// Largest entry accepted (a Pulsar batch with its metadata).
    #[schemars(with = "String")]
    pub max_entry_size: ByteSize,
    /// Most bytes written by one group commit before it is made durable.
    #[schemars(with = "String")]
    pub group_commit_max_size: ByteSize,
    /// Bytes of appends queued or in flight before appenders wait (backpressure).
    #[schemars(with = "String")]
    pub max_pending_size: ByteSize,
    /// Broker-wide memory for recent entries served to live consumers without disk reads.
    #[schemars(with = "String")]
    pub tail_cache_size: ByteSize,
    /// Cap of one topic's share of the tail cache.
    #[schemars(with = "String")]
    pub tail_cache_topic_size: ByteSize,
    /// Sealed-ledger indexes kept in memory.
    pub index_cache_ledgers: usize,
    /// Segment files kept open for reads.
    pub max_open_segments: usize,
    /// Appends are refused (retriable: producers get SEND_ERROR and retry) while the volume of
    /// the log is fuller than this fraction, or has less room than two segments, so that the
    /// journal never runs out of space mid-write (BookKeeper's `diskUsageThreshold`). Appends
    /// resume by themselves when space returns.
    pub max_disk_usage: f64,
    /// Local-disk budget of the log: appends are refused the same way while its segment files
    /// take more than this, e.g. while the lake is unreachable and nothing can be offloaded.
    /// 0 = no budget beyond `max_disk_usage`.
    #[schemars(with = "String")]
    pub max_local_size: ByteSize,
    /// How often the volume's free space and the log's size are checked.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub disk_check_interval: Duration,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            segment_size: ByteSize::mib(256),
            preallocate: true,
            rollover_size: ByteSize::mib(64),
            rollover_entries: 500_000,
            rollover_age: Duration::from_secs(600),
            sync: SyncPolicy::Always,
            sync_interval: Duration::from_millis(10),
            max_entry_size: ByteSize::mib(8),
            group_commit_max_size: ByteSize::mib(4),
            max_pending_size: ByteSize::mib(64),
            tail_cache_size: ByteSize::mib(256),
            tail_cache_topic_size: ByteSize::mib(16),
            index_cache_ledgers: 256,
            max_open_segments: 64,
            max_disk_usage: 0.95,
            max_local_size: ByteSize::b(0),
            disk_check_interval: Duration::from_secs(1),
        }
    }
}

/// The metadata store (topics, ledgers, cursors).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataConfig {
    /// `sqlite:PATH` URL of the store, or `etcd://host:port[,host:port…][/prefix]` for nodes
    /// of a cluster (prefix default `/ledgerlake`). Empty: `sqlite:<data_dir>/metadata.db`.
    pub url: String,
    /// Time-to-live of the node's etcd session (its lease): a node that stops renewing drops
    /// out of the cluster after this long, and knows it has after two thirds of it. Whole
    /// seconds, at least 2 s (etcd's minimum).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub session_ttl: Duration,
    /// How often each node of a cluster probes the others: a node whose bookie and Pulsar
    /// addresses both refuse connections (no process listens there) twice in a row has its
    /// session ended by the prober at once, so its topics move in about a second rather than
    /// after `session_ttl`. A node that does not answer at all (hung, cut off) is left to its
    /// lease. 0 turns probing off.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub peer_probe_interval: Duration,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        MetadataConfig {
            url: String::new(),
            session_ttl: Duration::from_secs(10),
            peer_probe_interval: Duration::from_millis(500),
        }
    }
}

impl Config {
    /// Directory of the log's segment and index files.
    pub fn ledger_dir(&self) -> PathBuf {
        self.data_dir.join("ledger")
    }

    /// Root of the lake's warehouse as a location Iceberg understands (`file:/abs/path` or
    /// `s3://bucket/prefix`).
    pub fn warehouse_location(&self) -> String {
        let w = self.lake.warehouse.trim_end_matches('/');
        if w.starts_with("s3://") || w.starts_with("s3a://") || w.starts_with("file:") {
            return w.to_string();
        }
        let dir = if w.is_empty() {
            self.data_dir.join("warehouse")
        } else {
            PathBuf::from(w)
        };
        let abs = std::path::absolute(&dir).unwrap_or(dir);
        format!("file:{}", abs.display())
    }

    /// URI of the SQL catalog (`sqlite:` or `postgres://`), defaulted under `data_dir`.
    pub fn catalog_uri(&self) -> String {
        if !self.lake.catalog.uri.is_empty() {
            return self.lake.catalog.uri.clone();
        }
        let path = self.data_dir.join("catalog.db");
        let abs = std::path::absolute(&path).unwrap_or(path);
        format!("sqlite:{}?mode=rwc", abs.display())
    }

    /// Checks values that are individually well-typed but inconsistent or out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = &self.ledger;
        let invalid = |key: &str, why: String| {
            Err(ConfigError::Invalid {
                key: key.to_string(),
                reason: why,
            })
        };
        if l.segment_size.as_u64() > u64::from(u32::MAX) {
            return invalid(
                "ledger.segment_size",
                format!("{} exceeds 4 GiB", l.segment_size),
            );
        }
        if l.segment_size.as_u64() < ByteSize::mib(1).as_u64() {
            return invalid("ledger.segment_size", "must be at least 1 MiB".into());
        }
        if l.max_entry_size.as_u64() + 64 > l.segment_size.as_u64() / 2 {
            return invalid(
                "ledger.max_entry_size",
                format!(
                    "{} must be under half of ledger.segment_size ({})",
                    l.max_entry_size, l.segment_size
                ),
            );
        }
        if l.max_pending_size.as_u64() < l.max_entry_size.as_u64() {
            return invalid(
                "ledger.max_pending_size",
                "must be at least ledger.max_entry_size".into(),
            );
        }
        if l.max_pending_size.as_u64() > u64::from(u32::MAX) {
            return invalid("ledger.max_pending_size", "exceeds 4 GiB".into());
        }
        if !(l.max_disk_usage > 0.0 && l.max_disk_usage <= 1.0) {
            return invalid("ledger.max_disk_usage", "must be in (0, 1]".into());
        }
        if l.max_local_size.as_u64() != 0 && l.max_local_size.as_u64() < 2 * l.segment_size.as_u64()
        {
            return invalid(
                "ledger.max_local_size",
                "must be 0 (no budget) or at least two segments (ledger.segment_size)".into(),
            );
        }
        if l.disk_check_interval.is_zero() {
            return invalid("ledger.disk_check_interval", "must be positive".into());
        }
        if l.rollover_entries == 0 {
            return invalid("ledger.rollover_entries", "must be at least 1".into());
        }
        if l.rollover_size.as_u64() == 0 {
            return invalid("ledger.rollover_size", "must be positive".into());
        }
        if l.rollover_age.is_zero() {
            return invalid("ledger.rollover_age", "must be positive".into());
        }
        if l.sync == SyncPolicy::IntervalMs && l.sync_interval.is_zero() {
            return invalid("ledger.sync_interval", "must be positive".into());
        }
        if l.group_commit_max_size.as_u64() == 0 {
            return invalid("ledger.group_commit_max_size", "must be positive".into());
        }
        if l.max_open_segments == 0 || l.index_cache_ledgers == 0 {
            return invalid(
                "ledger.max_open_segments",
                "max_open_segments and index_cache_ledgers must be at least 1".into(),
            );
        }
        if self.broker.max_message_size.as_u64() + 64 * 1024 > l.max_entry_size.as_u64() {
            return invalid(
                "broker.max_message_size",
                format!(
                    "{} plus 64 KiB of metadata must fit in ledger.max_entry_size ({})",
                    self.broker.max_message_size, l.max_entry_size
                ),
            );
        }
        let auth = &self.broker.authentication;
        if auth.enabled
            && auth.tokens.is_empty()
            && auth.token_secret_key.is_none()
            && auth.token_public_key.is_none()
        {
            return invalid(
                "broker.authentication",
                "authentication is enabled but no token, token_secret_key or token_public_key \
                 is configured"
                    .into(),
            );
        }
        if auth.refresh_check_interval.is_zero() {
            return invalid(
                "broker.authentication.refresh_check_interval",
                "must be positive".into(),
            );
        }
        if self.broker.cursor_persist_interval.is_zero() {
            return invalid("broker.cursor_persist_interval", "must be positive".into());
        }
        if self.broker.retention_check_interval.is_zero() {
            return invalid("broker.retention_check_interval", "must be positive".into());
        }
        if self.broker.keepalive.is_zero() {
            return invalid("broker.keepalive", "must be positive".into());
        }
        let m = &self.metrics;
        if m.rate_window < Duration::from_secs(1) {
            return invalid("metrics.rate_window", "must be at least 1s".into());
        }
        if m.enabled && self.broker.cursor_persist_interval >= m.rate_window {
            // Rates are sampled at that tick: a window without two samples reads as no rate.
            return invalid(
                "broker.cursor_persist_interval",
                format!(
                    "must be shorter than metrics.rate_window ({:?}): the rates are sampled at \
                     that interval",
                    m.rate_window
                ),
            );
        }
        if m.lag_window < Duration::from_secs(1) {
            return invalid("metrics.lag_window", "must be at least 1s".into());
        }
        if !(m.hot_share_factor > 1.0 && m.hot_share_factor.is_finite()) {
            return invalid(
                "metrics.hot_share_factor",
                "must be a number above 1".into(),
            );
        }
        if !(m.hot_min_rate >= 0.0 && m.hot_min_rate.is_finite()) {
            return invalid("metrics.hot_min_rate", "must be 0 or more".into());
        }
        if self.autorecovery.audit_interval < Duration::from_secs(1) {
            return invalid("autorecovery.audit_interval", "must be at least 1s".into());
        }
        let auth = &self.broker.authentication;
        let clustered =
            self.server.bookie_addr.is_some() || self.metadata.url.starts_with("etcd://");
        if auth.enabled && clustered && auth.node_token.is_none() {
            return invalid(
                "broker.authentication.node_token",
                "a node of a cluster needs a superuser token to present to the other nodes' bookies when authentication is on".into(),
            );
        }
        if auth
            .node_token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty() || t == "file:")
        {
            return invalid("broker.authentication.node_token", "is empty".into());
        }
        // A node of a cluster is dialled by the others (and its clients are sent to it) at
        // its advertised host, which is the Pulsar listener's when none is set: a listener
        // bound to every interface names no host anybody can dial.
        let s = &self.server;
        let everywhere = [
            Some(s.pulsar_addr),
            s.pulsar_tls_addr,
            Some(s.http_addr),
            s.https_addr,
            s.bookie_addr,
        ]
        .into_iter()
        .flatten()
        .find(|a| a.ip().is_unspecified());
        if let Some(addr) = everywhere.filter(|_| clustered) {
            if self.broker.advertised_address.is_empty() {
                return invalid(
                    "broker.advertised_address",
                    format!(
                        "a node of a cluster with a listener bound to every interface ({addr}) \
                         must name the host the other nodes reach it at"
                    ),
                );
            }
        }
        let advertised = &self.broker.advertised_address;
        if !advertised.is_empty() && split_host_port(advertised).is_none() {
            return invalid(
                "broker.advertised_address",
                format!("{advertised:?} is not host:port (an IPv6 host in brackets: [::1]:6650)"),
            );
        }
        if self.metadata.session_ttl < Duration::from_secs(2) {
            return invalid("metadata.session_ttl", "must be at least 2s".into());
        }
        let url = &self.metadata.url;
        if url.starts_with("etcd://") {
            if let Err(e) = EtcdUrl::parse(url) {
                return invalid("metadata.url", e);
            }
        } else if !url.is_empty() && !url.starts_with("sqlite:") {
            return invalid(
                "metadata.url",
                format!("'{url}': expected sqlite:PATH or etcd://host:port[,host:port…][/prefix]"),
            );
        }
        self.server.validate()?;
        self.validate_lake()
    }

    fn validate_lake(&self) -> Result<(), ConfigError> {
        let lake = &self.lake;
        let invalid = |key: &str, why: String| {
            Err(ConfigError::Invalid {
                key: key.to_string(),
                reason: why,
            })
        };
        let w = lake.warehouse.as_str();
        if w.contains("://") && !(w.starts_with("s3://") || w.starts_with("s3a://")) {
            return invalid(
                "lake.warehouse",
                format!("'{w}': use a local path or an s3:// location"),
            );
        }
        if lake.target_file_size.as_u64() < ByteSize::kib(64).as_u64() {
            return invalid("lake.target_file_size", "must be at least 64 KiB".into());
        }
        if lake.batch_rows == 0 {
            return invalid("lake.batch_rows", "must be at least 1".into());
        }
        if lake.check_interval.is_zero() || lake.orphan_check_interval.is_zero() {
            return invalid(
                "lake.check_interval",
                "check_interval and orphan_check_interval must be positive".into(),
            );
        }
        if lake.max_concurrent_tables == 0 {
            return invalid("lake.max_concurrent_tables", "must be at least 1".into());
        }
        let r = &self.replay;
        if r.threads == 0 || r.max_concurrent_scans == 0 {
            return invalid(
                "replay.threads",
                "threads and max_concurrent_scans must be at least 1".into(),
            );
        }
        if r.read_ahead.as_u64() == 0
            || r.read_ahead > r.topic_budget
            || r.topic_budget > r.broker_budget
            || r.broker_budget.as_u64() > u64::from(u32::MAX)
        {
            return invalid(
                "replay.read_ahead",
                "need 0 < read_ahead <= topic_budget <= broker_budget <= 4 GiB".into(),
            );
        }
        let q = &self.sql;
        if q.threads == 0 || q.max_concurrent_queries == 0 {
            return invalid(
                "sql.threads",
                "threads and max_concurrent_queries must be at least 1".into(),
            );
        }
        if !(0..=19).contains(&q.thread_niceness) {
            return invalid(
                "sql.thread_niceness",
                format!("{} is not a nice value from 0 to 19", q.thread_niceness),
            );
        }
        if q.memory_limit.as_u64() < (16 << 20) || q.query_timeout.is_zero() {
            return invalid(
                "sql.memory_limit",
                "need memory_limit >= 16 MiB and a positive query_timeout".into(),
            );
        }
        if lake.catalog.name.trim().is_empty() {
            return invalid("lake.catalog.name", "must not be empty".into());
        }
        let uri = lake.catalog.uri.as_str();
        match lake.catalog.kind {
            CatalogKind::Sql => {
                if !(uri.is_empty()
                    || uri.starts_with("sqlite:")
                    || uri.starts_with("postgres://")
                    || uri.starts_with("postgresql://"))
                {
                    return invalid(
                        "lake.catalog.uri",
                        format!("'{uri}': the SQL catalog takes sqlite: or postgres:// URIs"),
                    );
                }
            }
            CatalogKind::Rest => {
                if !(uri.starts_with("http://") || uri.starts_with("https://")) {
                    return invalid(
                        "lake.catalog.uri",
                        format!("'{uri}': the REST catalog needs an http(s):// URI"),
                    );
                }
            }
        }
        Ok(())
    }
}

/// `host:port` split at its port: a host name (letters, digits, `-`, `.`, `_`), an IPv4
/// address or an IPv6 one in brackets (kept; no scope id), and a port number (digits only).
/// `None` for anything else, a bare IPv6 address included. The one place addresses are split.
pub fn split_host_port(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port = port.parse().ok()?;
    // A scope id (`%eth0`) names an interface of this host only.
    if !host.contains('%') && address.parse::<std::net::SocketAddr>().is_ok() {
        return Some((host, port));
    }
    let named = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
    named.then_some((host, port))
}
