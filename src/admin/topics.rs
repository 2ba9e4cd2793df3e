//! Topics (Pulsar's paths under `/admin/v2/persistent/{tenant}/{namespace}/{topic}`):
//! - `…/partitions`: create (PUT), grow on a live topic (POST; clients find the new
//!   partitions by their periodic partition lookup) and read (GET) partitioned topics;
//! - `PUT …/{topic}`: create a non-partitioned topic (409 when it exists);
//! - `GET …/partitioned-stats?perPartition=`: the partitions' stats summed, with
//!   `metadata.partitions` and each partition's stats;
//! - `GET …/internalStats`: ledgers with their tier (`local`, `offloaded`, `lake`) and cursors;
//! - `PUT …/unload[?destinationBroker=host:port]`: clients are disconnected, reconnect and
//!   load the topic anew, on the named node when one is given (a planned move).
//!
//! A body naming a partition count may be a bare integer (Java admin) or
//! `{"partitions": N}` (pulsarctl).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Json, Router};
use serde_json::json;

use super::error::AdminError;
use super::Routes;
use super::{topic_path, AdminState};
use crate::naming::TopicName;

const TOPIC: &str = "/admin/v2/persistent/{tenant}/{namespace}/{topic}";

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .at(
            &format!("{TOPIC}/partitions"),
            put(create).post(update).get(read),
        )
        .at(TOPIC, put(create_topic))
        .at(
            &format!("{TOPIC}/partitioned-stats"),
            get(partitioned_stats),
        )
        .at(&format!("{TOPIC}/internalStats"), get(internal_stats))
        .at(&format!("{TOPIC}/unload"), put(unload))
}

async fn create_topic(
    State(state): State<AdminState>,
    Path((tenant, namespace, topic)): Path<(String, String, String)>,
) -> Result<StatusCode, AdminError> {
    let name = topic_name(&tenant, &namespace, &topic)?;
    state.ops()?.create_topic(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatsParams {
    #[serde(default = "yes")]
    per_partition: bool,
}

fn yes() -> bool {
    true
}

async fn partitioned_stats(
    State(state): State<AdminState>,
    Path((tenant, namespace, topic)): Path<(String, String, String)>,
    Query(q): Query<StatsParams>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let name = topic_name(&tenant, &namespace, &topic)?;
    Ok(Json(
        state
            .ops()?
            .partitioned_stats(&name, q.per_partition)
            .await?,
    ))
}

async fn internal_stats(
    State(state): State<AdminState>,
    Path((tenant, namespace, topic)): Path<(String, String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let name = topic_path(&tenant, &namespace, &topic)?;
    Ok(Json(state.ops()?.internal_stats(&name).await?))
}

/// Query of `PUT …/unload`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct UnloadParams {
    /// A planned move: the id (advertised HTTP `host:port`) of the node to serve the topic
    /// next, as Pulsar's `destinationBroker`.
    destination_broker: Option<String>,
}

async fn unload(
    State(state): State<AdminState>,
    Path((tenant, namespace, topic)): Path<(String, String, String)>,
    Query(q): Query<UnloadParams>,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&tenant, &namespace, &topic)?;
    let to = q.destination_broker.as_deref().filter(|d| !d.is_empty());
    state.ops()?.unload(&name, to).await?;
    Ok(StatusCode::NO_CONTENT)
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
    let body = body.trim();
    let object = || {
        serde_json::from_str::<serde_json::Value>(body)
            .ok()?
            .get("partitions")?
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
    };
    body.parse::<u32>()
        .ok()
        .or_else(object)
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
