//! Who is asking, for every admin route: the bearer token is authenticated (401 without a
//! valid one while authentication is on) and the authorizer is asked once per request, for the
//! tenant, namespace or topic the route names (403 when refused). The principal then rides in
//! the request's extensions for handlers that need it (`POST /sql` authorizes its query in the
//! SQL engine). Health endpoints sit outside this layer.

use std::collections::HashMap;

use axum::extract::{RawPathParams, Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::Response;

use super::error::AdminError;
use super::{namespace_path, topic_path, AdminState};
use crate::auth::{Action, Principal, Resource};

/// The bearer token of a request, if any.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// What a route's path parameters name: a topic, else a namespace, else a tenant, else the
/// cluster.
fn resource(params: &HashMap<&str, &str>) -> Result<Resource, AdminError> {
    let (tenant, namespace) = (params.get("tenant"), params.get("namespace"));
    match (tenant, namespace, params.get("topic")) {
        (Some(t), Some(n), Some(local)) => Ok(Resource::Topic(topic_path(t, n, local)?.base())),
        (Some(t), Some(n), None) => Ok(Resource::Namespace(namespace_path(t, n)?)),
        (Some(t), None, _) => Ok(Resource::Tenant(t.to_string())),
        _ => Ok(Resource::Cluster),
    }
}

/// The middleware: authenticate, authorize, then hand the principal on.
pub(crate) async fn guard(
    State(state): State<AdminState>,
    params: RawPathParams,
    mut request: Request,
    next: Next,
) -> Result<Response, AdminError> {
    let principal: Principal = state.access.authenticate_token(bearer(request.headers()))?;
    let params: HashMap<&str, &str> = params.iter().collect();
    let on = resource(&params)?;
    let action = match *request.method() {
        Method::GET | Method::HEAD => Action::AdminRead,
        _ => Action::AdminWrite,
    };
    // A SQL request is authorized by the SQL engine, per query, like the other SQL surfaces.
    if request.uri().path() != "/sql" {
        state.access.authorize(&principal, action, &on).await?;
    }
    request.extensions_mut().insert(principal);
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::NamespaceName;

    #[test]
    fn routes_name_their_resource() -> Result<(), AdminError> {
        let p = |pairs: &[(&'static str, &'static str)]| pairs.iter().copied().collect();
        assert_eq!(resource(&p(&[]))?, Resource::Cluster);
        assert_eq!(
            resource(&p(&[("tenant", "t")]))?,
            Resource::Tenant("t".into())
        );
        assert_eq!(
            resource(&p(&[("tenant", "t"), ("namespace", "n")]))?,
            Resource::Namespace(
                NamespaceName::new("t", "n").map_err(|e| AdminError::BadRequest(e.to_string()))?
            )
        );
        assert_eq!(
            resource(&p(&[
                ("tenant", "t"),
                ("namespace", "n"),
                ("topic", "x-partition-2")
            ]))?
            .to_string(),
            "topic persistent://t/n/x",
            "a partition is authorized as its topic"
        );
        assert!(resource(&p(&[("tenant", "t!"), ("namespace", "n")])).is_err());
        Ok(())
    }
}
