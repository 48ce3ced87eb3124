//! Node leases: a node's heartbeat writes no object, only the node itself
//! renews its lease, and a node coming back from silence wakes
//! node-lifecycle with one status write.

mod common;

use axum::http::StatusCode;
use corral_api::Role;
use serde_json::json;

#[tokio::test]
async fn a_lease_renewal_is_no_object_write_and_only_the_node_renews_it() {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    let node = common::token(&server, "node-1", Role::Node).await;
    let other = common::token(&server, "node-2", Role::Node).await;

    let (status, body) =
        common::call(&server, "PUT", "/v1/nodes/node-1/lease", Some(&node), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no Node yet: {body}");
    let registered = json!({"kind": "Node", "metadata": {"name": "node-1"}, "spec": {}});
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/nodes/node-1",
        Some(&node),
        Some(registered),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let version = body["metadata"]["resourceVersion"].as_u64();

    let (status, lease) =
        common::call(&server, "PUT", "/v1/nodes/node-1/lease", Some(&node), None).await;
    assert_eq!(status, StatusCode::OK, "{lease}");
    assert_eq!(lease["node"], "node-1");
    let (_, read) =
        common::call(&server, "GET", "/v1/nodes/node-1/lease", Some(&admin), None).await;
    assert_eq!(read["renewedAt"], lease["renewedAt"]);
    let (_, stored) = common::call(&server, "GET", "/v1/nodes/node-1", Some(&admin), None).await;
    assert_eq!(
        stored["metadata"]["resourceVersion"].as_u64(),
        version,
        "a renewal writes no object"
    );

    let (status, refused) =
        common::call(&server, "PUT", "/v1/nodes/node-1/lease", Some(&other), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("only the node itself"),
        "{refused}"
    );
    let (status, _) =
        common::call(&server, "GET", "/v1/nodes/node-2/lease", Some(&admin), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_returning_node_writes_its_heartbeat_once() {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    let lifecycle = common::token(&server, "node-lifecycle", Role::Controller).await;
    let node = common::token(&server, "node-1", Role::Node).await;
    let registered = json!({"kind": "Node", "metadata": {"name": "node-1"}, "spec": {}});
    common::call(
        &server,
        "PUT",
        "/v1/nodes/node-1",
        Some(&node),
        Some(registered),
    )
    .await;
    let silent = json!({"status": {"phase": "Silent"}});
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/nodes/node-1/status",
        Some(&lifecycle),
        Some(silent),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, lease) =
        common::call(&server, "PUT", "/v1/nodes/node-1/lease", Some(&node), None).await;
    assert_eq!(status, StatusCode::OK, "{lease}");
    let (_, stored) = common::call(&server, "GET", "/v1/nodes/node-1", Some(&admin), None).await;
    assert_eq!(
        stored["status"]["heartbeat"], lease["renewedAt"],
        "the returning node's heartbeat is in its status: {stored}"
    );
}
