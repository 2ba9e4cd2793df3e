//! `/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions`: create (PUT), grow (POST) and
//! read (GET) partitioned topics, as Pulsar's admin API does.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::put;
use axum::{Json, Router};
use serde_json::json;

use super::error::AdminError;
use super::{topic_path, AdminState};
use crate::naming::TopicName;

pub(super) fn routes() -> Router<AdminState> {
    Router::new().route(
        "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions",
        put(create).post(update).get(read),
    )
}

fn topic_name(tenant: &str, namespace: &str, topic: &str) -> Result<TopicName, AdminError> {
    let name = topic_path(tenant, namespace, topic)?;
    if name.partition().is_some() {
        return Err(AdminError::BadRequest(format!(
            "{name} names a partition, not a topic"
        )));
    }
    Ok(name)
}

fn partition_count(body: &str) -> Result<u32, AdminError> {
    body.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            AdminError::BadRequest(format!("expected a positive partition count, got '{body}'"))
        })
}

async fn create(
    State(state): State<AdminState>,
    Path((tenant, namespace, topic)): Path<(String, String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    set_partitions(&state, &tenant, &namespace, &topic, &body, false).await
}

async fn update(
    State(state): State<AdminState>,
    Path((tenant, namespace, topic)): Path<(String, String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    set_partitions(&state, &tenant, &namespace, &topic, &body, true).await
}

async fn set_partitions(
    state: &AdminState,
    tenant: &str,
    namespace: &str,
    topic: &str,
    body: &str,
    update: bool,
) -> Result<StatusCode, AdminError> {
    let name = topic_name(tenant, namespace, topic)?;
    let n = partition_count(body)?;
    state.ops()?.set_partitions(&name, n, update).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn read(
    State(state): State<AdminState>,
    Path((tenant, namespace, topic)): Path<(String, String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let name = topic_name(&tenant, &namespace, &topic)?;
    let n = state.ops()?.partitions(&name).await?;
    Ok(Json(json!({ "partitions": n })))
}
