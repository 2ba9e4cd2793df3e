//! Tenants, clusters and namespaces through Pulsar's paths and JSON:
//! - `GET /admin/v2/clusters`, `GET|PUT|POST|DELETE /admin/v2/clusters/{cluster}`
//!   (`ClusterData`; superusers only);
//! - `GET /admin/v2/brokers/{cluster}`: the live nodes of this node's cluster (their HTTP
//!   `host:port`; superusers only, as Pulsar);
//! - `GET /admin/v2/autorecovery`: what this node's autorecovery last found (missing bookies,
//!   under-replicated sealed ledgers) and copied (superusers only);
//! - `GET /admin/v2/tenants`, `GET|PUT|POST|DELETE /admin/v2/tenants/{tenant}` (`TenantInfo`
//!   `{"adminRoles": […], "allowedClusters": […]}`; superusers only, so the path parameter is
//!   not named `tenant` for the access guard);
//! - `GET /admin/v2/namespaces/{tenant}` → `["t/ns", …]`; `GET
//!   /admin/v2/persistent/{tenant}/{namespace}` → its topics and partitions, `…/partitioned` →
//!   its partitioned topics;
//!   `GET|PUT|DELETE /admin/v2/namespaces/{tenant}/{namespace}` (GET answers Pulsar's
//!   `Policies` document; PUT takes one optionally); tenant admins and superusers.
//!
//! Writes answer 204 (clusters 200, as Pulsar); 404 missing, 409 exists or not empty, 412 a
//! broken rule, 405 forced deletion.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};

use super::delete::DeleteParams;
use super::error::AdminError;
use super::Routes;
use super::{namespace_path, AdminState};
use crate::tenancy::{ClusterData, TenantInfo};

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .at("/admin/v2/clusters", get(list_clusters))
        .at(
            "/admin/v2/clusters/{cluster}",
            get(get_cluster)
                .put(create_cluster)
                .post(update_cluster)
                .delete(delete_cluster),
        )
        .at("/admin/v2/brokers/{cluster}", get(list_brokers))
        .at("/admin/v2/autorecovery", get(autorecovery_status))
        .at("/admin/v2/tenants", get(list_tenants))
        .at(
            "/admin/v2/tenants/{name}",
            get(get_tenant)
                .put(create_tenant)
                .post(update_tenant)
                .delete(delete_tenant),
        )
        .at("/admin/v2/namespaces/{tenant}", get(list_namespaces))
        .at(
            "/admin/v2/persistent/{tenant}/{namespace}",
            get(list_topics),
        )
        .at(
            "/admin/v2/persistent/{tenant}/{namespace}/partitioned",
            get(list_partitioned),
        )
        .at(
            "/admin/v2/namespaces/{tenant}/{namespace}",
            get(get_namespace)
                .put(create_namespace)
                .delete(delete_namespace),
        )
}

/// A JSON body, or 400 naming what is wrong with it.
pub(super) fn json_body<T: serde::de::DeserializeOwned>(body: &str) -> Result<T, AdminError> {
    serde_json::from_str(body).map_err(|e| AdminError::BadRequest(format!("invalid body: {e}")))
}

async fn list_clusters(State(s): State<AdminState>) -> Result<Json<Vec<String>>, AdminError> {
    Ok(Json(s.ops()?.clusters().await?))
}

async fn get_cluster(
    State(s): State<AdminState>,
    Path(c): Path<String>,
) -> Result<Json<ClusterData>, AdminError> {
    Ok(Json(s.ops()?.cluster(&c).await?))
}

async fn create_cluster(
    State(s): State<AdminState>,
    Path(c): Path<String>,
    body: String,
) -> Result<StatusCode, AdminError> {
    s.ops()?.create_cluster(&c, &json_body(&body)?).await?;
    Ok(StatusCode::OK)
}

async fn update_cluster(
    State(s): State<AdminState>,
    Path(c): Path<String>,
    body: String,
) -> Result<StatusCode, AdminError> {
    s.ops()?.update_cluster(&c, &json_body(&body)?).await?;
    Ok(StatusCode::OK)
}

async fn delete_cluster(
    State(s): State<AdminState>,
    Path(c): Path<String>,
) -> Result<StatusCode, AdminError> {
    s.ops()?.delete_cluster(&c).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_brokers(
    State(s): State<AdminState>,
    Path(c): Path<String>,
) -> Result<Json<Vec<String>>, AdminError> {
    Ok(Json(s.ops()?.brokers(&c).await?))
}

async fn autorecovery_status(
    State(s): State<AdminState>,
) -> Result<Json<crate::bookie::autorecovery::AutoRecoveryStatus>, AdminError> {
    Ok(Json(s.ops()?.autorecovery_status()?))
}

async fn list_tenants(State(s): State<AdminState>) -> Result<Json<Vec<String>>, AdminError> {
    Ok(Json(s.ops()?.tenants().await?))
}

async fn get_tenant(
    State(s): State<AdminState>,
    Path(t): Path<String>,
) -> Result<Json<TenantInfo>, AdminError> {
    Ok(Json(s.ops()?.tenant(&t).await?))
}

async fn create_tenant(
    State(s): State<AdminState>,
    Path(t): Path<String>,
    body: String,
) -> Result<StatusCode, AdminError> {
    s.ops()?.create_tenant(&t, json_body(&body)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn update_tenant(
    State(s): State<AdminState>,
    Path(t): Path<String>,
    body: String,
) -> Result<StatusCode, AdminError> {
    s.ops()?.update_tenant(&t, json_body(&body)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_tenant(
    State(s): State<AdminState>,
    Path(t): Path<String>,
    Query(f): Query<DeleteParams>,
) -> Result<StatusCode, AdminError> {
    s.ops()?.delete_tenant(&t, f.force).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_namespaces(
    State(s): State<AdminState>,
    Path(t): Path<String>,
) -> Result<Json<Vec<String>>, AdminError> {
    Ok(Json(s.ops()?.namespaces(&t).await?))
}

async fn get_namespace(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(s.ops()?.namespace_document(&ns).await?))
}

async fn create_namespace(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    body: String,
) -> Result<StatusCode, AdminError> {
    let ns = namespace_path(&t, &n)?;
    s.ops()?.create_namespace(&ns, Some(&body)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_namespace(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
    Query(f): Query<DeleteParams>,
) -> Result<StatusCode, AdminError> {
    let ns = namespace_path(&t, &n)?;
    s.ops()?.delete_namespace(&ns, f.force).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_topics(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<Vec<String>>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(s.ops()?.topics(&ns).await?))
}

async fn list_partitioned(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<Vec<String>>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(s.ops()?.partitioned_topics(&ns).await?))
}
