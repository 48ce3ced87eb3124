//! Owners and cascade through the API, in-process: the PinnedDeployment
//! controller's pods name their deployment in `metadata.owner`; deleting
//! the deployment deletes them (recorded as `deleted with pd/web`), or with
//! `?cascade=orphan` keeps them without an owner; an owner must exist, only
//! the managing controller writes it, and it adopts orphans again.

mod common;

use axum::http::StatusCode;
use corral_api::Role;
use corral_ownership::PINNED_DEPLOYMENT;
use corral_server::SharedServer;
use corral_server::ownership::{BuiltinTokens, register_builtins};
use serde_json::{Value, json};

const PDS: &str = "/v1/namespaces/default/pinneddeployments";
const PODS: &str = "/v1/namespaces/default/pods";

struct Cluster {
    server: SharedServer,
    admin: String,
    controller: String,
}

async fn cluster() -> Cluster {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    let builtins = register_builtins(&server, &BuiltinTokens::new())
        .await
        .expect("built-in controllers register");
    let controller = builtins
        .get(PINNED_DEPLOYMENT)
        .cloned()
        .expect("a token for the PinnedDeployment controller");
    Cluster {
        server,
        admin,
        controller,
    }
}

fn deployment(name: &str) -> Value {
    let template = json!({"metadata": {"labels": {"app": name}},
                          "spec": {"containers": [{"name": "main", "image": "busybox"}]}});
    json!({"kind": "PinnedDeployment", "metadata": {"name": name},
           "spec": {"replicas": 2, "selector": {"app": name},
                    "templates": {"previous": template, "next": template}}})
}

