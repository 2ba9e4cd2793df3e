//! `schemas/openapi.json` describes exactly the routes the router serves: every (method,
//! path) it documents is served, and every one served is documented.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use axum::routing::{on, MethodFilter};

use super::{route_paths, router, AdminState, Health};

/// The (method, path) pairs the router serves: adding a route for a served pair panics
/// (axum refuses overlapping method routes), for any other pair it does not.
fn served() -> Result<BTreeSet<(String, String)>, Box<dyn std::error::Error>> {
    let access = crate::auth::Access::from_config(&Default::default())?;
    let app = router(
        AdminState {
            health: Health::new(),
            ops: Arc::new(tokio::sync::OnceCell::new()),
            access,
        },
        1 << 20,
    );
    let methods = [
        ("get", MethodFilter::GET),
        ("put", MethodFilter::PUT),
        ("post", MethodFilter::POST),
        ("delete", MethodFilter::DELETE),
        ("patch", MethodFilter::PATCH),
    ];
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut out = BTreeSet::new();
    for path in route_paths() {
        for (name, filter) in methods {
            let probe = app.clone();
            let overlaps = catch_unwind(AssertUnwindSafe(|| {
                let _ = probe.route(&path, on(filter, || async {}));
            }))
            .is_err();
            if overlaps {
                out.insert((name.to_string(), path.clone()));
            }
        }
    }
    std::panic::set_hook(quiet);
    Ok(out)
}

#[test]
fn openapi_document_lists_exactly_the_routes_served() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/openapi.json");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().ok_or("no paths")? {
        for method in ["get", "put", "post", "delete", "patch"] {
            if item.get(method).is_some() {
                documented.insert((method.to_string(), path.clone()));
            }
        }
    }
    let served = served()?;
    assert!(
        served.len() > 50,
        "the probe found too few routes: {served:?}"
    );
    let missing: Vec<_> = served.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "schemas/openapi.json is out of step with the router\nserved, not documented: {missing:#?}\ndocumented, not served: {extra:#?}"
    );
    Ok(())
}
