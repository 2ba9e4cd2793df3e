//! Topic deletion (Pulsar's paths):
//! - `DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}`: a non-partitioned topic;
//! - `DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions`: a partitioned topic
//!   (every partition and its partition count; when a forced deletion's clients made a
//!   partition anew meanwhile, the partition count and schemas stay with it).
//!
//! 204 when deleted, 404 when it does not exist, 412 while producers or consumers are
//! connected, unless `force=true`, which sends them CLOSE_PRODUCER / CLOSE_CONSUMER first (as
//! Pulsar does; clients reconnect and, with auto-creation on, find a new empty topic). Its log
//! data, ledgers, cursors and schemas go; its lake table is dropped and the table's files deleted
//! when `lake.drop_table_on_topic_delete` is on (default). Offload of the table is held off for
//! the whole deletion ([`crate::ops::Operations::delete_topic`]).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::delete;
use axum::Router;

use super::error::AdminError;
use super::Routes;
use super::{topic_path, AdminState};

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .at(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}",
            delete(delete_topic),
        )
        .at(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions",
            delete(delete_partitioned),
        )
}

/// Query parameters of the DELETE paths (topics, namespaces, tenants).
#[derive(Debug, serde::Deserialize)]
pub(super) struct DeleteParams {
    /// Delete even though clients are attached (topics; refused for tenants and namespaces).
    #[serde(default)]
    pub(super) force: bool,
}

async fn delete_topic(
    State(state): State<AdminState>,
    Path((tenant, namespace, topic)): Path<(String, String, String)>,
    Query(params): Query<DeleteParams>,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&tenant, &namespace, &topic)?;
    state.ops()?.delete_topic(&name, params.force).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_partitioned(
    State(state): State<AdminState>,
    Path((tenant, namespace, topic)): Path<(String, String, String)>,
    Query(params): Query<DeleteParams>,
) -> Result<StatusCode, AdminError> {
    let name = topic_path(&tenant, &namespace, &topic)?;
    state
        .ops()?
        .delete_partitioned_topic(&name, params.force)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
