//! `POST /v1/images/import` and `GET /v1/images`, in-process against fake
//! agents: operators import (users, controllers and nodes are refused
//! before anything is read), the body reaches every node's agent whole
//! over the agent channel's TLS (no bearer secret), each node answers for itself (an agent's
//! refusal, an unreachable agent, a missing node), and without `node=`
//! only Ready nodes are asked.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::RawQuery;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::{get, post};
use corral_api::{Kind, Role};
use corral_server::SharedServer;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// What a fake agent was sent: the `Authorization` header, the query and
/// the body of each import.
type Seen = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

/// An agent that imports anything: it answers one image named by `name=`
/// (or `local/fake:1`) whose size is the body's length.
async fn fake_agent(server: &SharedServer, node: &str) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let kept = seen.clone();
    let app = axum::Router::new()
        .route(
            "/v1/images/import",
            post(
                move |headers: HeaderMap, RawQuery(query): RawQuery, body: Bytes| {
                    let kept = kept.clone();
                    async move {
                        let auth = headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string();
                        let query = query.unwrap_or_default();
                        let name = query
                            .strip_prefix("name=")
                            .map_or("local/fake:1".to_string(), |n| n.replace("%2F", "/").replace("%3A", ":"));
                        kept.lock().unwrap().push((auth, query, body.to_vec()));
                        axum::Json(json!([{"reference": name, "digest": "sha256:00", "size": body.len()}]))
                    }
                },
            ),
        )
        .route(
            "/v1/images",
            get(|| async {
                axum::Json(json!([{"reference": "local/busybox:1", "digest": "sha256:11", "size": 7, "pods": ["pod/web"]}]))
            }),
        );
    (common::serve_agent(server, node, app).await, seen)
}

/// An agent that refuses every import, as a corrupt archive is refused.
async fn refusing_agent(server: &SharedServer, node: &str) -> String {
    let app = axum::Router::new().route(
        "/v1/images/import",
        post(|_body: Bytes| async {
            (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"code": "BadRequest", "message": "import failed, nothing was imported: archive is neither an OCI layout nor a docker archive"})),
            )
        }),
    );
    common::serve_agent(server, node, app).await
}

/// A port nothing listens on: connecting is refused.
async fn dead_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

async fn node(server: &SharedServer, name: &str, phase: &str, endpoint: Option<&str>) {
    let mut status = json!({"phase": phase});
    if let Some(endpoint) = endpoint {
        status["agentEndpoint"] = json!(endpoint);
    }
    common::put(server, Kind::Node, name, json!({}), status).await;
}

