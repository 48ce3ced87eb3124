//! A node comes back from a reboot on its own (issue 21, item 6). Pods
//! run (three under `corral up`, twenty under a lone agent); then the node
//! is left as a reboot leaves it — every container killed, every mount
//! under the data dir gone (overlay rootfs, the pinned namespace files, the
//! data tmpfs), every pod namespace and veth gone with them, the cgroups
//! gone — while the data dir (pod records, runc's state dirs, images) stays
//! as it was. Started again on the same data dir, the agent must find every
//! sandbox stale, rebuild it and run every pod again with its address:
//! under `corral up` (control plane up), and as a lone `corral agent` with
//! the API server down (it reports the recovery when the server returns).
//! The simulated reboot and the check that a pod runs again are
//! `corral_testkit::reboot`, shared with `corral-bench reboot-recovery`,
//! which measures the recovery in a release build. Real runc, root.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{CORRAL, cleanup_node, pod_manifest, wait_for};
use corral_testkit::reboot::{self, Running};
use corral_testkit::{ImageFormat, busybox_image_tar, require_root, require_tool};
use serde_json::{Value, json};

/// The pods of the test under `corral up`.
const PODS: [&str; 3] = ["web-a", "web-b", "web-c"];

/// How many pods the lone agent recovers (the measure: time to
/// all-running for 20 pods after the agent starts).
const LONE_PODS: usize = 20;

/// How long the recovered pods may take to run again.
const RECOVERY_BOUND: Duration = Duration::from_secs(30);

/// Every pod of the record set running locally
/// ([`reboot::all_running`]); otherwise `None`, and what is missing is
/// printed (once a second at most).
fn all_running(data_dir: &Path, pods: usize) -> Option<Vec<Running>> {
    match reboot::all_running(data_dir, pods) {
        Ok(running) => Some(running),
        Err(missing) => {
            static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
            let mut last = LAST.lock().unwrap();
            if last.is_none_or(|at| at.elapsed() > Duration::from_secs(1)) {
                eprintln!("not yet: {missing}");
                *last = Some(Instant::now());
            }
            None
        }
    }
}

/// Waits until the node has admitted every pod: killed before its start
/// workflow is done, a pod would be started by that workflow again rather
/// than recovered.
fn wait_admitted(data_dir: &Path) {
    wait_for("the pods to be admitted", Duration::from_secs(60), || {
        local_records(data_dir)
            .iter()
            .all(reboot::admitted)
            .then_some(())
    });
}

/// The agent's pod records.
fn local_records(data_dir: &Path) -> Vec<Value> {
    reboot::local_records(data_dir)
        .unwrap()
        .into_iter()
        .map(|(_, record)| record)
        .collect()
}

/// The pod's httpd answers on its address from the host (through its veth).
fn answers(address: &str) -> bool {
    let to: SocketAddr = format!("[{address}]:8080").parse().unwrap();
    let Ok(mut stream) = TcpStream::connect_timeout(&to, Duration::from_secs(2)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(b"GET / HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.")
}

/// The running pods, each with a new container, the same address and
/// the same restart count as before the reboot (a reboot is no crash).
fn assert_recovered(before: &[Running], after: &[Running]) {
    for (old, new) in before.iter().zip(after) {
        assert_ne!(
            old.runtime_ids, new.runtime_ids,
            "{new:?} was not started again"
        );
        assert_eq!(old.address, new.address);
        assert_eq!(
            old.restarts, new.restarts,
            "the reboot counted as a crash restart"
        );
        assert!(
            answers(&new.address),
            "{new:?} does not answer on its address"
        );
    }
}

fn apply_pods(dir: &Path, names: &[String], apply: impl Fn(&str)) {
    for name in names {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, pod_manifest(name, "local/busybox:1")).unwrap();
        apply(path.to_str().unwrap());
    }
}

