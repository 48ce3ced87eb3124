//! The in-process harness the server's integration tests share: the app on
//! an in-memory store with sequential uids, tokens for any identity, and one
//! request helper. No socket: requests go through `app()` directly.

#![allow(dead_code)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use chrono::Utc;
use corral_api::{AuthorClass, Identity, Kind, Object, Role};
use corral_server::clock::SequentialIds;
use corral_server::{Server, SharedServer, SystemClock, TokenIssuer, app};
use corral_store::ChangeMeta;
use corral_store::sqlite::SqliteStore;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// A server on a fresh in-memory store (uids `uid-1`, `uid-2`, …).
pub fn new_server() -> SharedServer {
    let store = SqliteStore::open_in_memory().expect("in-memory store");
    Server::with(
        Arc::new(store),
        Arc::new(SystemClock),
        Arc::new(SequentialIds::default()),
    )
}

/// A token for `name` with `role`.
/// A token for `name` as `role`; users may act in every namespace.
pub async fn token(server: &SharedServer, name: &str, role: Role) -> String {
    let identity = Identity::new(name, role);
    let identity = if role == Role::User {
        identity.with_namespaces(vec!["*".into()])
    } else {
        identity
    };
    TokenIssuer::issue(&*server.store, &*server.clock, identity)
        .await
        .expect("issue a token")
}

/// Sends one request; the body comes back as JSON, or as a JSON string when
/// it is not JSON (metrics, healthz).
pub async fn call(
    server: &SharedServer,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let response = app(server.clone())
        .oneshot(request.body(body).expect("a valid request"))
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

/// Stores `kind/name` (in namespace `default` when namespaced) with `spec`
/// and `status`, uid `uid-NAME`, straight into the store.
pub async fn put(server: &SharedServer, kind: Kind, name: &str, spec: Value, status: Value) {
    let namespace = kind.is_namespaced().then_some("default");
    let mut object = Object::new(kind, namespace, name, spec);
    object.metadata.uid = format!("uid-{name}");
    object.metadata.created_at = Some(Utc::now());
    object.status = status;
    let change = ChangeMeta {
        author: "test".into(),
        class: AuthorClass::External,
        message: String::new(),
        time: Utc::now(),
        always_record: false,
    };
    server
        .store
        .create(object, &change)
        .await
        .expect("the test object is stored");
}
