//! Offload and stats of a topic (Pulsar's paths):
//! - `PUT /admin/v2/persistent/{tenant}/{namespace}/{topic}/offload`: offload everything written
//!   so far (the open ledger is sealed first). Answers `{"request": n}`: the request is done
//!   once `GET .../offload` shows `completedRequest >= n`.
//! - `GET .../offload`: `OffloadProcessStatus` (`status`, `lastError`,
//!   `firstUnoffloadedMessage`) plus lag and progress.
//! - `GET .../stats`: storage and ledgers, a `lake` object naming the Iceberg table, each
//!   loaded subscription's backlog (entries, bytes, age) and serving tier, and the broker's
//!   replay counters.
//! - `GET .../verify[?deep=true]`: `ledgerlake verify` of the topic (all its partitions): every
//!   id of the log and the lake checked, the findings listed (200 whether or not it found
//!   something; the report's `findings` tell).

use axum::extract::{Path, Query, State};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde_json::json;

use super::error::AdminError;
use super::Routes;
use super::{topic_path, AdminState};

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .at(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}/offload",
            put(trigger).get(status),
        )
        .at(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats",
            get(stats),
        )
        .at(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}/verify",
            get(verify),
        )
}

#[derive(serde::Deserialize)]
struct VerifyQuery {
    #[serde(default)]
    deep: bool,
}

async fn verify(
    State(state): State<AdminState>,
    Path((tenant, namespace, name)): Path<(String, String, String)>,
    Query(q): Query<VerifyQuery>,
) -> Result<Json<crate::verify::TopicReport>, AdminError> {
    let t = topic_path(&tenant, &namespace, &name)?;
    Ok(Json(state.ops()?.verify(&t, q.deep).await?))
}

async fn trigger(
    State(state): State<AdminState>,
    Path((tenant, namespace, name)): Path<(String, String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let t = topic_path(&tenant, &namespace, &name)?;
    let ticket = state.ops()?.request_offload(&t).await?;
    Ok(Json(json!({ "request": ticket })))
}

async fn status(
    State(state): State<AdminState>,
    Path((tenant, namespace, name)): Path<(String, String, String)>,
) -> Result<Json<crate::offload::OffloadStatus>, AdminError> {
    let t = topic_path(&tenant, &namespace, &name)?;
    Ok(Json(state.ops()?.offload_status(&t).await?))
}

async fn stats(
    State(state): State<AdminState>,
    Path((tenant, namespace, name)): Path<(String, String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let t = topic_path(&tenant, &namespace, &name)?;
    Ok(Json(state.ops()?.topic_stats(&t).await?))
}
