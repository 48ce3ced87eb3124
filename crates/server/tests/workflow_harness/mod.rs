//! The harness of the workflow tests: the router in-process on an
//! in-memory store with a clock the test moves by hand, an operator token,
//! and helpers for pods, registrations, steps and step logs.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use corral_api::workflow::{StepLogEntry, WorkflowInstance, WorkflowStatus};
use corral_api::{Identity, Object, Role};
use corral_server::clock::SequentialIds;
use corral_server::{Clock, Server, SharedServer, TokenIssuer};
use corral_store::sqlite::SqliteStore;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// A clock tests move by hand.
#[derive(Debug)]
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    pub fn advance(&self, by: TimeDelta) {
        let mut now = self.0.lock().expect("clock lock");
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().expect("clock lock")
    }
}

pub struct Harness {
    pub server: SharedServer,
    pub app: Router,
    pub clock: Arc<ManualClock>,
    pub admin: String,
}

pub const PODS: &str = "/v1/namespaces/default/pods";

impl Harness {
    pub async fn new() -> Harness {
        let store = Arc::new(SqliteStore::open_in_memory().expect("in-memory store"));
        let start = Utc
            .with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .expect("valid time");
        let clock = Arc::new(ManualClock(Mutex::new(start)));
        let server = Server::with(store, clock.clone(), Arc::new(SequentialIds::default()));
        let app = corral_server::app(server.clone());
        let mut harness = Harness {
            server,
            app,
            clock,
            admin: String::new(),
        };
        harness.admin = harness.token("admin", Role::Operator).await;
        harness
    }

    /// A token for `name` as `role`; a user may act in namespace `default`.
    pub async fn token(&self, name: &str, role: Role) -> String {
        let identity = Identity::new(name, role);
        let identity = if role == Role::User {
            identity.with_namespaces(vec!["default".into()])
        } else {
            identity
        };
        TokenIssuer::issue(&*self.server.store, &*self.server.clock, identity)
            .await
            .expect("token")
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(match body {
                Some(body) => Body::from(body.to_string()),
                None => Body::empty(),
            })
            .expect("request");
        let response = self.app.clone().oneshot(request).await.expect("response");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, value)
    }

    pub async fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, value) = self.call(method, path, &self.admin.clone(), body).await;
        assert!(status.is_success(), "{method} {path}: {status} {value}");
        value
    }

    pub async fn create_pod(&self, name: &str, image: &str) -> Object {
        let body = pod(name, image);
        serde_json::from_value(self.ok("POST", PODS, Some(body)).await).expect("an object")
    }

    /// Binds pod `name` to `node` as the scheduler does (`status.node`).
    pub async fn bind(&self, name: &str, node: &str) {
        let scheduler = self.token("scheduler", Role::Controller).await;
        let mut pod = self.ok("GET", &format!("{PODS}/{name}"), None).await;
        pod["status"]["node"] = json!(node);
        let (status, value) = self
            .call(
                "PUT",
                &format!("{PODS}/{name}/status"),
                &scheduler,
                Some(pod),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{value}");
    }

    /// The scheduler claims pod `name`'s placement: its start instance
    /// has begun.
    pub async fn claim_placement(&self, name: &str) {
        let scheduler = self.token("scheduler", Role::Controller).await;
        let claim = json!({"action": "claim", "step": "scheduler/place"});
        self.step_ok(name, &scheduler, claim).await;
    }

    pub async fn register_slow_mount(&self) {
        let body = json!({
            "kind": "Controller",
            "metadata": {"name": "acme-storage"},
            "spec": {"steps": [{
                "name": "acme/slow-mount", "kind": "Pod", "workflow": "start",
                "before": ["storage"], "timeout": "10m"
            }]}
        });
        self.ok("PUT", "/v1/controllers/acme-storage", Some(body))
            .await;
    }

    pub async fn workflows(&self, name: &str) -> WorkflowStatus {
        let value = self
            .ok("GET", &format!("{PODS}/{name}/workflows"), None)
            .await;
        serde_json::from_value(value).expect("the instances")
    }

    pub async fn step(&self, name: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call("POST", &format!("{PODS}/{name}/steps"), token, Some(body))
            .await
    }

    pub async fn step_ok(&self, name: &str, token: &str, body: Value) -> WorkflowInstance {
        let (status, value) = self.step(name, token, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{body}: {value}");
        serde_json::from_value(value).expect("an instance")
    }

    pub async fn logs(&self, name: &str, query: &str) -> Vec<StepLogEntry> {
        let value = self
            .ok("GET", &format!("{PODS}/{name}/steplogs{query}"), None)
            .await;
        serde_json::from_value(value).expect("log entries")
    }
}

pub fn pod(name: &str, image: &str) -> Value {
    json!({
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": image}]}
    })
}

pub fn phase(instance: &WorkflowInstance, step: &str) -> String {
    instance
        .step(step)
        .unwrap_or_else(|| panic!("{} has no step {step}", instance.id))
        .state
        .phase()
        .to_string()
}
