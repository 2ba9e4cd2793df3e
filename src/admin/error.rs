//! Admin API errors and their HTTP statuses (the one place this mapping lives). Bodies follow
//! Pulsar's admin API: `{"reason": "..."}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::ledger::metadata::MetadataError;
use crate::naming::TopicNameError;

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The service is still recovering.
    #[error("the service is not ready yet")]
    NotReady,
    /// The object is stopping or moving (an unloaded topic): retry.
    #[error("{0}")]
    Unavailable(String),
    /// A conflicting object exists.
    #[error("{0}")]
    Conflict(String),
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Metadata(MetadataError),
    /// The object does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The feature is switched off in this service's configuration.
    #[error("{0}")]
    Disabled(String),
    /// A dependency (lake, catalog, object store) failed.
    #[error("{0}")]
    Internal(String),
    /// Missing or wrong credentials.
    #[error("{0}")]
    Unauthorized(String),
    /// The request is understood and refused (a write statement to read-only SQL).
    #[error("{0}")]
    Forbidden(String),
    /// A limit of the service was reached (query memory, query time).
    #[error("{0}")]
    LimitExceeded(String),
    /// The object is in use (a topic with connected clients), or a rule of the request is
    /// broken (unknown cluster, permission not set at that level).
    #[error("{0}")]
    PreconditionFailed(String),
    /// The service does not allow this (forced deletion).
    #[error("{0}")]
    NotAllowed(String),
    /// Not available in this configuration (permissions without authorization).
    #[error("{0}")]
    NotImplemented(String),
    /// The request body is over `server.max_request_body`.
    #[error("{0}")]
    TooLarge(String),
    /// Another node serves the topic: 307 to the same path on its web service URL (the
    /// router's [`super::redirect_to_owner`] completes the `Location`).
    #[error("{why}")]
    Redirect {
        /// The owner's `http://host:port`.
        base: String,
        /// The owner's `https://host:port`, when it serves HTTPS.
        base_tls: Option<String>,
        /// The topic (partition) it serves.
        topic: String,
        /// Why (the owner named).
        why: String,
    },
}

/// What a 307 response carries until [`super::redirect_to_owner`] turns it into a `Location`
/// header: the owner's base URL and the topic (partition) it serves.
#[derive(Debug, Clone)]
pub struct RedirectBase {
    /// The owner's `http://host:port`.
    pub base: String,
    /// The owner's `https://host:port`, when it serves HTTPS (for a request that came over
    /// HTTPS).
    pub base_tls: Option<String>,
    /// The topic (partition) it serves.
    pub topic: String,
}

impl From<crate::sql::SqlError> for AdminError {
    fn from(e: crate::sql::SqlError) -> Self {
        use crate::sql::SqlError;
        let text = e.to_string();
        match e {
            SqlError::Refused(_) => AdminError::Forbidden(text),
            SqlError::Invalid(_) => AdminError::BadRequest(text),
            SqlError::TableNotFound(_) => AdminError::NotFound(text),
            SqlError::Unauthenticated(_) => AdminError::Unauthorized(text),
            SqlError::Denied(_) => AdminError::Forbidden(text),
            SqlError::MemoryLimit { .. } | SqlError::Timeout(_) => AdminError::LimitExceeded(text),
            // HTTP has no cancel request: a client cancels by closing the connection.
            SqlError::Cancelled => AdminError::BadRequest(text),
            SqlError::Stopped => AdminError::NotReady,
            _ => AdminError::Internal(text),
        }
    }
}

impl From<crate::offload::OffloadError> for AdminError {
    fn from(e: crate::offload::OffloadError) -> Self {
        use crate::offload::OffloadError;
        match e {
            OffloadError::TopicNotFound(t) => AdminError::NotFound(format!("Topic {t} not found")),
            OffloadError::Metadata(m) => AdminError::Metadata(m),
            other => AdminError::Internal(other.to_string()),
        }
    }
}

