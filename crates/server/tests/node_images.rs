//! `POST /v1/nodes/{name}/images/prune`, in-process against a fake agent:
//! operators only, the node and its endpoint explained when missing, the
//! agent reached over the agent channel's TLS (no bearer secret) and its
//! report passed back.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use corral_api::{Kind, Role};
use serde_json::json;

const PRUNE: &str = "/v1/nodes/node-1/images/prune";

/// An agent endpoint that answers a prune with a fixed report and keeps
/// the `Authorization` headers it was sent.
async fn fake_agent(server: &corral_server::SharedServer) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/v1/images/prune",
        post(move |headers: HeaderMap| {
            let kept = kept.clone();
            async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                kept.lock().unwrap().push(auth);
                axum::Json(json!({"removedImages": ["reg.example/old:1"], "removedBlobs": 3, "removedLayers": 2}))
            }
        }),
    );
    let url = common::serve_agent(server, "node-1", app).await;
    (url, seen)
}

#[tokio::test]
async fn an_operator_has_the_nodes_agent_collect_its_images() {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    let (url, seen) = fake_agent(&server).await;
    common::put(
        &server,
        Kind::Node,
        "node-1",
        json!({}),
        json!({"agentEndpoint": url}),
    )
    .await;

    let (status, body) = common::call(&server, "POST", PRUNE, Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"removedImages": ["reg.example/old:1"], "removedBlobs": 3, "removedLayers": 2})
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec![String::new()],
        "no bearer secret"
    );
}

#[tokio::test]
async fn refusals_name_the_reason_before_any_agent_is_asked() {
    let server = common::new_server();
    common::agent_ca(&server);
    let admin = common::token(&server, "admin", Role::Operator).await;
    let user = common::token(&server, "alice", Role::User).await;

    let (status, body) = common::call(&server, "POST", PRUNE, Some(&admin), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("node-1"),
        "{body}"
    );

    common::put(&server, Kind::Node, "node-1", json!({}), json!({})).await;
    let (status, body) = common::call(&server, "POST", PRUNE, Some(&admin), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("no agent endpoint"),
        "{body}"
    );

    let (status, body) = common::call(&server, "POST", PRUNE, Some(&user), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
}
