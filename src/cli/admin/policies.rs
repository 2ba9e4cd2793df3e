//! `ledgerlake admin namespaces …` verbs for quotas and limits, as pulsar-admin names them:
//! backlog quotas, message TTL, dispatch and subscribe rates, and the count limits. Each is one
//! request to the namespace's policy path.

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{get, ns_path, with, Request};

/// Quota and limit verbs of `admin namespaces`.
#[derive(Debug, Subcommand)]
pub enum PolicyVerb {
    /// Set a backlog quota (superusers).
    SetBacklogQuota(BacklogQuotaArgs),
    /// The namespace's backlog quotas, by type.
    GetBacklogQuotas { namespace: String },
    /// Remove a backlog quota (superusers).
    RemoveBacklogQuota {
        namespace: String,
        /// `destination_storage` or `message_age`.
        #[arg(long = "type", short = 't', default_value = "destination_storage")]
        kind: String,
    },
    /// Expire unacknowledged messages older than this (0: never).
    SetMessageTtl {
        namespace: String,
        /// Seconds.
        #[arg(long = "messageTTL", alias = "ttl")]
        ttl: u32,
    },
    /// The namespace's message TTL.
    GetMessageTtl { namespace: String },
    /// Remove the namespace's message TTL.
    RemoveMessageTtl { namespace: String },
    /// Limit what each topic partition dispatches (superusers; -1: unlimited).
    SetDispatchRate(DispatchArgs),
    /// The namespace's dispatch rate.
    GetDispatchRate { namespace: String },
    /// Limit what each subscription dispatches (superusers; -1: unlimited).
    SetSubscriptionDispatchRate(DispatchArgs),
    /// The namespace's subscription dispatch rate.
    GetSubscriptionDispatchRate { namespace: String },
    /// Limit SUBSCRIBEs per consumer and period (superusers).
    SetSubscribeRate {
        namespace: String,
        /// Subscribes per consumer and period (-1: unlimited).
        #[arg(long = "subscribe-rate", default_value_t = -1)]
        rate: i32,
        /// Period in seconds.
        #[arg(long = "subscribe-rate-period", default_value_t = 30)]
        period: u32,
    },
    /// The namespace's subscribe rate.
    GetSubscribeRate { namespace: String },
    /// Most producers per topic partition (0: no limit).
    SetMaxProducersPerTopic(CountArgs),
    /// Most consumers per topic partition (0: no limit).
    SetMaxConsumersPerTopic(CountArgs),
    /// Most consumers per subscription (0: no limit).
    SetMaxConsumersPerSubscription(CountArgs),
    /// Unacknowledged messages a Shared consumer may hold (0: no limit).
    SetMaxUnackedMessagesPerConsumer(CountArgs),
    /// Unacknowledged messages a Shared subscription may have out (0: no limit).
    SetMaxUnackedMessagesPerSubscription(CountArgs),
    /// Most topics (partitions count) in the namespace (0: no limit).
    SetMaxTopicsPerNamespace(CountArgs),
    /// One of the count limits (`max-producers-per-topic`, `max-consumers-per-topic`, …).
    GetLimit {
        namespace: String,
        /// The limit's name, as in its `set-…` verb.
        limit: String,
    },
}

/// `set-backlog-quota NS --limitSize B --limitTime S --policy P --type T`.
#[derive(Debug, Args)]
pub struct BacklogQuotaArgs {
    namespace: String,
    /// Bytes of backlog (destination_storage).
    #[arg(long = "limitSize", short = 'l', default_value_t = -1)]
    limit_size: i64,
    /// Seconds of backlog age (message_age).
    #[arg(long = "limitTime", default_value_t = -1)]
    limit_time: i32,
    /// `producer_request_hold`, `producer_exception` or `consumer_backlog_eviction`.
    #[arg(long, short = 'p', default_value = "producer_request_hold")]
    policy: String,
    /// `destination_storage` or `message_age`.
    #[arg(long = "type", short = 't', default_value = "destination_storage")]
    kind: String,
}

/// `set-dispatch-rate NS --msg-dispatch-rate N --byte-dispatch-rate B --dispatch-rate-period S`.
#[derive(Debug, Args)]
pub struct DispatchArgs {
    namespace: String,
    /// Messages per period (-1: unlimited).
    #[arg(long = "msg-dispatch-rate", default_value_t = -1)]
    msgs: i64,
    /// Bytes per period (-1: unlimited).
    #[arg(long = "byte-dispatch-rate", default_value_t = -1)]
    bytes: i64,
    /// Period in seconds.
    #[arg(long = "dispatch-rate-period", default_value_t = 1)]
    period: u32,
}

/// `set-max-…` NS COUNT.
#[derive(Debug, Args)]
pub struct CountArgs {
    namespace: String,
    /// The limit (0: none).
    count: u32,
}

/// The count limits: verb name and policy path segment.
const LIMITS: [(&str, &str); 6] = [
    ("max-producers-per-topic", "maxProducersPerTopic"),
    ("max-consumers-per-topic", "maxConsumersPerTopic"),
    (
        "max-consumers-per-subscription",
        "maxConsumersPerSubscription",
    ),
    (
        "max-unacked-messages-per-consumer",
        "maxUnackedMessagesPerConsumer",
    ),
    (
        "max-unacked-messages-per-subscription",
        "maxUnackedMessagesPerSubscription",
    ),
    ("max-topics-per-namespace", "maxTopicsPerNamespace"),
];