impl From<crate::policies::PoliciesError> for AdminError {
    fn from(e: crate::policies::PoliciesError) -> Self {
        match e {
            crate::policies::PoliciesError::Metadata(m) => AdminError::Metadata(m),
            other => AdminError::Internal(other.to_string()),
        }
    }
}

impl From<MetadataError> for AdminError {
    fn from(e: MetadataError) -> Self {
        match e {
            MetadataError::Conflict(m) => AdminError::Conflict(m),
            // A later owner holds the topic now: ask again (it redirects there).
            fenced @ MetadataError::Fenced { .. } => AdminError::Unavailable(fenced.to_string()),
            other => AdminError::Metadata(other),
        }
    }
}

impl From<crate::ops::OpsError> for AdminError {
    fn from(e: crate::ops::OpsError) -> Self {
        use crate::ops::OpsError;
        match e {
            OpsError::Invalid(m) => AdminError::BadRequest(m),
            OpsError::NotFound(m) => AdminError::NotFound(m),
            OpsError::Conflict(m) => AdminError::Conflict(m),
            OpsError::Busy(m) | OpsError::LimitReached(m) => AdminError::PreconditionFailed(m),
            OpsError::Disabled(m) => AdminError::Disabled(m),
            OpsError::Offload(o) => o.into(),
            OpsError::Policies(p) => p.into(),
            OpsError::Metadata(m) => m.into(),
            OpsError::Tenancy(t) => t.into(),
            OpsError::NotAllowed(m) => AdminError::NotAllowed(m),
            OpsError::Unavailable(m) => AdminError::Unavailable(m),
            OpsError::NotImplemented(m) => AdminError::NotImplemented(m),
            OpsError::Redirect {
                base,
                base_tls,
                topic,
                why,
            } => AdminError::Redirect {
                base,
                base_tls,
                topic,
                why,
            },
            other => AdminError::Internal(other.to_string()),
        }
    }
}

impl From<crate::tenancy::TenancyError> for AdminError {
    fn from(e: crate::tenancy::TenancyError) -> Self {
        use crate::tenancy::TenancyError;
        let text = e.to_string();
        match e {
            TenancyError::NotFound(_) => AdminError::NotFound(text),
            TenancyError::Exists(_) | TenancyError::NotEmpty(_) => AdminError::Conflict(text),
            TenancyError::Invalid(_) => AdminError::PreconditionFailed(text),
            TenancyError::Metadata(m) => AdminError::Metadata(m),
            TenancyError::Corrupt { .. } => AdminError::Internal(text),
        }
    }
}

impl From<crate::auth::Denied> for AdminError {
    fn from(e: crate::auth::Denied) -> Self {
        AdminError::Forbidden(e.to_string())
    }
}

impl From<crate::auth::AuthError> for AdminError {
    fn from(e: crate::auth::AuthError) -> Self {
        AdminError::Unauthorized(format!("authentication failed: {e}"))
    }
}

impl From<TopicNameError> for AdminError {
    fn from(e: TopicNameError) -> Self {
        AdminError::BadRequest(e.to_string())
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let status = match &self {
            AdminError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AdminError::NotReady | AdminError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Conflict(_) => StatusCode::CONFLICT,
            AdminError::Metadata(_) | AdminError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::Disabled(_) => StatusCode::PRECONDITION_FAILED,
            AdminError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            AdminError::Forbidden(_) => StatusCode::FORBIDDEN,
            AdminError::LimitExceeded(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AdminError::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            AdminError::NotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            AdminError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            AdminError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            AdminError::Redirect {
                base,
                base_tls,
                topic,
                ..
            } => {
                let mut response = (
                    StatusCode::TEMPORARY_REDIRECT,
                    Json(json!({ "reason": self.to_string() })),
                )
                    .into_response();
                response.extensions_mut().insert(RedirectBase {
                    base: base.clone(),
                    base_tls: base_tls.clone(),
                    topic: topic.clone(),
                });
                return response;
            }
        };
        (status, Json(json!({ "reason": self.to_string() }))).into_response()
    }
}
