//! Rollbacks on a real node: back to an image whose registry is gone (the
//! node kept it: history is the GC root), and the system's automatic
//! rollback of a revision that never becomes ready. Real runc, root.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Cluster, wait_for};
use corral_testkit::{ImageFormat, LayerBuilder, RegistryServer, busybox_image, push_oci_layout};
use serde_json::Value;

fn web(pod: &Value) -> Value {
    pod["status"]["containers"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["name"] == "web").cloned())
        .unwrap_or(Value::Null)
}

/// Waits until the node runs `revision` with the web container up.
fn runs_revision(cluster: &Cluster, revision: u64) -> Value {
    wait_for(
        &format!("revision {revision} to run"),
        Duration::from_secs(60),
        || {
            let pod = cluster.get_json("pod/web");
            (pod["status"]["observedRevision"] == revision && web(&pod)["state"] == "running")
                .then_some(pod)
        },
    )
}

/// `/version` inside the running web container, read with runc exec.
fn version_inside(cluster: &Cluster, pod: &Value) -> String {
    let id = web(pod)["containerId"].as_str().unwrap().to_string();
    let output = Command::new("runc")
        .arg(format!(
            "--root={}",
            cluster.data_dir.path().join("runc").display()
        ))
        .args(["exec", &id, "cat", "/version"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn pod_manifest(image: &str, extra: &str) -> String {
    format!(
        "kind: Pod\nmetadata: {{name: web}}\nspec:\n  containers:\n    - name: web\n      image: {image}\n      command: [sleep, \"3600\"]\n{extra}"
    )
}

#[test]
fn rollback_needs_no_registry_for_a_recent_image() {
    let cluster = &common::start_node();
    let registry_dir = cluster.data_dir.path().join("registry");
    std::fs::create_dir_all(&registry_dir).unwrap();
    let registry = RegistryServer::start(&registry_dir);
    for version in ["1", "2"] {
        let dir = cluster.data_dir.path().join(format!("image-{version}"));
        std::fs::create_dir_all(&dir).unwrap();
        let tar = busybox_image()
            .layer(LayerBuilder::new().file("version", version.as_bytes(), 0o644))
            .write_tar(&dir, ImageFormat::OciLayout)
            .unwrap();
        push_oci_layout(registry.addr(), "busybox", version, &tar);
    }
    let address = registry.addr();
    let image = |tag: &str| format!("{address}/busybox:{tag}");

    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("v1.yaml", &pod_manifest(&image("1"), "")),
    ]);
    let first = runs_revision(cluster, 1);
    assert_eq!(version_inside(cluster, &first), "1");
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("v2.yaml", &pod_manifest(&image("2"), "")),
    ]);
    let second = runs_revision(cluster, 2);
    assert_eq!(version_inside(cluster, &second), "2");

    drop(registry);
    cluster.ok(&["rollback", "pod/web", "--to", "1", "-m", "image 2 is bad"]);
    let third = runs_revision(cluster, 3);
    assert_eq!(version_inside(cluster, &third), "1");
    assert_eq!(third["spec"]["containers"][0]["image"], image("1"));

    // Pruning (by the node's agent, asked through the API) keeps both:
    // image 1 runs, image 2 is a recent revision's.
    let pruned = cluster.ok(&["image", "prune"]);
    assert!(pruned.contains("0 images"), "{pruned}");
    let data_dir = cluster.data_dir.path().to_string_lossy().into_owned();
    let listed = cluster.ok(&["image", "ls", "--data-dir", &data_dir]);
    assert!(
        listed.contains(&image("1")) && listed.contains(&image("2")),
        "{listed}"
    );
}

#[test]
fn a_revision_that_never_gets_ready_is_rolled_back_by_the_system() {
    let cluster = &common::start_node();
    let good = "kind: Pod\nmetadata: {name: web}\nspec:\n  rollback: auto\n  containers:\n    - name: web\n      image: local/busybox:1\n      command: [httpd, -f, -p, \"8080\"]\n      readiness: {tcp: {port: 8080}, periodSeconds: 1, deadlineSeconds: 4}\n";
    cluster.ok(&["apply", "-f", &cluster.manifest("good.yaml", good)]);
    wait_for("revision 1 to be ready", Duration::from_secs(60), || {
        let pod = cluster.get_json("pod/web");
        (web(&pod)["ready"] == true).then_some(())
    });
    let bad = good.replace("[httpd, -f, -p, \"8080\"]", "[sleep, \"3600\"]");
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("bad.yaml", &bad),
        "-m",
        "no server",
    ]);
    let rolled = wait_for("the automatic rollback", Duration::from_secs(90), || {
        let pod = cluster.get_json("pod/web");
        (pod["metadata"]["revision"] == 3).then_some(pod)
    });
    assert_eq!(rolled["spec"]["containers"][0]["command"][0], "httpd");
    let history: Vec<Value> =
        serde_json::from_str(&cluster.ok(&["history", "pod/web", "-o", "json"])).unwrap();
    let last = history.last().unwrap();
    assert_eq!(last["class"], "system", "{last}");
    assert_eq!(last["author"], "workflow", "{last}");
    let message = last["message"].as_str().unwrap();
    assert!(
        message.starts_with("automatic rollback to revision 1"),
        "{message}"
    );
    assert!(message.contains("never became ready"), "{message}");
    wait_for(
        "the rolled-back revision to be ready",
        Duration::from_secs(60),
        || {
            let pod = cluster.get_json("pod/web");
            (pod["status"]["observedRevision"] == 3 && web(&pod)["ready"] == true).then_some(())
        },
    );
}
