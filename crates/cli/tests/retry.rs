//! Retrying a failed start on a real node: a pod whose image is missing
//! fails for good; once the image is imported, applying the same manifest
//! again (or `corral retry`) runs the failed steps again and the pod runs.
//! Real runc, root.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Cluster, wait_for};
use serde_json::Value;

fn pod(name: &str) -> String {
    format!(
        "kind: Pod
metadata: {{name: {name}}}
spec:
  containers:
    - name: main
      image: local/{name}:1
      command: [sleep, \"3600\"]
"
    )
}

/// The newest workflow instance of `target` as stored.
fn newest(cluster: &Cluster, target: &str) -> Value {
    let object = cluster.get_json(target);
    object["status"]["workflow"]["instances"]
        .as_array()
        .and_then(|all| all.last().cloned())
        .unwrap_or(Value::Null)
}

fn wait_outcome(cluster: &Cluster, target: &str, outcome: &str) {
    wait_for(
        &format!("{target}'s newest workflow to be {outcome}"),
        Duration::from_secs(60),
        || (newest(cluster, target)["outcome"] == outcome).then_some(()),
    );
}

fn wait_running(cluster: &Cluster, target: &str) {
    wait_for(&format!("{target} to run"), Duration::from_secs(60), || {
        (cluster.get_json(target)["status"]["phase"] == "Running").then_some(())
    });
}

/// Imports the node's busybox image again under `local/NAME:1`.
fn import_as(cluster: &Cluster, name: &str) {
    common::import_busybox(cluster, Some(&format!("local/{name}:1")));
}

#[test]
fn a_failed_pod_recovers_after_its_image_is_imported_and_it_is_applied_again() {
    let cluster = &common::start_node();
    let manifest = cluster.manifest("late.yaml", &pod("late"));
    cluster.ok(&["apply", "-f", &manifest]);
    wait_outcome(cluster, "pod/late", "failed");
    let why = cluster.ok(&["why", "pod/late"]);
    assert!(why.contains("is not on this node"), "{why}");
    assert!(
        why.contains("Once the cause is fixed, `corral retry pod/late` (or applying it again)"),
        "{why}"
    );

    import_as(cluster, "late");
    let applied = cluster.ok(&["apply", "-f", &manifest]);
    assert_eq!(
        applied.trim(),
        "pod/late unchanged (revision 1); retrying failed start-1"
    );
    wait_running(cluster, "pod/late");
    let instance = newest(cluster, "pod/late");
    assert_eq!(
        (&instance["id"], &instance["outcome"]),
        (&Value::from("start-1"), &Value::from("succeeded"))
    );
    let steps = cluster.ok(&["logs", "pod/late", "--steps"]);
    assert!(
        steps.contains("start workflow retried by"),
        "the step log says who retried: {steps}"
    );
    // Applying it again now changes nothing.
    let applied = cluster.ok(&["apply", "-f", &manifest]);
    assert_eq!(applied.trim(), "pod/late unchanged (revision 1)");
}

#[test]
fn corral_retry_runs_the_failed_steps_again_and_waits_for_them() {
    let cluster = &common::start_node();
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("later.yaml", &pod("later")),
    ]);
    wait_outcome(cluster, "pod/later", "failed");

    // Retried before the cause is fixed, it fails again, and --wait says so.
    let failed = cluster.corral(&["retry", "pod/later", "--wait", "--timeout", "60s"]);
    assert!(!failed.status.success());
    let failed = String::from_utf8_lossy(&failed.stderr);
    assert!(failed.contains("is not on this node"), "{failed}");
    wait_outcome(cluster, "pod/later", "failed");

    import_as(cluster, "later");
    let retried = cluster.ok(&["retry", "pod/later", "--wait", "--timeout", "60s"]);
    assert!(
        retried.starts_with("pod/later retrying start-1 (revision 1)"),
        "{retried}"
    );
    wait_running(cluster, "pod/later");

    // A running pod has nothing to retry, and the refusal says why.
    let refused = cluster.fails(&["retry", "pod/later"]);
    assert!(
        refused.contains("has nothing to retry: it succeeded"),
        "{refused}"
    );
}
