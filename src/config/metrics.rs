//! Configuration of what the service measures and exposes on `GET /metrics`, and of the two
//! early warnings built on those measures: hot partitions (DS-FAIL-12) and lag spirals
//! (DS-FAIL-03).

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Metrics (Prometheus text on `GET /metrics`), rates and the hot-partition and lag warnings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Record per-topic and per-subscription counters and serve `GET /metrics`. Off: neither
    /// (the admin stats still report backlogs; their rates read 0).
    pub enabled: bool,
    /// Series per topic and subscription (Pulsar's `exposeTopicLevelMetricsInPrometheus`).
    /// Off: the same families summed per namespace, with no `topic` label.
    pub expose_topic_level: bool,
    /// Window of the message and byte rates (`msgRateIn`, `pulsar_rate_in`, ...) and of a
    /// partition's share of its topic's traffic.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub rate_window: Duration,
    /// A partition is hot when its share of its topic's in-rate exceeds this multiple of an
    /// even share (1 / partitions); a Key_Shared consumer likewise among its subscription's
    /// consumers. Must be above 1.
    pub hot_share_factor: f64,
    /// A partition (or Key_Shared consumer) taking fewer than this many messages per second
    /// is never flagged hot, whatever its share: skew of a trickle is not a problem.
    pub hot_min_rate: f64,
    /// A subscription whose backlog grew across a whole window of this length is flagged as a
    /// lag spiral (it stays flagged until a window ends without growth).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub lag_window: Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            expose_topic_level: true,
            rate_window: Duration::from_secs(60),
            hot_share_factor: 2.0,
            hot_min_rate: 10.0,
            lag_window: Duration::from_secs(300),
        }
    }
}