#[test]
fn pods_come_back_after_a_reboot_with_the_control_plane_up() {
    let mut cluster = common::start_node();
    let names: Vec<String> = PODS.iter().map(|name| name.to_string()).collect();
    apply_pods(cluster.data_dir.path(), &names, |path| {
        cluster.ok(&["apply", "-f", path]);
    });
    let data_dir = cluster.data_dir.path().to_path_buf();
    let before = wait_for("three pods to run", Duration::from_secs(60), || {
        all_running(&data_dir, PODS.len())
    });
    wait_admitted(&data_dir);

    cluster.kill9();
    reboot::simulate_reboot(&data_dir).unwrap();
    let started = Instant::now();
    cluster.restart();
    let after = wait_for(
        "every pod to run again after the reboot",
        RECOVERY_BOUND,
        || all_running(&data_dir, PODS.len()),
    );
    eprintln!(
        "all {} pods running again {:?} after corral up started",
        PODS.len(),
        started.elapsed()
    );
    assert_recovered(&before, &after);

    for (name, running) in PODS.iter().zip(&after) {
        let target = format!("pod/{name}");
        let pod = wait_for(
            &format!("{target} to report Running"),
            Duration::from_secs(20),
            || {
                let pod = cluster.get_json(&target);
                (pod["status"]["phase"] == "Running").then_some(pod)
            },
        );
        assert_eq!(pod["status"]["address"], json!(running.address));
        // `why` tells the recovery as a workflow of its own.
        let why = wait_for(
            &format!("why {target} to show the recovery"),
            Duration::from_secs(20),
            || {
                let why = cluster.ok(&["why", &target]);
                why.contains("recover workflow finished").then_some(why)
            },
        );
        for step in [
            "node/check-sandbox",
            "node/clear-stale-sandbox",
            "node/create-sandbox",
            "node/prepare-volumes",
            "node/start-containers",
        ] {
            assert!(why.contains(step), "{why}");
        }
        let steps = cluster.ok(&["logs", "--steps", &target, "--step", "node/check-sandbox"]);
        assert!(
            steps.contains("network namespace is gone"),
            "the step log says what was stale: {steps}"
        );
    }
}

/// A server and a lone agent on their own data dirs (as in autonomy.rs),
/// removed on drop.
struct Split {
    dir: tempfile::TempDir,
    port: u16,
    server: Option<Child>,
    agent: Option<Child>,
    node_token: String,
}

impl Split {
    fn server_dir(&self) -> PathBuf {
        self.dir.path().join("server")
    }

    fn agent_dir(&self) -> PathBuf {
        self.dir.path().join("agent")
    }

    fn start_server(&mut self) {
        let mut child = Command::new(CORRAL)
            .args(["server", "--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--data-dir")
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
            ])
            .arg("--ca")
            .arg(self.server_dir().join("tls").join("ca.pem"))
            // In the host's own namespace: never turn on its forwarding.
            .args(["--forwarding", "pod-links", "--token", &self.node_token])
            .args(["--name", "node-1", "--data-dir"])
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
            .env("CORRAL_CONFIG", self.server_dir().join("admin.json"))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "corral {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
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

#[test]
fn the_agent_alone_recovers_its_pods_with_the_control_plane_down() {
    require_root();
    require_tool("runc");
    let mut split = Split {
        dir: tempfile::Builder::new()
            .prefix("corral-reboot-")
            .tempdir()
            .unwrap(),
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
    let names: Vec<String> = (0..LONE_PODS).map(|i| format!("web-{i:02}")).collect();
    apply_pods(split.dir.path(), &names, |path| {
        split.corral(&["apply", "-f", path]);
    });
    let before = wait_for("the pods to run", Duration::from_secs(180), || {
        all_running(&agent_dir, LONE_PODS)
    });
    wait_admitted(&agent_dir);

    // The whole node reboots; only the agent comes back.
    Split::kill(&mut split.agent);
    Split::kill(&mut split.server);
    reboot::simulate_reboot(&agent_dir).unwrap();
    let started = Instant::now();
    split.start_agent();
    let after = wait_for(
        "every pod to run again from local state alone",
        RECOVERY_BOUND,
        || all_running(&agent_dir, LONE_PODS),
    );
    eprintln!(
        "all {LONE_PODS} pods running again {:?} after the lone agent started",
        started.elapsed()
    );
    assert_recovered(&before, &after);
    assert!(
        local_records(&agent_dir)
            .iter()
            .all(|record| record["recovery"]["steps"]
                .as_array()
                .is_some_and(|s| s.len() == 5)),
        "each record keeps its recovery for the API"
    );

    // The server returns: each pod's recovery is reported, and shown.
    split.start_server();
    for name in &names {
        let target = format!("pod/{name}");
        let why = wait_for(
            &format!("why {target} to show the recovery"),
            Duration::from_secs(30),
            || {
                let why = split.corral(&["why", &target]);
                why.contains("recover workflow finished").then_some(why)
            },
        );
        assert!(why.contains("node/start-containers"), "{why}");
    }
    wait_for(
        "the reported recoveries to leave local state",
        Duration::from_secs(20),
        || {
            local_records(&agent_dir)
                .iter()
                .all(|record| record.get("recovery").is_none())
                .then_some(())
        },
    );
    // Nothing healthy restarts once the API is back.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(all_running(&agent_dir, LONE_PODS), Some(after));
}
