//! The two-party opt-in for sandbox relaxations, in-process: a pod's ask
//! needs a Policy's grant; Policies are written by operators only.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use corral_api::{Identity, Role};
use corral_server::clock::SequentialIds;
use corral_server::{Server, SharedServer, SystemClock, TokenIssuer, app};
use corral_store::sqlite::SqliteStore;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

struct Cluster {
    server: SharedServer,
    operator: String,
    user: String,
}

async fn cluster() -> Cluster {
    let store = SqliteStore::open_in_memory().expect("in-memory store");
    let server = Server::with(
        Arc::new(store),
        Arc::new(SystemClock),
        Arc::new(SequentialIds::default()),
    );
    let mut tokens = Vec::new();
    for identity in [
        Identity::new("admin", Role::Operator),
        Identity::new("alice", Role::User),
    ] {
        tokens.push(
            TokenIssuer::issue(&*server.store, &*server.clock, identity)
                .await
                .expect("issue a token"),
        );
    }
    let user = tokens.pop().expect("two tokens");
    let operator = tokens.pop().expect("two tokens");
    Cluster {
        server,
        operator,
        user,
    }
}

async fn call(
    server: &SharedServer,
    method: &str,
    uri: &str,
    token: &str,
    body: Value,
) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("a valid request");
    let response = app(server.clone())
        .oneshot(request)
        .await
        .expect("infallible service");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("a readable body")
        .to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

fn pod(name: &str, relax: &[&str]) -> Value {
    json!({"kind": "Pod", "metadata": {"name": name, "namespace": "team-a"},
           "spec": {"security": {"relax": relax},
                    "containers": [{"name": "web", "image": "nginx"}]}})
}

fn policy(name: &str, grant: &[&str]) -> Value {
    json!({"kind": "Policy", "metadata": {"name": name},
           "spec": {"namespaces": ["team-a"], "grant": grant}})
}

const PODS: &str = "/v1/namespaces/team-a/pods";

#[tokio::test]
async fn an_ask_without_a_policy_is_refused_naming_the_missing_policy() {
    let c = cluster().await;
    let (status, body) = call(
        &c.server,
        "POST",
        PODS,
        &c.user,
        pod("web", &["run-as-root"]),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        body["message"],
        "pod asks for run-as-root but no Policy grants it to namespace team-a"
    );
    // Apply (PUT) goes through the same admission.
    let (status, body) = call(
        &c.server,
        "PUT",
        &format!("{PODS}/web"),
        &c.user,
        pod("web", &["host-network"]),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("host-network"),
        "{body}"
    );
}

#[tokio::test]
async fn a_policy_without_the_ask_admits_the_default_sandbox() {
    let c = cluster().await;
    let (status, body) = call(
        &c.server,
        "POST",
        "/v1/policies",
        &c.operator,
        policy("root", &["run-as-root"]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(&c.server, "POST", PODS, &c.user, pod("web", &[])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn both_halves_admit_and_a_later_ask_is_checked_on_apply() {
    let c = cluster().await;
    let (status, body) = call(
        &c.server,
        "POST",
        "/v1/policies",
        &c.operator,
        policy("root", &["run-as-root"]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(
        &c.server,
        "POST",
        PODS,
        &c.user,
        pod("web", &["run-as-root"]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(
        &c.server,
        "PUT",
        &format!("{PODS}/web"),
        &c.user,
        pod("web", &["run-as-root", "capability:NET_ADMIN"]),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        body["message"],
        "pod asks for capability:NET_ADMIN but no Policy grants it to namespace team-a"
    );
}

#[tokio::test]
async fn pinned_deployment_templates_need_the_grant_too() {
    let c = cluster().await;
    let template = json!({"metadata": {"labels": {"app": "web"}},
        "spec": {"security": {"relax": ["writable-rootfs"]},
                 "containers": [{"name": "web", "image": "nginx"}]}});
    let deployment = json!({"kind": "PinnedDeployment", "metadata": {"name": "web", "namespace": "team-a"},
        "spec": {"replicas": 1, "selector": {"app": "web"},
                 "templates": {"previous": template, "next": template}}});
    let uri = "/v1/namespaces/team-a/pinneddeployments";
    let (status, body) = call(&c.server, "POST", uri, &c.user, deployment.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("writable-rootfs"),
        "{body}"
    );
    let (status, body) = call(
        &c.server,
        "POST",
        "/v1/policies",
        &c.operator,
        policy("rw", &["writable-rootfs"]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(&c.server, "POST", uri, &c.user, deployment).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_user_writing_a_policy_is_forbidden() {
    let c = cluster().await;
    let (status, body) = call(
        &c.server,
        "POST",
        "/v1/policies",
        &c.user,
        policy("root", &["run-as-root"]),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("owned by operators"), "{body}");
    assert!(message.contains("alice (user) may not write"), "{body}");
}

#[tokio::test]
async fn a_bad_relaxation_name_is_invalid_with_its_field_path() {
    let c = cluster().await;
    let (status, body) = call(
        &c.server,
        "POST",
        PODS,
        &c.user,
        pod("web", &["run-as-rot"]),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["fields"][0]["path"], "spec.security.relax[0]");
    assert!(
        body["fields"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("unknown relaxation \"run-as-rot\": expected one of run-as-root"),
        "{body}"
    );
    let (status, body) = call(
        &c.server,
        "POST",
        "/v1/policies",
        &c.operator,
        policy("bad", &["capability:FLY"]),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["fields"][0]["path"], "spec.grant[0]");
}
