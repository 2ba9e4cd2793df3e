//! Backlog quotas and message TTL as Pulsar defines them: the JSON shapes of
//! `/backlogQuotaMap`, `/backlogQuota` and `/messageTTL`, and the per-topic resolution (a
//! topic's own quota of a type wins over its namespace's quota of that type).
//!
//! A backlog is what the slowest durable subscription has not acknowledged, whichever tier
//! holds it: entries offloaded to the lake and deleted locally are still backlog.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Pulsar's `BacklogQuotaType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BacklogQuotaType {
    /// A limit on the backlog's bytes (`limitSize`).
    DestinationStorage,
    /// A limit on the age of the oldest unacknowledged message (`limitTime`, seconds).
    MessageAge,
}

impl BacklogQuotaType {
    /// Parses the `backlogQuotaType` query parameter (Pulsar's default is
    /// `destination_storage`).
    pub fn parse(s: Option<&str>) -> Result<Self, String> {
        match s {
            None | Some("destination_storage") => Ok(Self::DestinationStorage),
            Some("message_age") => Ok(Self::MessageAge),
            Some(other) => Err(format!(
                "unknown backlogQuotaType '{other}' (destination_storage or message_age)"
            )),
        }
    }
}

/// Pulsar's `RetentionPolicy` of a backlog quota: what happens when it is exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BacklogPolicy {
    /// New producers are refused with `ProducerBlockedQuotaExceededError` (the client retries)
    /// and connected ones are closed; sends wait in the client until the backlog drains.
    ProducerRequestHold,
    /// As hold, with `ProducerBlockedQuotaExceededException`: the client fails pending sends.
    ProducerException,
    /// The slowest subscriptions skip forward until the backlog is back under 90 % of the
    /// size limit (or under the age limit).
    ConsumerBacklogEviction,
}

/// Pulsar's `BacklogQuota` `{limitSize, limitTime, policy}` (`limit` is the deprecated name of
/// `limitSize`, still accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BacklogQuota {
    /// Bytes of backlog allowed (negative: no size limit).
    #[serde(default = "minus_one", alias = "limit")]
    pub limit_size: i64,
    /// Seconds of backlog age allowed (negative: no age limit).
    #[serde(default = "minus_one32")]
    pub limit_time: i32,
    /// What happens when it is exceeded (Pulsar's default: hold).
    #[serde(default = "hold")]
    pub policy: BacklogPolicy,
}

fn minus_one() -> i64 {
    -1
}

fn minus_one32() -> i32 {
    -1
}

fn hold() -> BacklogPolicy {
    BacklogPolicy::ProducerRequestHold
}

/// Quotas by type, as `backlog_quota_map` holds them.
pub type BacklogQuotaMap = BTreeMap<BacklogQuotaType, BacklogQuota>;

/// The backlog limits in force for one topic partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BacklogLimits {
    /// The size quota, when one with a positive `limitSize` is set.
    pub storage: Option<BacklogQuota>,
    /// The age quota, when one with a positive `limitTime` is set.
    pub age: Option<BacklogQuota>,
    /// `messageTTL` in seconds: older unacknowledged messages expire (0 or unset: never).
    pub ttl_seconds: Option<u32>,
}

impl BacklogLimits {
    /// The limits from a topic's own map and TTL, else its namespace's, type by type.
    pub fn resolve(
        topic: &BacklogQuotaMap,
        namespace: &BacklogQuotaMap,
        ttl: Option<u32>,
    ) -> BacklogLimits {
        let pick = |t| topic.get(&t).or_else(|| namespace.get(&t)).copied();
        BacklogLimits {
            storage: pick(BacklogQuotaType::DestinationStorage).filter(|q| q.limit_size > 0),
            age: pick(BacklogQuotaType::MessageAge).filter(|q| q.limit_time > 0),
            ttl_seconds: ttl.filter(|t| *t > 0),
        }
    }

    /// Whether anything is to be checked.
    pub fn is_empty(&self) -> bool {
        self.storage.is_none() && self.age.is_none() && self.ttl_seconds.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulsar_json_shapes() -> Result<(), serde_json::Error> {
        let q: BacklogQuota =
            serde_json::from_str(r#"{"limit": 10, "policy": "consumer_backlog_eviction"}"#)?;
        assert_eq!(q.limit_size, 10);
        assert_eq!(q.limit_time, -1);
        assert_eq!(q.policy, BacklogPolicy::ConsumerBacklogEviction);
        let q: BacklogQuota = serde_json::from_str(r#"{"limitTime": 60}"#)?;
        assert_eq!(q.policy, BacklogPolicy::ProducerRequestHold);
        let mut map = BacklogQuotaMap::new();
        map.insert(BacklogQuotaType::MessageAge, q);
        assert_eq!(
            serde_json::to_string(&map)?,
            r#"{"message_age":{"limitSize":-1,"limitTime":60,"policy":"producer_request_hold"}}"#
        );
        Ok(())
    }

    #[test]
    fn topic_quota_wins_per_type() {
        let q = |size, time, policy| BacklogQuota {
            limit_size: size,
            limit_time: time,
            policy,
        };
        let mut ns = BacklogQuotaMap::new();
        ns.insert(
            BacklogQuotaType::DestinationStorage,
            q(100, -1, BacklogPolicy::ProducerException),
        );
        ns.insert(
            BacklogQuotaType::MessageAge,
            q(-1, 30, BacklogPolicy::ProducerRequestHold),
        );
        let mut topic = BacklogQuotaMap::new();
        topic.insert(
            BacklogQuotaType::DestinationStorage,
            q(5, -1, BacklogPolicy::ConsumerBacklogEviction),
        );
        let l = BacklogLimits::resolve(&topic, &ns, Some(0));
        assert_eq!(l.storage.map(|q| q.limit_size), Some(5));
        assert_eq!(l.age.map(|q| q.limit_time), Some(30));
        assert_eq!(l.ttl_seconds, None);
        let none = BacklogLimits::resolve(&BacklogQuotaMap::new(), &BacklogQuotaMap::new(), None);
        assert!(none.is_empty());
    }
}
