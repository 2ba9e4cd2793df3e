//! Inactive-topic deletion policies as Pulsar's admin API carries them
//! (`InactiveTopicPolicies`), and the rule the broker applies once resolved (topic, else
//! namespace, else `[broker.delete_inactive_topics]`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{InactiveTopicDeleteMode, InactiveTopicsConfig};

/// Pulsar's `InactiveTopicPolicies` body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InactiveTopicPolicies {
    /// What inactive means.
    #[serde(default = "default_mode")]
    pub inactive_topic_delete_mode: InactiveTopicDeleteMode,
    /// Inactive this long, in seconds.
    #[serde(default)]
    pub max_inactive_duration_seconds: i32,
    /// Whether inactive topics are deleted at all.
    #[serde(default)]
    pub delete_while_inactive: bool,
}

fn default_mode() -> InactiveTopicDeleteMode {
    InactiveTopicDeleteMode::NoSubscriptions
}

impl InactiveTopicPolicies {
    /// The broker's default as a policy.
    pub fn from_config(c: &InactiveTopicsConfig) -> Self {
        Self {
            inactive_topic_delete_mode: c.mode,
            max_inactive_duration_seconds: i32::try_from(c.max_inactive_duration.as_secs())
                .unwrap_or(i32::MAX),
            delete_while_inactive: c.enabled,
        }
    }

    /// The rule in force: `None` when deletion is off.
    pub fn rule(&self) -> Option<InactiveRule> {
        self.delete_while_inactive.then(|| InactiveRule {
            mode: self.inactive_topic_delete_mode,
            after: Duration::from_secs(self.max_inactive_duration_seconds.max(0) as u64),
        })
    }

    /// Refuses a negative duration.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_inactive_duration_seconds < 0 {
            return Err("maxInactiveDurationSeconds must not be negative".into());
        }
        Ok(())
    }
}

/// When a loaded topic is deleted for inactivity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InactiveRule {
    /// What inactive means.
    pub mode: InactiveTopicDeleteMode,
    /// Nothing published (and the mode's condition held) this long.
    pub after: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulsar_bodies_parse_and_resolve() {
        let p: InactiveTopicPolicies = serde_json::from_str(
            r#"{"inactiveTopicDeleteMode":"delete_when_subscriptions_caught_up",
                "maxInactiveDurationSeconds":30,"deleteWhileInactive":true}"#,
        )
        .expect("a Pulsar body");
        assert_eq!(
            p.rule(),
            Some(InactiveRule {
                mode: InactiveTopicDeleteMode::SubscriptionsCaughtUp,
                after: Duration::from_secs(30)
            })
        );
        let off: InactiveTopicPolicies =
            serde_json::from_str(r#"{"maxInactiveDurationSeconds":30}"#).expect("partial body");
        assert_eq!(off.rule(), None);
        assert!(serde_json::from_str::<InactiveTopicPolicies>(
            r#"{"inactiveTopicDeleteMode":"delete_sometimes"}"#
        )
        .is_err());
        let negative = InactiveTopicPolicies {
            max_inactive_duration_seconds: -1,
            ..off
        };
        assert!(negative.validate().is_err());
    }
}
