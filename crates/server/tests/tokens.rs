//! Token lifecycle: listing without secrets, revocation by id or name that
//! reaches every server within seconds, node tokens revoked with the node,
//! who may ask decided before what was asked, and oversized bodies named.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::{call, new_server, token};
use corral_api::{Identity, Kind, Role};
use corral_server::clock::SequentialIds;
use corral_server::{Server, SystemClock, TokenIssuer};
use corral_store::Store;
use corral_store::sqlite::SqliteStore;
use serde_json::{Value, json};

#[tokio::test]
async fn operators_list_tokens_without_secrets_and_revoke_them() {
    let server = new_server();
    let admin = token(&server, "admin", Role::Operator).await;
    let alice = token(&server, "alice", Role::User).await;
    let alice_too = token(&server, "alice", Role::User).await;
    let bot = token(&server, "bot", Role::Controller).await;

    // alice uses her token once: its last use is recorded.
    let (status, _) = call(&server, "GET", "/v1/whoami", Some(&alice), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, listed) = call(&server, "GET", "/v1/tokens", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let text = listed.to_string();
    for secret in [&admin, &alice, &alice_too, &bot] {
        let hash = corral_server::auth::hash_token(secret);
        assert!(
            !text.contains(secret.as_str()) && !text.contains(&hash),
            "{text}"
        );
    }
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let alice_id = corral_server::auth::hash_token(&alice)[..12].to_string();
    let row = rows.iter().find(|r| r["id"] == alice_id.as_str()).unwrap();
    assert_eq!(row["identity"]["name"], "alice");
    assert!(row["lastUsedAt"].is_string(), "{row}");

    // Users may neither list nor revoke.
    for (method, uri) in [("GET", "/v1/tokens"), ("DELETE", "/v1/tokens/admin")] {
        let (status, value) = call(&server, method, uri, Some(&alice), None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {uri}: {value}");
    }

    // By id: only that token stops working, at once on this server.
    let (status, value) = call(
        &server,
        "DELETE",
        &format!("/v1/tokens/{alice_id}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{value}");
    assert_eq!(value["revoked"][0]["id"], alice_id.as_str());
    let (status, value) = call(&server, "GET", "/v1/whoami", Some(&alice), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{value}");
    let (status, _) = call(&server, "GET", "/v1/whoami", Some(&alice_too), None).await;
    assert_eq!(status, StatusCode::OK);

    // By name: every token of that name.
    let _more = token(&server, "bot", Role::Controller).await;
    let (status, value) = call(&server, "DELETE", "/v1/tokens/bot", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{value}");
    assert_eq!(value["revoked"].as_array().unwrap().len(), 2);
    let (status, value) = call(&server, "DELETE", "/v1/tokens/nobody", Some(&admin), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{value}");

    // A built-in controller's token is the server's own.
    token(&server, "scheduler", Role::Controller).await;
    let (status, value) = call(
        &server,
        "DELETE",
        "/v1/tokens/scheduler",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{value}");
    assert!(
        value["message"]
            .as_str()
            .unwrap()
            .contains("built-in controller"),
        "{value}"
    );
}

#[tokio::test]
async fn a_revocation_reaches_another_server_of_the_cluster_within_seconds() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
    let server = |store: &Arc<dyn Store>| {
        Server::with(
            store.clone(),
            Arc::new(SystemClock),
            Arc::new(SequentialIds::default()),
        )
    };
    let (a, b) = (server(&store), server(&store));
    let admin = TokenIssuer::issue(&*a.store, &*a.clock, Identity::new("admin", Role::Operator))
        .await
        .unwrap();
    let carol = TokenIssuer::issue(&*a.store, &*a.clock, Identity::new("carol", Role::Operator))
        .await
        .unwrap();
    // b has seen carol's token.
    assert_eq!(
        call(&b, "GET", "/v1/whoami", Some(&carol), None).await.0,
        StatusCode::OK
    );
    let (status, _) = call(&a, "DELETE", "/v1/tokens/carol", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        call(&a, "GET", "/v1/whoami", Some(&carol), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    tokio::time::sleep(corral_server::auth::REVALIDATE_AFTER + Duration::from_millis(200)).await;
    let (status, value) = call(&b, "GET", "/v1/whoami", Some(&carol), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{value}");
}

#[tokio::test]
async fn a_nodes_tokens_go_when_it_is_forgotten_or_its_name_is_taken_over() {
    let server = new_server();
    let admin = token(&server, "admin", Role::Operator).await;
    // node-1 was lost; a new machine joins under its name.
    common::put(
        &server,
        Kind::Node,
        "node-1",
        json!({}),
        json!({"phase": "Lost"}),
    )
    .await;
    let old = token(&server, "node-1", Role::Node).await;
    let (_, joiner) = call(
        &server,
        "POST",
        "/v1/tokens",
        Some(&admin),
        Some(json!({"name": "join", "role": "joiner"})),
    )
    .await;
    let joiner = joiner["token"].as_str().unwrap().to_string();
    let (status, joined) = call(
        &server,
        "POST",
        "/v1/join",
        Some(&joiner),
        Some(json!({"node": "node-1"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{joined}");
    let new = joined["token"].as_str().unwrap().to_string();
    assert_eq!(
        call(&server, "GET", "/v1/whoami", Some(&old), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&server, "GET", "/v1/whoami", Some(&new), None).await.0,
        StatusCode::OK
    );

    // Forgetting the node revokes the new machine's token too.
    let (status, node) = call(&server, "GET", "/v1/nodes/node-1", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    let mut forgotten: Value = node;
    forgotten["spec"]["forgotten"] = json!(true);
    let (status, value) = call(
        &server,
        "PUT",
        "/v1/nodes/node-1",
        Some(&admin),
        Some(forgotten),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{value}");
    assert_eq!(
        call(&server, "GET", "/v1/whoami", Some(&new), None).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn who_may_ask_is_decided_before_the_body_and_big_bodies_are_named() {
    let server = new_server();
    let alice = token(&server, "alice", Role::User).await;
    let (status, value) = call(
        &server,
        "POST",
        "/v1/tokens",
        Some(&alice),
        Some(json!({"nonsense": 1})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{value}");
    let admin = token(&server, "admin", Role::Operator).await;
    let huge = json!({
        "kind": "Pod",
        "metadata": {"name": "big"},
        "spec": {"containers": [{"name": "c", "image": "i", "command": ["x".repeat(5 * 1024 * 1024)]}]}
    });
    let (status, value) = call(
        &server,
        "PUT",
        "/v1/namespaces/default/pods/big",
        Some(&admin),
        Some(huge),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{value}");
    assert_eq!(value["code"], "TooLarge");
    assert!(
        value["message"]
            .as_str()
            .unwrap()
            .contains("limit of 4194304 bytes"),
        "{value}"
    );
}
