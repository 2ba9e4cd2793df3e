//! Inactive-topic policies through Pulsar's paths: `GET|POST|DELETE
//! /admin/v2/namespaces/{t}/{ns}/inactiveTopicPolicies` and
//! `/admin/v2/persistent/{t}/{ns}/{topic}/inactiveTopicPolicies` (the topic's wins). The body is
//! Pulsar's `InactiveTopicPolicies` JSON; GET answers `null` when unset (the broker default,
//! `[broker.delete_inactive_topics]`, applies). A change applies to loaded topics before the
//! answer.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};

use super::error::AdminError;
use super::namespaces::{update, update_topic};
use super::Routes;
use super::{namespace_path, topic_path, AdminState};
use crate::policies::InactiveTopicPolicies;

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .at(
            "/admin/v2/namespaces/{tenant}/{namespace}/inactiveTopicPolicies",
            get(get_ns).post(set_ns).delete(delete_ns),
        )
        .at(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}/inactiveTopicPolicies",
            get(get_topic).post(set_topic).delete(delete_topic),
        )
}

fn parse(body: &str) -> Result<InactiveTopicPolicies, AdminError> {
    let p: InactiveTopicPolicies = serde_json::from_str(body)
        .map_err(|e| AdminError::BadRequest(format!("expected InactiveTopicPolicies JSON: {e}")))?;
    p.validate().map_err(AdminError::BadRequest)?;
    Ok(p)
}

async fn get_ns(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<Option<InactiveTopicPolicies>>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(
        s.ops()?
            .namespace_policies(&ns)
            .await?
            .inactive_topic_policies,
    ))
}

async fn set_ns(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = parse(&body)?;
    update(&s, &t, &n, |p| p.inactive_topic_policies = Some(v)).await
}

async fn delete_ns(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<StatusCode, AdminError> {
    update(&s, &t, &n, |p| p.inactive_topic_policies = None).await
}

async fn get_topic(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
) -> Result<Json<Option<InactiveTopicPolicies>>, AdminError> {
    let name = topic_path(&t, &n, &topic)?.base();
    Ok(Json(
        s.ops()?
            .topic_policies(&name)
            .await?
            .inactive_topic_policies,
    ))
}

async fn set_topic(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let v = parse(&body)?;
    update_topic(&s, (&t, &n, &topic), |p| {
        p.inactive_topic_policies = Some(v)
    })
    .await
}

async fn delete_topic(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
) -> Result<StatusCode, AdminError> {
    update_topic(&s, (&t, &n, &topic), |p| p.inactive_topic_policies = None).await
}
