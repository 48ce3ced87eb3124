//! Field ownership through the API, in-process: every write is checked
//! against the owner of each field it changes, registrations never give a
//! field a second owner, controllers are served only what they declared,
//! fields change hands only by an explicit transfer, and the built-in
//! controllers register through the same API.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use corral_api::Role;
use corral_server::ownership::{BuiltinTokens, register_builtins};
use corral_server::{SharedServer, app};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

struct Cluster {
    server: SharedServer,
    admin: String,
    builtins: BuiltinTokens,
}

async fn cluster() -> Cluster {
    let server = common::new_server();
    let admin = token(&server, "admin", Role::Operator).await;
    let builtins = register_builtins(&server, &BuiltinTokens::new())
        .await
        .expect("built-in controllers register");
    Cluster {
        server,
        admin,
        builtins,
    }
}

async fn token(server: &SharedServer, name: &str, role: Role) -> String {
    common::token(server, name, role).await
}

impl Cluster {
    fn builtin(&self, name: &str) -> &str {
        self.builtins
            .get(name)
            .map(String::as_str)
            .expect("a built-in token")
    }

    async fn call(
        &self,
        method: &str,
        uri: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        common::call(&self.server, method, uri, Some(token), body).await
    }

    async fn ok(&self, method: &str, uri: &str, token: &str, body: Option<Value>) -> Value {
        let (status, body) = self.call(method, uri, token, body).await;
        assert_eq!(status, StatusCode::OK, "{method} {uri}: {body}");
        body
    }

    /// Reads the pod as `token` sees it, lets `edit` change its status and
    /// writes the status back.
    async fn write_status(
        &self,
        token: &str,
        edit: impl FnOnce(&mut Value),
    ) -> (StatusCode, Value) {
        let mut pod = self.ok("GET", WEB, token, None).await;
        if pod["status"].is_null() {
            pod["status"] = json!({});
        }
        edit(&mut pod["status"]);
        self.call("PUT", &format!("{WEB}/status"), token, Some(pod))
            .await
    }

    async fn register(&self, name: &str, spec: Value) -> (StatusCode, Value) {
        let body = json!({"kind": "Controller", "metadata": {"name": name}, "spec": spec});
        self.call(
            "PUT",
            &format!("/v1/controllers/{name}"),
            &self.admin,
            Some(body),
        )
        .await
    }
}

const WEB: &str = "/v1/namespaces/default/pods/web";

fn pod() -> Value {
    json!({"kind": "Pod", "metadata": {"name": "web", "labels": {"app": "web"}},
           "spec": {"containers": [{"name": "web", "image": "busybox"}], "runtime": "runc"}})
}

