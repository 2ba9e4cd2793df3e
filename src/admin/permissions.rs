//! Permissions through Pulsar's paths (tenant admins and superusers; granting answers 501
//! while authorization is off, as Pulsar does):
//! - `GET /admin/v2/namespaces/{tenant}/{namespace}/permissions` → `{role: [actions]}`;
//!   `POST|DELETE …/permissions/{role}` (body: a JSON array of `produce`, `consume`,
//!   `functions`, `sources`, `sinks`, `packages`);
//! - `POST …/permissions/subscription/{subscription}` (body: an array of roles) and
//!   `DELETE …/permissions/{subscription}/{role}`: which roles may use a subscription;
//! - `GET|POST …/subscriptionAuthMode` (`"None"` or `"Prefix"`);
//! - `GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/permissions` (namespace and topic
//!   grants together), `POST|DELETE …/{topic}/permissions/{role}` (DELETE answers 412 when
//!   the role's grant is at namespace level only).

use std::collections::BTreeSet;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};

use super::error::AdminError;
use super::tenancy::json_body;
use super::Routes;
use super::{namespace_path, topic_path, AdminState};
use crate::tenancy::{AuthAction, Grants, SubscriptionAuthMode};

pub(super) fn routes() -> Router<AdminState> {
    let ns = "/admin/v2/namespaces/{tenant}/{namespace}";
    let topic = "/admin/v2/persistent/{tenant}/{namespace}/{topic}";
    Router::new()
        .at(&format!("{ns}/permissions"), get(namespace_grants))
        .at(
            &format!("{ns}/permissions/{{name}}"),
            post(grant_namespace).delete(revoke_namespace),
        )
        .at(
            &format!("{ns}/permissions/subscription/{{name}}"),
            post(grant_subscription),
        )
        .at(
            &format!("{ns}/permissions/{{name}}/{{role}}"),
            axum::routing::delete(revoke_subscription),
        )
        .at(
            &format!("{ns}/subscriptionAuthMode"),
            get(get_mode).post(set_mode),
        )
        .at(&format!("{topic}/permissions"), get(topic_grants))
        .at(
            &format!("{topic}/permissions/{{role}}"),
            post(grant_topic).delete(revoke_topic),
        )
}

fn actions(body: &str) -> Result<BTreeSet<AuthAction>, AdminError> {
    json_body(body)
}

async fn namespace_grants(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<Grants>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(s.ops()?.namespace_permissions(&ns).await?))
}

async fn grant_namespace(
    State(s): State<AdminState>,
    Path((t, n, role)): Path<(String, String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let ns = namespace_path(&t, &n)?;
    s.ops()?
        .grant_namespace(&ns, &role, actions(&body)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn revoke_namespace(
    State(s): State<AdminState>,
    Path((t, n, role)): Path<(String, String, String)>,
) -> Result<StatusCode, AdminError> {
    let ns = namespace_path(&t, &n)?;
    s.ops()?.revoke_namespace(&ns, &role).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn grant_subscription(
    State(s): State<AdminState>,
    Path((t, n, sub)): Path<(String, String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let ns = namespace_path(&t, &n)?;
    let roles: BTreeSet<String> = json_body(&body)?;
    s.ops()?.grant_subscription(&ns, &sub, roles).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn revoke_subscription(
    State(s): State<AdminState>,
    Path((t, n, sub, role)): Path<(String, String, String, String)>,
) -> Result<StatusCode, AdminError> {
    let ns = namespace_path(&t, &n)?;
    s.ops()?.revoke_subscription(&ns, &sub, &role).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn get_mode(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<SubscriptionAuthMode>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(s.ops()?.subscription_auth_mode(&ns).await?))
}

async fn set_mode(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let ns = namespace_path(&t, &n)?;
    // Pulsar's clients send the enum as a JSON string; a bare word is accepted too.
    let text = body.trim();
    let mode = json_body(text).or_else(|_| json_body(&format!("\"{text}\"")))?;
    s.ops()?.set_subscription_auth_mode(&ns, mode).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn topic_grants(
    State(s): State<AdminState>,
    Path((t, n, topic)): Path<(String, String, String)>,
) -> Result<Json<Grants>, AdminError> {
    let name = topic_path(&t, &n, &topic)?;
    Ok(Json(s.ops()?.topic_permissions(&name).await?))
}

async fn grant_topic(
    State(s): State<AdminState>,
    Path((t, n, topic, role)): Path<(String, String, String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&t, &n, &topic)?;
    s.ops()?.grant_topic(&name, &role, actions(&body)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn revoke_topic(
    State(s): State<AdminState>,
    Path((t, n, topic, role)): Path<(String, String, String, String)>,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&t, &n, &topic)?;
    s.ops()?.revoke_topic(&name, &role).await?;
    Ok(StatusCode::NO_CONTENT)
}