/// A pod as the controller makes it, owned by `owner` (kind, name, uid).
fn pod(name: &str, app: &str, owner: Option<Value>) -> Value {
    let mut metadata = json!({"name": name, "labels": {"app": app},
        "annotations": {"corral.dev/managed-by": PINNED_DEPLOYMENT,
                        "corral.dev/pinned-deployment": app, "corral.dev/version": "previous"}});
    if let Some(owner) = owner {
        metadata["owner"] = owner;
    }
    json!({"kind": "Pod", "metadata": metadata,
           "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
}

impl Cluster {
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

    /// Creates PD `name` and, as its controller, `count` pods owned by it.
    async fn deployment_with_pods(&self, name: &str, count: usize) -> Value {
        let created = self
            .ok("POST", PDS, &self.admin, Some(deployment(name)))
            .await;
        let owner = json!({"kind": "PinnedDeployment", "name": name,
                           "uid": created["metadata"]["uid"]});
        for index in 0..count {
            let body = pod(&format!("{name}-{index}"), name, Some(owner.clone()));
            self.ok("POST", PODS, &self.controller, Some(body)).await;
        }
        owner
    }

    async fn exists(&self, uri: &str) -> bool {
        let (status, body) = self.call("GET", uri, &self.admin, None).await;
        match status {
            StatusCode::OK => true,
            StatusCode::NOT_FOUND => false,
            other => panic!("GET {uri}: {other} {body}"),
        }
    }

    async fn history(&self, uri: &str) -> Vec<Value> {
        let body = self
            .ok("GET", &format!("{uri}/history"), &self.admin, None)
            .await;
        body.as_array().cloned().expect("history is a list")
    }
}

#[tokio::test]
async fn deleting_an_owner_deletes_its_dependents_and_says_why() {
    let cluster = cluster().await;
    cluster.deployment_with_pods("web", 2).await;
    cluster.deployment_with_pods("api", 1).await;
    cluster
        .ok(
            "POST",
            PODS,
            &cluster.admin,
            Some(json!({"kind": "Pod", "metadata": {"name": "lone"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}})),
        )
        .await;

    let uri = format!("{PDS}/web?message=replaced");
    cluster.ok("DELETE", &uri, &cluster.admin, None).await;

    for gone in ["web-0", "web-1"] {
        assert!(
            !cluster.exists(&format!("{PODS}/{gone}")).await,
            "{gone} went with pd/web"
        );
        let history = cluster.history(&format!("{PODS}/{gone}")).await;
        let last = history.last().expect("a deletion record");
        assert_eq!(last["deleted"], true, "{last}");
        assert_eq!(last["message"], "deleted with pd/web: replaced", "{last}");
        assert_eq!(
            last["author"], "admin",
            "the owner's deleter is the author: {last}"
        );
    }
    for kept in ["api-0", "lone"] {
        assert!(
            cluster.exists(&format!("{PODS}/{kept}")).await,
            "{kept} has another owner or none"
        );
    }
}

#[tokio::test]
async fn orphaning_keeps_the_dependents_and_clears_their_owner() {
    let cluster = cluster().await;
    cluster.deployment_with_pods("web", 2).await;

    let (status, body) = cluster
        .call(
            "DELETE",
            &format!("{PDS}/web?cascade=sideways"),
            &cluster.admin,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        cluster.exists(&format!("{PDS}/web")).await,
        "a refused delete deletes nothing"
    );

    cluster
        .ok(
            "DELETE",
            &format!("{PDS}/web?cascade=orphan"),
            &cluster.admin,
            None,
        )
        .await;
    assert!(!cluster.exists(&format!("{PDS}/web")).await);
    for name in ["web-0", "web-1"] {
        let pod = cluster
            .ok("GET", &format!("{PODS}/{name}"), &cluster.admin, None)
            .await;
        assert!(
            pod["metadata"].get("owner").is_none(),
            "{name} kept, no owner: {pod}"
        );
        let history = cluster.history(&format!("{PODS}/{name}")).await;
        let last = history.last().expect("a record of the orphaning");
        assert_eq!(last["message"], "orphaned: pd/web was deleted", "{last}");
    }
}

#[tokio::test]
async fn a_returning_deployment_adopts_its_orphans() {
    let cluster = cluster().await;
    cluster.deployment_with_pods("web", 1).await;
    cluster
        .ok(
            "DELETE",
            &format!("{PDS}/web?cascade=orphan"),
            &cluster.admin,
            None,
        )
        .await;
    let orphan = cluster
        .ok("GET", &format!("{PODS}/web-0"), &cluster.admin, None)
        .await;

    let created = cluster
        .ok("POST", PDS, &cluster.admin, Some(deployment("web")))
        .await;
    let mut adopted = orphan.clone();
    adopted["metadata"]["owner"] = json!({"kind": "PinnedDeployment", "name": "web",
                                          "uid": created["metadata"]["uid"]});
    let (status, body) = cluster
        .call(
            "PUT",
            &format!("{PODS}/web-0"),
            &cluster.admin,
            Some(adopted.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "people do not adopt: {body}");
    let stored = cluster
        .ok(
            "PUT",
            &format!("{PODS}/web-0"),
            &cluster.controller,
            Some(adopted),
        )
        .await;
    assert_eq!(
        stored["metadata"]["owner"]["uid"],
        created["metadata"]["uid"]
    );
    assert_eq!(
        stored["metadata"]["uid"], orphan["metadata"]["uid"],
        "the same pod, adopted"
    );

    cluster
        .ok("DELETE", &format!("{PDS}/web"), &cluster.admin, None)
        .await;
    assert!(
        !cluster.exists(&format!("{PODS}/web-0")).await,
        "an adopted pod goes with its owner"
    );
}

#[tokio::test]
async fn an_owner_must_exist_with_the_uid_named() {
    let cluster = cluster().await;
    let (status, body) = cluster
        .call(
            "POST",
            PODS,
            &cluster.controller,
            Some(pod(
                "ghost-0",
                "ghost",
                Some(json!({"kind": "PinnedDeployment", "name": "ghost", "uid": "uid-404"})),
            )),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("pd/ghost, which does not exist")),
        "{body}"
    );

    cluster
        .ok("POST", PDS, &cluster.admin, Some(deployment("web")))
        .await;
    let stale = json!({"kind": "PinnedDeployment", "name": "web", "uid": "uid-earlier"});
    let (status, body) = cluster
        .call(
            "POST",
            PODS,
            &cluster.controller,
            Some(pod("web-0", "web", Some(stale))),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("deleted and created again")),
        "{body}"
    );
}

#[tokio::test]
async fn people_may_not_name_an_owner() {
    let cluster = cluster().await;
    let owner = cluster.deployment_with_pods("web", 0).await;
    let user = common::token(&cluster.server, "alice", Role::User).await;
    let (status, body) = cluster
        .call("POST", PODS, &user, Some(pod("web-9", "web", Some(owner))))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"].as_str().is_some_and(
            |m| m.contains("metadata.owner is written by controller pinned-deployment")
        ),
        "{body}"
    );
}