fn message(body: &Value) -> String {
    body["message"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_person_may_not_write_status_node_and_the_scheduler_may() {
    let cluster = cluster().await;
    cluster.ok("PUT", WEB, &cluster.admin, Some(pod())).await;

    let (status, body) = cluster
        .write_status(&cluster.admin, |s| s["node"] = json!("node-1"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        message(&body),
        "status.node is owned by controller scheduler; admin (operator) may not write it"
    );

    let scheduler = cluster.builtin("scheduler").to_string();
    let (status, body) = cluster
        .write_status(&scheduler, |s| s["node"] = json!("node-1"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"]["node"], "node-1");

    // The bound node's agent reports; the scheduler's later write keeps what
    // it never saw.
    let node = token(&cluster.server, "node-1", Role::Node).await;
    let (status, body) = cluster
        .write_status(&node, |s| s["phase"] = json!("Running"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let other = token(&cluster.server, "node-2", Role::Node).await;
    let (status, body) = cluster
        .write_status(&other, |s| s["phase"] = json!("Failed"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        message(&body).contains("owned by the agent of node node-1"),
        "{body}"
    );
    let (status, _) = cluster
        .write_status(&scheduler, |s| s["node"] = json!("node-1"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let stored = cluster.ok("GET", WEB, &cluster.admin, None).await;
    assert_eq!(stored["status"]["phase"], "Running", "{stored}");
}

#[tokio::test]
async fn controllers_never_write_spec_and_only_people_delete() {
    let cluster = cluster().await;
    cluster.ok("PUT", WEB, &cluster.admin, Some(pod())).await;
    let scheduler = cluster.builtin("scheduler").to_string();
    let mut edited = pod();
    edited["spec"]["runtime"] = json!("gvisor");
    let (status, body) = cluster.call("PUT", WEB, &scheduler, Some(edited)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        message(&body),
        "spec.runtime is owned by people (operators and users); scheduler (controller) may not write it"
    );
    let (status, body) = cluster.call("DELETE", WEB, &scheduler, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        message(&body).contains("scheduler (controller) may not delete pod/web"),
        "{body}"
    );
    let alice = token(&cluster.server, "alice", Role::User).await;
    let (status, _) = cluster
        .call("DELETE", "/v1/controllers/ipam", &alice, None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    cluster.ok("DELETE", WEB, &alice, None).await;
}

#[tokio::test]
async fn a_second_owner_is_refused_naming_the_first() {
    let cluster = cluster().await;
    let (status, body) = cluster
        .register("metallb", json!({"owns": ["Pod:status.loadBalancer"]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = cluster
        .register("other-lb", json!({"owns": ["Pod:status.loadBalancer"]}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        message(&body),
        "Pod:status.loadBalancer is already owned by controller metallb; controller other-lb may not register it"
    );
    let (status, body) = cluster
        .register("rogue", json!({"owns": ["Pod:status.node"]}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        message(&body).starts_with("Pod:status.node is already owned by controller scheduler"),
        "{body}"
    );
    // A controller registers itself, never another one.
    let rogue = token(&cluster.server, "rogue", Role::Controller).await;
    let body = json!({"kind": "Controller", "metadata": {"name": "metallb"}, "spec": {"owns": []}});
    let (status, body) = cluster
        .call("PUT", "/v1/controllers/metallb", &rogue, Some(body))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
}

#[tokio::test]
async fn a_controller_is_served_only_what_it_declared() {
    let cluster = cluster().await;
    cluster.ok("PUT", WEB, &cluster.admin, Some(pod())).await;
    let (status, body) = cluster
        .register("sidecar", json!({"reads": ["Pod:spec.containers"]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let sidecar = token(&cluster.server, "sidecar", Role::Controller).await;

    let whole = cluster.ok("GET", WEB, &cluster.admin, None).await;
    assert_eq!(whole["spec"]["runtime"], "runc");
    let served = cluster.ok("GET", WEB, &sidecar, None).await;
    assert_eq!(
        served["spec"],
        json!({"containers": whole["spec"]["containers"]})
    );
    assert_eq!(served["metadata"]["labels"], json!({"app": "web"}));
    assert!(served["status"].is_null(), "{served}");

    let listed = cluster.ok("GET", "/v1/pods", &sidecar, None).await;
    assert_eq!(listed["items"][0]["spec"], served["spec"]);

    let request = Request::builder()
        .uri("/v1/pods?watch=true")
        .header("authorization", format!("Bearer {sidecar}"))
        .body(Body::empty())
        .expect("a request");
    let response = app(cluster.server.clone())
        .oneshot(request)
        .await
        .expect("a response");
    let mut body = response.into_body();
    let mut buffer = Vec::new();
    while !buffer.contains(&b'\n') {
        let frame = body.frame().await.expect("a frame").expect("a chunk");
        buffer.extend_from_slice(frame.data_ref().expect("data"));
    }
    let line = buffer.split(|b| *b == b'\n').next().expect("a line");
    let event: Value = serde_json::from_slice(line).expect("an event");
    assert_eq!(event["object"]["spec"], served["spec"], "{event}");

    // People and nodes see everything; a controller without registration
    // sees metadata only.
    let stranger = token(&cluster.server, "stranger", Role::Controller).await;
    let bare = cluster.ok("GET", WEB, &stranger, None).await;
    assert!(bare["spec"].is_null() && bare["status"].is_null(), "{bare}");
    assert_eq!(bare["metadata"]["name"], "web");
}

#[tokio::test]
async fn builtins_register_as_themselves_and_converge() {
    let cluster = cluster().await;
    let history = cluster
        .ok(
            "GET",
            "/v1/controllers/scheduler/history",
            &cluster.admin,
            None,
        )
        .await;
    assert_eq!(history[0]["author"], "scheduler", "{history}");
    assert_eq!(history[0]["class"], "system");
    let system = cluster
        .ok(
            "GET",
            "/v1/history?class=system&kind=Controller",
            &cluster.admin,
            None,
        )
        .await;
    let authors: Vec<&str> = system
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| r["author"].as_str())
        .collect();
    assert_eq!(
        authors,
        [
            "workflow",
            "scheduler",
            "ipam",
            "node-lifecycle",
            "pinned-deployment",
            "job",
            "per-node"
        ]
    );

    let listed = cluster
        .ok("GET", "/v1/controllers", &cluster.admin, None)
        .await;
    let objects: Vec<corral_api::Object> =
        serde_json::from_value(listed["items"].clone()).expect("controllers");
    let registry = corral_ownership::Registry::from_objects(&objects);
    assert!(registry.check_convergence().converges());

    // Registering again (a restart) reuses the tokens and changes nothing.
    let again = register_builtins(&cluster.server, &cluster.builtins)
        .await
        .expect("registers again");
    assert_eq!(again, cluster.builtins);
    let history = cluster
        .ok(
            "GET",
            "/v1/controllers/scheduler/history",
            &cluster.admin,
            None,
        )
        .await;
    assert_eq!(history.as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn a_transfer_hands_a_field_over_for_good() {
    let cluster = cluster().await;
    cluster.ok("PUT", WEB, &cluster.admin, Some(pod())).await;
    let (status, _) = cluster.register("placer", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let request = json!({"path": "Pod:status.node", "to": "placer"});

    let scheduler = cluster.builtin("scheduler").to_string();
    let (status, body) = cluster
        .call(
            "POST",
            "/v1/controllers/scheduler/transfer",
            &scheduler,
            Some(request.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    let body = cluster
        .ok(
            "POST",
            "/v1/controllers/scheduler/transfer",
            &cluster.admin,
            Some(request.clone()),
        )
        .await;
    assert_eq!(body["to"]["spec"]["owns"], json!(["Pod:status.node"]));
    let history = cluster
        .ok(
            "GET",
            "/v1/controllers/placer/history",
            &cluster.admin,
            None,
        )
        .await;
    let last = history.as_array().and_then(|h| h.last()).expect("a record");
    assert_eq!(
        last["message"],
        "transfer Pod:status.node from scheduler to placer"
    );
    assert_eq!(last["author"], "admin");

    let (status, body) = cluster
        .write_status(&scheduler, |s| s["node"] = json!("node-1"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        message(&body).contains("owned by controller placer"),
        "{body}"
    );
    let placer = token(&cluster.server, "placer", Role::Controller).await;
    let (status, body) = cluster
        .write_status(&placer, |s| s["node"] = json!("node-1"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // A second transfer from the old owner is refused; a restart keeps the
    // field with its new owner.
    let (status, _) = cluster
        .call(
            "POST",
            "/v1/controllers/scheduler/transfer",
            &cluster.admin,
            Some(request),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    register_builtins(&cluster.server, &cluster.builtins)
        .await
        .expect("registers again");
    let scheduler_object = cluster
        .ok("GET", "/v1/controllers/scheduler", &cluster.admin, None)
        .await;
    assert_eq!(
        scheduler_object["spec"]["owns"],
        json!(["VirtualMachine:status.node"])
    );
}
