//! Puts a topic partition's rate limits in force: its publish rate and dispatch rates (its own,
//! else its namespace's) and the shared limiters of its resource group (the namespace's group,
//! else its tenant's). Runs at load, on every policy tick and after every policy change.

use std::sync::Arc;

use super::throttle::{Rate, RateLimiter};
use super::{Broker, BrokerTopic};
use crate::policies::DispatchRate;

/// What a resource group's limiter limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    /// Its publish quota.
    Publish,
    /// Its dispatch quota.
    Dispatch,
}

fn dispatch_rate(r: Option<DispatchRate>) -> Rate {
    r.map_or(Rate::default(), |r| {
        Rate::per_period(
            r.dispatch_throttling_rate_in_msg,
            r.dispatch_throttling_rate_in_byte,
            r.rate_period_in_second,
        )
    })
}

impl Broker {
    /// Puts the publish and dispatch limits in force for `t`. A policy that cannot be read
    /// leaves the limits as they were.
    pub(super) async fn apply_throttle(&self, t: &BrokerTopic) {
        let rates = match self.policies.rate_limits(&t.name).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(topic = %t.name, error = %e, "reading rate policies failed");
                return;
            }
        };
        let publish = rates.publish.map_or(Rate::default(), |r| {
            Rate::from_pulsar(
                r.publish_throttling_rate_in_msg,
                r.publish_throttling_rate_in_byte,
            )
        });
        // The namespace's own group, else its tenant's.
        let group = match rates.resource_group {
            Some(g) => Some(g),
            None => match self
                .tenancy
                .tenant_resource_group(&t.name.namespace.tenant)
                .await
            {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(topic = %t.name, error = %e, "reading tenant quota failed");
                    return;
                }
            },
        };
        let (group_publish, group_dispatch) = match group {
            Some(g) => self.group_limiters(&g).await,
            None => (None, None),
        };
        t.throttle.set(publish, group_publish);
        t.dispatch.set(
            dispatch_rate(rates.dispatch),
            dispatch_rate(rates.subscription_dispatch),
            group_dispatch,
        );
        let (per_consumer, period) = rates.subscribe.map_or((0, 30), |r| {
            (
                u32::try_from(r.subscribe_throttling_rate_per_consumer).unwrap_or(0),
                r.rate_period_in_second.max(1),
            )
        });
        t.subscribe_gate.set(
            per_consumer,
            std::time::Duration::from_secs(u64::from(period)),
        );
    }

    /// The publish and dispatch limiters shared by the topics of resource group `name`
    /// (`None`: no such group, or no quota of that kind). A changed quota gets a new limiter.
    async fn group_limiters(
        &self,
        name: &str,
    ) -> (Option<Arc<RateLimiter>>, Option<Arc<RateLimiter>>) {
        let rg = match self.tenancy.resource_group(name).await {
            Ok(Some(rg)) => rg,
            Ok(None) => return (None, None),
            Err(e) => {
                tracing::warn!(group = name, error = %e, "reading resource group failed");
                return (None, None);
            }
        };
        (
            self.group_limiter(
                name,
                Kind::Publish,
                Rate::from_pulsar(rg.publish_rate_in_msgs, rg.publish_rate_in_bytes),
            ),
            self.group_limiter(
                name,
                Kind::Dispatch,
                Rate::from_pulsar(rg.dispatch_rate_in_msgs, rg.dispatch_rate_in_bytes),
            ),
        )
    }

    /// The group's limiter of `kind` at `rate`, kept while the rate is unchanged.
    fn group_limiter(&self, name: &str, kind: Kind, rate: Rate) -> Option<Arc<RateLimiter>> {
        if rate.is_unlimited() {
            return None;
        }
        let mut limiters = self
            .group_limiters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = (name.to_string(), kind);
        match limiters.get(&key) {
            Some(l) if l.rate() == rate => Some(l.clone()),
            _ => {
                let l = RateLimiter::new(rate);
                limiters.insert(key, l.clone());
                Some(l)
            }
        }
    }
}
