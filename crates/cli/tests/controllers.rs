//! Field ownership end to end with the real binary: `corral up` registers
//! the built-in controllers, `corral controllers check` proves they
//! converge and names a constructed cycle, a second owner of a field is
//! refused naming the first, and a person's write of `status.node` is
//! refused naming the scheduler.

mod common;

use common::Cluster;
use corral_client::{Client, ClientConfig};

const CYCLE: &str = "\
kind: Controller
metadata: {name: alpha}
spec:
  owns: [\"Pod:status.alpha\"]
  reads: [\"Pod:status.beta\"]
---
kind: Controller
metadata: {name: beta}
spec:
  owns: [\"Pod:status.beta\"]
  reads: [\"Pod:status.alpha\"]
";

const SECOND_OWNER: &str = "\
kind: Controller
metadata: {name: greedy}
spec:
  owns: [\"Pod:status.alpha\"]
";

#[test]
fn builtins_converge_and_a_constructed_cycle_is_named() {
    let cluster = Cluster::start();
    assert_eq!(cluster.ok(&["controllers", "check"]), "converges\n");
    let listed = cluster.ok(&["controllers", "list"]);
    assert!(listed.contains("controller scheduler"), "{listed}");
    assert!(
        listed.contains("Pod:spec") && listed.contains("people (operators and users)"),
        "{listed}"
    );
    let explained = cluster.ok(&["explain", "pod.status.node"]);
    assert_eq!(
        explained,
        "Pod:status.node\n  owner:   controller scheduler\n  readers: ipam\n"
    );

    let manifest = cluster.manifest("cycle.yaml", CYCLE);
    cluster.ok(&["apply", "-f", &manifest]);
    let output = cluster.corral(&["controllers", "check"]);
    assert!(!output.status.success(), "a cycle must fail the check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout,
        "alpha writes Pod:status.alpha read by beta; beta writes Pod:status.beta read by alpha\n"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("do not converge: 1 cycle(s)"), "{stderr}");
}

#[test]
fn a_second_owner_and_a_persons_status_node_write_are_refused() {
    let cluster = Cluster::start();
    let manifest = cluster.manifest("cycle.yaml", CYCLE);
    cluster.ok(&["apply", "-f", &manifest]);
    let second = cluster.manifest("greedy.yaml", SECOND_OWNER);
    let stderr = cluster.fails(&["apply", "-f", &second]);
    assert!(
        stderr.contains(
            "Pod:status.alpha is already owned by controller alpha; controller greedy may not register it"
        ),
        "{stderr}"
    );

    let pod = cluster.manifest("web.yaml", &common::pod_manifest("web", "local/busybox:1"));
    cluster.ok(&["apply", "-f", &pod]);
    let config = ClientConfig::load(&cluster.config).expect("the admin config");
    let client = Client::new(&config).expect("a client");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let error = runtime.block_on(async {
        let key = corral_api::ObjectKey::new(corral_api::Kind::Pod, None, "web");
        // The real scheduler and agent write this pod's status meanwhile: a
        // stale write is refused as stale (409), so read again until the
        // write is judged on its merits.
        loop {
            let mut pod = client.get(&key).await.expect("the pod");
            pod.status["node"] = serde_json::json!("node-1");
            let error = client
                .put_status(&pod)
                .await
                .expect_err("a person may not place a pod");
            if error.status() != Some(409) {
                break error;
            }
        }
    });
    assert_eq!(error.status(), Some(403));
    assert_eq!(
        error.to_string(),
        "status.node is owned by controller scheduler; admin (operator) may not write it"
    );

    // The operator hands the field over; the CLI names the move.
    let moved = cluster.ok(&[
        "controllers",
        "transfer",
        "Pod:status.alpha",
        "--to",
        "greedy",
    ]);
    assert_eq!(
        moved,
        "Pod:status.alpha: transferred from alpha to greedy\n"
    );
    let explained = cluster.ok(&["explain", "pod.status.alpha"]);
    assert!(
        explained.contains("owner:   controller greedy"),
        "{explained}"
    );
}
