//! End to end through the real binary: a pod's init containers run one
//! after another, each to a successful exit, before its containers start
//! (`node/run-init-containers` in the start workflow); one that exits
//! non-zero fails the step, and `why` names it and its exit code.

use std::time::Duration;

use corral_testkit::unique_name;

mod common;

/// `first` writes a line into the shared emptyDir, `second` checks it is
/// there and adds its own; `main` runs after both.
fn ordered(name: &str) -> String {
    format!(
        "kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGraceSeconds: 0
  volumes: [{{name: work, emptyDir: {{}}}}]
  initContainers:
    - name: first
      image: local/busybox:1
      command: [sh, -c, 'sleep 1; echo one > /work/order']
      mounts: [{{volume: work, path: /work}}]
    - name: second
      image: local/busybox:1
      command: [sh, -c, 'grep -q one /work/order && echo two >> /work/order']
      mounts: [{{volume: work, path: /work}}]
  containers:
    - name: main
      image: local/busybox:1
      command: [sh, -c, 'echo main >> /work/order; exec sleep 3600']
      mounts: [{{volume: work, path: /work}}]
"
    )
}

#[test]
fn init_containers_run_in_order_before_the_containers_start() {
    let cluster = common::start_node();
    let name = unique_name("init");
    let target = format!("pod/{name}");
    let path = cluster.manifest("ordered.yaml", &ordered(&name));
    let out = cluster.ok(&["apply", "-f", &path, "--wait", "--timeout", "90s"]);
    assert!(out.contains("node/run-init-containers"), "{out}");
    let order = cluster.ok(&["exec", &target, "-c", "main", "--", "cat", "/work/order"]);
    assert_eq!(
        order.split_whitespace().collect::<Vec<_>>(),
        ["one", "two", "main"]
    );
    let steps = cluster.ok(&[
        "logs",
        "--steps",
        &target,
        "--step",
        "node/run-init-containers",
    ]);
    assert!(steps.contains("first: exited 0"), "{steps}");
    assert!(steps.contains("second: exited 0"), "{steps}");
    assert!(
        steps.contains("first, second succeeded, in order"),
        "{steps}"
    );
    let first = steps.find("first: exited 0").expect("first");
    let second = steps.find("second: started").expect("second started");
    assert!(
        first < second,
        "second started before first exited:\n{steps}"
    );
    cluster.ok(&["delete", &target, "--wait", "--timeout", "60s"]);
}

#[test]
fn a_failing_init_container_keeps_the_containers_from_starting() {
    let cluster = common::start_node();
    let name = unique_name("initfail");
    let target = format!("pod/{name}");
    let text = ordered(&name).replace("sleep 1; echo one > /work/order", "exit 7");
    let path = cluster.manifest("failing.yaml", &text);
    cluster.ok(&["apply", "-f", &path]);
    let why = common::wait_for("the init step to fail", Duration::from_secs(90), || {
        let why = cluster.ok(&["why", &target]);
        why.lines()
            .any(|l| {
                l.contains("✗ node/run-init-containers")
                    && l.contains("init container first exited with 7")
            })
            .then_some(why)
    });
    assert!(!why.contains("second: started"), "{why}");
    let pod = cluster.get_json(&target);
    assert!(
        pod["status"]["containers"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "no container started: {pod}"
    );
    cluster.ok(&["delete", &target, "--wait", "--timeout", "60s"]);
}

#[test]
fn deleting_a_pod_stops_the_init_container_that_runs() {
    let cluster = common::start_node();
    let name = unique_name("initstop");
    let target = format!("pod/{name}");
    let text = ordered(&name).replace("sleep 1; echo one > /work/order", "exec sleep 3600");
    cluster.ok(&["apply", "-f", &cluster.manifest("long.yaml", &text)]);
    common::wait_for(
        "the first init container to run",
        Duration::from_secs(60),
        || {
            let steps = cluster.ok(&[
                "logs",
                "--steps",
                &target,
                "--step",
                "node/run-init-containers",
            ]);
            steps.contains("first: started").then_some(())
        },
    );
    assert_eq!(
        runc_containers(&cluster).len(),
        1,
        "the init container runs"
    );
    let out = cluster.ok(&["delete", &target, "--wait", "--timeout", "90s"]);
    assert!(out.contains("deleted: its stop workflow"), "{out}");
    let stops = cluster.ok(&["logs", "--steps", &target, "--step", "node/stop-containers"]);
    assert!(stops.contains("first: stopped after"), "{stops}");
    assert!(
        runc_containers(&cluster).is_empty(),
        "nothing of the pod runs"
    );
}

/// The ids of the node's runc containers.
fn runc_containers(cluster: &common::Cluster) -> Vec<String> {
    let root = cluster.data_dir.path().join("runc");
    let listed = std::process::Command::new("runc")
        .arg(format!("--root={}", root.display()))
        .args(["list", "-q"])
        .output()
        .expect("runc list");
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}
