//! Namespace offload policies through Pulsar's paths; changes take effect on the next offload
//! check, without restart:
//! - `GET|PUT /admin/v2/namespaces/{tenant}/{namespace}/offloadThreshold` (bytes; 0 = as soon
//!   as a ledger seals; negative = never by size),
//! - `GET|PUT /admin/v2/namespaces/{tenant}/{namespace}/offloadThresholdInSeconds` (negative =
//!   off),
//! - `GET|PUT|DELETE /admin/v2/namespaces/{tenant}/{namespace}/offloadDeletionLagMs`,
//! - `GET|PUT /admin/v2/namespaces/{tenant}/{namespace}/lakePartitioning` (`"day"` or
//!   `"hour"`, for tables created afterwards; ledgerlake's own),
//! - `GET|PUT /admin/v2/namespaces/{tenant}/{namespace}/lakeTableLayout` (`"per-topic"` or
//!   `"shared"`: one table `__topics` with a `topic` column for all the namespace's topics;
//!   ledgerlake's own; 409 while the namespace has topics and the layout would change),
//! - `GET|POST|DELETE /admin/v2/namespaces/{tenant}/{namespace}/deduplication` (`true`/`false`),
//!   and per topic `GET|POST|DELETE /admin/v2/persistent/{t}/{ns}/{topic}/deduplicationEnabled`
//!   (wins over the namespace); applied to loaded topics before the answer.
//! - `GET|POST|DELETE /admin/v2/namespaces/{tenant}/{namespace}/persistence`
//!   (`{"bookkeeperEnsemble": e, "bookkeeperWriteQuorum": w, "bookkeeperAckQuorum": a,
//!   "managedLedgerMaxMarkDeleteRate": r}`, `e >= w >= a`, `w` below `e` striping the
//!   ledger (ADR 0017; not `w == 1`); for ledgers opened afterwards;
//!   unset: up to 3 bookies as live, ack quorum up to 2; ADR 0010),
//! - `GET|POST|DELETE /admin/v2/namespaces/{tenant}/{namespace}/retention`
//!   (`{"retentionTimeInMinutes": m, "retentionSizeInMB": s}`, -1 = no limit), enforced on the
//!   log and the lake by the offload engine's passes.
//!
//! Also `PUT /admin/v2/namespaces/{tenant}/{namespace}/unload`: every topic of the namespace is
//! unloaded on every node ([`crate::ops`]'s `unload_namespace`), clients reconnect and the
//! topics are placed again.
//!
//! GET answers the value in force (the namespace's own, else the configured default).

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde_json::json;

use super::error::AdminError;
use super::Routes;
use super::{namespace_path, topic_path, AdminState};
use crate::config::{LakePartitioning, LakeTableLayout};
use crate::naming::TopicName;
use crate::policies::{NamespacePolicies, PersistencePolicies, RetentionPolicy};

pub(super) fn routes() -> Router<AdminState> {
    let base = "/admin/v2/namespaces/{tenant}/{namespace}";
    Router::new()
        .at(&format!("{base}/unload"), put(unload))
        .at(
            &format!("{base}/offloadThreshold"),
            get(get_threshold).put(put_threshold),
        )
        .at(
            &format!("{base}/offloadThresholdInSeconds"),
            get(get_threshold_secs).put(put_threshold_secs),
        )
        .at(
            &format!("{base}/offloadDeletionLagMs"),
            get(get_lag).put(put_lag).delete(delete_lag),
        )
        .at(
            &format!("{base}/lakePartitioning"),
            get(get_partitioning).put(put_partitioning),
        )
        .at(
            &format!("{base}/lakeTableLayout"),
            get(get_layout).put(put_layout),
        )
        .at(
            &format!("{base}/retention"),
            get(get_retention)
                .post(set_retention)
                .delete(delete_retention),
        )
        .at(
            &format!("{base}/persistence"),
            get(get_persistence)
                .post(set_persistence)
                .delete(delete_persistence),
        )
        .at(
            &format!("{base}/deduplication"),
            get(get_dedup).post(set_dedup).delete(delete_dedup),
        )
        .at(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}/deduplicationEnabled",
            get(get_topic_dedup)
                .post(set_topic_dedup)
                .delete(delete_topic_dedup),
        )
}

fn boolean(body: &str) -> Result<bool, AdminError> {
    body.trim()
        .parse::<bool>()
        .map_err(|_| AdminError::BadRequest(format!("expected true or false, got '{body}'")))
}

fn base_topic(tenant: &str, ns: &str, topic: &str) -> Result<TopicName, AdminError> {
    Ok(topic_path(tenant, ns, topic)?.base())
}

async fn get_dedup(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(json!(s.ops()?.namespace_deduplication(&ns).await?)))
}

async fn set_dedup_value(
    s: &AdminState,
    t: &str,
    n: &str,
    value: Option<bool>,
) -> Result<StatusCode, AdminError> {
    update(s, t, n, |p| p.deduplication_enabled = value).await
}

async fn set_dedup(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = boolean(&body)?;
    set_dedup_value(&s, &t, &n, Some(v)).await
}