fn dispatch_body(a: &DispatchArgs) -> Value {
    json!({
        "dispatchThrottlingRateInMsg": a.msgs,
        "dispatchThrottlingRateInByte": a.bytes,
        "ratePeriodInSecond": a.period,
        "relativeToPublishRate": false,
    })
}

fn set_count(a: CountArgs, index: usize) -> anyhow::Result<Request> {
    let path = format!("{}/{}", ns_path(&a.namespace)?, LIMITS[index].1);
    Ok(with(reqwest::Method::POST, path, Some(json!(a.count))))
}

/// The request of one verb.
pub(super) fn request(v: PolicyVerb) -> anyhow::Result<Request> {
    use reqwest::Method as M;
    let at = |ns: &str, segment: &str| -> anyhow::Result<String> {
        Ok(format!("{}/{segment}", ns_path(ns)?))
    };
    Ok(match v {
        PolicyVerb::SetBacklogQuota(a) => with(
            M::POST,
            at(
                &a.namespace,
                &format!("backlogQuota?backlogQuotaType={}", a.kind),
            )?,
            Some(json!({
                "limitSize": a.limit_size,
                "limitTime": a.limit_time,
                "policy": a.policy,
            })),
        ),
        PolicyVerb::GetBacklogQuotas { namespace } => get(at(&namespace, "backlogQuotaMap")?),
        PolicyVerb::RemoveBacklogQuota { namespace, kind } => with(
            M::DELETE,
            at(&namespace, &format!("backlogQuota?backlogQuotaType={kind}"))?,
            None,
        ),
        PolicyVerb::SetMessageTtl { namespace, ttl } => {
            with(M::POST, at(&namespace, "messageTTL")?, Some(json!(ttl)))
        }
        PolicyVerb::GetMessageTtl { namespace } => get(at(&namespace, "messageTTL")?),
        PolicyVerb::RemoveMessageTtl { namespace } => {
            with(M::DELETE, at(&namespace, "messageTTL")?, None)
        }
        PolicyVerb::SetDispatchRate(a) => with(
            M::POST,
            at(&a.namespace, "dispatchRate")?,
            Some(dispatch_body(&a)),
        ),
        PolicyVerb::GetDispatchRate { namespace } => get(at(&namespace, "dispatchRate")?),
        PolicyVerb::SetSubscriptionDispatchRate(a) => with(
            M::POST,
            at(&a.namespace, "subscriptionDispatchRate")?,
            Some(dispatch_body(&a)),
        ),
        PolicyVerb::GetSubscriptionDispatchRate { namespace } => {
            get(at(&namespace, "subscriptionDispatchRate")?)
        }
        PolicyVerb::SetSubscribeRate {
            namespace,
            rate,
            period,
        } => with(
            M::POST,
            at(&namespace, "subscribeRate")?,
            Some(json!({
                "subscribeThrottlingRatePerConsumer": rate,
                "ratePeriodInSecond": period,
            })),
        ),
        PolicyVerb::GetSubscribeRate { namespace } => get(at(&namespace, "subscribeRate")?),
        PolicyVerb::SetMaxProducersPerTopic(a) => set_count(a, 0)?,
        PolicyVerb::SetMaxConsumersPerTopic(a) => set_count(a, 1)?,
        PolicyVerb::SetMaxConsumersPerSubscription(a) => set_count(a, 2)?,
        PolicyVerb::SetMaxUnackedMessagesPerConsumer(a) => set_count(a, 3)?,
        PolicyVerb::SetMaxUnackedMessagesPerSubscription(a) => set_count(a, 4)?,
        PolicyVerb::SetMaxTopicsPerNamespace(a) => set_count(a, 5)?,
        PolicyVerb::GetLimit { namespace, limit } => {
            let Some((_, segment)) = LIMITS.iter().find(|(verb, _)| *verb == limit) else {
                let known: Vec<&str> = LIMITS.iter().map(|(v, _)| *v).collect();
                anyhow::bail!("unknown limit '{limit}' (one of {})", known.join(", "));
            };
            get(at(&namespace, segment)?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_map_to_pulsars_paths() -> anyhow::Result<()> {
        let r = request(PolicyVerb::SetBacklogQuota(BacklogQuotaArgs {
            namespace: "t/ns".into(),
            limit_size: 10,
            limit_time: -1,
            policy: "producer_exception".into(),
            kind: "destination_storage".into(),
        }))?;
        assert_eq!(
            r.path,
            "/namespaces/t/ns/backlogQuota?backlogQuotaType=destination_storage"
        );
        let r = request(PolicyVerb::SetMaxConsumersPerTopic(CountArgs {
            namespace: "t/ns".into(),
            count: 4,
        }))?;
        assert_eq!(
            (r.path.as_str(), r.body),
            ("/namespaces/t/ns/maxConsumersPerTopic", Some(json!(4)))
        );
        let r = request(PolicyVerb::GetLimit {
            namespace: "t/ns".into(),
            limit: "max-topics-per-namespace".into(),
        })?;
        assert_eq!(r.path, "/namespaces/t/ns/maxTopicsPerNamespace");
        assert!(request(PolicyVerb::GetLimit {
            namespace: "t/ns".into(),
            limit: "nope".into(),
        })
        .is_err());
        Ok(())
    }
}
