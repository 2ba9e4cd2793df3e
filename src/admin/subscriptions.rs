//! Subscriptions of a topic (Pulsar's paths under `/admin/v2/persistent/{t}/{ns}/{topic}`):
//! - `GET …/subscriptions`: the durable subscriptions;
//! - `PUT …/subscription/{sub}` (body: a `MessageId` `{"ledgerId","entryId"}`, or none for
//!   the latest position; `?messageId=earliest|latest` too): create one there, 409 if it
//!   exists;
//! - `DELETE …/subscription/{sub}?force=`: 412 while consumers are attached unless forced;
//! - `POST …/subscription/{sub}/skip/{n}`, `…/skip_all` (clear-backlog),
//!   `…/expireMessages/{seconds}`, `…/all_subscription/expireMessages/{seconds}`;
//! - `POST …/subscription/{sub}/resetcursor/{timestamp}` and `…/resetcursor` (body: a
//!   `MessageId`): consumers are disconnected and reconnect there;
//! - `GET …/subscription/{sub}/position/{n}`: peek the n-th message of its backlog (see
//!   [`super::messages`]).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;

use super::error::AdminError;
use super::Routes;
use super::{topic_path, AdminState};
use crate::broker::manage::Skip;
use crate::broker::subscription::SeekTarget;
use crate::ledger::Position;
use crate::ops::Target;

const TOPIC: &str = "/admin/v2/persistent/{tenant}/{namespace}/{topic}";

pub(super) fn routes() -> Router<AdminState> {
    let sub = format!("{TOPIC}/subscription/{{subscription}}");
    Router::new()
        .at(&format!("{TOPIC}/subscriptions"), get(list))
        .at(&sub, put(create).delete(remove))
        .at(&format!("{sub}/skip/{{n}}"), post(skip))
        .at(&format!("{sub}/skip_all"), post(skip_all))
        .at(&format!("{sub}/expireMessages/{{seconds}}"), post(expire))
        .at(
            &format!("{TOPIC}/all_subscription/expireMessages/{{seconds}}"),
            post(expire_all),
        )
        .at(
            &format!("{sub}/resetcursor/{{timestamp}}"),
            post(reset_to_time),
        )
        .at(&format!("{sub}/resetcursor"), post(reset_to_id))
}

/// Pulsar's `MessageId` body.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageIdBody {
    ledger_id: i64,
    entry_id: i64,
    #[serde(default = "minus_one")]
    partition_index: i32,
}

fn minus_one() -> i32 {
    -1
}

impl MessageIdBody {
    /// The position named; `(-1, -1)` is Pulsar's "earliest" and `i64::MAX` ids its "latest".
    fn target(&self) -> Result<Target, AdminError> {
        match (self.ledger_id, self.entry_id) {
            (-1, -1) => Ok(Target::Earliest),
            (l, e) if l == i64::MAX && e == i64::MAX => Ok(Target::Latest),
            (l, e) if l >= 0 && e >= 0 => Ok(Target::Position(Position::new(l as u64, e as u64))),
            (l, e) => Err(AdminError::BadRequest(format!(
                "invalid message id {l}:{e}"
            ))),
        }
    }
}

/// Parses an optional `MessageId` body.
fn message_id(body: &str) -> Result<Option<MessageIdBody>, AdminError> {
    if body.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(body).map(Some).map_err(|e| {
        AdminError::BadRequest(format!(
            "expected a MessageId {{\"ledgerId\",\"entryId\"}}: {e}"
        ))
    })
}

type TopicPath = Path<(String, String, String)>;
type SubPath = Path<(String, String, String, String)>;

async fn list(
    State(s): State<AdminState>,
    Path((t, ns, topic)): TopicPath,
) -> Result<Json<Vec<String>>, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    Ok(Json(s.ops()?.subscriptions(&name).await?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateParams {
    /// `earliest` or `latest` (pulsarctl), when no body names a message.
    message_id: Option<String>,
}

async fn create(
    State(s): State<AdminState>,
    Path((t, ns, topic, sub)): SubPath,
    Query(q): Query<CreateParams>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    let at = match (message_id(&body)?, q.message_id.as_deref()) {
        (Some(id), _) => id.target()?,
        (None, Some("earliest")) => Target::Earliest,
        (None, None | Some("latest")) => Target::Latest,
        (None, Some(other)) => {
            return Err(AdminError::BadRequest(format!(
                "messageId must be earliest or latest, got '{other}'"
            )))
        }
    };
    s.ops()?.create_subscription(&name, &sub, at).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct ForceParam {
    #[serde(default)]
    force: bool,
}

async fn remove(
    State(s): State<AdminState>,
    Path((t, ns, topic, sub)): SubPath,
    Query(q): Query<ForceParam>,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    s.ops()?.delete_subscription(&name, &sub, q.force).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn skip(
    State(s): State<AdminState>,
    Path((t, ns, topic, sub, n)): Path<(String, String, String, String, u64)>,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    s.ops()?.skip(&name, &sub, Skip::Entries(n)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn skip_all(
    State(s): State<AdminState>,
    Path((t, ns, topic, sub)): SubPath,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    s.ops()?.skip(&name, &sub, Skip::All).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn expire(
    State(s): State<AdminState>,
    Path((t, ns, topic, sub, secs)): Path<(String, String, String, String, u64)>,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    s.ops()?
        .skip(&name, &sub, Skip::OlderThanSeconds(secs))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn expire_all(
    State(s): State<AdminState>,
    Path((t, ns, topic, secs)): Path<(String, String, String, u64)>,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    let ops = s.ops()?;
    for sub in ops.subscriptions(&name).await? {
        ops.skip(&name, &sub, Skip::OlderThanSeconds(secs)).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn reset_to_time(
    State(s): State<AdminState>,
    Path((t, ns, topic, sub, ts)): Path<(String, String, String, String, i64)>,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    s.ops()?
        .reset_cursor(&name, &sub, SeekTarget::PublishTime(ts), None)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn reset_to_id(
    State(s): State<AdminState>,
    Path((t, ns, topic, sub)): SubPath,
    body: String,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&t, &ns, &topic)?;
    let id = message_id(&body)?
        .ok_or_else(|| AdminError::BadRequest("resetcursor needs a MessageId body".into()))?;
    let to = match id.target()? {
        Target::Position(p) => SeekTarget::Position(p),
        Target::Earliest => SeekTarget::Position(Position::new(0, 0)),
        Target::Latest => SeekTarget::PublishTime(i64::MAX),
    };
    let partition = u32::try_from(id.partition_index).ok();
    s.ops()?.reset_cursor(&name, &sub, to, partition).await?;
    Ok(StatusCode::NO_CONTENT)
}
