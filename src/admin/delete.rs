//! Topic deletion (Pulsar's paths):
//! - `DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}`: a non-partitioned topic;
//! - `DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions`: a partitioned topic
//!   (every partition and its partition count).
//!
//! 204 when deleted, 404 when it does not exist, 412 while producers or consumers are
//! connected, unless `force=true`, which sends them CLOSE_PRODUCER / CLOSE_CONSUMER first (as
//! Pulsar does; clients reconnect and, with auto-creation on, find a new empty topic). Its log
//! data, ledgers, cursors and schemas go; its lake table is dropped and the table's files deleted
//! when `lake.drop_table_on_topic_delete` is on (default). Offload of the table is held off for
//! the whole deletion.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::delete;
use axum::Router;

use super::error::AdminError;
use super::{topic_path, AdminState, Services};
use crate::broker::topic_name::TopicName;
use crate::broker::BrokerError;

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}",
            delete(delete_topic),
        )
        .route(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions",
            delete(delete_partitioned),
        )
}

/// Query parameters of the DELETE paths.
#[derive(Debug, serde::Deserialize)]
struct DeleteParams {
    #[serde(default)]
    force: bool,
}

fn broker_error(e: BrokerError) -> AdminError {
    match e {
        BrokerError::Busy(m) => {
            AdminError::PreconditionFailed(format!("{m} (force=true closes them first)"))
        }
        BrokerError::Metadata(m) => AdminError::Metadata(m),
        other => AdminError::Internal(other.to_string()),
    }
}

/// The topic a DELETE path names, the running services, and its partition count (0: not a
/// partitioned topic, or a single partition).
async fn target<'a>(
    state: &'a AdminState,
    (tenant, namespace, topic): &(String, String, String),
) -> Result<(TopicName, &'a Services, u32), AdminError> {
    let name = topic_path(tenant, namespace, topic)?;
    let services = state.services()?;
    let partitions = services
        .broker
        .partitions(&name)
        .await
        .map_err(broker_error)?;
    Ok((name, services, partitions))
}

async fn delete_topic(
    State(state): State<AdminState>,
    Path(path): Path<(String, String, String)>,
    Query(params): Query<DeleteParams>,
) -> Result<StatusCode, AdminError> {
    let (name, services, partitions) = target(&state, &path).await?;
    if partitions > 0 {
        return Err(AdminError::Conflict(format!(
            "{name} is a partitioned topic: DELETE .../{}/partitions",
            path.2
        )));
    }
    delete_all(services, &name.base(), vec![name], params.force).await
}

async fn delete_partitioned(
    State(state): State<AdminState>,
    Path(path): Path<(String, String, String)>,
    Query(params): Query<DeleteParams>,
) -> Result<StatusCode, AdminError> {
    let (name, services, partitions) = target(&state, &path).await?;
    if partitions == 0 {
        return Err(AdminError::NotFound(format!(
            "Partitioned topic {name} not found"
        )));
    }
    let names = (0..partitions).map(|i| name.partition_name(i)).collect();
    delete_all(services, &name, names, params.force).await
}

/// Deletes the topics `names` of the table of `base`, then `base`'s own metadata (partition
/// count, schemas) and its lake table, with offload of that table held off throughout.
async fn delete_all(
    services: &Services,
    base: &TopicName,
    names: Vec<TopicName>,
    force: bool,
) -> Result<StatusCode, AdminError> {
    let _paused = match &services.offload {
        Some(o) => Some(o.pause_table(base).await),
        None => None,
    };
    let mut existed = false;
    for name in &names {
        existed |= services
            .broker
            .delete_topic(name, force)
            .await
            .map_err(broker_error)?;
    }
    existed |= services
        .log
        .delete_topic(&base.to_string())
        .await
        .map_err(|e| AdminError::Internal(e.to_string()))?;
    // Also when the log part was gone already: a crash between the log deletion and the
    // table drop is finished by repeating the DELETE.
    let dropped = match &services.offload {
        Some(o) => o.topic_deleted(base).await?,
        None => false,
    };
    if !existed && !dropped {
        return Err(AdminError::NotFound(format!("Topic {base} not found")));
    }
    tracing::info!(topic = %base, partitions = names.len(), "topic deleted");
    Ok(StatusCode::NO_CONTENT)
}
