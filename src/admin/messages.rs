//! Reading messages through the admin API (Pulsar's paths under
//! `/admin/v2/persistent/{t}/{ns}/{topic}`):
//! - `GET …/subscription/{sub}/position/{n}`: peek the n-th (1-based) entry of the
//!   subscription's backlog;
//! - `GET …/examinemessage?initialPosition=earliest|latest&messagePosition=n`: the n-th entry
//!   from the first, or back from the last;
//! - `GET …/lastMessageId`: `{ledgerId, entryId, partitionIndex}`.
//!
//! As Pulsar answers peek: the body is the entry's payload (decompressed; for a batch, the
//! batch's framed messages with `X-Pulsar-num-batch-message`), its metadata in `X-Pulsar-*`
//! headers (`X-Pulsar-Message-ID`, `X-Pulsar-publish-time`, `X-Pulsar-producer-name`,
//! `X-Pulsar-sequence-id`, `X-Pulsar-partition-key`, `X-Pulsar-event-time`,
//! `X-Pulsar-PROPERTY-{key}`). Entries are read from whichever tier holds them.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use super::error::AdminError;
use super::Routes;
use super::{topic_path, AdminState};
use crate::broker::manage::Examine;
use crate::ledger::Entry;
use crate::naming::TopicName;

const TOPIC: &str = "/admin/v2/persistent/{tenant}/{namespace}/{topic}";

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .at(
            &format!("{TOPIC}/subscription/{{subscription}}/position/{{n}}"),
            get(peek),
        )
        .at(&format!("{TOPIC}/examinemessage"), get(examine))
        .at(&format!("{TOPIC}/lastMessageId"), get(last_message_id))
}

fn header(headers: &mut HeaderMap, name: &str, value: impl ToString) {
    if let (Ok(n), Ok(v)) = (
        HeaderName::try_from(name),
        HeaderValue::try_from(value.to_string()),
    ) {
        headers.insert(n, v);
    }
}

/// Milliseconds since the epoch as an RFC 3339 time (what Pulsar's admin clients parse).
fn rfc3339(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(|| ms.to_string(), |t| t.to_rfc3339())
}

/// The entry as Pulsar's peek answers it.
fn respond(name: &TopicName, entry: Entry) -> Result<impl IntoResponse, AdminError> {
    let opened = crate::protocol::entry::open_entry(&entry.payload)
        .map_err(|e| AdminError::Internal(format!("entry {} unreadable: {e}", entry.position)))?;
    let m = &opened.metadata;
    let mut h = HeaderMap::new();
    let partition = name.partition().map_or(-1, |p| p as i64);
    header(
        &mut h,
        "X-Pulsar-Message-ID",
        format!(
            "{}:{}:{partition}",
            entry.position.ledger, entry.position.entry
        ),
    );
    header(&mut h, "X-Pulsar-publish-time", rfc3339(m.publish_time));
    header(&mut h, "X-Pulsar-producer-name", &m.producer_name);
    header(&mut h, "X-Pulsar-sequence-id", m.sequence_id);
    if let Some(k) = &m.partition_key {
        header(&mut h, "X-Pulsar-partition-key", k);
    }
    if let Some(t) = m.event_time.filter(|t| *t > 0) {
        header(&mut h, "X-Pulsar-event-time", rfc3339(t));
    }
    if let Some(n) = opened.batch_size {
        header(&mut h, "X-Pulsar-num-batch-message", n);
    }
    for kv in &m.properties {
        header(&mut h, &format!("X-Pulsar-PROPERTY-{}", kv.key), &kv.value);
    }
    if m.null_value == Some(true) {
        header(&mut h, "X-Pulsar-null-value", "true");
    }
    Ok((h, opened.payload))
}

async fn peek(
    State(s): State<AdminState>,
    Path((t, ns, topic, sub, n)): Path<(String, String, String, String, u64)>,
) -> Result<impl IntoResponse, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    let entry = s.ops()?.peek(&name, &sub, n).await?;
    respond(&name, entry)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExamineParams {
    #[serde(default = "latest")]
    initial_position: String,
    #[serde(default = "one")]
    message_position: u64,
}

fn latest() -> String {
    "latest".into()
}

fn one() -> u64 {
    1
}

async fn examine(
    State(s): State<AdminState>,
    Path((t, ns, topic)): Path<(String, String, String)>,
    Query(q): Query<ExamineParams>,
) -> Result<impl IntoResponse, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    let from = match q.initial_position.as_str() {
        "earliest" => Examine::Earliest(q.message_position),
        "latest" => Examine::Latest(q.message_position),
        other => {
            return Err(AdminError::BadRequest(format!(
                "initialPosition must be earliest or latest, got '{other}'"
            )))
        }
    };
    let entry = s.ops()?.examine(&name, from).await?;
    respond(&name, entry)
}

async fn last_message_id(
    State(s): State<AdminState>,
    Path((t, ns, topic)): Path<(String, String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    Ok(Json(s.ops()?.last_message_id(&name).await?))
}
