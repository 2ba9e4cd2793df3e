//! The HTTP surface on `server.http_addr`: health and the first Pulsar admin API paths (topic
//! partitions, offload and stats, namespace offload policies); metrics, the rest of the admin
//! API joins it in later issues. `POST /sql` runs read-only SQL ([`crate::sql`]). Errors map to HTTP statuses in [`error`] and only
//! there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::ledger::MetadataStore;

mod delete;
pub mod error;
mod lake;
mod namespaces;
mod sql;
mod topics;

/// Readiness shared between the service and the HTTP handlers.
#[derive(Debug, Default)]
pub struct Health {
    /// Invariant: true only between the end of recovery and the start of shutdown.
    ready: AtomicBool,
}

impl Health {
    /// A new, not-yet-ready state.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Marks the service ready (recovery finished) or not (shutting down).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Whether the service is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// What the HTTP handlers share.
#[derive(Debug, Clone)]
pub struct AdminState {
    /// Readiness.
    pub health: Arc<Health>,
    /// The metadata store, once recovery has opened it.
    pub meta: Arc<tokio::sync::OnceCell<Arc<dyn MetadataStore>>>,
    /// The log, the offload engine (`None` when the lake is disabled) and the namespace
    /// policies, once recovery has finished.
    pub services: Arc<tokio::sync::OnceCell<Services>>,
}

/// Parts of the running service the admin API drives.
#[derive(Debug, Clone)]
pub struct Services {
    /// The log.
    pub log: Arc<crate::ledger::Log>,
    /// The offload engine, `None` when `lake.enabled = false`.
    pub offload: Option<crate::offload::OffloadEngine>,
    /// Namespace policies.
    pub policies: Arc<crate::policies::PolicyStore>,
    /// The broker (policy changes it must apply at once).
    pub broker: Arc<crate::broker::Broker>,
    /// The SQL engine (`None` when `sql.enabled = false`).
    pub sql: Option<crate::sql::SqlEngine>,
}

/// The topic named by an admin path `/{tenant}/{namespace}/{topic}` (persistent domain).
pub(crate) fn topic_path(
    tenant: &str,
    namespace: &str,
    topic: &str,
) -> Result<crate::broker::topic_name::TopicName, error::AdminError> {
    Ok(format!("persistent://{tenant}/{namespace}/{topic}").parse()?)
}

/// The namespace `tenant/namespace` named by an admin path, checked with the topic-name rules.
pub(crate) fn namespace_path(tenant: &str, namespace: &str) -> Result<String, error::AdminError> {
    use crate::broker::topic_name::valid_part;
    if valid_part(tenant) && valid_part(namespace) {
        Ok(format!("{tenant}/{namespace}"))
    } else {
        Err(error::AdminError::BadRequest(format!(
            "invalid namespace name '{tenant}/{namespace}'"
        )))
    }
}

impl AdminState {
    /// The running services, or 503 while recovering.
    pub fn services(&self) -> Result<&Services, error::AdminError> {
        self.services.get().ok_or(error::AdminError::NotReady)
    }
}

/// The router of the HTTP surface.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .merge(topics::routes())
        .merge(delete::routes())
        .merge(lake::routes())
        .merge(namespaces::routes())
        .merge(sql::routes())
        .with_state(state)
}

async fn live() -> Json<serde_json::Value> {
    Json(json!({ "status": "live" }))
}

async fn ready(State(state): State<AdminState>) -> (StatusCode, Json<serde_json::Value>) {
    if state.health.is_ready() {
        (StatusCode::OK, Json(json!({ "status": "ready" })))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "not_ready" })),
        )
    }
}
