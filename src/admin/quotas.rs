//! Resource-group quotas through Pulsar's paths (rates per topic are in `rates.rs`); changes
//! apply to loaded topics before the answer:
//! - `GET /admin/v2/resourcegroups`, `GET|PUT|DELETE /admin/v2/resourcegroups/{group}`
//!   (`ResourceGroup` `{"publishRateInMsgs", "publishRateInBytes", "dispatchRateInMsgs",
//!   "dispatchRateInBytes"}`): a quota shared by every topic of the namespaces attached to it,
//!   e.g. all of a tenant's; superusers only; DELETE answers 412 while a namespace uses it;
//! - `GET|DELETE /admin/v2/tenants/{tenant}/resourcegroup` and `POST …/resourcegroup/{group}`
//!   (ledgerlake's own): the tenant's group, the quota of every namespace of the tenant without a
//!   group of its own, including namespaces created later, so a tenant admin cannot escape it by
//!   creating a namespace; superusers only (the path names no `tenant` parameter for the guard);
//! - `GET|DELETE /admin/v2/namespaces/{tenant}/{namespace}/resourcegroup` and
//!   `POST …/resourcegroup/{group}`: the namespace's group. Attaching and detaching are for
//!   superusers (a tenant admin must not lift its own tenant's quota); reading is for the
//!   tenant's admins too.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};

use super::error::AdminError;
use super::tenancy::json_body;
use super::Routes;
use super::{namespace_path, AdminState};
use crate::auth::{Action, Principal, Resource};
use crate::tenancy::ResourceGroup;

pub(super) fn routes() -> Router<AdminState> {
    let ns = "/admin/v2/namespaces/{tenant}/{namespace}";
    Router::new()
        .at("/admin/v2/resourcegroups", get(list_groups))
        .at(
            "/admin/v2/resourcegroups/{group}",
            get(get_group).put(put_group).delete(delete_group),
        )
        .at(
            &format!("{ns}/resourcegroup"),
            get(get_ns_group).delete(detach_group),
        )
        .at(&format!("{ns}/resourcegroup/{{group}}"), post(attach_group))
        .at(
            "/admin/v2/tenants/{name}/resourcegroup",
            get(get_tenant_group).delete(detach_tenant_group),
        )
        .at(
            "/admin/v2/tenants/{name}/resourcegroup/{group}",
            post(attach_tenant_group),
        )
}

async fn list_groups(State(s): State<AdminState>) -> Result<Json<Vec<String>>, AdminError> {
    Ok(Json(s.ops()?.resource_groups().await?))
}

async fn get_group(
    State(s): State<AdminState>,
    Path(g): Path<String>,
) -> Result<Json<ResourceGroup>, AdminError> {
    Ok(Json(s.ops()?.resource_group(&g).await?))
}

async fn put_group(
    State(s): State<AdminState>,
    Path(g): Path<String>,
    body: String,
) -> Result<StatusCode, AdminError> {
    s.ops()?.put_resource_group(&g, &json_body(&body)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_group(
    State(s): State<AdminState>,
    Path(g): Path<String>,
) -> Result<StatusCode, AdminError> {
    s.ops()?.delete_resource_group(&g).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn get_ns_group(
    State(s): State<AdminState>,
    Path((t, n)): Path<(String, String)>,
) -> Result<Json<Option<String>>, AdminError> {
    let ns = namespace_path(&t, &n)?;
    Ok(Json(
        s.ops()?.namespace_policies(&ns).await?.resource_group_name,
    ))
}

/// Setting rates and attaching or detaching a group change a tenant's quota: superusers only
/// (the access guard let tenant admins through, as for every other namespace route).
pub(super) async fn superuser_only(
    s: &AdminState,
    principal: &Principal,
) -> Result<(), AdminError> {
    s.access
        .authorize(principal, Action::AdminWrite, &Resource::Cluster)
        .await?;
    Ok(())
}

async fn attach_group(
    State(s): State<AdminState>,
    Extension(principal): Extension<Principal>,
    Path((t, n, g)): Path<(String, String, String)>,
) -> Result<StatusCode, AdminError> {
    superuser_only(&s, &principal).await?;
    let ns = namespace_path(&t, &n)?;
    s.ops()?.set_namespace_resource_group(&ns, Some(&g)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn detach_group(
    State(s): State<AdminState>,
    Extension(principal): Extension<Principal>,
    Path((t, n)): Path<(String, String)>,
) -> Result<StatusCode, AdminError> {
    superuser_only(&s, &principal).await?;
    let ns = namespace_path(&t, &n)?;
    s.ops()?.set_namespace_resource_group(&ns, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn get_tenant_group(
    State(s): State<AdminState>,
    Path(t): Path<String>,
) -> Result<Json<Option<String>>, AdminError> {
    Ok(Json(s.ops()?.tenant_resource_group(&t).await?))
}

async fn attach_tenant_group(
    State(s): State<AdminState>,
    Path((t, g)): Path<(String, String)>,
) -> Result<StatusCode, AdminError> {
    s.ops()?.set_tenant_resource_group(&t, Some(&g)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn detach_tenant_group(
    State(s): State<AdminState>,
    Path(t): Path<String>,
) -> Result<StatusCode, AdminError> {
    s.ops()?.set_tenant_resource_group(&t, None).await?;
    Ok(StatusCode::NO_CONTENT)
}
