//! `[broker.delete_inactive_topics]`: Pulsar's inactive-topic deletion
//! (`brokerDeleteInactiveTopicsEnabled`, `…Mode`, `…MaxInactiveDurationSeconds`), the default of
//! every namespace and topic that sets no `inactiveTopicPolicies` of its own. Off by default:
//! a service for infinite retention does not delete topics unless asked to.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// When a topic counts as inactive (Pulsar's `InactiveTopicDeleteMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum InactiveTopicDeleteMode {
    /// No producer, no subscription, nothing published for the inactive duration.
    #[serde(rename = "delete_when_no_subscriptions")]
    NoSubscriptions,
    /// No producer, no consumer, every subscription caught up (no backlog), nothing published
    /// for the inactive duration.
    #[serde(rename = "delete_when_subscriptions_caught_up")]
    SubscriptionsCaughtUp,
}

/// The broker-wide default of inactive-topic deletion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct InactiveTopicsConfig {
    /// Delete inactive non-partitioned topics (their log, cursors, schemas and, with
    /// `lake.drop_table_on_topic_delete`, their lake table).
    pub enabled: bool,
    /// What inactive means.
    pub mode: InactiveTopicDeleteMode,
    /// Inactive this long: nothing published, no producer (and per `mode`).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub max_inactive_duration: Duration,
}

impl Default for InactiveTopicsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            mode: InactiveTopicDeleteMode::NoSubscriptions,
            max_inactive_duration: Duration::from_secs(60),
        }
    }
}
