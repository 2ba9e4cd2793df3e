//! Namespace offload policies through Pulsar's paths; changes take effect on the next offload
//! check, without restart:
//! - `GET|PUT /admin/v2/namespaces/{tenant}/{namespace}/offloadThreshold` (bytes; 0 = as soon
//!   as a ledger seals; negative = never by size),
//! - `GET|PUT /admin/v2/namespaces/{tenant}/{namespace}/offloadThresholdInSeconds` (negative =
//!   off),
//! - `GET|PUT|DELETE /admin/v2/namespaces/{tenant}/{namespace}/offloadDeletionLagMs`,
//! - `GET|PUT /admin/v2/namespaces/{tenant}/{namespace}/lakePartitioning` (`"day"` or
//!   `"hour"`, for tables created afterwards; ledgerlake's own).
//!
//! GET answers the value in force (the namespace's own, else the configured default).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::error::AdminError;
use super::AdminState;
use crate::config::LakePartitioning;
use crate::policies::NamespacePolicies;

pub(super) fn routes() -> Router<AdminState> {
    let base = "/admin/v2/namespaces/{tenant}/{namespace}";
    Router::new()
        .route(
            &format!("{base}/offloadThreshold"),
            get(get_threshold).put(put_threshold),
        )
        .route(
            &format!("{base}/offloadThresholdInSeconds"),
            get(get_threshold_secs).put(put_threshold_secs),
        )
        .route(
            &format!("{base}/offloadDeletionLagMs"),
            get(get_lag).put(put_lag).delete(delete_lag),
        )
        .route(
            &format!("{base}/lakePartitioning"),
            get(get_partitioning).put(put_partitioning),
        )
}

fn namespace(tenant: &str, namespace: &str) -> Result<String, AdminError> {
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '=' | ':' | '.'))
    };
    if ok(tenant) && ok(namespace) {
        Ok(format!("{tenant}/{namespace}"))
    } else {
        Err(AdminError::BadRequest(format!(
            "invalid namespace name '{tenant}/{namespace}'"
        )))
    }
}

fn number(body: &str) -> Result<i64, AdminError> {
    body.trim()
        .parse::<i64>()
        .map_err(|_| AdminError::BadRequest(format!("expected a number, got '{body}'")))
}

async fn update(
    state: &AdminState,
    tenant: &str,
    ns: &str,
    change: impl FnOnce(&mut NamespacePolicies),
) -> Result<StatusCode, AdminError> {
    let ns = namespace(tenant, ns)?;
    state.services()?.policies.update(&ns, change).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn effective(
    state: &AdminState,
    tenant: &str,
    ns: &str,
) -> Result<crate::policies::EffectivePolicies, AdminError> {
    let ns = namespace(tenant, ns)?;
    Ok(state.services()?.policies.effective(&ns).await?)
}

async fn get_threshold(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    Ok(Json(json!(
        effective(&s, &t, &n).await?.offload_threshold_bytes
    )))
}

async fn put_threshold(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = number(&body)?;
    update(&s, &t, &n, |p| p.offload_threshold_bytes = Some(v)).await
}

async fn get_threshold_secs(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    Ok(Json(json!(
        effective(&s, &t, &n).await?.offload_threshold_seconds
    )))
}

async fn put_threshold_secs(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = number(&body)?;
    update(&s, &t, &n, |p| p.offload_threshold_seconds = Some(v)).await
}

async fn get_lag(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let lag = effective(&s, &t, &n).await?.offload_deletion_lag;
    Ok(Json(json!(lag.as_millis() as u64)))
}

async fn put_lag(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = number(&body)?;
    if v < 0 {
        return Err(AdminError::BadRequest(
            "offloadDeletionLagMs must not be negative".into(),
        ));
    }
    update(&s, &t, &n, |p| p.offload_deletion_lag_ms = Some(v as u64)).await
}

async fn delete_lag(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<StatusCode, AdminError> {
    update(&s, &t, &n, |p| p.offload_deletion_lag_ms = None).await
}

async fn get_partitioning(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<LakePartitioning>, AdminError> {
    Ok(Json(effective(&s, &t, &n).await?.lake_partitioning))
}

async fn put_partitioning(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = match body.trim().trim_matches('"') {
        "day" => LakePartitioning::Day,
        "hour" => LakePartitioning::Hour,
        other => {
            return Err(AdminError::BadRequest(format!(
                "lakePartitioning is \"day\" or \"hour\", got '{other}'"
            )))
        }
    };
    update(&s, &t, &n, |p| p.lake_partitioning = Some(v)).await
}
