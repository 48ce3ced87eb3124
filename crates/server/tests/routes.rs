//! The route table against the router and the OpenAPI document: every
//! method of every routed path is documented and answered by `app()`, and
//! the document names nothing that is not routed.

mod common;

use std::collections::BTreeSet;

use axum::http::StatusCode;
use serde_json::Value;

/// A request path for a route's pattern, its parameters filled in.
fn concrete(pattern: &str) -> String {
    pattern
        .replace("{namespace}", "default")
        .replace("{plural}", "pods")
        .replace("{name}", "web")
        .replace("{revision}", "1")
}

/// True when the router itself answered: no route (404 with an empty
/// body; every handler's 404 is a JSON error) or no such method (405).
fn router_miss(status: StatusCode, body: &Value) -> bool {
    status == StatusCode::METHOD_NOT_ALLOWED
        || (status == StatusCode::NOT_FOUND && *body == Value::String(String::new()))
}

#[tokio::test]
async fn every_routed_path_is_documented_and_served() {
    let server = common::new_server();
    let document = corral_server::openapi::document();
    let table = corral_server::routes::table();
    let mut routed = BTreeSet::new();
    for route in &table {
        for (method, _) in route.operations() {
            let key = method.as_str().to_ascii_lowercase();
            assert!(
                document["paths"][route.path()][&key].is_object(),
                "{method} {} is routed but missing from the OpenAPI document",
                route.path()
            );
            let uri = concrete(route.path());
            let (status, body) = common::call(&server, method.as_str(), &uri, None, None).await;
            assert!(
                !router_miss(status, &body),
                "{method} {uri} is in the route table but app() does not serve it ({status})"
            );
            routed.insert((route.path().to_string(), key));
        }
    }
    let documented: BTreeSet<(String, String)> = document["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            let methods = item.as_object().expect("a path item").keys().cloned();
            methods.map(move |method| (path.clone(), method))
        })
        .collect();
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty(),
        "routed, not documented: {undocumented:?}"
    );
    assert!(unrouted.is_empty(), "documented, not routed: {unrouted:?}");
    for path in [
        "/v1/join",
        "/v1/controllers/{name}/transfer",
        "/v1/openapi.json",
    ] {
        assert!(document["paths"][path].is_object(), "{path}");
    }
}

#[tokio::test]
async fn the_probe_tells_a_router_miss_from_a_handler_answer() {
    let server = common::new_server();
    let (status, body) = common::call(&server, "GET", "/v1/nowhere/at/all/x/y/z", None, None).await;
    assert!(router_miss(status, &body), "{status} {body}");
    let (status, body) = common::call(&server, "PATCH", "/v1/whoami", None, None).await;
    assert!(router_miss(status, &body), "{status} {body}");
    let (status, body) = common::call(&server, "GET", "/v1/whoami", None, None).await;
    assert!(!router_miss(status, &body), "{status} {body}");
}
