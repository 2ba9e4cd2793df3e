//! `POST /sql`: one read-only statement, the body as plain text (or JSON `{"query": "..."}`),
//! the result as JSON rows (default), CSV or an Arrow IPC stream by the `Accept` header. With
//! authentication on, `Authorization: Bearer <token>` is required.
//!
//! Errors before the first row get their HTTP status (`admin::error`); an error after rows were
//! sent ends the response early (the body is then incomplete, never silently short: JSON and
//! Arrow bodies lack their end markers).

use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use futures::StreamExt;

use super::error::AdminError;
use super::AdminState;
use super::Routes;
use crate::sql::format::Format;

pub(super) fn routes() -> Router<AdminState> {
    Router::new().at("/sql", post(run))
}

fn query_text(headers: &HeaderMap, body: &[u8]) -> Result<String, AdminError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        #[derive(serde::Deserialize)]
        struct Body {
            query: String,
        }
        let b: Body = serde_json::from_slice(body)
            .map_err(|e| AdminError::BadRequest(format!("expected {{\"query\": \"...\"}}: {e}")))?;
        Ok(b.query)
    } else {
        String::from_utf8(body.to_vec())
            .map_err(|_| AdminError::BadRequest("the query is not UTF-8".into()))
    }
}

async fn run(
    State(state): State<AdminState>,
    Extension(principal): Extension<crate::auth::Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AdminError> {
    let engine = state.ops()?.sql()?.clone();
    let format = Format::from_accept(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()))
        .map_err(AdminError::BadRequest)?;
    let sql = query_text(&headers, &body)?;
    let mut rows = engine.query(&principal, &sql).await?;
    let mut encoder = format
        .encoder(rows.schema())
        .map_err(|e| AdminError::Internal(e.to_string()))?;
    // The first batch decides the status: most failures happen before any row.
    let first = match rows.next().await {
        Some(Err(e)) => return Err(e.into()),
        Some(Ok(b)) => Some(b),
        None => None,
    };
    let head = match &first {
        Some(b) => encoder
            .batch(b)
            .map_err(|e| AdminError::Internal(e.to_string()))?,
        None => Vec::new(),
    };
    let rest = futures::stream::unfold(
        (rows, encoder, false),
        |(mut rows, mut encoder, done)| async move {
            if done {
                return None;
            }
            match rows.next().await {
                Some(Ok(b)) => {
                    let bytes = encoder.batch(&b).map_err(io_error);
                    Some((bytes.map(Bytes::from), (rows, encoder, false)))
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "SQL query failed after its first rows");
                    Some((Err(io_error(e)), (rows, encoder, true)))
                }
                None => {
                    let bytes = encoder.finish().map_err(io_error);
                    Some((bytes.map(Bytes::from), (rows, encoder, true)))
                }
            }
        },
    );
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(head)) })
        .chain(rest);
    Response::builder()
        .header(header::CONTENT_TYPE, format.content_type())
        .body(Body::from_stream(stream))
        .map_err(|e| AdminError::Internal(e.to_string()))
}

fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}
