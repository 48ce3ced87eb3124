//! Deleting a node drains it, end to end with two real agents (real runc):
//! its unpinned pod moves to the other node as a system revision; a pod
//! pinned there holds the drain, and `why node/x` names it; once that pod
//! is deleted the Node is removed, and its agent, which keeps running,
//! stops heartbeating and does not register it again.
//! Root and runc; fails (never skips) without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::agents::Agents;
use common::wait_for;
use corral_testkit::{ImageFormat, busybox_image_tar, require_root, require_tool};

fn pod(name: &str, pin: Option<&str>) -> String {
    let placement = pin
        .map(|node| format!("  placement: {{node: {node}}}\n"))
        .unwrap_or_default();
    format!(
        "kind: Pod\nmetadata: {{name: {name}}}\nspec:\n{placement}  terminationGraceSeconds: 0\n  containers:\n    - {{name: main, image: local/busybox:1, command: [sleep, \"3600\"]}}\n"
    )
}

/// Waits until pod `name` runs on `node`.
fn wait_running_on(lab: &Agents, name: &str, node: &str) {
    wait_for(
        &format!("pod/{name} Running on {node}"),
        Duration::from_secs(60),
        || {
            let pod = lab.json(&format!("pod/{name}"));
            (pod["status"]["node"] == node && pod["status"]["phase"] == "Running").then_some(())
        },
    );
}

#[test]
fn deleting_a_node_moves_its_pods_waits_for_pinned_ones_and_the_agent_leaves() {
    require_root();
    require_tool("runc");
    let mut lab = Agents::start("corral-node-drain-");
    let tar = busybox_image_tar(lab.dir.path(), ImageFormat::DockerArchive);
    let join = lab.corral(&["token", "create", "--join", "--ttl", "10m"]);
    lab.start_agent("node-a", join.trim(), &tar);
    lab.wait_ready("node-a");
    for (name, pin) in [("mover", None), ("pet", Some("node-a"))] {
        let manifest = lab.path(&format!("{name}.yaml"));
        std::fs::write(&manifest, pod(name, pin)).unwrap();
        lab.corral(&["apply", "-f", manifest.to_str().unwrap()]);
    }
    wait_running_on(&lab, "mover", "node-a");
    wait_running_on(&lab, "pet", "node-a");
    lab.start_agent("node-b", join.trim(), &tar);
    lab.wait_ready("node-b");

    let deleted = lab.corral(&["delete", "node/node-a"]);
    assert!(
        deleted.contains("node/node-a deleting: its stop workflow"),
        "{deleted}"
    );
    // The unpinned pod moves; its history says why.
    wait_running_on(&lab, "mover", "node-b");
    let history = lab.corral(&["history", "pod/mover"]);
    assert!(
        history.contains("moved off node-a: the node is being deleted (drained)"),
        "{history}"
    );
    // The pinned one holds the drain, and `why` says so.
    let why = wait_for(
        "why node/node-a to name the pinned pod",
        Duration::from_secs(30),
        || {
            let why = lab.corral(&["why", "node/node-a"]);
            why.contains("1 pod pinned here").then_some(why)
        },
    );
    assert!(
        why.contains("scheduler/drain") && why.contains("pet"),
        "{why}"
    );
    let node = lab.json("node/node-a");
    assert!(node["metadata"]["deleting"].is_object(), "{node}");
    assert_eq!(lab.json("pod/pet")["status"]["node"], "node-a");
    // Nothing new lands on it meanwhile.
    let manifest = lab.path("late.yaml");
    std::fs::write(&manifest, pod("late", None)).unwrap();
    lab.corral(&["apply", "-f", manifest.to_str().unwrap()]);
    wait_running_on(&lab, "late", "node-b");

    // Once the pinned pod is gone the drain ends and the node is removed;
    // `delete --wait` follows it to the end.
    lab.corral(&["delete", "pod/pet"]);
    let gone = lab.corral(&["delete", "node/node-a", "--wait"]);
    let last = gone.trim().lines().last().unwrap_or_default();
    assert!(
        last.contains("node/node-a") && last.contains("deleted"),
        "{gone}"
    );
    let steps = lab.corral(&["logs", "node/node-a", "--steps"]);
    assert!(
        steps.contains("scheduler/drain") && steps.contains("no pod or VM is bound"),
        "{steps}"
    );
    // Its agent runs on, but does not register the node again.
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        lab.agent("node-a").try_wait().unwrap().is_none(),
        "the agent of the deleted node keeps running"
    );
    let again = lab.try_corral(&["get", "node/node-a"]);
    assert!(
        again
            .as_ref()
            .is_err_and(|error| error.contains("not found")),
        "{again:?}"
    );
    assert_eq!(lab.json("pod/mover")["status"]["phase"], "Running");
}

/// A pod being deleted on a node that is then lost is removed: nothing is
/// left to stop it, and its history says so.
#[test]
fn a_pod_being_deleted_goes_when_its_node_is_lost() {
    require_root();
    require_tool("runc");
    let mut lab = Agents::start("corral-node-lost-");
    let tar = busybox_image_tar(lab.dir.path(), ImageFormat::DockerArchive);
    let join = lab.corral(&["token", "create", "--join", "--ttl", "10m"]);
    lab.start_agent("node-a", join.trim(), &tar);
    lab.wait_ready("node-a");
    let manifest = lab.path("stuck.yaml");
    std::fs::write(&manifest, pod("stuck", None)).unwrap();
    lab.corral(&["apply", "-f", manifest.to_str().unwrap()]);
    wait_running_on(&lab, "stuck", "node-a");
    // The agent dies; the deletion begins before the node is seen silent,
    // so it waits on node steps nobody will claim.
    let agent = lab.agent("node-a");
    agent.kill().unwrap();
    agent.wait().unwrap();
    let deleting = lab.corral(&["delete", "pod/stuck"]);
    assert!(deleting.contains("deleting"), "{deleting}");
    lab.corral(&["node", "forget", "node-a"]);
    wait_for("pod/stuck to go", Duration::from_secs(20), || {
        lab.try_corral(&["get", "pod/stuck"])
            .is_err_and(|error| error.contains("not found"))
            .then_some(())
    });
    let history = lab.corral(&["history", "pod/stuck"]);
    assert!(
        history.contains("its node node-a is lost: nothing left to stop"),
        "{history}"
    );
}
