//! Offload and stats of a topic (Pulsar's paths):
//! - `PUT /admin/v2/persistent/{tenant}/{namespace}/{topic}/offload`: offload everything written
//!   so far (the open ledger is sealed first). Answers `{"request": n}`: the request is done
//!   once `GET .../offload` shows `completedRequest >= n`.
//! - `GET .../offload`: `OffloadProcessStatus` (`status`, `lastError`,
//!   `firstUnoffloadedMessage`) plus lag and progress.
//! - `GET .../stats`: storage and ledgers, a `lake` object naming the Iceberg table, each
//!   loaded subscription's backlog (entries, bytes, age) and serving tier, and the broker's
//!   replay counters.

use axum::extract::{Path, State};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde_json::json;

use super::error::AdminError;
use super::{topic_path, AdminState};
use crate::offload::OffloadEngine;

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}/offload",
            put(trigger).get(status),
        )
        .route(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats",
            get(stats),
        )
}

fn engine(state: &AdminState) -> Result<OffloadEngine, AdminError> {
    state.services()?.offload.clone().ok_or_else(|| {
        AdminError::Disabled("the lake is disabled in this service (lake.enabled = false)".into())
    })
}

async fn trigger(
    State(state): State<AdminState>,
    Path((tenant, namespace, name)): Path<(String, String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let t = topic_path(&tenant, &namespace, &name)?;
    let ticket = engine(&state)?.request(&t).await?;
    Ok(Json(json!({ "request": ticket })))
}

async fn status(
    State(state): State<AdminState>,
    Path((tenant, namespace, name)): Path<(String, String, String)>,
) -> Result<Json<crate::offload::OffloadStatus>, AdminError> {
    let t = topic_path(&tenant, &namespace, &name)?;
    Ok(Json(engine(&state)?.status(&t).await?))
}

async fn stats(
    State(state): State<AdminState>,
    Path((tenant, namespace, name)): Path<(String, String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let t = topic_path(&tenant, &namespace, &name)?;
    let services = state.services()?;
    let mut ledgers = Vec::new();
    let mut storage = 0u64;
    let mut entries = 0u64;
    let wanted_partition = t.partition().map(|p| p as i32);
    let mut subscriptions = serde_json::Map::new();
    for (partition, log) in crate::offload::partition_logs(&services.log, &t.base()).await? {
        if wanted_partition.is_some_and(|w| w != partition) {
            continue;
        }
        for (name, s) in services.broker.subscription_stats(log.name()).await {
            let key = if partition >= 0 && wanted_partition.is_none() {
                format!("{name} (partition {partition})")
            } else {
                name
            };
            subscriptions.insert(
                key,
                serde_json::to_value(s).map_err(|e| AdminError::Internal(e.to_string()))?,
            );
        }
        for l in log.ledgers() {
            if matches!(
                l.state,
                crate::ledger::LedgerState::Open
                    | crate::ledger::LedgerState::Sealed
                    | crate::ledger::LedgerState::Offloaded
            ) {
                storage += l.size_bytes;
            }
            entries += l.entry_count;
            ledgers.push(json!({ "topic": log.name(), "ledger": l }));
        }
    }
    if ledgers.is_empty() && !services.log.topic_exists(&t.to_string()).await? {
        return Err(AdminError::NotFound(format!("Topic {t} not found")));
    }
    let lake = match &services.offload {
        Some(e) => serde_json::to_value(e.lake_stats(&t).await?)
            .map_err(|e| AdminError::Internal(e.to_string()))?,
        None => serde_json::Value::Null,
    };
    Ok(Json(json!({
        "storageSize": storage,
        "entries": entries,
        "ledgers": ledgers,
        "lake": lake,
        "subscriptions": subscriptions,
        "replay": services.broker.replay_stats(),
    })))
}
