//! Rate policies through Pulsar's paths, each `GET|POST|DELETE` at namespace scope
//! (`/admin/v2/namespaces/{t}/{ns}/…`) and topic scope (`/admin/v2/persistent/{t}/{ns}/{topic}/…`,
//! which wins); GET answers `null` when unset; changes apply to loaded topics before the
//! answer; setting and removing them is for superusers (a tenant admin must not lift the limits
//! an operator set; it may read them):
//! - `publishRate` (`PublishRate` `{"publishThrottlingRateInMsg", "publishThrottlingRateInByte"}`,
//!   -1 = unlimited): per topic partition, producers throttled;
//! - `dispatchRate` (`DispatchRate` `{"dispatchThrottlingRateInMsg",
//!   "dispatchThrottlingRateInByte", "ratePeriodInSecond"}`): per topic partition, shared by its
//!   subscriptions;
//! - `subscriptionDispatchRate` (the same body): per subscription;
//! - `subscribeRate` (`SubscribeRate` `{"subscribeThrottlingRatePerConsumer",
//!   "ratePeriodInSecond": 30}`): SUBSCRIBEs each consumer (client host and consumer name) may
//!   make per period and topic partition; beyond, `NotAllowedError`.
//!
//! `relativeToPublishRate: true` is refused (400): it is not supported.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::AdminError;
use super::namespaces::{update, update_topic};
use super::quotas::superuser_only;
use super::tenancy::json_body;
use super::Routes;
use super::{namespace_path, topic_path, AdminState};
use crate::auth::Principal;
use crate::policies::{DispatchRate, NamespacePolicies, PublishRate, SubscribeRate};

/// A rate body: its JSON shape and what it refuses.
trait RateBody: Serialize + DeserializeOwned + Copy + Send + Sync + 'static {
    fn check(&self) -> Result<(), AdminError> {
        Ok(())
    }
}

impl RateBody for PublishRate {}

impl RateBody for SubscribeRate {
    fn check(&self) -> Result<(), AdminError> {
        if self.rate_period_in_second == 0 {
            return Err(AdminError::BadRequest(
                "ratePeriodInSecond must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

impl RateBody for DispatchRate {
    fn check(&self) -> Result<(), AdminError> {
        if self.relative_to_publish_rate {
            return Err(AdminError::BadRequest(
                "relativeToPublishRate is not supported".into(),
            ));
        }
        if self.rate_period_in_second == 0 {
            return Err(AdminError::BadRequest(
                "ratePeriodInSecond must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

pub(super) fn routes() -> Router<AdminState> {
    let router = Router::new();
    let router = with_rate::<PublishRate>(router, "publishRate", |p| &mut p.publish_rate);
    let router = with_rate::<DispatchRate>(router, "dispatchRate", |p| &mut p.dispatch_rate);
    let router = with_rate::<DispatchRate>(router, "subscriptionDispatchRate", |p| {
        &mut p.subscription_dispatch_rate
    });
    with_rate::<SubscribeRate>(router, "subscribeRate", |p| &mut p.subscribe_rate)
}

/// Adds the namespace and topic routes of one rate policy.
fn with_rate<T: RateBody>(
    router: Router<AdminState>,
    segment: &str,
    field: fn(&mut NamespacePolicies) -> &mut Option<T>,
) -> Router<AdminState> {
    router
        .at(
            &format!("/admin/v2/namespaces/{{tenant}}/{{namespace}}/{segment}"),
            get(move |s: State<AdminState>, Path((t, n)): Path<(String, String)>| async move {
                let mut p = s.ops()?.namespace_policies(&namespace_path(&t, &n)?).await?;
                Ok::<_, AdminError>(Json(*field(&mut p)))
            })
            .post(
                move |s: State<AdminState>,
                      who: Extension<Principal>,
                      Path((t, n)): Path<(String, String)>,
                      body: String| async move {
                    superuser_only(&s, &who).await?;
                    let v = parse::<T>(&body)?;
                    update(&s, &t, &n, |p| *field(p) = Some(v)).await
                },
            )
            .delete(
                move |s: State<AdminState>,
                      who: Extension<Principal>,
                      Path((t, n)): Path<(String, String)>| async move {
                    superuser_only(&s, &who).await?;
                    update(&s, &t, &n, |p| *field(p) = None).await
                },
            ),
        )
        .at(
            &format!("/admin/v2/persistent/{{tenant}}/{{namespace}}/{{topic}}/{segment}"),
            get(
                move |s: State<AdminState>,
                      Path((t, n, topic)): Path<(String, String, String)>| async move {
                    let name = topic_path(&t, &n, &topic)?.base();
                    let mut p = s.ops()?.topic_policies(&name).await?;
                    Ok::<_, AdminError>(Json(*field(&mut p)))
                },
            )
            .post(
                move |s: State<AdminState>,
                      who: Extension<Principal>,
                      Path((t, n, topic)): Path<(String, String, String)>,
                      body: String| async move {
                    superuser_only(&s, &who).await?;
                    let v = parse::<T>(&body)?;
                    update_topic(&s, (&t, &n, &topic), |p| *field(p) = Some(v)).await
                },
            )
            .delete(
                move |s: State<AdminState>,
                      who: Extension<Principal>,
                      Path((t, n, topic)): Path<(String, String, String)>| async move {
                    superuser_only(&s, &who).await?;
                    update_topic(&s, (&t, &n, &topic), |p| *field(p) = None).await
                },
            ),
        )
}

fn parse<T: RateBody>(body: &str) -> Result<T, AdminError> {
    let v: T = json_body(body)?;
    v.check()?;
    Ok(v)
}
