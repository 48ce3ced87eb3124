//! End to end through the real binary with runc: `corral up` keeps a warm
//! pool of pod sandboxes (user and network namespaces with a veth). A pod
//! starts from one (its `node/create-sandbox` says so), the pool refills,
//! stopping `corral up` removes every spare (namespaces, veths, id ranges)
//! and leaves the pod's own sandbox, and spares a killed agent left are
//! swept when it starts again. Root only.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{start_node, wait_for};
use corral_agent::sandbox_pool::{POOL_SIZE, RANGE_PREFIX, SPARE_PREFIX, spare_veth_name};

/// The spares' pinned namespace files (`spare-N`, `spare-N.user`).
fn spare_files(data_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data_dir.join("netns"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.starts_with(SPARE_PREFIX))
        .collect();
    names.sort();
    names
}

/// The spares' network namespaces (not their `.user` files).
fn spares(data_dir: &Path) -> Vec<PathBuf> {
    spare_files(data_dir)
        .into_iter()
        .filter(|name| !name.ends_with(".user"))
        .map(|name| data_dir.join("netns").join(name))
        .collect()
}

fn link_exists(name: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", "dev", name])
        .output()
        .expect("run ip link")
        .status
        .success()
}

/// The holders of id ranges that are spares (the table's snapshot and
/// journal, as the agent reads them).
fn spare_ranges(data_dir: &Path) -> Vec<String> {
    let table = corral_agent::idranges::read_table(&data_dir.join("agent/id-ranges.json"))
        .expect("the range table reads");
    table
        .holders()
        .filter(|holder| holder.starts_with(RANGE_PREFIX))
        .map(str::to_string)
        .collect()
}

fn full_pool(data_dir: &Path) -> Vec<PathBuf> {
    wait_for("the pool to fill", Duration::from_secs(60), || {
        let spares = spares(data_dir);
        (spares.len() == POOL_SIZE && spares.iter().all(|net| link_exists(&spare_veth_name(net))))
            .then_some(spares)
    })
}

#[test]
fn pods_start_from_the_warm_pool_and_stopping_leaves_no_spare() {
    corral_testkit::require_tool("ip");
    let mut cluster = start_node();
    let data_dir = cluster.data_dir.path().to_path_buf();
    let ready = full_pool(&data_dir);
    assert_eq!(spare_ranges(&data_dir).len(), POOL_SIZE);

    let manifest = "kind: Pod\nmetadata: {name: warm}\nspec:\n  terminationGraceSeconds: 0\n  containers: [{name: c, image: local/busybox:1, command: [sleep, '3600']}]\n";
    cluster.ok(&["apply", "-f", &cluster.manifest("warm.yaml", manifest)]);
    wait_for("the pod to run", Duration::from_secs(60), || {
        (cluster.get_json("pod/warm")["status"]["phase"] == "Running").then_some(())
    });
    let steps = cluster.ok(&[
        "logs",
        "--steps",
        "pod/warm",
        "--step",
        "node/create-sandbox",
    ]);
    assert!(steps.contains("warm pool"), "{steps}");
    // The oldest spare became the pod's: its veth renamed, its namespaces
    // pinned under the pod's name, its id range the pod's.
    assert!(!link_exists(&spare_veth_name(&ready[0])), "renamed");
    let pod_netns = std::fs::read_dir(data_dir.join("netns"))
        .expect("the namespace dir")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("pod-"))
        .count();
    assert_eq!(pod_netns, 2, "the pod's network and user namespaces");
    let exec = cluster.ok(&["exec", "pod/warm", "--", "cat", "/proc/self/uid_map"]);
    assert!(exec.contains("65536"), "{exec}");
    // The pool refills with a new spare.
    let refilled = full_pool(&data_dir);
    assert!(!refilled.contains(&ready[0]), "{refilled:?}");

    // A clean stop removes every spare and keeps the pod's sandbox.
    assert!(cluster.terminate(), "corral up stops cleanly");
    assert_eq!(spare_files(&data_dir), Vec::<String>::new());
    for net in &refilled {
        let veth = spare_veth_name(net);
        wait_for("the spare veth to go", Duration::from_secs(10), || {
            (!link_exists(&veth)).then_some(())
        });
    }
    assert_eq!(spare_ranges(&data_dir), Vec::<String>::new());
    let pod_left = std::fs::read_dir(data_dir.join("netns"))
        .expect("the namespace dir")
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("pod-"))
        .count();
    assert_eq!(pod_left, 2, "the pod keeps its sandbox across agent stops");

    // Spares a killed agent leaves are swept when it starts again (the
    // names repeat: without the sweep the pool could not refill).
    cluster.restart();
    let before = full_pool(&data_dir);
    cluster.kill9();
    assert_eq!(spares(&data_dir), before, "left by the killed agent");
    cluster.restart();
    let after = full_pool(&data_dir);
    assert_eq!(
        spare_ranges(&data_dir).len(),
        POOL_SIZE,
        "no stale range kept"
    );
    assert!(cluster.terminate(), "corral up stops cleanly");
    assert_eq!(spare_files(&data_dir), Vec::<String>::new());
    for net in before.iter().chain(&after) {
        let veth = spare_veth_name(net);
        wait_for("the spare veth to go", Duration::from_secs(10), || {
            (!link_exists(&veth)).then_some(())
        });
    }
}
