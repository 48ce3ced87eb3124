//! The two-party opt-in for sandbox relaxations, in-process: a pod's ask
//! needs a Policy's grant; Policies are written by operators only.

mod common;

use axum::http::StatusCode;
use corral_api::Role;
use corral_server::SharedServer;
use serde_json::{Value, json};

struct Cluster {
    server: SharedServer,
    operator: String,
    user: String,
}

async fn cluster() -> Cluster {
    let server = common::new_server();
    let operator = common::token(&server, "admin", Role::Operator).await;
    let user = common::token(&server, "alice", Role::User).await;
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
    common::call(server, method, uri, Some(token), Some(body)).await
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
