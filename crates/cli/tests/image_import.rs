//! `corral image import` and `corral image ls` through the API, end to
//! end with the real binary: with only `CORRAL_CONFIG` set the image lands
//! in the store of the cluster's node (not in a local data dir) and a pod
//! runs it; a cut archive is refused and imports nothing; in a 2-node lab
//! one upload lands on both nodes, `--node` targets one, and a node whose
//! agent is down fails alone, named. Needs root, runc and busybox-static
//! (and `ip` for the lab); fails, never skips, without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::lab::Lab;
use common::{Cluster, wait_for};
use corral_testkit::{ImageFormat, busybox_image_tar, require_root, require_tool, unique_name};
use serde_json::Value;

/// The references `image ls -o json` shows on each node, by node.
fn listed(report: &str) -> Vec<(String, Vec<String>)> {
    let report: Value = serde_json::from_str(report).expect("image ls -o json is JSON");
    report["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|node| {
            let images = node["images"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["reference"].as_str().unwrap().to_string())
                .collect();
            (node["node"].as_str().unwrap().to_string(), images)
        })
        .collect()
}

fn sleeper(name: &str, image: &str, node: Option<&str>) -> String {
    let placement = node.map_or(String::new(), |node| {
        format!("  placement: {{node: {node}}}\n")
    });
    format!(
        "kind: Pod\nmetadata: {{name: {name}}}\nspec:\n{placement}  terminationGraceSeconds: 0\n  containers:\n    - {{name: main, image: \"{image}\", command: [sleep, \"3600\"]}}\n"
    )
}

/// Whether the store of data dir `dir` names `reference`.
fn stored_in(dir: &Path, reference: &str) -> bool {
    std::fs::read_to_string(dir.join("images/images.json"))
        .is_ok_and(|index| index.contains(&format!("\"{reference}\"")))
}

