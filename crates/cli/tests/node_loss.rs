//! Node loss end to end with two real agents on one server: freeze one
//! agent (SIGSTOP) and its `availability: ha` pod runs on the other node
//! after the grace while its best-effort pod stays bound; thaw it
//! (SIGCONT) and it stops the stale ha copy (fencing) before it reports
//! Ready. Both agents join with one join token and keep the identity they
//! get. Real runc, root; fails (never skips) without them.

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

/// One server and two agents, killed and cleaned up on drop.
struct TwoNodes {
    dir: tempfile::TempDir,
    port: u16,
    server: Option<Child>,
    agents: Vec<Child>,
}

impl TwoNodes {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn corral(&self, args: &[&str]) -> String {
        let output = Command::new(CORRAL)
            .args(args)
            .env("CORRAL_CONFIG", self.path("server").join("admin.json"))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "corral {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn json(&self, target: &str) -> Value {
        serde_json::from_str(&self.corral(&["get", target, "-o", "json"])).unwrap()
    }

    /// Starts node `name`'s agent with a join token, which it exchanges
    /// for its own identity on first start.
    fn start_agent(&mut self, name: &str, join: &str, tar: &Path) {
        let dir = self.path(name);
        self.corral(&[
            "image",
            "import",
            tar.to_str().unwrap(),
            "--data-dir",
            dir.to_str().unwrap(),
        ]);
        let child = Command::new(CORRAL)
            .args([
                "agent",
                "--server",
                &format!("https://127.0.0.1:{}", self.port),
                "--ca",
            ])
            .arg(self.path("server").join("tls").join("ca.pem"))
            .args(["--join-token", join, "--name", name])
            // Two agents share this host's network namespace: no pod
            // network (routes, DNS, forwarding) for either.
            .arg("--no-pod-network")
            .arg("--data-dir")
            .arg(&dir)
            .env("CORRAL_LOG", "warn")
            .spawn()
            .unwrap();
        self.agents.push(child);
    }

