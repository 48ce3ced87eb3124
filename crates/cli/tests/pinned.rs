//! End-to-end acceptance of PinnedDeployments on a real node: 4 replicas
//! at 25% run 1 pod on next and 3 on previous; 50% converts one pod in
//! place (same name, same uid, a new revision authored by the
//! pinned-deployment controller); promote makes next the previous. Also:
//! an unschedulable pod's `why` names each node's reason; deleting a
//! PinnedDeployment deletes its pods and stops their containers, while
//! `--cascade=orphan` keeps them and a returning deployment adopts them.
//! Needs root, runc and busybox-static; fails (never skips) without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use common::{Cluster, wait_for};
use serde_json::Value;

const DEPLOYMENT: &str = "kind: PinnedDeployment
metadata: {name: web}
spec:
  replicas: 4
  replicasPercentNext: 25
  selector: {app: web}
  templates:
    previous:
      metadata: {labels: {app: web}}
      spec:
        terminationGraceSeconds: 0
        containers:
          - {name: web, image: local/busybox:1, command: [sleep, \"3600\"], env: {VERSION: one}}
    next:
      metadata: {labels: {app: web}}
      spec:
        terminationGraceSeconds: 0
        containers:
          - {name: web, image: local/busybox:1, command: [sleep, \"3600\"], env: {VERSION: two}}
";

/// name → (version annotation, uid, env VERSION, running its revision).
fn pods(cluster: &Cluster) -> BTreeMap<String, (String, String, String, bool)> {
    let listed: Value = serde_json::from_str(&cluster.ok(&["get", "pods", "-o", "json"])).unwrap();
    let items = listed["items"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .filter(|pod| pod["metadata"]["annotations"]["corral.dev/pinned-deployment"] == "web")
        .map(|pod| {
            let meta = &pod["metadata"];
            let running = pod["status"]["phase"] == "Running"
                && pod["status"]["observedRevision"] == meta["revision"];
            (
                meta["name"].as_str().unwrap().to_string(),
                (
                    meta["annotations"]["corral.dev/version"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    meta["uid"].as_str().unwrap().to_string(),
                    pod["spec"]["containers"][0]["env"]["VERSION"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    running,
                ),
            )
        })
        .collect()
}

fn settle(cluster: &Cluster) -> String {
    cluster.ok(&["rollout", "status", "pd/web", "--timeout", "120"])
}

fn split(cluster: &Cluster) -> (usize, usize) {
    let all = pods(cluster);
    let next = all
        .values()
        .filter(|p| p.0 == "next" && p.2 == "two")
        .count();
    let previous = all
        .values()
        .filter(|p| p.0 == "previous" && p.2 == "one")
        .count();
    (previous, next)
}

#[test]
fn pinned_deployment_rolls_out_in_place_and_promotes() {
    let cluster = &common::start_node();
    cluster.ok(&["apply", "-f", &cluster.manifest("pd.yaml", DEPLOYMENT)]);
    let out = settle(cluster);
    assert!(out.contains("rollout settled"), "{out}");
    assert!(out.contains("previous 3/3 current, 3 ready"), "{out}");
    // A settled PinnedDeployment answers `why` with its versions' counts.
    let why = cluster.ok(&["why", "pd/web"]);
    assert!(
        why.starts_with("pd/web (revision 1) is healthy: previous 3/3 ready (3 current), next 1/1 ready (1 current)"),
        "{why}"
    );
    let before = pods(cluster);
    assert_eq!(
        before.keys().cloned().collect::<Vec<_>>(),
        ["web-0", "web-1", "web-2", "web-3"]
    );
    assert_eq!(split(cluster), (3, 1));
    assert_eq!(before["web-3"].0, "next");

    let out = cluster.ok(&["rollout", "pd/web", "--percent", "50"]);
    assert!(out.contains("50% on next (2 of 4 replicas)"), "{out}");
    let out = settle(cluster);
    assert!(out.contains("next 2/2 current, 2 ready"), "{out}");
    let after = pods(cluster);
    assert_eq!(split(cluster), (2, 2));
    for (name, pod) in &after {
        assert_eq!(pod.1, before[name].1, "{name} kept its uid");
        assert!(pod.3, "{name} runs its revision");
    }
    // The converted pod: a second revision, authored by the controller.
    let history: Value =
        serde_json::from_str(&cluster.ok(&["history", "pod/web-2", "-o", "json"])).unwrap();
    let records = history.as_array().unwrap();
    assert_eq!(records.len(), 2, "{history}");
    for record in records {
        assert_eq!(record["author"], "pinned-deployment", "{record}");
        assert_eq!(record["class"], "system", "{record}");
    }
    assert!(
        records[1]["message"]
            .as_str()
            .unwrap()
            .contains("previous → next"),
        "{history}"
    );

    let refused = cluster.fails(&["rollout", "promote", "pd/web"]);
    assert!(refused.contains("promote needs 100%"), "{refused}");
    // The README's `rollout --percent 100 && rollout promote`, at once:
    // the controller's status writes in between are not edits of the spec.
    cluster.ok(&["rollout", "pd/web", "--percent", "100"]);
    cluster.ok(&["rollout", "promote", "pd/web"]);
    let out = settle(cluster);
    assert!(out.contains("previous 4/4 current, 4 ready"), "{out}");
    let promoted = pods(cluster);
    for (name, pod) in &promoted {
        assert_eq!(pod.0, "previous", "{name}");
        assert_eq!(pod.2, "two", "{name}");
        assert_eq!(pod.1, before[name].1, "{name} kept its uid");
    }
    let pd = cluster.get_json("pd/web");
    assert_eq!(pd["spec"]["replicasPercentNext"], 0);
    assert_eq!(pd["status"]["previous"]["ready"], 4);
}

#[test]
fn an_unschedulable_pods_why_names_each_nodes_reason() {
    let cluster = &common::start_node();
    let node = wait_for("the node to be Ready", Duration::from_secs(60), || {
        let nodes: Value =
            serde_json::from_str(&cluster.ok(&["get", "nodes", "-o", "json"])).ok()?;
        let node = nodes["items"].as_array()?.first()?.clone();
        (node["status"]["phase"] == "Ready").then_some(node)
    });
    let name = node["metadata"]["name"].as_str().unwrap().to_string();
    let manifest = "kind: Pod
metadata: {name: huge}
spec:
  containers:
    - {name: huge, image: local/busybox:1, command: [sleep, \"3600\"], resources: {memory: 1000Ti}}
";
    cluster.ok(&["apply", "-f", &cluster.manifest("huge.yaml", manifest)]);
    let why = wait_for("the pod to be refused", Duration::from_secs(60), || {
        let why = cluster.ok(&["why", "pod/huge"]);
        why.contains("insufficient memory").then_some(why)
    });
    assert!(
        why.contains(&format!("{name}: insufficient memory: ")),
        "{why}"
    );
    assert!(why.contains("1000Ti requested"), "{why}");
    assert!(why.contains("0/1 nodes can run pod/huge"), "{why}");
}

#[test]
fn why_of_a_pinned_deployment_names_the_pod_that_is_not_healthy() {
    let cluster = &common::start_node();
    let manifest = "kind: PinnedDeployment
metadata: {name: flaky}
spec:
  replicas: 2
  replicasPercentNext: 50
  selector: {app: flaky}
  templates:
    previous:
      metadata: {labels: {app: flaky}}
      spec:
        terminationGraceSeconds: 0
        containers:
          - {name: app, image: local/busybox:1, command: [sleep, \"3600\"]}
    next:
      metadata: {labels: {app: flaky}}
      spec:
        terminationGraceSeconds: 0
        containers:
          - {name: app, image: local/busybox:1, command: [sh, -c, \"sleep 1; exit 3\"]}
";
    cluster.ok(&["apply", "-f", &cluster.manifest("flaky.yaml", manifest)]);
    let why = wait_for(
        "why pd/flaky to name the crashing pod",
        Duration::from_secs(60),
        || {
            let why = cluster.ok(&["why", "pd/flaky"]);
            why.contains("exited with code 3").then_some(why)
        },
    );
    let first = why.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("pd/flaky (revision 1) is not healthy: previous 1/1 ready"),
        "{why}"
    );
    assert!(
        first.contains("; pod/flaky-1: container app exited with code 3"),
        "{why}"
    );
    cluster.ok(&["delete", "pd/flaky"]);
    for pod in ["pod/flaky-0", "pod/flaky-1"] {
        let _ = cluster.corral(&["delete", pod]);
    }
}

const SMALL: &str = "kind: PinnedDeployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {app: web}
  templates:
    previous:
      metadata: {labels: {app: web}}
      spec:
        terminationGraceSeconds: 0
        containers:
          - {name: web, image: local/busybox:1, command: [sleep, \"3600\"]}
    next:
      metadata: {labels: {app: web}}
      spec:
        terminationGraceSeconds: 0
        containers:
          - {name: web, image: local/busybox:1, command: [sleep, \"3600\"]}
";

/// The pods of pd/web as `get pods -o json` lists them, by name.
fn web_pods(cluster: &Cluster) -> BTreeMap<String, Value> {
    let listed: Value = serde_json::from_str(&cluster.ok(&["get", "pods", "-o", "json"])).unwrap();
    listed["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|pod| pod["metadata"]["annotations"]["corral.dev/pinned-deployment"] == "web")
        .map(|pod| (pod["metadata"]["name"].as_str().unwrap().to_string(), pod))
        .collect()
}

/// Applies pd/web and waits until both its pods run; returns them.
fn apply_and_settle(cluster: &Cluster) -> BTreeMap<String, Value> {
    cluster.ok(&["apply", "-f", &cluster.manifest("small.yaml", SMALL)]);
    let out = settle(cluster);
    assert!(out.contains("rollout settled"), "{out}");
    let pods = web_pods(cluster);
    assert_eq!(
        pods.keys().collect::<Vec<_>>(),
        ["web-0", "web-1"],
        "{pods:?}"
    );
    pods
}

/// The container ids runc knows on the cluster's node.
fn runc_containers(cluster: &Cluster) -> Vec<String> {
    let listed = Command::new("runc")
        .arg("--root")
        .arg(cluster.data_dir.path().join("runc"))
        .args(["list", "-q"])
        .output()
        .expect("runc list");
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn container_ids(pods: &BTreeMap<String, Value>) -> Vec<String> {
    pods.values()
        .flat_map(|pod| {
            pod["status"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|c| c["containerId"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn deleting_a_pinned_deployment_deletes_its_pods_unless_orphaned() {
    let cluster = &common::start_node();
    let pods = apply_and_settle(cluster);
    let uid = cluster.get_json("pd/web")["metadata"]["uid"].clone();
    for (name, pod) in &pods {
        let owner = &pod["metadata"]["owner"];
        assert_eq!(owner["kind"], "PinnedDeployment", "{name}: {pod}");
        assert_eq!(owner["name"], "web", "{name}: {pod}");
        assert_eq!(owner["uid"], uid, "{name}: {pod}");
    }
    let wide = cluster.ok(&["get", "pods", "-o", "wide"]);
    assert!(wide.lines().next().unwrap().contains("OWNER"), "{wide}");
    assert!(
        wide.lines().filter(|line| line.contains("pd/web")).count() == 2,
        "{wide}"
    );
    let described = cluster.ok(&["describe", "pod/web-0"]);
    assert!(
        described.contains("Owner:       pd/web (uid "),
        "{described}"
    );
    let containers = container_ids(&pods);
    assert_eq!(containers.len(), 2, "{pods:?}");
    let running = runc_containers(cluster);
    for id in &containers {
        assert!(
            running.contains(id),
            "{id} runs before the delete: {running:?}"
        );
    }

    let out = cluster.ok(&["delete", "pd/web"]);
    assert!(out.contains("pd/web deleted"), "{out}");
    wait_for("pd/web's pods to go", Duration::from_secs(30), || {
        web_pods(cluster).is_empty().then_some(())
    });
    wait_for("their containers to stop", Duration::from_secs(60), || {
        let running = runc_containers(cluster);
        (!containers.iter().any(|id| running.contains(id))).then_some(())
    });
    let history: Value =
        serde_json::from_str(&cluster.ok(&["history", "pod/web-0", "-o", "json"])).unwrap();
    let last = history.as_array().and_then(|h| h.last()).cloned().unwrap();
    assert_eq!(last["message"], "deleted with pd/web", "{history}");

    // Orphaned: the pods stay, running, without an owner…
    let pods = apply_and_settle(cluster);
    cluster.ok(&["delete", "pd/web", "--cascade=orphan"]);
    let refused = cluster.fails(&["get", "pd/web"]);
    assert!(refused.contains("not found"), "{refused}");
    std::thread::sleep(Duration::from_secs(3));
    let orphans = web_pods(cluster);
    assert_eq!(orphans.keys().collect::<Vec<_>>(), ["web-0", "web-1"]);
    for (name, pod) in &orphans {
        assert!(pod["metadata"].get("owner").is_none(), "{name}: {pod}");
        assert_eq!(
            pod["metadata"]["uid"], pods[name]["metadata"]["uid"],
            "{name}"
        );
        assert_eq!(pod["status"]["phase"], "Running", "{name}: {pod}");
    }
    let running = runc_containers(cluster);
    for id in container_ids(&orphans) {
        assert!(running.contains(&id), "{id} still runs: {running:?}");
    }
    let wide = cluster.ok(&["get", "pods", "-o", "wide"]);
    assert!(!wide.contains("pd/web"), "{wide}");

    // …and a deployment of that name adopts them instead of making more.
    cluster.ok(&["apply", "-f", &cluster.manifest("small.yaml", SMALL)]);
    let uid = cluster.get_json("pd/web")["metadata"]["uid"].clone();
    let adopted = wait_for("pd/web to adopt its pods", Duration::from_secs(30), || {
        let pods = web_pods(cluster);
        pods.values()
            .all(|pod| pod["metadata"]["owner"]["uid"] == uid)
            .then_some(pods)
    });
    assert_eq!(adopted.keys().collect::<Vec<_>>(), ["web-0", "web-1"]);
    for (name, pod) in &adopted {
        assert_eq!(
            pod["metadata"]["uid"], pods[name]["metadata"]["uid"],
            "{name} adopted, not made again"
        );
    }
    cluster.ok(&["delete", "pd/web"]);
    wait_for("the adopted pods to go", Duration::from_secs(30), || {
        web_pods(cluster).is_empty().then_some(())
    });
}
