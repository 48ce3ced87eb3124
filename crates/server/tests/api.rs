//! The API in-process: authentication, validation, optimistic concurrency,
//! watch, metrics and the OpenAPI document, driven through `app()` without
//! a socket.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use std::sync::Arc;

use corral_api::{Identity, Role};
use corral_server::{Server, SharedServer, TokenIssuer, app};
use corral_store::Store;
use corral_store::sqlite::SqliteStore;
use futures::StreamExt;
use serde_json::{Value, json};
use tower::ServiceExt;

async fn server() -> (SharedServer, String) {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    (server, admin)
}

async fn call(
    server: &SharedServer,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    common::call(server, method, uri, token, body).await
}

fn pod(image: &str) -> Value {
    json!({"kind": "Pod", "metadata": {"name": "web", "labels": {"app": "web"}},
           "spec": {"containers": [{"name": "web", "image": image}]}})
}

const WEB: &str = "/v1/namespaces/default/pods/web";

#[tokio::test]
async fn every_request_needs_a_known_token() {
    let (server, token) = server().await;
    let (status, body) = call(&server, "GET", "/v1/pods", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["code"], "Unauthenticated");
    let (status, _) = call(&server, "GET", "/v1/pods", Some("corral_nope"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = call(&server, "GET", "/v1/whoami", Some(&token), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"name": "admin", "role": "operator"}));
    let (status, _) = call(&server, "GET", "/healthz", None, None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn only_operators_mint_tokens() {
    let (server, token) = server().await;
    let (status, body) = call(
        &server,
        "POST",
        "/v1/tokens",
        Some(&token),
        Some(json!({"name": "alice", "role": "user", "namespaces": ["default"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let alice = body["token"].as_str().unwrap().to_string();
    let (status, body) = call(
        &server,
        "POST",
        "/v1/tokens",
        Some(&alice),
        Some(json!({"name": "eve", "role": "operator"})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _) = call(
        &server,
        "POST",
        "/v1/tokens",
        Some(&token),
        Some(json!({"name": "Bad Name", "role": "user"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn invalid_objects_are_refused_with_field_paths_and_nothing_stored() {
    let (server, token) = server().await;
    let mut bad = pod("x");
    bad["spec"]["containers"][0]["imagePullPolicy"] = json!("Always");
    let (status, body) = call(&server, "PUT", WEB, Some(&token), Some(bad)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["code"], "Invalid");
    assert!(
        body["fields"][0]["path"]
            .as_str()
            .unwrap()
            .starts_with("spec.containers[0]"),
        "{body}"
    );
    let (status, body) = call(&server, "PUT", WEB, Some(&token), Some(pod(""))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["fields"][0]["path"], "spec.containers[0].image");
    let (status, _) = call(&server, "GET", WEB, Some(&token), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A body for another name or kind than the route is refused too.
    let (status, _) = call(
        &server,
        "PUT",
        "/v1/namespaces/default/pods/other",
        Some(&token),
        Some(pod("i")),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call(
        &server,
        "PUT",
        "/v1/namespaces/default/nodes/web",
        Some(&token),
        Some(pod("i")),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn compare_and_swap_and_status_writes() {
    let (server, token) = server().await;
    let (status, created) = call(&server, "PUT", WEB, Some(&token), Some(pod("a"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(created["metadata"]["revision"], 1);
    assert_eq!(created["metadata"]["uid"], "uid-1");
    assert_eq!(
        created["spec"]["restartPolicy"], "Always",
        "specs are stored canonical"
    );

    let mut stale = created.clone();
    let created_version = created["metadata"]["resourceVersion"]
        .as_u64()
        .expect("resourceVersion");
    call(&server, "PUT", WEB, Some(&token), Some(pod("b"))).await;
    stale["spec"]["containers"][0]["image"] = json!("c");
    let (status, body) = call(&server, "PUT", WEB, Some(&token), Some(stale)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(&format!("resourceVersion {created_version} is stale")),
        "{body}"
    );

    // status.node is the scheduler's (field ownership); its write keeps
    // the status fields it does not see.
    let scheduler = TokenIssuer::issue(
        &*server.store,
        &*server.clock,
        Identity::new("scheduler", Role::Controller),
    )
    .await
    .expect("issue a token");
    let (status, with_status) = call(
        &server,
        "PUT",
        &format!("{WEB}/status"),
        Some(&scheduler),
        Some(json!({"status": {"node": "node-1"}})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{with_status}");
    assert_eq!(
        with_status["metadata"]["revision"], 2,
        "a status write makes no revision"
    );
    assert_eq!(with_status["status"]["node"], "node-1");
    let (_, history) = call(
        &server,
        "GET",
        &format!("{WEB}/history"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(history.as_array().unwrap().len(), 2);

    // Applying a spec keeps the status.
    let (_, applied) = call(&server, "PUT", WEB, Some(&token), Some(pod("d"))).await;
    assert_eq!(applied["status"]["node"], "node-1");
    assert_eq!(applied["metadata"]["revision"], 3);

    // Clearing status.node moves the pod: history records the move as a
    // system change of the same spec, and its `move` instance serves it.
    let (status, moved) = call(
        &server,
        "PUT",
        &format!("{WEB}/status?message=moved%20off%20node-1%3A%20the%20node%20is%20lost"),
        Some(&scheduler),
        Some(json!({"status": {"node": null}})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{moved}");
    assert_eq!(moved["metadata"]["revision"], 4, "a move is recorded");
    let (_, moved) = call(&server, "GET", WEB, Some(&token), None).await;
    let instances = moved["status"]["workflow"]["instances"]
        .as_array()
        .expect("instances");
    let latest = instances.last().expect("an instance");
    assert_eq!(
        (&latest["workflow"], &latest["revision"]),
        (&json!("move"), &json!(4))
    );
    let (_, history) = call(
        &server,
        "GET",
        &format!("{WEB}/history"),
        Some(&token),
        None,
    )
    .await;
    let last = history.as_array().and_then(|h| h.last()).expect("a record");
    assert_eq!(
        (
            &last["revision"],
            &last["author"],
            &last["class"],
            &last["message"]
        ),
        (
            &json!(4),
            &json!("scheduler"),
            &json!("system"),
            &json!("moved off node-1: the node is lost")
        )
    );
}

/// An apply reads the current object from its server's watch cache when
/// it can; a cache that has not heard of another writer's newest change
/// must never decide the apply. Two servers on one database file, each
/// through its own store handle: a handle's watch carries only its own
/// writes, so the first server's cache never hears of the second's, the
/// lag of a cache behind another server (as on etcd) made permanent. The
/// first server's apply undoing the second's change must still be a new
/// revision, never taken for "nothing to change".
#[tokio::test]
async fn an_update_answers_with_the_object_as_stored_or_as_its_caller_sees_it() {
    let (server, admin) = server().await;
    let (status, _) = call(&server, "PUT", WEB, Some(&admin), Some(pod("a:1"))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, updated) = call(&server, "PUT", WEB, Some(&admin), Some(pod("a:2"))).await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    let (_, stored) = call(&server, "GET", WEB, Some(&admin), None).await;
    assert_eq!(updated, stored);
    assert_eq!(updated["metadata"]["revision"], 2);
    assert_eq!(updated["spec"]["containers"][0]["image"], "a:2");
    // start-1 never began (no scheduler here): start-2 is all there is.
    let ids: Vec<&Value> = updated["status"]["workflow"]["instances"]
        .as_array()
        .map(|instances| instances.iter().map(|i| &i["id"]).collect())
        .unwrap_or_default();
    assert_eq!(ids, [&json!("start-2")], "{updated}");

    // A controller is answered with what it reads: with no registration,
    // metadata only.
    let job = common::token(&server, "job", Role::Controller).await;
    let managed = |image: &str| {
        let mut body = pod(image);
        body["metadata"]["name"] = json!("run-1");
        body["metadata"]["annotations"] = json!({"corral.dev/managed-by": "job"});
        body
    };
    let run = "/v1/namespaces/default/pods/run-1";
    let (status, created) = call(&server, "PUT", run, Some(&job), Some(managed("b:1"))).await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let (status, updated) = call(&server, "PUT", run, Some(&job), Some(managed("b:2"))).await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(updated["metadata"]["revision"], 2, "{updated}");
    assert!(updated.get("spec").is_none_or(Value::is_null), "{updated}");
    assert!(
        updated.get("status").is_none_or(Value::is_null),
        "{updated}"
    );
}

#[tokio::test]
async fn an_apply_is_decided_on_the_stores_copy_when_its_cache_is_behind() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let open = || -> Arc<dyn Store> { Arc::new(SqliteStore::open(&path).expect("store")) };
    let (first, second) = (Server::new(open()), Server::new(open()));
    let token = common::token(&first, "admin", Role::Operator).await;
    let image = |index: usize| format!("registry.example/app:{index}");
    let (status, created) = call(&first, "PUT", WEB, Some(&token), Some(pod(&image(0)))).await;
    assert_eq!(status, StatusCode::OK, "{created}");
    for index in 1..=40 {
        let (status, moved_on) =
            call(&second, "PUT", WEB, Some(&token), Some(pod(&image(index)))).await;
        assert_eq!(status, StatusCode::OK, "round {index}: {moved_on}");
        let (status, back) = call(
            &first,
            "PUT",
            WEB,
            Some(&token),
            Some(pod(&image(index - 1))),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{back}");
        assert_eq!(
            back["spec"]["containers"][0]["image"],
            json!(image(index - 1)),
            "round {index}"
        );
        assert_eq!(
            back["metadata"]["revision"],
            json!(moved_on["metadata"]["revision"].as_u64().expect("revision") + 1),
            "round {index}: the apply undoing the other server's change is a revision of its own"
        );
    }
    let (_, stored) = call(&second, "GET", WEB, Some(&token), None).await;
    assert_eq!(stored["spec"]["containers"][0]["image"], json!(image(39)));
    assert_eq!(stored["metadata"]["revision"], json!(81));
}

/// The node writes a pod's status at any moment; a rollback that loses
/// the race to a status write is made again on the newer object (it asks
/// for no resourceVersion, so a status write is no one's conflicting
/// change). Seen in CI as "resourceVersion 30 is stale, the current one is
/// 31" from `corral rollback` while the agent reported on the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_is_not_refused_for_a_status_written_meanwhile() {
    let (server, token) = server().await;
    for image in ["a", "b"] {
        let (status, _) = call(&server, "PUT", WEB, Some(&token), Some(pod(image))).await;
        assert_eq!(status, StatusCode::OK);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reporter = {
        let (server, stop) = (server.clone(), stop.clone());
        tokio::spawn(async move {
            let key = corral_api::ObjectKey::new(corral_api::Kind::Pod, Some("default"), "web");
            let mut written = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let mut object = server.store.get(&key).await.unwrap().unwrap();
                let expected = object.metadata.resource_version;
                object.status = json!({"phase": "Running", "report": written});
                let change = corral_store::ChangeMeta {
                    author: "node".into(),
                    class: corral_api::AuthorClass::System,
                    message: String::new(),
                    time: chrono::Utc::now(),
                    always_record: false,
                };
                if server.store.update(object, expected, &change).await.is_ok() {
                    written += 1;
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            written
        })
    };
    for round in 0..40u64 {
        let to = 1 + round % 2;
        let (status, rolled) = call(
            &server,
            "POST",
            &format!("{WEB}/rollback"),
            Some(&token),
            Some(json!({"to": to})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "rollback {round} to {to}: {rolled}");
        assert_eq!(rolled["metadata"]["revision"], json!(3 + round));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let reports = reporter.await.unwrap();
    assert!(
        reports >= 10,
        "the status writer raced the rollbacks ({reports} writes)"
    );
}

#[tokio::test]
async fn diff_rollback_and_cluster_history() {
    let (server, token) = server().await;
    call(
        &server,
        "PUT",
        &format!("{WEB}?message=one"),
        Some(&token),
        Some(pod("a")),
    )
    .await;
    call(
        &server,
        "PUT",
        &format!("{WEB}?message=two"),
        Some(&token),
        Some(pod("b")),
    )
    .await;
    let (status, diff) = call(
        &server,
        "GET",
        &format!("{WEB}/diff?from=1&to=2"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        diff["changes"],
        json!([{"path": "spec.containers[0].image", "old": "a", "new": "b"}])
    );
    let (status, rolled) = call(
        &server,
        "POST",
        &format!("{WEB}/rollback"),
        Some(&token),
        Some(json!({"to": 1, "message": "bad image"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(rolled["metadata"]["revision"], 3);
    assert_eq!(rolled["spec"]["containers"][0]["image"], "a");
    let (status, _) = call(
        &server,
        "POST",
        &format!("{WEB}/rollback"),
        Some(&token),
        Some(json!({"to": 1})),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "rolling back to the current spec is refused"
    );
    let (status, _) = call(
        &server,
        "POST",
        &format!("{WEB}/rollback"),
        Some(&token),
        Some(json!({"to": 9})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, records) = call(
        &server,
        "GET",
        "/v1/history?since=1h&class=external",
        Some(&token),
        None,
    )
    .await;
    let messages: Vec<&str> = records
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        vec!["one", "two", "rollback to revision 1: bad image"]
    );
    let (status, _) = call(
        &server,
        "GET",
        "/v1/history?since=yesterday",
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // One object's newest revisions, oldest first.
    let revisions = |records: &Value| -> Vec<u64> {
        records
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["revision"].as_u64().unwrap())
            .collect()
    };
    let (status, newest) = call(
        &server,
        "GET",
        &format!("{WEB}/history?limit=2"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{newest}");
    assert_eq!(revisions(&newest), [2, 3]);
    let (_, every) = call(
        &server,
        "GET",
        &format!("{WEB}/history"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(revisions(&every), [1, 2, 3]);
    let (status, refused) = call(
        &server,
        "GET",
        &format!("{WEB}/history?limit=0"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(refused.to_string().contains("limit"), "{refused}");
}

#[tokio::test]
async fn watch_streams_changes_after_a_resource_version() {
    let (server, token) = server().await;
    call(&server, "PUT", WEB, Some(&token), Some(pod("a"))).await;
    let request = Request::builder()
        .uri("/v1/pods?watch=true&resourceVersion=0")
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    let response = app(server.clone()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body().into_data_stream();
    call(&server, "PUT", WEB, Some(&token), Some(pod("b"))).await;
    let mut text = String::new();
    while text.lines().count() < 2 {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(5), body.next())
            .await
            .expect("watch events arrive")
            .expect("stream open")
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[1]["type"], "MODIFIED");
    assert_eq!(events[1]["object"]["spec"]["containers"][0]["image"], "b");
}

#[tokio::test]
async fn metrics_count_requests() {
    let (server, token) = server().await;
    call(&server, "PUT", WEB, Some(&token), Some(pod("a"))).await;
    let (status, text) = call(&server, "GET", "/metrics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let text = text.as_str().unwrap();
    assert!(
        text.contains("corral_http_requests_total{method=\"PUT\",route=\"/v1/namespaces/{namespace}/{plural}/{name}\",status=\"200\"} 1"),
        "{text}"
    );
    // The pod's revision, and the workflow definition its start runs.
    assert!(text.contains("corral_history_revisions 2"), "{text}");
}

#[test]
fn checked_in_openapi_document_matches_the_types() {
    let generated = serde_json::to_string_pretty(&corral_server::openapi::document()).unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let checked_in = std::fs::read_to_string(path).expect("docs/openapi.json is checked in");
    assert!(
        generated.trim() == checked_in.trim(),
        "docs/openapi.json is out of date: regenerate it with `corral openapi > docs/openapi.json`"
    );
    let document: Value = serde_json::from_str(&checked_in).unwrap();
    for schema in [
        "Object",
        "PodSpec",
        "RevisionRecord",
        "ErrorBody",
        "ControllerSpec",
        "VirtualMachineSpec",
    ] {
        assert!(
            document["components"]["schemas"][schema].is_object(),
            "schema {schema} missing"
        );
    }
    assert!(
        document["paths"]["/v1/namespaces/{namespace}/{plural}/{name}/rollback"]["post"]
            .is_object()
    );
}
