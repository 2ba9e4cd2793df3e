//! `GET /metrics`: Prometheus text format 0.0.4 with Pulsar's topic and subscription families
//! and ledgerlake's own ([`crate::metrics`]). Open like `/health` (Pulsar's default,
//! `authenticateMetricsEndpoint=false`): scrapers carry no token. 412 when
//! `metrics.enabled = false`.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::error::AdminError;
use super::AdminState;
use super::Routes;

pub(super) fn routes() -> Router<AdminState> {
    Router::new().at("/metrics", get(scrape))
}

async fn scrape(State(state): State<AdminState>) -> Result<impl IntoResponse, AdminError> {
    let text = state.ops()?.metrics_text().await?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text))
}
