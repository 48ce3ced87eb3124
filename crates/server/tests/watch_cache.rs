//! Lists and watches served from the watch cache, in-process: pages, reading
//! one's own writes, node-scoped watches that hear a pod leave, and a
//! watch from before the cache's window.

mod common;

use std::time::Duration;

use axum::body::{Body, BodyDataStream};
use axum::http::{Request, StatusCode};
use corral_api::Role;
use corral_server::{SharedServer, app};
use futures::StreamExt;
use serde_json::{Value, json};
use tower::ServiceExt;

fn pod(name: &str) -> Value {
    json!({"kind": "Pod", "metadata": {"name": name, "labels": {"app": "web"}},
           "spec": {"containers": [{"name": "web", "image": "local/busybox:1"}]}})
}

async fn setup() -> (SharedServer, String, String) {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    let scheduler = common::token(&server, "scheduler", Role::Controller).await;
    (server, admin, scheduler)
}

async fn create(server: &SharedServer, token: &str, name: &str) {
    let uri = format!("/v1/namespaces/default/pods/{name}");
    let (status, body) = common::call(server, "PUT", &uri, Some(token), Some(pod(name))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

async fn bind(server: &SharedServer, scheduler: &str, name: &str, node: Option<&str>) {
    let uri = format!("/v1/namespaces/default/pods/{name}/status");
    let body = json!({"status": {"node": node}});
    let (status, body) = common::call(server, "PUT", &uri, Some(scheduler), Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

async fn open_watch(server: &SharedServer, token: &str, uri: &str) -> (StatusCode, BodyDataStream) {
    let request = Request::builder()
        .uri(uri)
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .expect("a valid request");
    let response = app(server.clone())
        .oneshot(request)
        .await
        .expect("infallible");
    (response.status(), response.into_body().into_data_stream())
}

/// Reads watch lines until `count` arrived.
async fn lines(body: &mut BodyDataStream, count: usize) -> Vec<Value> {
    let mut text = String::new();
    while text.lines().count() < count {
        let chunk = tokio::time::timeout(Duration::from_secs(5), body.next())
            .await
            .expect("watch events arrive")
            .expect("stream open")
            .expect("a chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text.lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// Asserts nothing more arrives for a moment.
async fn quiet(body: &mut BodyDataStream) {
    let more = tokio::time::timeout(Duration::from_millis(300), body.next()).await;
    assert!(more.is_err(), "no more events expected, got {more:?}");
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["metadata"]["name"].as_str().expect("name").to_string())
        .collect()
}

#[tokio::test]
async fn a_list_reads_its_own_writes_in_pages() {
    let (server, admin, _) = setup().await;
    for name in ["e", "a", "d", "b", "c"] {
        create(&server, &admin, name).await;
    }
    let (status, first) =
        common::call(&server, "GET", "/v1/pods?limit=2", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(names(&first), ["a", "b"]);
    let version = first["resourceVersion"].as_u64().expect("resourceVersion");
    create(&server, &admin, "bb").await;
    let token = first["continue"].as_str().expect("a continue token");
    let (_, second) = common::call(
        &server,
        "GET",
        &format!("/v1/pods?limit=2&continue={token}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(
        names(&second),
        ["bb", "c"],
        "a page reads the cache as it is now"
    );
    assert_eq!(
        second["resourceVersion"], version,
        "every page carries the first page's revision"
    );
    let token = second["continue"].as_str().expect("a continue token");
    let (_, third) = common::call(
        &server,
        "GET",
        &format!("/v1/pods?limit=2&continue={token}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(names(&third), ["d", "e"]);
    assert!(third.get("continue").is_none(), "the last page: {third}");
    let (status, bad) = common::call(
        &server,
        "GET",
        "/v1/pods?continue=nonsense",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        bad["message"]
            .as_str()
            .unwrap_or_default()
            .contains("continue"),
        "{bad}"
    );
}

#[tokio::test]
async fn a_node_watch_hears_its_pods_arrive_change_and_leave() {
    let (server, admin, scheduler) = setup().await;
    create(&server, &admin, "mine").await;
    create(&server, &admin, "other").await;
    let (_, listed) = common::call(&server, "GET", "/v1/pods?node=n1", Some(&admin), None).await;
    assert!(names(&listed).is_empty(), "{listed}");
    let version = listed["resourceVersion"].as_u64().expect("resourceVersion");
    let uri = format!("/v1/pods?watch=true&node=n1&resourceVersion={version}");
    let (status, mut body) = open_watch(&server, &admin, &uri).await;
    assert_eq!(status, StatusCode::OK);

    bind(&server, &scheduler, "other", Some("n2")).await;
    bind(&server, &scheduler, "mine", Some("n1")).await;
    let events = lines(&mut body, 1).await;
    assert_eq!(events[0]["type"], "ADDED", "bound here: {events:?}");
    assert_eq!(events[0]["object"]["metadata"]["name"], "mine");

    bind(&server, &scheduler, "mine", Some("n2")).await;
    let events = lines(&mut body, 1).await;
    assert_eq!(events[0]["type"], "DELETED", "moved away: {events:?}");
    assert_eq!(events[0]["object"]["status"]["node"], "n2");
    quiet(&mut body).await;

    let (_, on_n2) = common::call(&server, "GET", "/v1/pods?node=n2", Some(&admin), None).await;
    assert_eq!(names(&on_n2), ["mine", "other"]);
    let (status, refused) =
        common::call(&server, "GET", "/v1/nodes?node=n1", Some(&admin), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
}

#[tokio::test]
async fn a_watch_resumes_inside_the_window_and_replays_older_changes_from_the_store() {
    // A change made before the server starts is older than its cache's
    // window of changes.
    let store = corral_store::sqlite::SqliteStore::open_in_memory().expect("a store");
    let mut first: corral_api::Object = serde_json::from_value(pod("a")).expect("a pod");
    first.metadata.namespace = Some("default".into());
    first.metadata.uid = "uid-a".into();
    first
        .metadata
        .annotations
        .insert(corral_api::MANAGED_BY.into(), "job".into());
    let change = corral_store::ChangeMeta {
        author: "test".into(),
        class: corral_api::AuthorClass::External,
        message: String::new(),
        time: chrono::Utc::now(),
        always_record: false,
    };
    corral_store::Store::create(&store, first, &change)
        .await
        .expect("created before the server");
    let server = corral_server::Server::with(
        std::sync::Arc::new(store),
        std::sync::Arc::new(corral_server::SystemClock),
        std::sync::Arc::new(corral_server::clock::SequentialIds::default()),
    );
    let admin = common::token(&server, "admin", Role::Operator).await;
    let (_, listed) = common::call(&server, "GET", "/v1/pods", Some(&admin), None).await;
    let version = listed["resourceVersion"].as_u64().expect("resourceVersion");
    create(&server, &admin, "b").await;
    create(&server, &admin, "c").await;

    let uri = format!("/v1/pods?watch=true&resourceVersion={version}");
    let (_, mut body) = open_watch(&server, &admin, &uri).await;
    let events = lines(&mut body, 2).await;
    let replayed: Vec<&str> = events
        .iter()
        .map(|e| e["object"]["metadata"]["name"].as_str().expect("name"))
        .collect();
    assert_eq!(replayed, ["b", "c"], "only the changes after the list");

    // From 0: older than the cache's window, replayed from the store.
    let (status, mut body) =
        open_watch(&server, &admin, "/v1/pods?watch=true&resourceVersion=0").await;
    assert_eq!(status, StatusCode::OK);
    let events = lines(&mut body, 3).await;
    assert_eq!(events[0]["object"]["metadata"]["name"], "a");

    // A node-scoped watch cannot be replayed from the store: list again.
    let (status, _) = open_watch(
        &server,
        &admin,
        "/v1/pods?watch=true&node=n1&resourceVersion=0",
    )
    .await;
    assert_eq!(status, StatusCode::GONE);
    // Nor one scoped to a managing controller.
    let (status, _) = open_watch(
        &server,
        &admin,
        "/v1/pods?watch=true&managedBy=job&resourceVersion=0",
    )
    .await;
    assert_eq!(status, StatusCode::GONE);
    // Listed, that scope has the pods the controller manages.
    for (manager, expected) in [("job", vec!["a"]), ("pinned-deployment", vec![])] {
        let uri = format!("/v1/pods?managedBy={manager}");
        let (_, listed) = common::call(&server, "GET", &uri, Some(&admin), None).await;
        assert_eq!(names(&listed), expected, "{uri}");
    }

    let (status, _) = open_watch(
        &server,
        &admin,
        "/v1/pods?watch=true&resourceVersion=999999",
    )
    .await;
    assert_eq!(status, StatusCode::GONE, "a watch from the future");
}

#[tokio::test]
async fn the_driver_times_out_a_step_at_its_deadline_without_ticking_everything() {
    let (server, admin, _) = setup().await;
    let controller = json!({
        "kind": "Controller",
        "metadata": {"name": "acme-storage"},
        "spec": {"steps": [{
            "name": "acme/slow-mount", "kind": "Pod", "workflow": "start",
            "before": ["storage"], "timeout": "1s"
        }]}
    });
    let (status, body) = common::call(
        &server,
        "PUT",
        "/v1/controllers/acme-storage",
        Some(&admin),
        Some(controller),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    create(&server, &admin, "web").await;
    let owner = common::token(&server, "acme-storage", Role::Controller).await;
    let (status, body) = common::call(
        &server,
        "POST",
        "/v1/namespaces/default/pods/web/steps",
        Some(&owner),
        Some(json!({"action": "claim", "step": "acme/slow-mount"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let shutdown = tokio_util::sync::CancellationToken::new();
    let driver = tokio::spawn(corral_server::workflows::drive(
        server.clone(),
        shutdown.clone(),
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let phase = loop {
        let (_, pod) = common::call(
            &server,
            "GET",
            "/v1/namespaces/default/pods/web",
            Some(&admin),
            None,
        )
        .await;
        // Stored per step, by name: only the state.
        let phase =
            pod["status"]["workflow"]["instances"][0]["steps"]["acme/slow-mount"]["phase"].clone();
        if phase == "timedOut" || tokio::time::Instant::now() > deadline {
            break phase;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(phase, "timedOut", "the driver woke at the step's deadline");
    shutdown.cancel();
    driver.await.expect("the driver stops");
}
