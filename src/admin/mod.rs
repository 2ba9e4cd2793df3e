//! The HTTP surface on `server.http_addr`: health today; the Pulsar admin API, metrics and
//! HTTP SQL join it in later issues. Errors map to HTTP statuses here and only here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

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

/// The router of the HTTP surface.
pub fn router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .with_state(health)
}

async fn live() -> Json<serde_json::Value> {
    Json(json!({ "status": "live" }))
}

async fn ready(State(health): State<Arc<Health>>) -> (StatusCode, Json<serde_json::Value>) {
    if health.is_ready() {
        (StatusCode::OK, Json(json!({ "status": "ready" })))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "not_ready" })),
        )
    }
}
