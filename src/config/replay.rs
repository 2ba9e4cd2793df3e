//! Configuration of replay from the lake: the threads lake reads run on, and the memory they
//! may hold.

use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Serving consumers whose position is in a range only the lake still holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayConfig {
    /// Worker threads of the replay runtime (lake scans, Parquet decoding, rebuilding entries).
    /// Separate from the broker's workers, so a consumer catching up on a huge backlog cannot
    /// slow producers or live consumers.
    pub threads: usize,
    /// Lake scans running at the same time, broker-wide (further readers wait their turn).
    pub max_concurrent_scans: usize,
    /// Rebuilt entries a subscription may hold ahead of its consumers' permits.
    #[schemars(with = "String")]
    pub read_ahead: ByteSize,
    /// Read-ahead memory of all subscriptions of one topic partition.
    #[schemars(with = "String")]
    pub topic_budget: ByteSize,
    /// Read-ahead memory of the whole broker.
    #[schemars(with = "String")]
    pub broker_budget: ByteSize,
    /// A subscription that has not read from its lake stream for this long drops the stream and
    /// its buffers (a slow consumer does not hold memory).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub idle_release: Duration,
    /// First wait before retrying a failed lake read (doubles up to `retry_max`).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retry_initial: Duration,
    /// Longest wait between retries of a failed lake read.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retry_max: Duration,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            threads: 2,
            max_concurrent_scans: 4,
            read_ahead: ByteSize::mib(8),
            topic_budget: ByteSize::mib(64),
            broker_budget: ByteSize::mib(256),
            idle_release: Duration::from_secs(30),
            retry_initial: Duration::from_millis(200),
            retry_max: Duration::from_secs(30),
        }
    }
}