#[test]
fn an_import_with_only_the_client_config_lands_on_the_clusters_node() {
    require_root();
    require_tool("runc");
    let cluster = Cluster::start();
    let node = wait_for("the node to be Ready", Duration::from_secs(30), || {
        let nodes = cluster.get_json("nodes");
        let node = &nodes["items"][0];
        (node["status"]["phase"] == "Ready")
            .then(|| node["metadata"]["name"].as_str().map(str::to_string))?
    });
    let tar = busybox_image_tar(cluster.data_dir.path(), ImageFormat::OciLayout);
    let reference = format!("local/{}:1", unique_name("imported"));

    let out = cluster.ok(&[
        "image",
        "import",
        &tar.to_string_lossy(),
        "--name",
        &reference,
    ]);
    assert!(
        out.starts_with(&format!("{node}: imported {reference} (sha256:")),
        "{out}"
    );
    assert!(
        stored_in(cluster.data_dir.path(), &reference),
        "the cluster node's store has it"
    );
    assert!(
        !stored_in(Path::new("/var/lib/corral"), &reference),
        "nothing went to the default data dir"
    );

    let pod = unique_name("uses-import");
    let manifest = cluster.manifest("pod.yaml", &sleeper(&pod, &reference, None));
    cluster.ok(&["apply", "-f", &manifest]);
    wait_for(
        "the pod to run the imported image",
        Duration::from_secs(60),
        || (cluster.get_json(&format!("pod/{pod}"))["status"]["phase"] == "Running").then_some(()),
    );
    let table = cluster.ok(&["image", "ls"]);
    let row = table
        .lines()
        .find(|line| line.contains(&reference))
        .unwrap_or_else(|| panic!("image ls lacks {reference}:\n{table}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(columns[0], node, "{row}");
    assert_eq!(columns.last(), Some(&"1"), "one pod uses it: {row}");
    let json: Value = serde_json::from_str(&cluster.ok(&["image", "ls", "-o", "json"])).unwrap();
    let image = json["nodes"][0]["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["reference"] == reference.as_str())
        .cloned()
        .unwrap();
    assert_eq!(image["pods"], serde_json::json!([format!("pod/{pod}")]));
    assert!(image["size"].as_u64().unwrap() > 100_000, "{image}");

    // A cut archive: the node says why, nothing is imported, the command fails.
    let cut = cluster.data_dir.path().join("cut.tar");
    let bytes = std::fs::read(&tar).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2 + 100]).unwrap();
    let cut_name = format!("local/{}:1", unique_name("cut"));
    let error = cluster.fails(&[
        "image",
        "import",
        &cut.to_string_lossy(),
        "--name",
        &cut_name,
    ]);
    assert!(
        error.contains(&format!(
            "{node}: failed: import failed, nothing was imported"
        )),
        "{error}"
    );
    assert!(error.contains("import failed on 1 of 1 nodes"), "{error}");
    assert!(!cluster.ok(&["image", "ls"]).contains(&cut_name));
    cluster.ok(&["delete", &format!("pod/{pod}")]);
}

#[test]
fn a_two_node_lab_gets_one_upload_on_both_nodes_or_on_the_one_named() {
    require_root();
    for tool in ["runc", "ip"] {
        require_tool(tool);
    }
    let images = tempfile::tempdir().expect("temp dir");
    let tar = busybox_image_tar(images.path(), ImageFormat::OciLayout);
    let lab = Lab::up("images", 2, &tar, &[]);
    let tar = tar.to_string_lossy().into_owned();

    // Every Ready node, by default.
    let out = lab.corral(&["image", "import", &tar, "--name", "local/both:1"]);
    for node in ["node-0", "node-1"] {
        assert!(
            out.contains(&format!("{node}: imported local/both:1 (sha256:")),
            "{out}"
        );
    }
    let both = listed(&lab.corral(&["image", "ls", "-o", "json"]));
    assert_eq!(both.len(), 2, "{both:?}");
    for (node, images) in &both {
        assert!(
            images.contains(&"local/both:1".to_string()),
            "{node}: {images:?}"
        );
    }

    // --node: that node only.
    let out = lab.corral(&[
        "image",
        "import",
        &tar,
        "--name",
        "local/one:1",
        "--node",
        "node-1",
    ]);
    assert!(out.contains("node-1: imported local/one:1"), "{out}");
    assert!(!out.contains("node-0"), "{out}");
    let on = |node: &str| -> Vec<String> {
        let report = lab.corral(&["image", "ls", "--node", node, "-o", "json"]);
        let mut nodes = listed(&report);
        assert_eq!(nodes.len(), 1, "{report}");
        nodes.remove(0).1
    };
    assert!(on("node-1").contains(&"local/one:1".to_string()));
    assert!(!on("node-0").contains(&"local/one:1".to_string()));

    // The image imported on both runs on node-1.
    let manifest = lab.dir.join("both.yaml");
    std::fs::write(
        &manifest,
        sleeper("uses-both", "local/both:1", Some("node-1")),
    )
    .unwrap();
    lab.corral(&["apply", "-f", &manifest.to_string_lossy()]);
    wait_for(
        "pod uses-both to run on node-1",
        Duration::from_secs(90),
        || {
            let pod = lab.json("pod/uses-both")?;
            (pod["status"]["phase"] == "Running" && pod["status"]["node"] == "node-1").then_some(())
        },
    );

    // A node whose agent is down fails alone, named; the other imports.
    let stopped = lab.lab(&["stop-agent", "node-1"]);
    assert!(stopped.status.success(), "{stopped:?}");
    let error = lab
        .try_corral(&[
            "image",
            "import",
            &tar,
            "--name",
            "local/half:1",
            "--node",
            "node-0",
            "--node",
            "node-1",
        ])
        .expect_err("node-1's agent is down");
    assert!(error.contains("node-0: imported local/half:1"), "{error}");
    assert!(
        error.contains("node-1: failed: cannot reach the agent of node node-1"),
        "{error}"
    );
    assert!(
        error.contains("import failed on 1 of 2 nodes: node-1"),
        "{error}"
    );
    assert!(on("node-0").contains(&"local/half:1".to_string()));
    let listing = lab
        .try_corral(&["image", "ls", "--node", "node-1"])
        .expect_err("node-1 cannot answer");
    assert!(listing.contains("node-1: cannot list images"), "{listing}");
}