async fn delete_dedup(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<StatusCode, AdminError> {
    set_dedup_value(&s, &t, &n, None).await
}

async fn get_topic_dedup(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let base = base_topic(&t, &n, &topic)?;
    Ok(Json(json!(s.ops()?.deduplication(&base).await?)))
}

/// Applies `change` to the own policies of topic `tenant/ns/topic` (its base topic): 204.
pub(super) async fn update_topic(
    state: &AdminState,
    (tenant, ns, topic): (&str, &str, &str),
    change: impl FnMut(&mut NamespacePolicies),
) -> Result<StatusCode, AdminError> {
    let base = base_topic(tenant, ns, topic)?;
    state.ops()?.update_topic_policies(&base, change).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn set_topic_dedup_value(
    s: &AdminState,
    t: &str,
    n: &str,
    topic: &str,
    value: Option<bool>,
) -> Result<StatusCode, AdminError> {
    update_topic(s, (t, n, topic), |p| p.deduplication_enabled = value).await
}

async fn set_topic_dedup(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = boolean(&body)?;
    set_topic_dedup_value(&s, &t, &n, &topic, Some(v)).await
}

async fn delete_topic_dedup(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
) -> Result<StatusCode, AdminError> {
    set_topic_dedup_value(&s, &t, &n, &topic, None).await
}

fn number(body: &str) -> Result<i64, AdminError> {
    body.trim()
        .parse::<i64>()
        .map_err(|_| AdminError::BadRequest(format!("expected a number, got '{body}'")))
}

/// Applies `change` to namespace `tenant/ns`'s policies: 204.
pub(super) async fn update(
    state: &AdminState,
    tenant: &str,
    ns: &str,
    change: impl FnMut(&mut NamespacePolicies),
) -> Result<StatusCode, AdminError> {
    let ns = namespace_path(tenant, ns)?;
    state.ops()?.update_namespace_policies(&ns, change).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn effective(
    state: &AdminState,
    tenant: &str,
    ns: &str,
) -> Result<crate::policies::EffectivePolicies, AdminError> {
    let ns = namespace_path(tenant, ns)?;
    Ok(state.ops()?.effective_policies(&ns).await?)
}

/// Query of `PUT …/unload`.
#[derive(Debug, Default, serde::Deserialize)]
struct UnloadParams {
    /// Only this node's topics (how the node asked first reaches the others; ledgerlake's own).
    #[serde(default)]
    local: bool,
}

/// Unloads every topic of the namespace, on every node (`crate::ops` fans the call out).
async fn unload(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    Query(q): Query<UnloadParams>,
    headers: HeaderMap,
) -> Result<StatusCode, AdminError> {
    let ns = namespace_path(&t, &n)?;
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    s.ops()?
        .unload_namespace(&ns, q.local, authorization)
        .await?;
    Ok(StatusCode::NO_CONTENT)
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

async fn get_layout(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<LakeTableLayout>, AdminError> {
    Ok(Json(effective(&s, &t, &n).await?.lake_table_layout))
}

async fn put_layout(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = match body.trim().trim_matches('"') {
        "per-topic" => LakeTableLayout::PerTopic,
        "shared" => LakeTableLayout::Shared,
        other => {
            return Err(AdminError::BadRequest(format!(
                "lakeTableLayout is \"per-topic\" or \"shared\", got '{other}'"
            )))
        }
    };
    let ns = namespace_path(&t, &n)?;
    s.ops()?.set_lake_table_layout(&ns, v).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn get_persistence(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<Option<PersistencePolicies>>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(s.ops()?.namespace_policies(&ns).await?.persistence))
}

async fn set_persistence(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v: PersistencePolicies = serde_json::from_str(&body).map_err(|e| {
        AdminError::BadRequest(format!(
            "expected {{\"bookkeeperEnsemble\": e, \"bookkeeperWriteQuorum\": w, \
             \"bookkeeperAckQuorum\": a, \"managedLedgerMaxMarkDeleteRate\": r}}: {e}"
        ))
    })?;
    if let Some(why) = v.invalid() {
        return Err(AdminError::BadRequest(why));
    }
    update(&s, &t, &n, |p| p.persistence = Some(v)).await
}

async fn delete_persistence(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<StatusCode, AdminError> {
    update(&s, &t, &n, |p| p.persistence = None).await
}

async fn get_retention(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<RetentionPolicy>, AdminError> {
    Ok(Json(effective(&s, &t, &n).await?.retention))
}

async fn set_retention(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v: RetentionPolicy = serde_json::from_str(&body).map_err(|e| {
        AdminError::BadRequest(format!(
            "expected {{\"retentionTimeInMinutes\": m, \"retentionSizeInMB\": s}}: {e}"
        ))
    })?;
    if v.retention_time_in_minutes < -1 || v.retention_size_in_mb < -1 {
        return Err(AdminError::BadRequest(
            "retention limits are -1 (none) or at least 0".into(),
        ));
    }
    update(&s, &t, &n, |p| p.retention = Some(v)).await
}

async fn delete_retention(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<StatusCode, AdminError> {
    update(&s, &t, &n, |p| p.retention = None).await
}
