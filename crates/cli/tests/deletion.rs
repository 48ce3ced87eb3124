//! End to end through the real binary: deleting a pod runs its `stop`
//! workflow. A Controller's step registered into `stop` (a finalizer)
//! holds the deletion — `why` names it — until the controller completes it
//! with its own token; preStop hooks run in the containers; `--wait`
//! follows the deletion until the pod is gone; `--skip` and `--force` skip
//! steps and say so in history.

use std::time::Duration;

use corral_api::{Kind, ObjectKey};
use corral_client::{Client, ClientConfig};
use corral_testkit::unique_name;
use serde_json::Value;

mod common;

const CONTROLLER: &str = "kind: Controller
metadata: {name: acme-backup}
spec:
  steps:
    - {name: acme/backup, kind: Pod, workflow: stop, requires: [stopped], wantedBy: deleted, timeout: 10m}
";

/// A pod whose `main` container's preStop hook succeeds and whose `side`
/// container's hook exits 3 (its shell's code, so the hook ran in it).
fn pod_manifest(name: &str) -> String {
    format!(
        "kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGraceSeconds: 5
  containers:
    - name: main
      image: local/busybox:1
      command: [sleep, '3600']
      preStop: {{exec: {{command: [sh, -c, 'test -d /proc/1']}}}}
    - name: side
      image: local/busybox:1
      command: [sleep, '3600']
      preStop: {{exec: {{command: [sh, -c, 'exit 3']}}}}
"
    )
}

fn node() -> common::Cluster {
    let cluster = common::start_node();
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("controller.yaml", CONTROLLER),
    ]);
    cluster
}

fn client(cluster: &common::Cluster, token: &str) -> Client {
    let mut config = ClientConfig::load(&cluster.config).expect("client config");
    config.token = token.trim().to_string();
    Client::new(&config).expect("client")
}

/// Applies a pod and waits until it runs.
fn running_pod(cluster: &common::Cluster, prefix: &str) -> String {
    let name = unique_name(prefix);
    let path = cluster.manifest(&format!("{name}.yaml"), &pod_manifest(&name));
    cluster.ok(&["apply", "-f", &path]);
    let target = format!("pod/{name}");
    common::wait_for(
        &format!("{target} running"),
        Duration::from_secs(90),
        || (cluster.get_json(&target)["status"]["phase"] == "Running").then_some(()),
    );
    name
}

fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

fn gone(cluster: &common::Cluster, target: &str) -> Option<()> {
    let out = cluster.corral(&["get", target]);
    (!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not found"))
        .then_some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_step_a_controller_registered_holds_the_deletion_until_it_is_done() {
    let cluster = node();
    let name = running_pod(&cluster, "final");
    let target = format!("pod/{name}");
    let key = ObjectKey::new(Kind::Pod, Some("default"), &name);

    let out = cluster.ok(&["delete", &target, "-m", "retired"]);
    assert!(
        out.contains(&format!("{target} deleting: its stop workflow")),
        "{out}"
    );
    // The node stops everything; the finalizer then holds the pod.
    let why = common::wait_for(
        "the node's steps to be done",
        Duration::from_secs(60),
        || {
            let why = cluster.ok(&["why", &target]);
            why.contains("✓ node/remove-sandbox").then_some(why)
        },
    );
    let line = line_with(&why, "acme/backup");
    assert!(
        line.contains("not yet claimed") && line.contains("(owner acme-backup)"),
        "{why}"
    );
    let pod = cluster.get_json(&target);
    assert_eq!(pod["metadata"]["deleting"]["by"], "admin", "{pod}");
    assert_eq!(pod["metadata"]["deleting"]["workflow"], "stop-1", "{pod}");
    let row = cluster.ok(&["get", &target]);
    assert!(row.contains("Deleting"), "{row}");

    // The hooks ran in the containers before they stopped.
    let stops = cluster.ok(&["logs", "--steps", &target, "--step", "node/stop-containers"]);
    assert!(
        stops.contains("main: preStop") && stops.contains("done in"),
        "{stops}"
    );
    assert!(
        stops.contains("side: preStop") && stops.contains("exit status: 3"),
        "{stops}"
    );

    // Its spec no longer changes while it is being deleted.
    let changed = pod_manifest(&name).replace("3600", "3601");
    let refused = cluster.fails(&["apply", "-f", &cluster.manifest("changed.yaml", &changed)]);
    assert!(refused.contains("is being deleted"), "{refused}");

    // The controller completes its step with its own token: the pod goes.
    let token = cluster.ok(&["token", "create", "--controller", "acme-backup"]);
    let acme = client(&cluster, &token);
    acme.claim_step(&key, "acme/backup").await.expect("claim");
    acme.complete_step(&key, "acme/backup", Some("backed up"))
        .await
        .expect("complete");
    common::wait_for(
        &format!("{target} to be gone"),
        Duration::from_secs(30),
        || gone(&cluster, &target),
    );
    let history = cluster.ok(&["history", &target]);
    assert!(history.contains("retired"), "{history}");
    let backup = cluster.ok(&["logs", "--steps", &target, "--step", "acme/backup"]);
    assert!(backup.contains("backed up"), "{backup}");
    let released = cluster.ok(&["logs", "--steps", &target, "--step", "ipam/release-address"]);
    assert!(released.contains("is free again"), "{released}");
}

#[test]
fn delete_wait_follows_until_gone_and_skip_and_force_are_recorded() {
    let cluster = node();

    // --skip the finalizer and --wait: the command returns once it is gone.
    let name = running_pod(&cluster, "skipped");
    let target = format!("pod/{name}");
    let out = cluster.ok(&[
        "delete",
        &target,
        "--skip",
        "acme/backup",
        "--wait",
        "--timeout",
        "90s",
    ]);
    assert!(
        out.contains("deleted: its stop workflow stop-1 finished"),
        "{out}"
    );
    assert!(gone(&cluster, &target).is_some(), "{target} is still there");
    let history = cluster.ok(&["history", &target]);
    assert!(
        history.contains("skipped acme/backup (by admin)"),
        "{history}"
    );
    let skipped = cluster.ok(&["logs", "--steps", &target, "--step", "acme/backup"]);
    assert!(skipped.contains("skipped by admin"), "{skipped}");

    // A step the workflow does not have is refused, naming it.
    let name = running_pod(&cluster, "forced");
    let target = format!("pod/{name}");
    let refused = cluster.fails(&["delete", &target, "--skip", "acme/nope"]);
    assert!(refused.contains("has no step acme/nope"), "{refused}");

    // --force skips everything left: removed at once, and said so.
    let out = cluster.ok(&["delete", &target, "--force"]);
    assert!(out.contains(&format!("{target} deleted")), "{out}");
    assert!(gone(&cluster, &target).is_some(), "{target} is still there");
    let history = cluster.ok(&["history", &target]);
    assert!(
        history.contains("skipped") && history.contains("acme/backup (by admin)"),
        "{history}"
    );
    // The node still removes what it ran for the pod.
    let pods: Value =
        serde_json::from_str(&cluster.ok(&["get", "pods", "-o", "json"])).expect("json");
    assert!(
        pods["items"].as_array().is_some_and(Vec::is_empty),
        "{pods}"
    );
}
