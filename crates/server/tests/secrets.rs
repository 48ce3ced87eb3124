//! Secrets end to end through the router on a SQLite file: values go in,
//! only sizes and keyed hashes come out — of reads, lists, watches,
//! history, diffs and the database file — until someone who may read them
//! asks `reveal`; rollbacks restore old values; a key rotation seals
//! everything again and the old key opens nothing.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::call;
use corral_api::{Identity, Role};
use corral_server::clock::SequentialIds;
use corral_server::secrets::{KEYRING_FILE, Keyring};
use corral_server::{Server, SharedServer, SystemClock, TokenIssuer, app};
use corral_store::sqlite::SqliteStore;
use futures::StreamExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const PASSWORD: &str = "pa55-4711-never-shown";
const CERT: &str = "CERT-0815-never-shown";
const NEW_PASSWORD: &str = "new-pa55-0042-never-shown";
const DB: &str = "/v1/namespaces/default/secrets/db";

struct Cluster {
    server: SharedServer,
    admin: String,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn new() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("corral.db")).unwrap();
        let server = Server::with(
            Arc::new(store),
            Arc::new(SystemClock),
            Arc::new(SequentialIds::default()),
        );
        server
            .secrets
            .install(Keyring::open_or_create(&dir.path().join(KEYRING_FILE)).unwrap());
        let admin = issue(&server, Identity::new("admin", Role::Operator)).await;
        Cluster { server, admin, dir }
    }

    async fn ok(&self, method: &str, uri: &str, body: Option<Value>) -> Value {
        let (status, value) = call(&self.server, method, uri, Some(&self.admin), body).await;
        assert!(status.is_success(), "{method} {uri}: {status} {value}");
        value
    }

    /// Every byte the store's files hold, as text.
    fn files(&self) -> String {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(self.dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("corral.db"))
            {
                all.extend(std::fs::read(path).unwrap());
            }
        }
        String::from_utf8_lossy(&all).into_owned()
    }
}

async fn issue(server: &SharedServer, identity: Identity) -> String {
    TokenIssuer::issue(&*server.store, &*server.clock, identity)
        .await
        .unwrap()
}

fn secret(password: &str) -> Value {
    json!({
        "kind": "Secret",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"type": "db-login", "stringData": {"password": password},
                 "data": {"cert": STANDARD.encode(CERT)}}
    })
}

fn assert_no_value(what: &str, text: &str) {
    for value in [PASSWORD, CERT, NEW_PASSWORD, &STANDARD.encode(CERT)] {
        assert!(!text.contains(value), "{what} shows a secret value: {text}");
    }
}

fn revealed(value: &Value, key: &str) -> String {
    let encoded = value["data"][key].as_str().unwrap();
    String::from_utf8(STANDARD.decode(encoded).unwrap()).unwrap()
}

/// `GET …/secrets/db/reveal?QUERY` as the holder of `token`.
async fn reveal_as(c: &Cluster, token: &str, query: &str) -> (StatusCode, Value) {
    call(
        &c.server,
        "GET",
        &format!("{DB}/reveal{query}"),
        Some(token),
        None,
    )
    .await
}

