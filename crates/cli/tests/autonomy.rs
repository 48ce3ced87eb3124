//! Nodes run for weeks without the control plane: with the API server
//! killed, the agent restarts crashed containers; restarted alone, it
//! brings its pods back from local state; when the server returns, status
//! reconciles and no healthy container restarts. Real runc, root.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{CORRAL, cleanup_node, wait_for};
use corral_testkit::{ImageFormat, busybox_image_tar, require_root, require_tool};
use serde_json::Value;

/// The processes and directories of a split cluster, removed on drop.
struct Split {
    dir: tempfile::TempDir,
    port: u16,
    server: Option<Child>,
    agent: Option<Child>,
    node_token: String,
}

impl Split {
    /// A server with node-1's token and the busybox image in the agent's
    /// store; its agent running.
    fn start(prefix: &str) -> Split {
        require_root();
        require_tool("runc");
        let mut split = Split {
            dir: tempfile::Builder::new().prefix(prefix).tempdir().unwrap(),
            port: free_port(),
            server: None,
            agent: None,
            node_token: String::new(),
        };
        split.start_server();
        split.node_token = split
            .corral(&["token", "create", "--node", "node-1"])
            .trim()
            .to_string();
        let tar = busybox_image_tar(split.dir.path(), ImageFormat::DockerArchive);
        let agent_dir = split.agent_dir();
        split.corral(&[
            "image",
            "import",
            tar.to_str().unwrap(),
            "--data-dir",
            agent_dir.to_str().unwrap(),
        ]);
        split.start_agent();
        split
    }

    fn server_dir(&self) -> PathBuf {
        self.dir.path().join("server")
    }

    fn agent_dir(&self) -> PathBuf {
        self.dir.path().join("agent")
    }

    fn config(&self) -> PathBuf {
        self.server_dir().join("admin.json")
    }