/// `POST uri` with `chunks` as a streamed body.
async fn upload(
    server: &SharedServer,
    uri: &str,
    token: Option<&str>,
    chunks: Vec<&'static [u8]>,
) -> (StatusCode, Value) {
    let stream = futures::stream::iter(
        chunks
            .into_iter()
            .map(|chunk| Ok::<_, std::io::Error>(Bytes::from_static(chunk))),
    );
    let mut request = Request::builder()
        .method("POST")
        .uri(uri)
        .header("content-type", "application/x-tar");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = corral_server::app(server.clone())
        .oneshot(request.body(Body::from_stream(stream)).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

#[tokio::test]
async fn each_named_node_imports_the_whole_upload_or_says_why_not() {
    let server = common::new_server();
    common::agent_ca(&server);
    let admin = common::token(&server, "admin", Role::Operator).await;
    let (good, seen) = fake_agent(&server, "node-1").await;
    let refusing = refusing_agent(&server, "node-2").await;
    let dead = dead_endpoint().await;
    node(&server, "node-1", "Ready", Some(&good)).await;
    node(&server, "node-2", "Ready", Some(&refusing)).await;
    node(&server, "node-3", "Silent", Some(&dead)).await;
    node(&server, "node-4", "Joining", None).await;

    let (status, body) = upload(
        &server,
        "/v1/images/import?node=node-1&node=node-2&node=node-3&node=node-4&node=ghost&node=node-1&name=local%2Fapp%3A2",
        Some(&admin),
        vec![b"first chunk, ", b"second chunk, ", b"the end"],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let nodes = body["nodes"].as_array().unwrap();
    let names: Vec<&str> = nodes.iter().map(|n| n["node"].as_str().unwrap()).collect();
    assert_eq!(names, ["node-1", "node-2", "node-3", "node-4", "ghost"]);
    assert_eq!(
        nodes[0],
        json!({"node": "node-1", "images": [{"reference": "local/app:2", "digest": "sha256:00", "size": 34}]})
    );
    let error = |i: usize| nodes[i]["error"].as_str().unwrap().to_string();
    assert!(error(1).contains("neither an OCI layout"), "{}", error(1));
    assert_eq!(nodes[1]["images"], json!([]));
    assert!(
        error(2).contains("cannot reach the agent of node node-3"),
        "{}",
        error(2)
    );
    assert!(
        error(3).contains("node node-4 (Joining) reports no agent endpoint"),
        "{}",
        error(3)
    );
    assert_eq!(error(4), "node ghost does not exist");

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "node-1 is asked once");
    let (auth, query, bytes) = &seen[0];
    assert_eq!(auth, "", "no bearer secret");
    assert_eq!(query, "name=local%2Fapp%3A2");
    assert_eq!(bytes.as_slice(), b"first chunk, second chunk, the end");
}

#[tokio::test]
async fn without_nodes_every_ready_node_imports_and_the_rest_are_skipped() {
    let server = common::new_server();
    common::agent_ca(&server);
    let admin = common::token(&server, "admin", Role::Operator).await;

    let (status, body) = upload(&server, "/v1/images/import", Some(&admin), vec![b"x"]).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["message"], "the cluster has no nodes");

    let (one, seen_one) = fake_agent(&server, "node-c").await;
    let (two, seen_two) = fake_agent(&server, "node-b").await;
    node(&server, "node-b", "Ready", Some(&two)).await;
    node(&server, "node-c", "Silent", Some(&one)).await;
    let (status, body) = upload(&server, "/v1/images/import", Some(&admin), vec![b"x"]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["nodes"][0]["node"], "node-b");
    assert_eq!(body["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(
        body["skipped"],
        json!([{"node": "node-c", "reason": "Silent, not Ready"}])
    );
    assert_eq!(seen_two.lock().unwrap().len(), 1);
    assert!(
        seen_one.lock().unwrap().is_empty(),
        "a Silent node is not asked"
    );

    let server = common::new_server();
    common::agent_ca(&server);
    let admin = common::token(&server, "admin", Role::Operator).await;
    node(&server, "node-c", "Silent", Some(&one)).await;
    let (status, body) = upload(&server, "/v1/images/import", Some(&admin), vec![b"x"]).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("no node is Ready (node-c: Silent, not Ready)"),
        "{body}"
    );
}

#[tokio::test]
async fn only_operators_import_and_only_people_list() {
    let server = common::new_server();
    common::agent_ca(&server);
    let (agent, seen) = fake_agent(&server, "node-1").await;
    node(&server, "node-1", "Ready", Some(&agent)).await;
    let user = common::token(&server, "alice", Role::User).await;
    let controller = common::token(&server, "scheduler", Role::Controller).await;
    let node_token = common::token(&server, "node-1", Role::Node).await;

    for token in [&user, &controller, &node_token] {
        let (status, body) = upload(&server, "/v1/images/import", Some(token), vec![b"x"]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .starts_with("only operators import images"),
            "{body}"
        );
    }
    let (status, _) = upload(&server, "/v1/images/import", None, vec![b"x"]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(seen.lock().unwrap().is_empty(), "no agent was asked");

    let (status, body) = common::call(&server, "GET", "/v1/images", Some(&user), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"nodes": [{"node": "node-1", "images": [{"reference": "local/busybox:1", "digest": "sha256:11", "size": 7, "pods": ["pod/web"]}]}]})
    );
    let (status, body) = common::call(&server, "GET", "/v1/images", Some(&controller), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
}

#[tokio::test]
async fn a_list_answers_for_each_node_even_when_one_cannot() {
    let server = common::new_server();
    common::agent_ca(&server);
    let admin = common::token(&server, "admin", Role::Operator).await;
    let (agent, _) = fake_agent(&server, "node-1").await;
    let dead = dead_endpoint().await;
    node(&server, "node-1", "Ready", Some(&agent)).await;
    node(&server, "node-2", "Ready", Some(&dead)).await;

    let (status, body) = common::call(&server, "GET", "/v1/images", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["nodes"][0]["images"][0]["reference"],
        "local/busybox:1"
    );
    assert_eq!(body["nodes"][1]["node"], "node-2");
    assert!(
        body["nodes"][1]["error"]
            .as_str()
            .unwrap()
            .contains("cannot reach the agent of node node-2"),
        "{body}"
    );

    let (status, body) =
        common::call(&server, "GET", "/v1/images?node=node-1", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["nodes"].as_array().unwrap().len(), 1);
}