#[tokio::test]
async fn values_are_sealed_shown_to_nobody_and_revealed_to_those_who_may() {
    let c = Cluster::new().await;
    // A watch from the start sees every write.
    let request = Request::builder()
        .uri("/v1/secrets?watch=true&resourceVersion=0")
        .header("authorization", format!("Bearer {}", c.admin))
        .body(Body::empty())
        .unwrap();
    let watch = app(c.server.clone()).oneshot(request).await.unwrap();
    let mut watch = watch.into_body().into_data_stream();

    let stored = c.ok("PUT", DB, Some(secret(PASSWORD))).await;
    assert_eq!(stored["spec"]["type"], "db-login");
    assert_eq!(stored["spec"]["keys"]["password"]["size"], PASSWORD.len());
    assert_eq!(stored["spec"]["keys"]["cert"]["size"], CERT.len());
    assert_eq!(
        stored["spec"]["keys"]["password"]["hash"]
            .as_str()
            .unwrap()
            .len(),
        32
    );
    assert!(stored["spec"].get("stringData").is_none() && stored["spec"].get("data").is_none());
    assert_no_value("the apply's answer", &stored.to_string());

    // The same values again: unchanged. A new password: revision 2.
    let again = c.ok("PUT", DB, Some(secret(PASSWORD))).await;
    assert_eq!(
        again["metadata"]["resourceVersion"],
        stored["metadata"]["resourceVersion"]
    );
    let changed = c.ok("PUT", DB, Some(secret(NEW_PASSWORD))).await;
    assert_eq!(changed["metadata"]["revision"], 2);
    assert_ne!(
        changed["spec"]["keys"]["password"]["hash"],
        stored["spec"]["keys"]["password"]["hash"]
    );
    assert_eq!(
        changed["spec"]["keys"]["cert"], stored["spec"]["keys"]["cert"],
        "same value, same hash"
    );

    for uri in [
        DB.to_string(),
        "/v1/namespaces/default/secrets".to_string(),
        format!("{DB}/history"),
        format!("{DB}/history/1"),
        format!("{DB}/diff?from=1&to=2"),
        "/v1/history".to_string(),
        format!("{DB}/steplogs"),
    ] {
        let shown = c.ok("GET", &uri, None).await;
        assert_no_value(&uri, &shown.to_string());
    }
    let diff = c.ok("GET", &format!("{DB}/diff?from=1&to=2"), None).await;
    assert!(
        diff.to_string().contains("spec.keys.password.hash"),
        "the diff names the key: {diff}"
    );
    let mut events = String::new();
    while events.lines().count() < 2 {
        let chunk = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .expect("watch events arrive")
            .unwrap()
            .unwrap();
        events.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert_no_value("the watch stream", &events);
    assert_no_value("the database files", &c.files());

    // Revealed to an operator, now and at revision 1.
    let now = c.ok("GET", &format!("{DB}/reveal"), None).await;
    assert_eq!(
        (now["revision"].as_u64(), revealed(&now, "password")),
        (Some(2), NEW_PASSWORD.to_string())
    );
    assert_eq!(revealed(&now, "cert"), CERT);
    let then = c.ok("GET", &format!("{DB}/reveal?revision=1"), None).await;
    assert_eq!(revealed(&then, "password"), PASSWORD);

    // Who else may read them, and the rule that refuses the others.
    let reader = issue(
        &c.server,
        Identity::new("ci", Role::User)
            .with_namespaces(vec!["default".into()])
            .reading_secrets(true),
    )
    .await;
    let plain = issue(
        &c.server,
        Identity::new("bob", Role::User).with_namespaces(vec!["default".into()]),
    )
    .await;
    let elsewhere = issue(
        &c.server,
        Identity::new("eve", Role::User)
            .with_namespaces(vec!["team".into()])
            .reading_secrets(true),
    )
    .await;
    let controller = issue(&c.server, Identity::new("acme", Role::Controller)).await;
    let node = issue(&c.server, Identity::new("node-1", Role::Node)).await;
    let (status, value) = reveal_as(&c, &reader, "").await;
    assert_eq!(
        (status, revealed(&value, "password")),
        (StatusCode::OK, NEW_PASSWORD.to_string())
    );
    for (token, rule) in [
        (&plain, "only with a token made with --read-secrets"),
        (&elsewhere, "may act only in namespaces team"),
        (&controller, "declares it reads Secret spec.data"),
        (
            &node,
            "only the Secrets of pods bound to it that use them: name the pod",
        ),
    ] {
        let (status, value) = reveal_as(&c, token, "").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{value}");
        assert!(value["message"].as_str().unwrap().contains(rule), "{value}");
    }
    // bob still sees which keys there are.
    let (status, shown) = call(&c.server, "GET", DB, Some(&plain), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(shown["spec"]["keys"]["password"].is_object());

    // A rollback restores the old values, without showing them.
    let rolled = c
        .ok("POST", &format!("{DB}/rollback"), Some(json!({"to": 1})))
        .await;
    assert_no_value("the rollback's answer", &rolled.to_string());
    let now = c.ok("GET", &format!("{DB}/reveal"), None).await;
    assert_eq!(
        (now["revision"].as_u64(), revealed(&now, "password")),
        (Some(3), PASSWORD.to_string())
    );
}

#[tokio::test]
async fn a_node_reads_a_secret_only_for_a_pod_bound_to_it_that_uses_it() {
    let c = Cluster::new().await;
    c.ok("PUT", DB, Some(secret(PASSWORD))).await;
    let uses_db = |container: &str| {
        json!({"containers": [{"name": container, "image": "busybox",
            "env": {"PASS": {"secret": "db", "key": "password"}}}]})
    };
    common::put(
        &c.server,
        corral_api::Kind::Pod,
        "app",
        uses_db("app"),
        json!({"node": "node-1"}),
    )
    .await;
    common::put(
        &c.server,
        corral_api::Kind::Pod,
        "plain",
        json!({"containers": [{"name": "plain", "image": "busybox"}]}),
        json!({"node": "node-1"}),
    )
    .await;
    common::put(
        &c.server,
        corral_api::Kind::Pod,
        "waiting",
        uses_db("waiting"),
        json!({}),
    )
    .await;
    let node = issue(&c.server, Identity::new("node-1", Role::Node)).await;
    let other = issue(&c.server, Identity::new("node-2", Role::Node)).await;

    // The right node, for the pod that uses the Secret.
    let (status, value) = reveal_as(&c, &node, "?pod=app").await;
    assert_eq!(
        (status, revealed(&value, "password")),
        (StatusCode::OK, PASSWORD.to_string())
    );

    for (token, pod, rule) in [
        (&other, "app", "pod app is bound to node node-1"),
        (&node, "plain", "pod plain does not use secret db"),
        (&node, "waiting", "pod waiting is bound to no node"),
        (&node, "ghost", "pod ghost not found in namespace default"),
    ] {
        let (status, value) = reveal_as(&c, token, &format!("?pod={pod}")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{pod}: {value}");
        let message = value["message"].as_str().unwrap();
        assert!(
            message.contains("a node reads only the Secrets of pods bound to it that use them")
                && message.contains(rule),
            "{pod}: {value}"
        );
        assert_no_value("a refusal", &value.to_string());
    }
}

#[tokio::test]
async fn rotation_seals_everything_again_and_the_old_key_opens_nothing() {
    let c = Cluster::new().await;
    c.ok("PUT", DB, Some(secret(PASSWORD))).await;
    c.ok("PUT", DB, Some(secret(NEW_PASSWORD))).await;
    let old_keyring = c.dir.path().join("old-keyring");
    std::fs::copy(c.dir.path().join(KEYRING_FILE), &old_keyring).unwrap();

    let user = issue(
        &c.server,
        Identity::new("ci", Role::User)
            .with_namespaces(vec!["*".into()])
            .reading_secrets(true),
    )
    .await;
    let (status, _) = call(
        &c.server,
        "POST",
        "/v1/secrets/rotate-key",
        Some(&user),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "operators only");
    let report = c.ok("POST", "/v1/secrets/rotate-key", None).await;
    assert_eq!(report, json!({"key": 2, "resealed": 2, "retired": [1]}));

    let old = Keyring::open_or_create(&old_keyring).unwrap();
    let sealed = c.server.store.list_sealed("").await.unwrap();
    assert_eq!(sealed.len(), 2, "revisions 1 and 2 keep their values");
    for record in &sealed {
        assert!(
            old.open(&record.name, &record.value).is_err(),
            "the old key opens {}",
            record.name
        );
    }
    // Still readable, old revisions too.
    let now = c.ok("GET", &format!("{DB}/reveal"), None).await;
    assert_eq!(revealed(&now, "password"), NEW_PASSWORD);
    let then = c.ok("GET", &format!("{DB}/reveal?revision=1"), None).await;
    assert_eq!(revealed(&then, "password"), PASSWORD);

    // Deleting the Secret drops its values.
    c.ok("DELETE", DB, None).await;
    assert!(c.server.store.list_sealed("").await.unwrap().is_empty());
}

#[tokio::test]
async fn bad_values_are_refused_without_quoting_them() {
    let c = Cluster::new().await;
    let (status, value) = call(
        &c.server,
        "PUT",
        DB,
        Some(&c.admin),
        Some(json!({"kind": "Secret", "metadata": {"name": "db"},
            "spec": {"data": {"password": "not base64 pa55-4711-never-shown!"}, "stringData": {"bad/key": "x"}}})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{value}");
    let text = value.to_string();
    assert!(
        text.contains("spec.data.password") && text.contains("not valid base64"),
        "{text}"
    );
    assert!(text.contains("spec.stringData.bad/key"), "{text}");
    assert_no_value("the refusal", &text);
    let (status, value) = call(
        &c.server,
        "PUT",
        DB,
        Some(&c.admin),
        Some(json!({"kind": "Secret", "metadata": {"name": "db"},
            "spec": {"stringData": {"password": 4711}}})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{value}");
    assert!(!value.to_string().contains("4711"), "{value}");
    // Keys the server never sealed are refused.
    let (status, value) = call(
        &c.server,
        "PUT",
        DB,
        Some(&c.admin),
        Some(json!({"kind": "Secret", "metadata": {"name": "db"},
            "spec": {"keys": {"password": {"size": 3, "hash": "00112233445566778899aabbccddeeff"}}}})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{value}");
    assert!(
        value
            .to_string()
            .contains("names values this cluster does not hold"),
        "{value}"
    );
    assert!(
        c.server.store.list_sealed("").await.unwrap().is_empty(),
        "nothing was sealed"
    );
}
