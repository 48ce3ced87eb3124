//! End to end through the real binary: the example volume plugin
//! (`examples/volume-plugins/dirvol`, a shell script speaking only the
//! plugin protocol) installed in `DATA/plugins`, its steps registered by
//! its `Controller` and executed by the node. A pod writes to its plugin
//! volume; a plugin that fails on purpose shows its message in `why` and
//! its output in `logs --steps`; deleting the pod runs `unmount` and
//! `release`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_testkit::unique_name;

mod common;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/volume-plugins")
}

/// Installs dirvol on the node (its backing root and call journal in the
/// node's data dir, set by the operator's dirvol.conf) and registers its
/// Controller.
fn install_dirvol(cluster: &common::Cluster) {
    corral_testkit::require_tool("jq");
    let plugins = cluster.data_dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins dir");
    std::fs::copy(examples().join("dirvol"), plugins.join("dirvol")).expect("install dirvol");
    let conf = format!(
        "root={}\njournal={}\n",
        cluster.data_dir.path().join("dirvol-root").display(),
        cluster.data_dir.path().join("dirvol-journal").display()
    );
    std::fs::write(plugins.join("dirvol.conf"), conf).expect("write dirvol.conf");
    let controller = examples().join("dirvol-controller.yaml");
    cluster.ok(&["apply", "-f", &controller.to_string_lossy()]);
}

fn manifest(name: &str, options: &str) -> String {
    format!(
        "kind: Pod\nmetadata: {{name: {name}}}\nspec:\n  volumes:\n    - name: data\n      plugin: {{driver: dirvol, options: {{{options}}}}}\n  containers:\n    - name: main\n      image: local/busybox:1\n      command: [sh, -c, \"echo written-by-pod > /data/file; exec sleep 3600\"]\n      mounts: [{{volume: data, path: /data}}]\n"
    )
}

#[test]
fn a_plugin_volume_is_prepared_mounted_and_released_by_its_plugin() {
    let cluster = common::start_node();
    install_dirvol(&cluster);
    let root = cluster.data_dir.path().join("dirvol-root");
    let journal = cluster.data_dir.path().join("dirvol-journal");

    let name = unique_name("plugvol");
    let target = format!("pod/{name}");
    let path = cluster.manifest("good.yaml", &manifest(&name, ""));
    cluster.ok(&["apply", "-f", &path]);
    let pod = common::wait_for(
        &format!("{target} running"),
        Duration::from_secs(90),
        || {
            let pod = cluster.get_json(&target);
            (pod["status"]["phase"] == "Running").then_some(pod)
        },
    );
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let backing = root.join(format!("{uid}-data"));
    let written = common::wait_for("the pod's write", Duration::from_secs(30), || {
        std::fs::read_to_string(backing.join("file")).ok()
    });
    assert_eq!(written.trim(), "written-by-pod");
    let read = cluster.ok(&["exec", &target, "-c", "main", "--", "cat", "/data/file"]);
    assert_eq!(read.trim(), "written-by-pod");

    // why shows the plugin's steps done, owned by its Controller.
    let why = cluster.ok(&["why", &target]);
    assert!(why.contains("dirvol/prepare"), "{why}");
    assert!(why.contains("dirvol/mount"), "{why}");
    let steps = cluster.ok(&["logs", "--steps", &target, "--step", "dirvol/prepare"]);
    assert!(steps.contains("backing directory"), "{steps}");

    // Deleting the pod unmounts and releases the volume, as steps of its
    // stop workflow that `logs --steps` shows.
    let deleted = cluster.ok(&["delete", &target, "--wait", "--timeout", "90s"]);
    assert!(
        deleted.contains("deleted: its stop workflow stop-1 finished"),
        "{deleted}"
    );
    for step in ["dirvol/unmount", "dirvol/release"] {
        let log = cluster.ok(&["logs", "--steps", &target, "--step", step]);
        assert!(
            log.contains("stop-1") && log.contains("done: "),
            "{step}: {log}"
        );
    }
    let calls = std::fs::read_to_string(&journal).expect("the plugin's journal");
    let verbs: Vec<&str> = calls
        .lines()
        .filter(|l| l.ends_with(&uid))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(verbs, ["prepare", "mount", "unmount", "release"], "{calls}");
    // The journal line comes first; the removal follows.
    common::wait_for(
        "release to remove the backing directory",
        Duration::from_secs(20),
        || (!backing.exists()).then_some(()),
    );
}

#[test]
fn a_failing_plugin_shows_its_message_in_why_and_its_output_in_step_logs() {
    let cluster = common::start_node();
    install_dirvol(&cluster);

    let name = unique_name("plugfail");
    let target = format!("pod/{name}");
    let text = manifest(&name, "fail: prepare");
    let path = cluster.manifest("bad.yaml", &text);
    cluster.ok(&["apply", "-f", &path]);
    let message = "refusing to prepare volume data on purpose (option fail=prepare)";
    let why = common::wait_for(
        "why to name the failed plugin step",
        Duration::from_secs(90),
        || {
            let why = cluster.ok(&["why", &target]);
            why.lines()
                .any(|l| l.contains("✗ dirvol/prepare") && l.contains(message))
                .then_some(why)
        },
    );
    assert!(
        why.lines()
            .any(|l| l.contains("storage (target)") && l.contains("blocked")),
        "{why}"
    );
    let steps = cluster.ok(&["logs", "--steps", &target, "--step", "dirvol/prepare"]);
    assert!(
        steps.contains("dirvol: asked to fail prepare (option fail=prepare)"),
        "{steps}"
    );
    assert!(steps.contains(message), "{steps}");
    assert_ne!(
        cluster.get_json(&target)["status"]["phase"],
        "Running",
        "no container starts on a volume that failed"
    );
}

#[test]
fn a_plugin_volume_without_its_controller_fails_prepare_volumes_clearly() {
    let cluster = common::start_node();
    let name = unique_name("plugnone");
    let target = format!("pod/{name}");
    let text = manifest(&name, "");
    let path = cluster.manifest("none.yaml", &text);
    cluster.ok(&["apply", "-f", &path]);
    common::wait_for(
        "why to say the steps are missing",
        Duration::from_secs(60),
        || {
            let why = cluster.ok(&["why", &target]);
            why.lines()
                .any(|l| {
                    l.contains("node/prepare-volumes")
                        && l.contains("dirvol/prepare, dirvol/mount executed by the node")
                })
                .then_some(())
        },
    );
}
