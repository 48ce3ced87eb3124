//! End to end through the real binary: `corral up` started with
//! `--registry-auth` and `--registry-certs-dir` runs a pod whose image is
//! on a real `docker-registry` speaking TLS (a test CA) and asking for
//! htpasswd credentials; the pull step's log shows the layers' progress.
//! Real runc, root.

use std::time::Duration;

use common::{Cluster, wait_for};
use corral_testkit::{ImageFormat, RegistryServer, TestCa, busybox_image_tar};

mod common;

#[test]
fn pod_image_from_a_tls_registry_with_credentials_runs() {
    corral_testkit::require_root();
    corral_testkit::require_tool("runc");
    let outside = tempfile::Builder::new()
        .prefix("corral-e2e-registry-")
        .tempdir()
        .expect("tempdir");
    let ca = TestCa::for_loopback();
    let registry = RegistryServer::start_secure(
        &outside.path().join("registry"),
        &ca,
        "node-puller",
        "correct horse",
    );
    let tar = busybox_image_tar(outside.path(), ImageFormat::OciLayout);
    registry.push("corral/busybox", "1", &tar);
    let certs_dir = outside.path().join("certs.d");
    registry.install_ca(&certs_dir);
    let auth_file = outside.path().join("registry-auth.json");
    std::fs::write(&auth_file, registry.docker_config_json()).expect("write auth file");

    let cluster = Cluster::start_with(&[
        "up",
        "--registry-auth",
        &auth_file.to_string_lossy(),
        "--registry-certs-dir",
        &certs_dir.to_string_lossy(),
    ]);
    let image = format!("{}/corral/busybox:1", registry.addr());
    let manifest = format!(
        "kind: Pod\nmetadata: {{name: web}}\nspec:\n  containers:\n    - name: web\n      image: {image}\n      command: [sleep, \"3600\"]\n"
    );
    cluster.ok(&["apply", "-f", &cluster.manifest("web.yaml", &manifest)]);
    wait_for("the pod to run", Duration::from_secs(90), || {
        let pod = cluster.get_json("pod/web");
        (pod["status"]["phase"] == "Running").then_some(pod)
    });

    // The pull step's log has a line per blob, each done.
    let logs = cluster.ok(&["logs", "pod/web", "--steps", "--step", "node/pull-image"]);
    let done: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains(&format!("{image}: layer sha256:")) && l.contains(" done"))
        .collect();
    assert!(done.len() >= 2, "config and layer lines in:\n{logs}");
}
