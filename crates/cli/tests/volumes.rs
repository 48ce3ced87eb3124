//! End to end through the real binary: a pod's `local` volume keeps its
//! data across an in-place update (the container restarts with new config)
//! and across the pod's deletion: another pod using the volume finds the
//! data on the same node. Its `emptyDir` goes with the pod.

use std::time::Duration;

use corral_testkit::unique_name;
use serde_json::Value;

mod common;

fn manifest(name: &str, volume: &str, greeting: &str) -> String {
    format!(
        "kind: Pod\nmetadata: {{name: {name}}}\nspec:\n  volumes:\n    - {{name: data, local: {{name: {volume}}}}}\n    - {{name: scratch, emptyDir: {{}}}}\n  containers:\n    - name: main\n      image: local/busybox:1\n      command: [sh, -c, \"echo $GREETING >> /data/log; echo here > /scratch/s; exec sleep 3600\"]\n      env: {{GREETING: {greeting}}}\n      mounts: [{{volume: data, path: /data}}, {{volume: scratch, path: /scratch}}]\n"
    )
}

fn running(cluster: &common::Cluster, target: &str, revision: u64) -> Value {
    common::wait_for(
        &format!("{target} running revision {revision}"),
        Duration::from_secs(60),
        || {
            let pod = cluster.get_json(target);
            (pod["status"]["phase"] == "Running"
                && pod["status"]["observedRevision"].as_u64() == Some(revision))
            .then_some(pod)
        },
    )
}

#[test]
fn local_volume_data_outlives_updates_and_the_pod() {
    let cluster = common::start_node();
    let volume = unique_name("data");
    let host_log = cluster
        .data_dir
        .path()
        .join("volumes")
        .join(&volume)
        .join("data")
        .join("log");

    let first = unique_name("vol");
    let target = format!("pod/{first}");
    let path = cluster.manifest("p1.yaml", &manifest(&first, &volume, "hello"));
    cluster.ok(&["apply", "-f", &path]);
    let pod = running(&cluster, &target, 1);
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let log = common::wait_for("the first line", Duration::from_secs(20), || {
        std::fs::read_to_string(&host_log)
            .ok()
            .filter(|t| t.contains("hello"))
    });
    assert_eq!(log, "hello\n");
    let scratch = cluster.ok(&["exec", &target, "-c", "main", "--", "cat", "/scratch/s"]);
    assert_eq!(scratch.trim(), "here");

    // An in-place update restarts the container; the volume keeps its data.
    let path = cluster.manifest("p1.yaml", &manifest(&first, &volume, "bonjour"));
    cluster.ok(&["apply", "-f", &path]);
    let updated = running(&cluster, &target, 2);
    assert_eq!(updated["metadata"]["uid"], pod["metadata"]["uid"]);
    common::wait_for("the second line", Duration::from_secs(20), || {
        std::fs::read_to_string(&host_log)
            .ok()
            .filter(|t| *t == "hello\nbonjour\n")
    });

    // Another pod on the volume after this one is gone finds the data.
    cluster.ok(&["delete", &target]);
    let pod_dir = cluster.data_dir.path().join("pods").join(&uid);
    common::wait_for(
        "the first pod's files to go",
        Duration::from_secs(60),
        || (!pod_dir.exists()).then_some(()),
    );
    let second = unique_name("vol");
    let path = cluster.manifest("p2.yaml", &manifest(&second, &volume, "hallo"));
    cluster.ok(&["apply", "-f", &path]);
    let pod2 = running(&cluster, &format!("pod/{second}"), 1);
    assert_eq!(pod2["status"]["node"], pod["status"]["node"]);
    let seen = common::wait_for("the third line", Duration::from_secs(20), || {
        let out = cluster.corral(&[
            "exec",
            &format!("pod/{second}"),
            "-c",
            "main",
            "--",
            "cat",
            "/data/log",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("hallo").then_some(text)
    });
    assert_eq!(seen, "hello\nbonjour\nhallo\n");
}
