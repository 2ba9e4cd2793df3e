//! Configuration of the lake (Iceberg catalog, warehouse storage) and of the offload engine,
//! including the namespace-policy defaults that apply until a namespace sets its own.

use std::collections::BTreeMap;
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The lake: where sealed ledgers go, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LakeConfig {
    /// Run the offload engine. When off, ledgers stay local (and nothing is written to the lake).
    pub enabled: bool,
    /// Warehouse root: empty = `<data_dir>/warehouse` on local disk; or an absolute path; or
    /// `s3://bucket/prefix` (see `[lake.s3]`).
    pub warehouse: String,
    /// The Iceberg catalog.
    pub catalog: CatalogConfig,
    /// S3 connection, used when the warehouse is an `s3://` location.
    pub s3: S3Config,
    /// Target size of one Parquet data file. Several sealed ledgers are buffered into one
    /// commit until about this much Parquet is expected.
    #[schemars(with = "String")]
    pub target_file_size: ByteSize,
    /// Rows per Arrow batch handed to the Parquet writer. Row groups end at a batch boundary
    /// once about 16 MiB are encoded. Smaller batches reuse warm memory (8192 rows of 100 B
    /// messages are about 1 MiB of payload); see benches/RESULTS.md.
    pub batch_rows: usize,
    /// How often the offload engine looks for work (it is also woken when a ledger seals).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub check_interval: Duration,
    /// Files under a table's data folder that no snapshot references are deleted once they
    /// are older than this (files of failed or crashed offload attempts).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub orphan_file_age: Duration,
    /// How often orphan files are looked for.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub orphan_check_interval: Duration,
    /// Files that retention (or a topic's deletion from a shared table) removed from a table
    /// stay in storage this long after the removal's commit, for readers that planned their
    /// scan on an earlier snapshot; then the earlier snapshots expire and the files are
    /// deleted. `0s` deletes them at once.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub removed_file_grace: Duration,
    /// Tables offloaded at the same time (each table has exactly one writer).
    pub max_concurrent_tables: usize,
    /// Deleting a topic also drops its lake table and deletes the table's files (as Pulsar
    /// deletes offloaded data with its topic); false keeps the table.
    pub drop_table_on_topic_delete: bool,
    /// Defaults of the namespace offload policies (`/admin/v2/namespaces/{t}/{ns}/...`).
    pub policy_defaults: PolicyDefaults,
}

impl Default for LakeConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            warehouse: String::new(),
            catalog: CatalogConfig::default(),
            s3: S3Config::default(),
            target_file_size: ByteSize::mib(128),
            batch_rows: 8_192,
            check_interval: Duration::from_secs(1),
            orphan_file_age: Duration::from_secs(3600),
            orphan_check_interval: Duration::from_secs(600),
            removed_file_grace: Duration::from_secs(600),
            max_concurrent_tables: 2,
            drop_table_on_topic_delete: true,
            policy_defaults: PolicyDefaults::default(),
        }
    }
}

/// Kind of Iceberg catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatalogKind {
    /// SQL catalog (Iceberg's JDBC catalog layout) on SQLite or PostgreSQL.
    Sql,
    /// Iceberg REST catalog (Polaris, Lakekeeper, Nessie, Tabular-style services).
    Rest,
}

/// The Iceberg catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogConfig {
    /// `sql` or `rest`.
    pub kind: CatalogKind,
    /// Catalog name (the SQL catalog's `catalog_name` column; shown in stats).
    pub name: String,
    /// SQL: `sqlite:PATH` or `postgres://user:pass@host:port/db`; empty =
    /// `sqlite:<data_dir>/catalog.db`. REST: the service's base URL.
    pub uri: String,
    /// Extra catalog properties passed through unchanged, e.g. for REST `credential`, `token`,
    /// `oauth2-server-uri`, `scope`, `warehouse`, `prefix`, `header.*`.
    pub properties: BTreeMap<String, String>,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        Self {
            kind: CatalogKind::Sql,
            name: "ledgerlake".into(),
            uri: String::new(),
            properties: BTreeMap::new(),
        }
    }
}

/// S3 connection of an `s3://` warehouse. Empty credentials fall back to the standard AWS
/// environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
/// `AWS_REGION`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    /// Endpoint URL, e.g. `http://127.0.0.1:8333`; empty = AWS.
    pub endpoint: String,
    /// Region.
    pub region: String,
    /// Path-style requests (`endpoint/bucket/key`), needed by most self-hosted servers.
    pub path_style: bool,
    /// Access key id (empty: environment).
    pub access_key_id: String,
    /// Secret access key (empty: environment).
    pub secret_access_key: String,
    /// Session token (optional).
    pub session_token: String,
    /// Send unsigned requests (public buckets).
    pub allow_anonymous: bool,
}

impl Default for S3Config {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            region: "us-east-1".into(),
            path_style: false,
            access_key_id: String::new(),
            secret_access_key: String::new(),
            session_token: String::new(),
            allow_anonymous: false,
        }
    }
}

/// Time granularity of a lake table's partitions (`publish_time`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LakePartitioning {
    /// `day(publish_time)`.
    Day,
    /// `hour(publish_time)`.
    Hour,
}

/// How a namespace's topics map to lake tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LakeTableLayout {
    /// One table per topic (a partitioned topic's partitions share it).
    #[default]
    PerTopic,
    /// One table for every topic of the namespace, with a `topic` column (partitioned by it):
    /// many small topics make one table, and one offload commit carries many topics.
    Shared,
}

impl LakeTableLayout {
    /// The policy's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            LakeTableLayout::PerTopic => "per-topic",
            LakeTableLayout::Shared => "shared",
        }
    }
}

/// Namespace policy defaults (Pulsar's names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyDefaults {
    /// `offloadThreshold`: offload once a topic's sealed, not yet offloaded bytes exceed this
    /// (oldest ledgers first). 0 = as soon as a ledger seals; negative = never by size.
    pub offload_threshold_bytes: i64,
    /// `offloadThresholdInSeconds`: offload sealed ledgers older than this. Negative = off.
    pub offload_threshold_seconds: i64,
    /// `offloadDeletionLagMs`: how long the local copy stays after its lake commit.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub offload_deletion_lag: Duration,
    /// Partition granularity of tables created in the namespace.
    pub lake_partitioning: LakePartitioning,
    /// `retentionTimeInMinutes`: consumed messages older than this are removed from the log
    /// and the lake (whole ledgers). -1 = no time limit.
    pub retention_time_minutes: i64,
    /// `retentionSizeInMB`: consumed messages beyond this size (oldest first, whole ledgers)
    /// are removed from the log and the lake. -1 = no size limit.
    pub retention_size_mb: i64,
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        Self {
            offload_threshold_bytes: 0,
            offload_threshold_seconds: -1,
            offload_deletion_lag: Duration::from_secs(3600),
            lake_partitioning: LakePartitioning::Day,
            retention_time_minutes: -1,
            retention_size_mb: -1,
        }
    }
}
