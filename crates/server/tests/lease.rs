//! Node leases: a node's heartbeat writes no object, only the node itself
//! renews its lease (each renewal granting the fencing period), a node
//! coming back from silence wakes node-lifecycle with one status write,
//! and a node's self-fence report is a revision of its history.

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
    // Each renewal grants the fencing period (the default, unset here).
    assert_eq!(lease["fenceAfterSeconds"], 20, "{lease}");
    let (_, read) =
        common::call(&server, "GET", "/v1/nodes/node-1/lease", Some(&admin), None).await;
    assert_eq!(read["renewedAt"], lease["renewedAt"]);
    assert_eq!(read["fenceAfterSeconds"], 20, "the lease records the grant");
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

#[tokio::test]
async fn a_self_fence_report_is_a_revision_of_the_nodes_history() {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
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
    let (_, before) = common::call(
        &server,
        "GET",
        "/v1/nodes/node-1/history",
        Some(&admin),
        None,
    )
    .await;
    let fence = json!({
        "at": "2026-01-01T00:00:25Z", "silentSeconds": 7, "fenceAfterSeconds": 6,
        "pods": ["default/ha"], "returnedAt": "2026-01-01T00:01:00Z", "moved": ["default/ha"]
    });
    let report = json!({"kind": "Node", "metadata": {"name": "node-1"}, "spec": {},
        "status": {"lastFence": fence}});
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/nodes/node-1/status?message=fenced%20itself",
        Some(&node),
        Some(report.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, after) = common::call(
        &server,
        "GET",
        "/v1/nodes/node-1/history",
        Some(&admin),
        None,
    )
    .await;
    let (before, after) = (
        before.as_array().expect("records").len(),
        after.as_array().expect("records").clone(),
    );
    assert_eq!(after.len(), before + 1, "{after:?}");
    let last = after.last().expect("a record");
    assert_eq!(last["message"], "fenced itself", "{last}");
    assert_eq!(last["author"], "node-1", "{last}");
    // The same report again records nothing more.
    common::call(
        &server,
        "PUT",
        "/v1/nodes/node-1/status?message=again",
        Some(&node),
        Some(report),
    )
    .await;
    let (_, again) = common::call(
        &server,
        "GET",
        "/v1/nodes/node-1/history",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(again.as_array().expect("records").len(), after.len());
}
