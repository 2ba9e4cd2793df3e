//! `GET /metrics`: Prometheus text format 0.0.4 with Pulsar's topic and subscription families
//! and ledgerlake's own ([`crate::metrics`]). Open like `/health` (Pulsar's default,
//! `authenticateMetricsEndpoint=false`): scrapers carry no token. 412 when
//! `metrics.enabled = false`.

use std::convert::Infallible;
use std::task::Poll;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;

use super::error::AdminError;
use super::AdminState;
use super::Routes;

pub(super) fn routes() -> Router<AdminState> {
    Router::new().at("/metrics", get(scrape))
}

/// A text at least this large hands the memory its making took back once it was sent (with
/// topic-level metrics on, several KB per loaded topic).
const LARGE_TEXT: usize = 16 << 20;

async fn scrape(State(state): State<AdminState>) -> Result<impl IntoResponse, AdminError> {
    let text = state.ops()?.metrics_text().await?;
    let body = if text.len() < LARGE_TEXT {
        Body::from(text)
    } else {
        let release = crate::memory::ReleaseOnDrop;
        let mut text = Some(Bytes::from(text));
        Body::from_stream(futures::stream::poll_fn(move |_| {
            // Dropped with the body, once it was sent (or the scraper went away).
            let _held = &release;
            Poll::Ready(text.take().map(Ok::<_, Infallible>))
        }))
    };
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body))
}
