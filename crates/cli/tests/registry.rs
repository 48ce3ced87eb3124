//! End to end through the real binary: `corral up` started with
//! `--registry-auth` and `--registry-certs-dir` runs a pod whose image is
//! on a real `docker-registry` speaking TLS (a test CA) and asking for
//! htpasswd credentials; the pull step's log shows the layers' progress.
//! Real runc, root.

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Cluster, wait_for};
use corral_testkit::{ImageFormat, RegistryServer, TestCa, busybox_image_tar};

mod common;

/// A scratch dir outside the node's data dir, for a test that needs root
/// and runc (it fails without them, never skips).
fn scratch(prefix: &str) -> tempfile::TempDir {
    corral_testkit::require_root();
    corral_testkit::require_tool("runc");
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("tempdir")
}

/// A `docker-registry` on loopback speaking TLS (a test CA) and asking for
/// `user`'s htpasswd credentials, holding the busybox image as
/// `repository:1`; and a certs dir (`--registry-certs-dir`) trusting it.
fn secure_registry(
    outside: &Path,
    user: &str,
    password: &str,
    repository: &str,
) -> (RegistryServer, PathBuf) {
    let ca = TestCa::for_loopback();
    let registry = RegistryServer::start_secure(&outside.join("registry"), &ca, user, password);
    let tar = busybox_image_tar(outside, ImageFormat::OciLayout);
    registry.push(repository, "1", &tar);
    let certs_dir = outside.join("certs.d");
    registry.install_ca(&certs_dir);
    (registry, certs_dir)
}

#[test]
fn pod_image_from_a_tls_registry_with_credentials_runs() {
    let outside = scratch("corral-e2e-registry-");
    let (registry, certs_dir) = secure_registry(
        outside.path(),
        "node-puller",
        "correct horse",
        "corral/busybox",
    );
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

#[test]
fn a_pods_pull_secret_brings_credentials_the_node_lacks() {
    let outside = scratch("corral-e2e-pullsecret-");
    let (registry, certs_dir) = secure_registry(
        outside.path(),
        "team-puller",
        "battery staple",
        "team/busybox",
    );
    // The node trusts the registry's CA but has no credentials for it.
    let cluster =
        Cluster::start_with(&["up", "--registry-certs-dir", &certs_dir.to_string_lossy()]);
    let image = format!("{}/team/busybox:1", registry.addr());
    let pod = |name: &str, secret: Option<&str>| {
        let secret = secret
            .map(|s| format!("  imagePullSecret: {s}\n"))
            .unwrap_or_default();
        format!(
            "kind: Pod\nmetadata: {{name: {name}}}\nspec:\n{secret}  containers:\n    - name: main\n      image: {image}\n      command: [sleep, \"3600\"]\n"
        )
    };
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("anon.yaml", &pod("anon", None)),
    ]);
    let why = wait_for(
        "the anonymous pull to be refused",
        Duration::from_secs(60),
        || {
            let why = cluster.ok(&["why", "pod/anon"]);
            why.contains("401").then_some(why)
        },
    );
    assert!(why.contains(&registry.addr().to_string()), "{why}");

    let config = serde_json::to_string(&registry.docker_config_json()).expect("json string");
    let secret = format!(
        "kind: Secret\nmetadata: {{name: pull}}\nspec:\n  type: registry-auth\n  stringData:\n    config.json: {config}\n"
    );
    cluster.ok(&["apply", "-f", &cluster.manifest("pull.yaml", &secret)]);
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("team.yaml", &pod("team", Some("pull"))),
    ]);
    wait_for(
        "the pod with the pull secret to run",
        Duration::from_secs(90),
        || (cluster.get_json("pod/team")["status"]["phase"] == "Running").then_some(()),
    );
    // The credentials show nowhere in the pod's step log.
    let logs = cluster.ok(&["logs", "pod/team", "--steps"]);
    assert!(!logs.contains("battery staple"), "{logs}");
}