    fn start_server(&mut self) {
        let mut child = Command::new(CORRAL)
            .args([
                "server",
                "--listen",
                &format!("127.0.0.1:{}", self.port),
                "--data-dir",
            ])
            .arg(self.server_dir())
            .env("CORRAL_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("export CORRAL_CONFIG="), "{line}");
        self.server = Some(child);
    }

    fn start_agent(&mut self) {
        let child = Command::new(CORRAL)
            .args([
                "agent",
                "--server",
                &format!("https://127.0.0.1:{}", self.port),
                "--ca",
            ])
            .arg(self.server_dir().join("tls").join("ca.pem"))
            // In the host's own namespace: never turn on its forwarding.
            .args(["--forwarding", "pod-links"])
            .args([
                "--token",
                &self.node_token,
                "--name",
                "node-1",
                "--data-dir",
            ])
            .arg(self.agent_dir())
            .env("CORRAL_LOG", "warn")
            .spawn()
            .unwrap();
        self.agent = Some(child);
    }

    fn kill(child: &mut Option<Child>) {
        if let Some(mut child) = child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn corral(&self, args: &[&str]) -> String {
        let output = Command::new(CORRAL)
            .args(args)
            .env("CORRAL_CONFIG", self.config())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "corral {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn pod(&self) -> Value {
        serde_json::from_str(&self.corral(&["get", "pod/web", "-o", "json"])).unwrap()
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        Self::kill(&mut self.agent);
        Self::kill(&mut self.server);
        cleanup_node(&self.agent_dir());
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn runc(root: &Path, args: &[&str]) {
    let status = Command::new("runc")
        .arg(format!("--root={}", root.display()))
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "runc {args:?}");
}

fn container_ids(pod: &Value) -> Vec<(String, String, u64)> {
    pod["status"]["containers"]
        .as_array()
        .map(|all| {
            all.iter()
                .map(|c| {
                    (
                        c["name"].as_str().unwrap_or_default().to_string(),
                        c["containerId"].as_str().unwrap_or_default().to_string(),
                        c["restarts"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The ids the agent's local state says run, straight from its record file.
fn local_container(agent_dir: &Path, name: &str) -> (String, Option<u64>) {
    let records = corral_agent::state::LocalState::open(agent_dir.join("agent/pods"))
        .and_then(|state| state.load_all())
        .expect("the agent's records read");
    let record = records
        .iter()
        .find(|record| record.pod.metadata.name == "web")
        .expect("the record of pod web");
    let container = record.containers.get(name);
    (
        container.map(|c| c.runtime_id.clone()).unwrap_or_default(),
        container.and_then(|c| c.pid.map(u64::from)),
    )
}

fn alive(pid: u64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn pods_survive_without_the_control_plane() {
    let mut split = Split::start("corral-autonomy-");
    let agent_dir = split.agent_dir();
    let manifest = split.dir.path().join("web.yaml");
    std::fs::write(
        &manifest,
        "kind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n    - {name: web, image: local/busybox:1, command: [httpd, -f, -p, \"8080\"]}\n    - {name: side, image: local/busybox:1, command: [sleep, \"3600\"]}\n",
    )
    .unwrap();
    split.corral(&["apply", "-f", manifest.to_str().unwrap()]);
    let before = wait_for("pod/web to run", Duration::from_secs(60), || {
        let pod = split.pod();
        let ids = container_ids(&pod);
        (pod["status"]["phase"] == "Running" && ids.len() == 2).then_some(ids)
    });

    // The server dies; a container dies: the agent restarts it anyway.
    Split::kill(&mut split.server);
    let runc_root = agent_dir.join("runc");
    let (web_id, _) = local_container(&agent_dir, "web");
    runc(&runc_root, &["kill", &web_id, "KILL"]);
    let (restarted_id, restarted_pid) =
        wait_for("the agent to restart web", Duration::from_secs(30), || {
            let (id, pid) = local_container(&agent_dir, "web");
            (id != web_id && pid.is_some_and(alive)).then_some((id, pid))
        });

    // The agent stops too (containers keep running); side dies meanwhile.
    // Started alone, with the server still down, it brings everything back.
    Split::kill(&mut split.agent);
    let (side_id, _) = local_container(&agent_dir, "side");
    runc(&runc_root, &["kill", &side_id, "KILL"]);
    split.start_agent();
    let (side_after, side_pid) = wait_for(
        "the restarted agent to start side",
        Duration::from_secs(30),
        || {
            let (id, pid) = local_container(&agent_dir, "side");
            (id != side_id && pid.is_some_and(alive)).then_some((id, pid))
        },
    );
    let (web_after, web_pid) = local_container(&agent_dir, "web");
    assert_eq!(
        web_after, restarted_id,
        "a healthy container was restarted by the agent's restart"
    );
    assert_eq!(web_pid, restarted_pid);

    // The server returns: status catches up; nothing healthy restarts.
    split.start_server();
    let after = wait_for("status to reconcile", Duration::from_secs(30), || {
        let ids = container_ids(&split.pod());
        let expected = [("web", &restarted_id), ("side", &side_after)];
        expected
            .iter()
            .all(|(name, id)| ids.iter().any(|(n, i, _)| n == name && i == *id))
            .then_some(ids)
    });
    assert!(
        after.iter().all(|(_, _, restarts)| *restarts >= 1),
        "{after:?} vs {before:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        local_container(&agent_dir, "web"),
        (restarted_id, restarted_pid)
    );
    assert_eq!(local_container(&agent_dir, "side"), (side_after, side_pid));
}

#[test]
fn an_update_made_before_the_node_made_the_sandbox_starts_the_pod_when_it_returns() {
    let mut split = Split::start("corral-late-node-");
    wait_for("node-1 to be Ready", Duration::from_secs(30), || {
        let nodes: Value =
            serde_json::from_str(&split.corral(&["get", "nodes", "-o", "json"])).ok()?;
        (nodes["items"][0]["status"]["phase"] == "Ready").then_some(())
    });
    // The agent is away (its node still Ready): the pod is placed and
    // addressed, and its node steps wait.
    Split::kill(&mut split.agent);
    let manifest = split.dir.path().join("web.yaml");
    let write = |value: &str| {
        std::fs::write(
            &manifest,
            format!("kind: Pod\nmetadata: {{name: web}}\nspec:\n  containers:\n    - {{name: web, image: local/busybox:1, command: [sleep, \"3600\"], env: {{V: \"{value}\"}}}}\n"),
        )
        .unwrap();
    };
    write("1");
    split.corral(&["apply", "-f", manifest.to_str().unwrap()]);
    wait_for("pod/web to be placed", Duration::from_secs(30), || {
        let pod = split.pod();
        (pod["status"]["node"] == "node-1" && pod["status"]["address"].is_string()).then_some(())
    });
    // Changed before the node made its sandbox: an update in place of a
    // pod that has no sandbox yet.
    write("2");
    split.corral(&["apply", "-f", manifest.to_str().unwrap()]);
    let why = split.corral(&["why", "pod/web"]);
    assert!(why.contains("update workflow update-2"), "{why}");

    split.start_agent();
    let pod = wait_for("pod/web to run revision 2", Duration::from_secs(60), || {
        let pod = split.pod();
        (pod["status"]["phase"] == "Running" && pod["status"]["observedRevision"] == 2)
            .then_some(pod)
    });
    assert_eq!(container_ids(&pod).len(), 1, "{pod}");
    let value = split.corral(&["exec", "pod/web", "--", "sh", "-c", "echo $V"]);
    assert_eq!(value.trim(), "2");
    let why = split.corral(&["why", "pod/web"]);
    assert!(why.contains("update workflow update-2"), "{why}");
    assert!(
        line_of(&why, "node/start-changed-containers").contains('✓'),
        "{why}"
    );
}

/// The line of `text` that mentions `needle`.
fn line_of<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle} in:\n{text}"))
}
