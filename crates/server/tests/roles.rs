//! Authentication and the four roles, in-process: no token is 401; a user
//! acts only in its namespaces and never writes a Policy; a node writes
//! only pods bound to it; a join token only joins a node, once per live
//! node name, until it expires.

mod common;

use axum::http::StatusCode;
use corral_api::{Identity, Role};
use corral_server::SharedServer;
use corral_server::auth::TokenIssuer;
use serde_json::{Value, json};

async fn user_in(server: &SharedServer, name: &str, namespaces: &[&str]) -> String {
    let identity = Identity::new(name, Role::User)
        .with_namespaces(namespaces.iter().map(|n| n.to_string()).collect());
    TokenIssuer::issue(&*server.store, &*server.clock, identity)
        .await
        .expect("issue a token")
}

fn pod(name: &str) -> Value {
    json!({"kind": "Pod", "metadata": {"name": name, "namespace": "team-a"},
           "spec": {"containers": [{"name": "web", "image": "nginx"}]}})
}

#[tokio::test]
async fn no_token_is_401() {
    let server = common::new_server();
    let (status, body) =
        common::call(&server, "GET", "/v1/namespaces/default/pods", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _) = common::call(
        &server,
        "GET",
        "/v1/namespaces/default/pods",
        Some("corral_not-a-token"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_user_acts_only_in_its_namespaces_and_never_writes_policies() {
    let server = common::new_server();
    let alice = user_in(&server, "alice", &["team-a"]).await;
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/namespaces/team-a/pods/web",
        Some(&alice),
        Some(pod("web")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/namespaces/team-b/pods/web",
        Some(&alice),
        Some(
            json!({"kind": "Pod", "metadata": {"name": "web", "namespace": "team-b"},
                    "spec": {"containers": [{"name": "web", "image": "nginx"}]}}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body.to_string().contains(
            "user alice may act only in namespaces team-a: namespace team-b is not one of them"
        ),
        "{body}"
    );
    let (status, _) = common::call(&server, "GET", "/v1/pods", Some(&alice), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a list across namespaces");

    let policy = json!({"kind": "Policy", "metadata": {"name": "p"},
                        "spec": {"namespaces": ["team-a"], "grant": ["run-as-root"]}});
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/policies/p",
        Some(&alice),
        Some(policy.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    // Not even a user of every namespace writes a Policy: field ownership.
    let everywhere = user_in(&server, "bob", &["*"]).await;
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/policies/p",
        Some(&everywhere),
        Some(policy),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _) = common::call(&server, "GET", "/v1/policies/p", Some(&everywhere), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was written");
}

#[tokio::test]
async fn a_user_token_must_name_its_namespaces() {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    let (status, body) = common::call(
        &server,
        "POST",
        "/v1/tokens",
        Some(&admin),
        Some(json!({"name": "carol", "role": "user"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.to_string().contains("namespaces: a user token names"),
        "{body}"
    );
    let (status, body) = common::call(
        &server,
        "POST",
        "/v1/tokens",
        Some(&admin),
        Some(json!({"name": "carol", "role": "user", "namespaces": ["team-a"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["identity"]["namespaces"], json!(["team-a"]));
}

#[tokio::test]
async fn a_node_writes_only_pods_bound_to_it() {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    let node_a = common::token(&server, "node-a", Role::Node).await;
    let scheduler = common::token(&server, "scheduler", Role::Controller).await;
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/namespaces/team-a/pods/web",
        Some(&admin),
        Some(pod("web")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut bound = body.clone();
    bound["status"]["node"] = json!("node-b");
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/namespaces/team-a/pods/web/status",
        Some(&scheduler),
        Some(bound),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the scheduler binds it to node-b: {body}"
    );

    let mut report = body.clone();
    report["status"]["phase"] = json!("Running");
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/namespaces/team-a/pods/web/status",
        Some(&node_a),
        Some(report),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "node-a writes node-b's pod: {body}"
    );
    assert!(body.to_string().contains("node-a"), "{body}");
}

/// `POST /v1/join {"node": NODE}` with `token`.
async fn join_as(server: &SharedServer, token: &str, node: &str) -> (StatusCode, Value) {
    common::call(
        server,
        "POST",
        "/v1/join",
        Some(token),
        Some(json!({ "node": node })),
    )
    .await
}

#[tokio::test]
async fn a_join_token_only_joins_a_node_which_then_holds_its_own_identity() {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    let (status, minted) = common::call(
        &server,
        "POST",
        "/v1/tokens",
        Some(&admin),
        Some(json!({"name": "join", "role": "joiner"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{minted}");
    let join = minted["token"].as_str().expect("a token").to_string();
    let expires: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(minted["identity"]["expiresAt"].clone()).expect("an expiry");
    let day = expires - chrono::Utc::now();
    assert!(
        day > chrono::TimeDelta::hours(23) && day <= chrono::TimeDelta::hours(24),
        "join tokens last a day by default: {expires}"
    );

    // It reads and writes nothing but the join.
    let (status, body) = common::call(
        &server,
        "GET",
        "/v1/namespaces/default/pods",
        Some(&join),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("may only join a node"),
        "{body}"
    );

    // Joining gives the node its own token, which acts as that node.
    let (status, joined) = join_as(&server, &join, "node-7").await;
    assert_eq!(status, StatusCode::OK, "{joined}");
    let node = joined["token"].as_str().expect("a node token").to_string();
    // The name is claimed at once, before the agent first reports.
    let (status, body) = join_as(&server, &join, "node-7").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, me) = common::call(&server, "GET", "/v1/whoami", Some(&node), None).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(
        (&me["name"], &me["role"]),
        (&json!("node-7"), &json!("node"))
    );
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/nodes/node-7",
        Some(&node),
        Some(json!({"kind": "Node", "metadata": {"name": "node-7"}, "spec": {}})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the node registers itself: {body}");

    // The same join token cannot take over a node that is alive.
    let (status, body) = join_as(&server, &join, "node-7").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("has already joined"),
        "{body}"
    );
    // Only join tokens join; a bad name is refused naming the field.
    let (status, _) = join_as(&server, &admin, "node-8").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = join_as(&server, &join, "Not A Name").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.to_string().contains("node"), "{body}");

    // An expired join token is refused outright.
    let expired = TokenIssuer::issue(
        &*server.store,
        &*server.clock,
        Identity::new("join", Role::Joiner)
            .expiring(chrono::Utc::now() - chrono::TimeDelta::seconds(1)),
    )
    .await
    .expect("issue a token");
    let (status, body) = join_as(&server, &expired, "node-9").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body.to_string().contains("expired"), "{body}");
}
