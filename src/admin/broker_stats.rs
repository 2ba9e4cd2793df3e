//! `GET /admin/v2/broker-stats/topics`: every loaded topic partition's rates, backlog, offload
//! lag and hot / lag-spiral flags, in Pulsar's shape (namespace → bundle → `persistent` →
//! topic → stats). `ledgerlake top` polls it.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};

use super::error::AdminError;
use super::AdminState;
use super::Routes;

pub(super) fn routes() -> Router<AdminState> {
    Router::new().at("/admin/v2/broker-stats/topics", get(topics))
}

async fn topics(State(s): State<AdminState>) -> Result<Json<serde_json::Value>, AdminError> {
    Ok(Json(s.ops()?.broker_topic_stats()?))
}
