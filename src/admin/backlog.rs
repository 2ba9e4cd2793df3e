//! Backlog quotas and message TTL through Pulsar's paths; changes are checked on loaded topics
//! before the answer (a newly exceeded hold or exception quota has closed the producers):
//! - `GET /admin/v2/namespaces/{tenant}/{namespace}/backlogQuotaMap` and
//!   `/admin/v2/persistent/{tenant}/{namespace}/{topic}/backlogQuotaMap` (`{"destination_storage":
//!   {"limitSize","limitTime","policy"}, "message_age": …}`; a topic's quota of a type wins over
//!   its namespace's);
//! - `POST|DELETE …/backlogQuota?backlogQuotaType=destination_storage|message_age` (Pulsar's
//!   `BacklogQuota` body; the limit of the quota's type must be positive, else 400). Setting
//!   and removing quotas is for superusers: a tenant admin must
//!   not lift the limits an operator set (it may read them). A quota at or above the
//!   namespace's retention gets 412, as with Pulsar;
//! - `GET|POST|DELETE /admin/v2/namespaces/{tenant}/{namespace}/messageTTL` (seconds in the
//!   body) and `/admin/v2/persistent/{tenant}/{namespace}/{topic}/messageTTL` (seconds in the
//!   body or `?messageTTL=`); tenant admins may set them. GET answers `null` when unset.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};

use super::error::AdminError;
use super::namespaces::{update, update_topic};
use super::quotas::superuser_only;
use super::tenancy::json_body;
use super::Routes;
use super::{namespace_path, topic_path, AdminState};
use crate::auth::Principal;
use crate::policies::{BacklogQuota, BacklogQuotaMap, BacklogQuotaType};

pub(super) fn routes() -> Router<AdminState> {
    let ns = "/admin/v2/namespaces/{tenant}/{namespace}";
    let topic = "/admin/v2/persistent/{tenant}/{namespace}/{topic}";
    Router::new()
        .at(&format!("{ns}/backlogQuotaMap"), get(get_ns_quotas))
        .at(
            &format!("{ns}/backlogQuota"),
            post(set_ns_quota).delete(delete_ns_quota),
        )
        .at(&format!("{topic}/backlogQuotaMap"), get(get_topic_quotas))
        .at(
            &format!("{topic}/backlogQuota"),
            post(set_topic_quota).delete(delete_topic_quota),
        )
        .at(
            &format!("{ns}/messageTTL"),
            get(get_ns_ttl).post(set_ns_ttl).delete(delete_ns_ttl),
        )
        .at(
            &format!("{topic}/messageTTL"),
            get(get_topic_ttl)
                .post(set_topic_ttl)
                .delete(delete_topic_ttl),
        )
}

type Params = Query<HashMap<String, String>>;

fn quota_type(params: &HashMap<String, String>) -> Result<BacklogQuotaType, AdminError> {
    BacklogQuotaType::parse(params.get("backlogQuotaType").map(String::as_str))
        .map_err(AdminError::BadRequest)
}

/// The quota in the body, refused (412) when it reaches the namespace's retention, as Pulsar
/// does: a backlog the retention would delete first could never be held to the quota.
async fn checked_quota(
    s: &AdminState,
    (t, n): (&str, &str),
    kind: BacklogQuotaType,
    body: &str,
) -> Result<BacklogQuota, AdminError> {
    let q: BacklogQuota = json_body(body)?;
    match kind {
        BacklogQuotaType::DestinationStorage if q.limit_size <= 0 => {
            return Err(AdminError::BadRequest(
                "a destination_storage quota needs a positive limitSize".into(),
            ))
        }
        BacklogQuotaType::MessageAge if q.limit_time <= 0 => {
            return Err(AdminError::BadRequest(
                "a message_age quota needs a positive limitTime (use \
                 backlogQuotaType=message_age)"
                    .into(),
            ))
        }
        _ => {}
    }
    let retention = s
        .ops()?
        .effective_policies(&namespace_path(t, n)?)
        .await?
        .retention;
    let size_limit = retention.retention_size_in_mb.saturating_mul(1 << 20);
    let time_limit = retention.retention_time_in_minutes.saturating_mul(60);
    if (retention.retention_size_in_mb > 0 && q.limit_size >= size_limit)
        || (retention.retention_time_in_minutes > 0 && i64::from(q.limit_time) >= time_limit)
    {
        return Err(AdminError::PreconditionFailed(
            "Backlog Quota exceeds configured retention quota for namespace. Please increase \
             retention quota and retry"
                .into(),
        ));
    }
    Ok(q)
}

