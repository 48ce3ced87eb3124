//! `logs` and `exec` refusals, in-process: every reason the API server
//! cannot reach a container is explained before any agent is contacted,
//! and an agent that is not the bound node's is refused at the handshake.
//! (The proxying itself is tested end to end in corral-cli's `pod_io`.)

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::put;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use corral_api::{Identity, Kind, Role};
use corral_server::clock::SequentialIds;
use corral_server::{Server, SharedServer, SystemClock, TokenIssuer, app};
use corral_store::sqlite::SqliteStore;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

async fn server() -> (SharedServer, String, String) {
    let store = SqliteStore::open_in_memory().unwrap();
    let server = Server::with(
        Arc::new(store),
        Arc::new(SystemClock),
        Arc::new(SequentialIds::default()),
    );
    let issue = |identity| {
        let server = server.clone();
        async move {
            TokenIssuer::issue(&*server.store, &*server.clock, identity)
                .await
                .unwrap()
        }
    };
    let admin = issue(Identity::new("admin", Role::Operator)).await;
    let node = issue(Identity::new("node-1", Role::Node)).await;
    (server, admin, node)
}

fn containers(names: &[&str]) -> Value {
    let list: Vec<Value> = names
        .iter()
        .map(|n| json!({"name": n, "image": "local/busybox:1"}))
        .collect();
    json!({ "containers": list })
}

async fn call(server: &SharedServer, method: &str, uri: &str, token: &str) -> (StatusCode, String) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {token}"));
    if method == "POST" {
        request = request
            .header("connection", "Upgrade")
            .header("upgrade", "corral-exec");
    }
    let response = app(server.clone())
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (
        status,
        body["message"].as_str().unwrap_or_default().to_string(),
    )
}

const PODS: &str = "/v1/namespaces/default/pods";

#[tokio::test]
async fn refusals_name_what_is_missing() {
    let (server, admin, node) = server().await;
    put(
        &server,
        Kind::Pod,
        "pair",
        containers(&["web", "side"]),
        json!({}),
    )
    .await;
    put(
        &server,
        Kind::Pod,
        "solo",
        containers(&["solo"]),
        json!({"node": "node-1"}),
    )
    .await;
    put(
        &server,
        Kind::Pod,
        "far",
        containers(&["far"]),
        json!({"node": "node-2"}),
    )
    .await;
    put(
        &server,
        Kind::Node,
        "node-1",
        json!({}),
        json!({"phase": "Ready"}),
    )
    .await;
    put(
        &server,
        Kind::Node,
        "node-2",
        json!({}),
        json!({"phase": "Ready", "agentEndpoint": "http://127.0.0.1:1"}),
    )
    .await;

    let (status, message) = call(&server, "GET", &format!("{PODS}/solo/logs"), &node).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(message.contains("for people"), "{message}");

    let (status, message) = call(&server, "GET", &format!("{PODS}/absent/logs"), &admin).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(message.contains("pod/absent does not exist"), "{message}");

    let (status, message) = call(&server, "GET", &format!("{PODS}/pair/logs"), &admin).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.contains("2 containers (web, side)"), "{message}");

    let uri = format!("{PODS}/pair/exec?container=nope&cmd=id");
    let (status, message) = call(&server, "POST", &uri, &admin).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        message.contains("no container \"nope\"; its containers: web, side"),
        "{message}"
    );

    let uri = format!("{PODS}/pair/logs?container=web");
    let (status, message) = call(&server, "GET", &uri, &admin).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(message.contains("not placed on a node yet"), "{message}");

    let (status, message) = call(&server, "GET", &format!("{PODS}/solo/logs"), &admin).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        message.contains("node node-1 reports no agent endpoint"),
        "{message}"
    );

    let (status, message) = call(&server, "GET", &format!("{PODS}/far/logs"), &admin).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(message.contains("no cluster CA"), "{message}");

    common::agent_ca(&server);
    let (status, message) = call(&server, "GET", &format!("{PODS}/far/logs"), &admin).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        message.contains("cannot reach the agent of node node-2"),
        "{message}"
    );

    // node-4's endpoint answered by an agent with node-3's certificate:
    // refused at the handshake, nothing sent.
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = asked.clone();
    let impostor = axum::Router::new().fallback(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { "logs of node-3" }
    });
    let endpoint = common::serve_agent(&server, "node-3", impostor).await;
    put(
        &server,
        Kind::Pod,
        "moved",
        containers(&["moved"]),
        json!({"node": "node-4"}),
    )
    .await;
    put(
        &server,
        Kind::Node,
        "node-4",
        json!({}),
        json!({"phase": "Ready", "agentEndpoint": endpoint}),
    )
    .await;
    let (status, message) = call(&server, "GET", &format!("{PODS}/moved/logs"), &admin).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        message.contains("as node node-4: it presented a certificate for another name"),
        "{message}"
    );
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 0);

    let uri = "/v1/namespaces/default/pinneddeployments/x/logs";
    let (status, message) = call(&server, "GET", uri, &admin).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(message.contains("only pods"), "{message}");

    // VMs: console logs and the console go to the VM's node; exec does not.
    let vms = "/v1/namespaces/default/virtualmachines";
    put(&server, Kind::VirtualMachine, "idle", json!({}), json!({})).await;
    let (status, message) = call(&server, "GET", &format!("{vms}/idle/logs"), &admin).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(message.contains("vm/idle is not placed"), "{message}");
    let uri = format!("{vms}/idle/exec?cmd=id");
    let (status, message) = call(&server, "POST", &uri, &admin).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(message.contains("corral console vm/NAME"), "{message}");
    let (status, message) = call(&server, "POST", &format!("{PODS}/solo/console"), &admin).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(message.contains("pods have no console"), "{message}");

    // exec without the upgrade headers.
    let response = app(server.clone())
        .oneshot(
            Request::builder()
                .method("POST")
                .uri(format!("{PODS}/solo/exec?cmd=id"))
                .header("authorization", format!("Bearer {admin}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}
