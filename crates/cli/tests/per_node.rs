//! End-to-end acceptance of PerNodeDeployments with real agents on one
//! server (real runc): exactly one pod on each of 3 nodes, pinned to it;
//! a node that joins gets one; a template edit updates every pod in place
//! (same uid); a node declared lost loses its pod. Root and runc; fails
//! (never skips) without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::agents::Agents;
use common::wait_for;
use corral_testkit::{ImageFormat, busybox_image_tar, require_root, require_tool};
use serde_json::Value;

/// The per-node deployment's view of the lab.
trait Exporter {
    fn pods(&self) -> BTreeMap<String, (String, String, String, String)>;
    fn wait_spread(
        &self,
        nodes: &[&str],
        version: &str,
    ) -> BTreeMap<String, (String, String, String, String)>;
}

impl Exporter for Agents {
    /// The pods of pnd/exporter: name → (node bound, phase, uid, env V).
    fn pods(&self) -> BTreeMap<String, (String, String, String, String)> {
        let listed: Value = serde_json::from_str(&self.corral(&[
            "get",
            "pods",
            "-l",
            "corral.dev/per-node=exporter",
            "-o",
            "json",
        ]))
        .unwrap();
        listed["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|pod| {
                let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
                (
                    text(&pod["metadata"]["name"]),
                    (
                        text(&pod["status"]["node"]),
                        text(&pod["status"]["phase"]),
                        text(&pod["metadata"]["uid"]),
                        text(&pod["spec"]["containers"][0]["env"]["V"]),
                    ),
                )
            })
            .collect()
    }

    /// Waits until each of `nodes` runs exactly one pod `exporter-<node>`
    /// with env V = `version`, and there are no others.
    fn wait_spread(
        &self,
        nodes: &[&str],
        version: &str,
    ) -> BTreeMap<String, (String, String, String, String)> {
        wait_for(
            &format!("one exporter pod ({version}) running on each of {nodes:?}"),
            Duration::from_secs(90),
            || {
                let pods = self.pods();
                let wanted: Vec<String> = nodes.iter().map(|n| format!("exporter-{n}")).collect();
                let all = pods.len() == nodes.len()
                    && wanted.iter().zip(nodes).all(|(name, node)| {
                        pods.get(name).is_some_and(|(on, phase, _, v)| {
                            on == node && phase == "Running" && v == version
                        })
                    });
                all.then_some(pods)
            },
        )
    }
}

fn exporter(version: &str) -> String {
    format!(
        "kind: PerNodeDeployment
metadata: {{name: exporter}}
spec:
  template:
    metadata: {{labels: {{app: exporter}}}}
    spec:
      terminationGraceSeconds: 0
      containers:
        - {{name: main, image: local/busybox:1, command: [sleep, \"3600\"], env: {{V: {version}}}}}
"
    )
}

#[test]
fn one_pod_on_every_node_following_joins_edits_and_losses() {
    require_root();
    require_tool("runc");
    let mut nodes = Agents::start("corral-per-node-");
    let tar = busybox_image_tar(nodes.dir.path(), ImageFormat::DockerArchive);
    let join = nodes.corral(&["token", "create", "--join", "--ttl", "10m"]);
    for name in ["node-a", "node-b", "node-c"] {
        nodes.start_agent(name, join.trim(), &tar);
    }
    for name in ["node-a", "node-b", "node-c"] {
        nodes.wait_ready(name);
    }
    let manifest = nodes.path("exporter.yaml");
    std::fs::write(&manifest, exporter("one")).unwrap();
    nodes.corral(&["apply", "-f", manifest.to_str().unwrap()]);
    let first = nodes.wait_spread(&["node-a", "node-b", "node-c"], "one");
    let pnd: Value =
        serde_json::from_str(&nodes.corral(&["get", "pnd/exporter", "-o", "json"])).unwrap();
    assert_eq!(pnd["status"]["desired"], 3, "{pnd}");
    let table = nodes.corral(&["get", "pnd"]);
    assert!(table.contains("DESIRED"), "{table}");
    let why = wait_for(
        "why pnd/exporter to be healthy",
        Duration::from_secs(30),
        || {
            let why = nodes.corral(&["why", "pnd/exporter"]);
            why.contains("is healthy").then_some(why)
        },
    );
    assert!(
        why.starts_with("pnd/exporter (revision 1) is healthy: 3/3 nodes run it ready (3 current)"),
        "{why}"
    );

    // A node that joins gets its pod.
    nodes.start_agent("node-d", join.trim(), &tar);
    nodes.wait_ready("node-d");
    nodes.wait_spread(&["node-a", "node-b", "node-c", "node-d"], "one");

    // A template edit updates every pod in place: same names, same uids.
    std::fs::write(&manifest, exporter("two")).unwrap();
    nodes.corral(&["apply", "-f", manifest.to_str().unwrap()]);
    let edited = nodes.wait_spread(&["node-a", "node-b", "node-c", "node-d"], "two");
    for (name, pod) in &first {
        assert_eq!(edited[name].2, pod.2, "{name} kept its uid");
    }
    let history: Value =
        serde_json::from_str(&nodes.corral(&["history", "pod/exporter-node-b", "-o", "json"]))
            .unwrap();
    let records = history.as_array().unwrap();
    assert_eq!(records.last().unwrap()["author"], "per-node", "{history}");

    // A node that leaves (its agent stopped, declared lost) loses its pod.
    let agent = nodes.agent("node-d");
    agent.kill().unwrap();
    agent.wait().unwrap();
    nodes.corral(&["node", "forget", "node-d"]);
    nodes.wait_spread(&["node-a", "node-b", "node-c"], "two");

    // Deleting the deployment deletes its pods.
    nodes.corral(&["delete", "pnd/exporter"]);
    wait_for("the pods to go", Duration::from_secs(30), || {
        nodes.pods().is_empty().then_some(())
    });
}
