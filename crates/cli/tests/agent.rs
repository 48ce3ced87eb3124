//! End-to-end acceptance of the node agent with real runc containers:
//! pods start through their workflow, update in place (only changed
//! containers restart), and exited containers restart per policy. Needs
//! root, runc and busybox-static; fails (never skips) without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Cluster, wait_for};
use serde_json::Value;

const POD: &str = "kind: Pod
metadata: {name: web}
spec:
  containers:
    - name: web
      image: local/busybox:1
      command: [httpd, -f, -p, \"8080\"]
      env: {GREETING: hello}
    - name: side
      image: local/busybox:1
      command: [sleep, \"3600\"]
      readiness: {exec: {command: [\"true\"]}, periodSeconds: 1}
";

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["containers"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

fn running(cluster: &Cluster) -> Value {
    wait_for("pod/web to run", Duration::from_secs(60), || {
        let pod = cluster.get_json("pod/web");
        // side's readiness is an exec probe: it runs through runc exec.
        let ready = pod["status"]["phase"] == "Running"
            && ["web", "side"]
                .iter()
                .all(|c| container(&pod, c)["state"] == "running")
            && container(&pod, "side")["ready"] == true;
        ready.then_some(pod)
    })
}

#[test]
fn pods_run_update_in_place_and_restart() {
    let cluster = &common::start_node();
    let path = cluster.manifest("web.yaml", POD);
    cluster.ok(&["apply", "-f", &path]);
    let first = running(cluster);
    assert!(first["status"]["node"].is_string(), "{first}");
    assert!(first["status"]["address"].is_string(), "{first}");
    let why = cluster.ok(&["why", "pod/web"]);
    assert!(why.contains("node/start-containers"), "{why}");

    // Change one container's env: revision 2, same uid and node; only that
    // container restarts.
    let changed = POD.replace("GREETING: hello", "GREETING: bonjour");
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("web2.yaml", &changed),
        "-m",
        "greet in french",
    ]);
    let second = wait_for("the update to land", Duration::from_secs(60), || {
        let pod = cluster.get_json("pod/web");
        (pod["status"]["observedRevision"] == 2 && container(&pod, "web")["state"] == "running")
            .then_some(pod)
    });
    assert_eq!(second["metadata"]["revision"], 2);
    assert_eq!(second["metadata"]["uid"], first["metadata"]["uid"]);
    assert_eq!(second["status"]["node"], first["status"]["node"]);
    assert_eq!(second["status"]["address"], first["status"]["address"]);
    assert_ne!(
        container(&second, "web")["startedAt"],
        container(&first, "web")["startedAt"]
    );
    assert_ne!(
        container(&second, "web")["containerId"],
        container(&first, "web")["containerId"]
    );
    assert_eq!(
        container(&second, "side")["containerId"],
        container(&first, "side")["containerId"]
    );
    assert_eq!(
        container(&second, "side")["startedAt"],
        container(&first, "side")["startedAt"]
    );
    // The stopped container is deleted from runc after the new one started,
    // and each generation has a cgroup of its own.
    let root = cluster.data_dir.path().join("runc");
    let old_id = container(&first, "web")["containerId"].as_str().unwrap();
    wait_for(
        "runc to forget the stopped container",
        Duration::from_secs(30),
        || (!runc_ids(&root).contains(&old_id.to_string())).then_some(()),
    );
    let new_id = container(&second, "web")["containerId"].as_str().unwrap();
    assert!(runc_ids(&root).contains(&new_id.to_string()));
    let generation = new_id.rsplit('-').next().unwrap();
    let uid = second["metadata"]["uid"].as_str().unwrap();
    let cgroups =
        std::fs::read_to_string(format!("/proc/{}/cgroup", runc_pid(&root, new_id))).unwrap();
    assert!(
        cgroups.contains(&format!("/corral/{uid}/web-{generation}")),
        "{cgroups}"
    );

    // Kill the web container's process: it restarts, restarts counts it.
    let id = container(&second, "web")["containerId"]
        .as_str()
        .unwrap()
        .to_string();
    let status = std::process::Command::new("runc")
        .arg(format!("--root={}", root.display()))
        .args(["kill", &id, "KILL"])
        .status()
        .unwrap();
    assert!(status.success());
    let third = wait_for("the container to restart", Duration::from_secs(60), || {
        let pod = cluster.get_json("pod/web");
        let web = container(&pod, "web");
        (web["restarts"] == 1 && web["state"] == "running").then_some(pod)
    });
    assert_ne!(container(&third, "web")["containerId"], id);
    assert_eq!(
        container(&third, "side")["containerId"],
        container(&first, "side")["containerId"]
    );

    // An update that no longer fits the node is refused by the node, says
    // why, and leaves the pod running its revision.
    let huge = changed.replace(
        "env: {GREETING: bonjour}",
        "env: {GREETING: bonjour}\n      resources: {memory: 1000Ti}",
    );
    cluster.ok(&["apply", "-f", &cluster.manifest("huge.yaml", &huge)]);
    let why = wait_for("the update to be refused", Duration::from_secs(90), || {
        let why = cluster.ok(&["why", "pod/web"]);
        why.contains("no longer fits node").then_some(why)
    });
    assert!(why.contains("insufficient memory"), "{why}");
    let pod = cluster.get_json("pod/web");
    assert_eq!(pod["status"]["observedRevision"], 2);
    assert_eq!(
        container(&pod, "web")["containerId"],
        container(&third, "web")["containerId"]
    );
}

/// The ids of the containers runc knows under `root`.
fn runc_ids(root: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new("runc")
        .arg(format!("--root={}", root.display()))
        .args(["list", "-q"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The pid of container `id`'s init process, as `runc state` reports it.
fn runc_pid(root: &std::path::Path, id: &str) -> u64 {
    let out = std::process::Command::new("runc")
        .arg(format!("--root={}", root.display()))
        .args(["state", id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    state["pid"].as_u64().unwrap()
}

/// The processes whose parent is `pid` and that are zombies (exited,
/// never collected).
fn zombie_children(pid: u32) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| {
            let after = stat.rsplit(')').next().unwrap_or("");
            let fields: Vec<&str> = after.split_whitespace().collect();
            fields.first() == Some(&"Z") && fields.get(1) == Some(&pid.to_string().as_str())
        })
        .collect()
}

#[test]
fn twenty_pods_started_and_deleted_leave_no_zombies() {
    let cluster = &common::start_node();
    let pid = cluster.pid().expect("corral up's pid");
    let mut manifest = String::new();
    for i in 0..20 {
        manifest.push_str(&format!(
            "---\nkind: Pod\nmetadata: {{name: z{i}}}\nspec:\n  terminationGraceSeconds: 0\n  containers: [{{name: c, image: local/busybox:1, command: [sleep, '3600']}}]\n"
        ));
    }
    let path = cluster.manifest("pods.yaml", &manifest);
    cluster.ok(&["apply", "-f", &path]);
    wait_for("20 pods to run", Duration::from_secs(120), || {
        let pods: Value = serde_json::from_str(&cluster.ok(&["get", "pods", "-o", "json"])).ok()?;
        let items = pods["items"].as_array()?;
        (items.len() == 20 && items.iter().all(|p| p["status"]["phase"] == "Running")).then_some(())
    });
    cluster.ok(&["delete", "-f", &path]);
    wait_for("the node to remove them", Duration::from_secs(60), || {
        let pods: Value = serde_json::from_str(&cluster.ok(&["get", "pods", "-o", "json"])).ok()?;
        pods["items"].as_array()?.is_empty().then_some(())
    });
    // Wait for the node itself: every container gone from runc and every
    // pod directory removed (the last thing it does for a pod).
    let data_dir = cluster.data_dir.path().to_path_buf();
    wait_for(
        "the node to stop every container",
        Duration::from_secs(60),
        || {
            let listed = std::process::Command::new("runc")
                .arg("--root")
                .arg(data_dir.join("runc"))
                .args(["list", "-q"])
                .output()
                .ok()?;
            let pods_left = std::fs::read_dir(data_dir.join("pods"))
                .map(|dir| dir.flatten().count())
                .unwrap_or(0);
            (listed.stdout.is_empty() && pods_left == 0).then_some(())
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    let zombies = zombie_children(pid);
    assert!(
        zombies.is_empty(),
        "uncollected children of corral up: {zombies:#?}"
    );
}

#[test]
fn a_directory_packed_from_the_hosts_busybox_runs_as_a_pod() {
    corral_testkit::require_root();
    corral_testkit::require_tool("runc");
    let busybox = corral_testkit::require_tool("/bin/busybox");
    let cluster = Cluster::start();
    // The README tour's first image, without building anything.
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("bb");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy(&busybox, root.join("bin/busybox")).unwrap();
    // Its applets as relative links (`busybox --install -s` would point
    // them at this host's path of busybox).
    let listed = std::process::Command::new(&busybox)
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
    }
    let archive = work.path().join("busybox.tar");
    let packed = cluster.ok(&[
        "image",
        "pack",
        &root.to_string_lossy(),
        "--name",
        "local/packed:1",
        "-o",
        &archive.to_string_lossy(),
    ]);
    assert!(packed.starts_with("packed local/packed:1 ("), "{packed}");
    let data_dir = cluster.data_dir.path().to_string_lossy().into_owned();
    cluster.ok(&[
        "image",
        "import",
        &archive.to_string_lossy(),
        "--data-dir",
        &data_dir,
    ]);
    let pod = "kind: Pod
metadata: {name: packed}
spec:
  terminationGraceSeconds: 0
  containers:
    - {name: c, image: local/packed:1, command: [sh, -c, \"echo from-the-packed-image; exec sleep 3600\"]}
";
    cluster.ok(&["apply", "-f", &cluster.manifest("packed.yaml", pod)]);
    wait_for(
        "the packed image's pod to run",
        Duration::from_secs(60),
        || (cluster.get_json("pod/packed")["status"]["phase"] == "Running").then_some(()),
    );
    let logs = wait_for("its output", Duration::from_secs(20), || {
        let logs = cluster.ok(&["logs", "pod/packed"]);
        logs.contains("from-the-packed-image").then_some(logs)
    });
    assert!(logs.contains("from-the-packed-image"));
    cluster.ok(&["delete", "pod/packed"]);
}