async fn get_ns_quotas(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<BacklogQuotaMap>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(
        s.ops()?.namespace_policies(&ns).await?.backlog_quota_map,
    ))
}

async fn set_ns_quota(
    State(s): State<AdminState>,
    Extension(principal): Extension<Principal>,
    Path((t, n)): Path<(String, String)>,
    Query(params): Params,
    body: String,
) -> Result<StatusCode, AdminError> {
    superuser_only(&s, &principal).await?;
    let kind = quota_type(&params)?;
    let q = checked_quota(&s, (&t, &n), kind, &body).await?;
    update(&s, &t, &n, |p| {
        p.backlog_quota_map.insert(kind, q);
    })
    .await
}

async fn delete_ns_quota(
    State(s): State<AdminState>,
    Extension(principal): Extension<Principal>,
    Path((t, n)): Path<(String, String)>,
    Query(params): Params,
) -> Result<StatusCode, AdminError> {
    superuser_only(&s, &principal).await?;
    let kind = quota_type(&params)?;
    update(&s, &t, &n, |p| {
        p.backlog_quota_map.remove(&kind);
    })
    .await
}

async fn get_topic_quotas(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
) -> Result<Json<BacklogQuotaMap>, AdminError> {
    let name = topic_path(&t, &n, &topic)?.base();
    Ok(Json(
        s.ops()?.topic_policies(&name).await?.backlog_quota_map,
    ))
}

async fn set_topic_quota(
    State(s): State<AdminState>,
    Extension(principal): Extension<Principal>,
    Path((t, n, topic)): Path<(String, String, String)>,
    Query(params): Params,
    body: String,
) -> Result<StatusCode, AdminError> {
    superuser_only(&s, &principal).await?;
    let kind = quota_type(&params)?;
    let q = checked_quota(&s, (&t, &n), kind, &body).await?;
    update_topic(&s, (&t, &n, &topic), |p| {
        p.backlog_quota_map.insert(kind, q);
    })
    .await
}

async fn delete_topic_quota(
    State(s): State<AdminState>,
    Extension(principal): Extension<Principal>,
    Path((t, n, topic)): Path<(String, String, String)>,
    Query(params): Params,
) -> Result<StatusCode, AdminError> {
    superuser_only(&s, &principal).await?;
    let kind = quota_type(&params)?;
    update_topic(&s, (&t, &n, &topic), |p| {
        p.backlog_quota_map.remove(&kind);
    })
    .await
}

/// TTL seconds from `?messageTTL=` or the body.
fn ttl(params: &HashMap<String, String>, body: &str) -> Result<u32, AdminError> {
    let raw = params.get("messageTTL").map_or(body.trim(), |v| v.trim());
    raw.parse::<u32>().map_err(|_| {
        AdminError::PreconditionFailed(format!(
            "Invalid value for message TTL, message TTL must be >= 0 (got '{raw}')"
        ))
    })
}

async fn get_ns_ttl(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<Option<u32>>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(
        s.ops()?.namespace_policies(&ns).await?.message_ttl_seconds,
    ))
}

async fn set_ns_ttl(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    Query(params): Params,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = ttl(&params, &body)?;
    update(&s, &t, &n, |p| p.message_ttl_seconds = Some(v)).await
}

async fn delete_ns_ttl(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<StatusCode, AdminError> {
    update(&s, &t, &n, |p| p.message_ttl_seconds = None).await
}

async fn get_topic_ttl(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
) -> Result<Json<Option<u32>>, AdminError> {
    let name = topic_path(&t, &n, &topic)?.base();
    Ok(Json(
        s.ops()?.topic_policies(&name).await?.message_ttl_seconds,
    ))
}

async fn set_topic_ttl(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
    Query(params): Params,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = ttl(&params, &body)?;
    update_topic(&s, (&t, &n, &topic), |p| p.message_ttl_seconds = Some(v)).await
}

async fn delete_topic_ttl(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
) -> Result<StatusCode, AdminError> {
    update_topic(&s, (&t, &n, &topic), |p| p.message_ttl_seconds = None).await
}