    fn signal(&self, agent: usize, signal: &str) {
        let pid = self.agents[agent].id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        for index in 0..self.agents.len() {
            // A frozen agent must run again to die cleanly.
            let _ = Command::new("kill")
                .args(["-CONT", &self.agents[index].id().to_string()])
                .status();
        }
        for agent in &mut self.agents {
            let _ = agent.kill();
            let _ = agent.wait();
        }
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        cleanup_node(&self.path("node-a"));
        cleanup_node(&self.path("node-b"));
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn pod(name: &str, availability: &str) -> String {
    format!(
        "kind: Pod\nmetadata: {{name: {name}}}\nspec:\n  availability: {availability}\n  terminationGraceSeconds: 0\n  containers:\n    - {{name: main, image: local/busybox:1, command: [sleep, \"3600\"]}}\n"
    )
}

fn node_spec(name: &str, unschedulable: bool) -> String {
    format!("kind: Node\nmetadata: {{name: {name}}}\nspec: {{unschedulable: {unschedulable}}}\n")
}

/// (node, phase) of a pod.
fn placed(nodes: &TwoNodes, name: &str) -> (String, String) {
    let pod = nodes.json(&format!("pod/{name}"));
    (
        pod["status"]["node"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        pod["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn apply(nodes: &TwoNodes, file: &str, text: &str) {
    let path = nodes.path(file);
    std::fs::write(&path, text).unwrap();
    nodes.corral(&["apply", "-f", path.to_str().unwrap()]);
}

#[test]
fn ha_pods_move_off_a_silent_node_and_the_stale_copy_is_fenced() {
    require_root();
    require_tool("runc");
    let mut nodes = TwoNodes {
        dir: tempfile::Builder::new()
            .prefix("corral-node-loss-")
            .tempdir()
            .unwrap(),
        port: free_port(),
        server: None,
        agents: Vec::new(),
    };
    let mut server = Command::new(CORRAL)
        .args(["server", "--listen", &format!("127.0.0.1:{}", nodes.port)])
        .args(["--silent-after", "8", "--ha-grace", "3", "--data-dir"])
        .arg(nodes.path("server"))
        .env("CORRAL_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    nodes.server = Some(server);
    let tar = busybox_image_tar(nodes.dir.path(), ImageFormat::DockerArchive);
    // One join token serves both nodes.
    let join = nodes.corral(&["token", "create", "--join", "--ttl", "10m"]);
    nodes.start_agent("node-a", join.trim(), &tar);
    nodes.start_agent("node-b", join.trim(), &tar);
    for name in ["node-a", "node-b"] {
        wait_for(
            &format!("{name} to be Ready"),
            Duration::from_secs(60),
            || {
                // Not found until the agent registers: keep waiting.
                let output = Command::new(CORRAL)
                    .args(["get", &format!("node/{name}"), "-o", "json"])
                    .env("CORRAL_CONFIG", nodes.path("server").join("admin.json"))
                    .output()
                    .ok()?;
                let node: Value = serde_json::from_slice(&output.stdout).ok()?;
                (node["status"]["phase"] == "Ready").then_some(())
            },
        );
        // It holds its own identity now, kept private in its data dir.
        let kept = nodes.path(name).join(format!("node-{name}.json"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&kept)
                .expect("node-NAME.json")
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{}", kept.display());
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(&kept).expect("read node-NAME.json"))
                .expect("json");
        let token = config["token"].as_str().expect("a token");
        assert_ne!(token, join.trim(), "the join token was exchanged");
    }

    // Both pods on node-b: cordon node-a while they are placed.
    apply(&nodes, "cordon.yaml", &node_spec("node-a", true));
    apply(&nodes, "ha.yaml", &pod("ha", "ha"));
    apply(&nodes, "best.yaml", &pod("best", "best-effort"));
    for name in ["ha", "best"] {
        wait_for(
            &format!("{name} to run on node-b"),
            Duration::from_secs(60),
            || (placed(&nodes, name) == ("node-b".into(), "Running".into())).then_some(()),
        );
    }
    apply(&nodes, "uncordon.yaml", &node_spec("node-a", false));
    let ha_uid = nodes.json("pod/ha")["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let record = nodes.path("node-b").join("agent/pods/default_ha.json");
    assert!(record.exists(), "node-b keeps a record of pod/ha");

    // Cut node-b off: its agent freezes, its containers keep running.
    nodes.signal(1, "-STOP");
    wait_for("node-b to be Silent", Duration::from_secs(60), || {
        (nodes.json("node/node-b")["status"]["phase"] == "Silent").then_some(())
    });
    wait_for("pod/ha to run on node-a", Duration::from_secs(90), || {
        (placed(&nodes, "ha") == ("node-a".into(), "Running".into())).then_some(())
    });
    let best = placed(&nodes, "best");
    assert_eq!(best.0, "node-b", "the best-effort pod stays bound");
    // The node itself, and what runs on it, answer for now.
    let why_node = nodes.corral(&["why", "node/node-b"]);
    assert!(
        why_node
            .lines()
            .next()
            .unwrap_or_default()
            .contains("is not healthy: it is silent since"),
        "{why_node}"
    );
    // Its start succeeded long ago; why answers for now: its node.
    let why_best = nodes.corral(&["why", "pod/best"]);
    let verdict = why_best.lines().next().unwrap_or_default();
    assert!(
        verdict
            .starts_with("pod/best (revision 1) is not healthy: its node node-b is silent since"),
        "{why_best}"
    );
    let moved = nodes.json("pod/ha");
    assert_eq!(
        moved["metadata"]["uid"],
        ha_uid.as_str(),
        "the same pod moved"
    );
    let why = nodes.corral(&["why", "pod/ha"]);
    assert!(why.contains("move"), "{why}");
    // History shows the move as a system change, saying why.
    let history: Vec<Value> =
        serde_json::from_str(&nodes.corral(&["history", "pod/ha", "-o", "json"])).expect("json");
    let last = history.last().expect("a history record");
    assert_eq!(last["class"], "system", "{history:?}");
    assert_eq!(last["author"], "scheduler", "{history:?}");
    let message = last["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("moved off node-b: the node is silent since"),
        "{history:?}"
    );
    assert_eq!(last["revision"], moved["metadata"]["revision"]);
    // The stale copy still runs on the frozen node.
    assert!(
        record.exists(),
        "node-b cannot have stopped it while frozen"
    );

    // Heal: node-b fences before it reports Ready.
    nodes.signal(1, "-CONT");
    wait_for(
        "node-b to stop its stale copy",
        Duration::from_secs(90),
        || (!record.exists()).then_some(()),
    );
    wait_for("node-b to be Ready again", Duration::from_secs(60), || {
        (nodes.json("node/node-b")["status"]["phase"] == "Ready").then_some(())
    });
    let ha = placed(&nodes, "ha");
    let why = nodes.corral(&["why", "pod/ha"]);
    assert_eq!(ha, ("node-a".into(), "Running".into()), "{why}");
    assert_eq!(placed(&nodes, "best"), ("node-b".into(), "Running".into()));

    // Pinning a pod to another node moves it there: same uid, the old
    // node stops its copy.
    let best_uid = nodes.json("pod/best")["metadata"]["uid"].clone();
    let pinned = pod("best", "best-effort").replace(
        "  availability: best-effort\n",
        "  availability: best-effort\n  placement: {node: node-a}\n",
    );
    apply(&nodes, "best-pinned.yaml", &pinned);
    wait_for("pod/best to run on node-a", Duration::from_secs(90), || {
        let pod = nodes.json("pod/best");
        let here = pod["status"]["node"] == "node-a"
            && pod["status"]["phase"] == "Running"
            && pod["status"]["observedRevision"] == 3;
        here.then_some(())
    });
    // Revision 2 is the operator's pin, revision 3 the scheduler's move.
    let history: Vec<Value> =
        serde_json::from_str(&nodes.corral(&["history", "pod/best", "-o", "json"])).expect("json");
    let summary: Vec<(&str, &str, &str)> = history
        .iter()
        .map(|record| {
            (
                record["author"].as_str().unwrap_or_default(),
                record["class"].as_str().unwrap_or_default(),
                record["message"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        summary[1..],
        [
            ("admin", "external", ""),
            (
                "scheduler",
                "system",
                "moved off node-b: spec.placement.node names node-a"
            )
        ],
        "{history:?}"
    );
    assert_eq!(nodes.json("pod/best")["metadata"]["uid"], best_uid);
    let best_record = nodes.path("node-b").join("agent/pods/default_best.json");
    wait_for(
        "node-b to stop its copy of pod/best",
        Duration::from_secs(60),
        || (!best_record.exists()).then_some(()),
    );
}
