//! The HTTP surface on `server.http_addr`: health and Pulsar admin API paths (clusters,
//! tenants, namespaces and their policies and permissions, publish rates and resource groups,
//! backlog quotas and message TTL; topic partitions, permissions, offload and stats),
//! `GET /metrics` (Prometheus, open like health). `POST /sql` runs read-only SQL
//! ([`crate::sql`]). Errors map to HTTP statuses in [`error`] and only there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

mod access;
mod backlog;
mod broker_stats;
mod delete;
pub mod error;
mod inactive;
mod lake;
mod limits;
pub mod listen;
mod messages;
mod metrics;
mod namespaces;
#[cfg(test)]
mod openapi_check;
mod permissions;
mod quotas;
mod rates;
mod sql;
mod subscriptions;
mod tenancy;
mod topics;

/// Every route path the admin modules registered (`schemas/openapi.json` is checked against
/// them). Invariant: routes are only added through [`Routes::at`].
static ROUTE_PATHS: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Adding a route and recording its path.
pub(crate) trait Routes {
    /// `Router::route`, with the path recorded in [`route_paths`].
    fn at(self, path: &str, handler: axum::routing::MethodRouter<AdminState>) -> Self;
}

impl Routes for Router<AdminState> {
    fn at(self, path: &str, handler: axum::routing::MethodRouter<AdminState>) -> Self {
        ROUTE_PATHS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path.to_string());
        self.route(path, handler)
    }
}

/// The route paths registered so far (all of them once [`router`] has run).
pub fn route_paths() -> Vec<String> {
    ROUTE_PATHS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect()
}

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
    /// The operations on the running service, once recovery has finished.
    pub ops: Arc<tokio::sync::OnceCell<crate::ops::Operations>>,
    /// Authentication and authorization, shared with the other surfaces.
    pub access: crate::auth::Access,
}

/// The topic named by an admin path `/{tenant}/{namespace}/{topic}` (persistent domain).
pub(crate) fn topic_path(
    tenant: &str,
    namespace: &str,
    topic: &str,
) -> Result<crate::naming::TopicName, error::AdminError> {
    Ok(crate::naming::TopicName::persistent(
        &namespace_path(tenant, namespace)?,
        topic,
    )?)
}

/// The namespace `tenant/namespace` named by an admin path, checked with the topic-name rules.
pub(crate) fn namespace_path(
    tenant: &str,
    namespace: &str,
) -> Result<crate::naming::NamespaceName, error::AdminError> {
    crate::naming::NamespaceName::new(tenant, namespace)
        .map_err(|e| error::AdminError::BadRequest(e.to_string()))
}

impl AdminState {
    /// The operations, or 503 while recovering.
    pub fn ops(&self) -> Result<&crate::ops::Operations, error::AdminError> {
        self.ops.get().ok_or(error::AdminError::NotReady)
    }
}

/// The router of the HTTP surface: health is open; every other route passes
/// [`access::guard`] (authentication, then one authorization per request). Request bodies
/// over `max_body` bytes are refused with 413 ([`refuse_oversized`]).
pub fn router(state: AdminState, max_body: usize) -> Router {
    let guarded = Router::new()
        .merge(topics::routes())
        .merge(subscriptions::routes())
        .merge(messages::routes())
        .merge(broker_stats::routes())
        .merge(delete::routes())
        .merge(lake::routes())
        .merge(namespaces::routes())
        .merge(tenancy::routes())
        .merge(permissions::routes())
        .merge(quotas::routes())
        .merge(inactive::routes())
        .merge(backlog::routes())
        .merge(limits::routes())
        .merge(rates::routes())
        .merge(sql::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            access::guard,
        ));
    Router::new()
        .at("/health/live", get(live))
        .at("/health/ready", get(ready))
        .merge(metrics::routes())
        .merge(guarded)
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn(move |request, next| {
            refuse_oversized(max_body, request, next)
        }))
        .layer(axum::middleware::from_fn(redirect_to_owner))
        .with_state(state)
}

/// Marks a request that came over the HTTPS listener (an extension the service adds there).
#[derive(Debug, Clone, Copy)]
pub struct OverTls;

/// Completes a 307 to a topic's owner ([`error::AdminError::Redirect`]): `Location` is the
/// owner's web service URL (its HTTPS one for a request that came over HTTPS; 503 when it
/// serves no HTTPS) with this request's path and query, as Pulsar's brokers redirect admin
/// calls to the owner of the bundle. Only a request naming that very topic (partition) is
/// redirected: a partitioned-topic call whose partitions live on several nodes would bounce
/// between them, so it gets 503 instead (fanning such calls out is not built yet).
async fn redirect_to_owner(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let path = request
        .uri()
        .path_and_query()
        .map_or_else(|| request.uri().path().to_string(), |p| p.to_string());
    let segments: Vec<String> = request
        .uri()
        .path()
        .split('/')
        .map(str::to_string)
        .collect();
    let over_tls = request.extensions().get::<OverTls>().is_some();
    let mut response = next.run(request).await;
    if let Some(error::RedirectBase {
        base,
        base_tls,
        topic,
    }) = response.extensions_mut().remove()
    {
        // A call that came over HTTPS never goes on in the clear: an owner without HTTPS
        // gets it nowhere (503), as its token would.
        let Some(base) = (if over_tls { base_tls } else { Some(base) }) else {
            return owner_without_https(&topic);
        };
        let local = topic.rsplit('/').next().unwrap_or_default();
        let target = format!("{}{path}", base.trim_end_matches('/'));
        match axum::http::HeaderValue::from_str(&target) {
            Ok(v) if segments.iter().any(|s| s == local) => {
                response
                    .headers_mut()
                    .insert(axum::http::header::LOCATION, v);
            }
            _ => *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE,
        }
    }
    response
}

/// 503 for a call made over HTTPS about a topic whose owner serves no HTTPS.
fn owner_without_https(topic: &str) -> axum::response::Response {
    axum::response::IntoResponse::into_response(error::AdminError::Unavailable(format!(
        "topic {topic} is served by a node without HTTPS; a call made over HTTPS is not \
         redirected to plain HTTP"
    )))
}

/// Answers 413 to a request whose `Content-Length` passes `max_body`, before any of its body
/// is read (nor `100 Continue` sent); bodies without a length are held to the same limit as
/// they are read (`DefaultBodyLimit`).
async fn refuse_oversized(
    max_body: usize,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return axum::response::IntoResponse::into_response(error::AdminError::TooLarge(format!(
            "the request body is larger than {max_body} bytes (server.max_request_body)"
        )));
    }
    next.run(request).await
}

/// Live unless the service failed in a way only a restart repairs (a failed journal
/// `fdatasync`: fail-stop), so that a supervisor restarts it.
async fn live(State(state): State<AdminState>) -> (StatusCode, Json<serde_json::Value>) {
    match state.ops.get().and_then(|ops| ops.fatal_failure()) {
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "failed", "reason": reason })),
        ),
        None => (StatusCode::OK, Json(json!({ "status": "live" }))),
    }
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
