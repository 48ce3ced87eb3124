//! A `corral lab` for a test: built in its own directory under /run, the
//! CLI run inside its nodes, and taken down on drop even when the test
//! fails (unless CORRAL_TEST_KEEP_LAB is set, to look at it afterwards).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::CORRAL;

/// A busybox httpd pod (`app: web`) serving the image's /etc on port 8080,
/// pinned to `node`.
pub fn httpd_pod(name: &str, node: &str) -> String {
    format!(
        "kind: Pod\nmetadata: {{name: {name}, labels: {{app: web}}}}\nspec:\n  placement: {{node: {node}}}\n  containers:\n    - name: web\n      image: local/busybox:1\n      command: [httpd, -f, -p, \"8080\", -h, /etc]\n      ports: [8080]\n"
    )
}

pub struct Lab {
    pub dir: PathBuf,
    /// The lab's `lab.json`.
    pub state: serde_json::Value,
}

impl Lab {
    /// `corral lab up --nodes N --image IMAGE FLAGS…` in a fresh directory
    /// named after `name`; insists it succeeds.
    pub fn up(name: &str, nodes: usize, image: &Path, flags: &[&str]) -> Lab {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut lab = Lab {
            dir: PathBuf::from(format!(
                "/run/corral-{name}-test-{}-{nanos:x}",
                std::process::id()
            )),
            state: serde_json::Value::Null,
        };
        let output = Command::new(CORRAL)
            .args(["lab", "up", "--nodes", &nodes.to_string()])
            .args(flags)
            .arg("--dir")
            .arg(&lab.dir)
            .arg("--image")
            .arg(image)
            .output()
            .expect("run corral lab up");
        assert!(
            output.status.success(),
            "corral lab up {flags:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        lab.state = serde_json::from_str(
            &std::fs::read_to_string(lab.dir.join("lab.json")).expect("lab.json"),
        )
        .expect("lab.json is JSON");
        lab
    }

    /// `corral lab ARGS --dir DIR`.
    pub fn lab(&self, args: &[&str]) -> Output {
        Command::new(CORRAL)
            .arg("lab")
            .args(args)
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .expect("run corral lab")
    }

    /// [`Lab::lab`], insisting it succeeds.
    pub fn lab_ok(&self, args: &[&str]) {
        let output = self.lab(args);
        assert!(output.status.success(), "corral lab {args:?}: {output:?}");
    }

    /// `corral lab exec` of `command` in `node`, not yet run.
    pub fn command(&self, node: &str, command: &[&str]) -> Command {
        let mut lab = Command::new(CORRAL);
        lab.args(["lab", "exec", "--dir"])
            .arg(&self.dir)
            .args(["--node", node, "--"])
            .args(command);
        lab
    }

    /// Runs `command` in `node`'s namespace; returns the output.
    pub fn exec(&self, node: &str, command: &[&str]) -> Output {
        self.command(node, command)
            .output()
            .expect("run corral lab exec")
    }

    /// Runs `command` in `node`'s namespace and insists it succeeds.
    pub fn run(&self, node: &str, command: &[&str]) -> String {
        let output = self.exec(node, command);
        assert!(
            output.status.success(),
            "{command:?} in {node} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The CLI against the lab's API (from node-0); insists it succeeds.
    pub fn corral(&self, args: &[&str]) -> String {
        self.try_corral(args)
            .unwrap_or_else(|error| panic!("corral {args:?} failed: {error}"))
    }

    /// The CLI against the lab's API: its stdout, or what it printed when
    /// it failed.
    pub fn try_corral(&self, args: &[&str]) -> Result<String, String> {
        let mut command = vec![CORRAL];
        command.extend_from_slice(args);
        let output = self.exec("node-0", &command);
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    /// `corral get OBJECT -o json`, if it exists and parses.
    pub fn json(&self, object: &str) -> Option<serde_json::Value> {
        let text = self.try_corral(&["get", object, "-o", "json"]).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// A field of node `index` in `lab.json` (`name`, `ipv6`, `ipv4`, …).
    pub fn node_field(&self, index: usize, field: &str) -> String {
        self.state["nodes"][index][field]
            .as_str()
            .unwrap_or_else(|| panic!("lab.json has no nodes[{index}].{field}"))
            .to_string()
    }

    /// `pod` fetches `url` with busybox wget (bounded by `timeout`, since
    /// busybox 1.35's `wget -T` crashes): the body, or what went wrong.
    pub fn fetch(&self, pod: &str, url: &str) -> Result<String, String> {
        self.try_corral(&[
            "exec",
            &format!("pod/{pod}"),
            "--",
            "busybox",
            "timeout",
            "5",
            "wget",
            "-qO-",
            url,
        ])
    }

    /// Waits for pod `name` to run and returns its `status.address`.
    pub fn running_address(&self, name: &str) -> String {
        super::wait_for(
            &format!("pod {name} running with an address"),
            std::time::Duration::from_secs(90),
            || {
                let pod = self.json(&format!("pod/{name}"))?;
                (pod["status"]["phase"] == "Running")
                    .then(|| pod["status"]["address"].as_str().map(str::to_string))?
            },
        )
    }

    /// corral's routes (protocol 87) in `node`.
    pub fn routes(&self, node: &str) -> String {
        self.run(node, &["ip", "-6", "route", "show", "proto", "87"])
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::env::var_os("CORRAL_TEST_KEEP_LAB").is_some() {
            eprintln!(
                "CORRAL_TEST_KEEP_LAB: the lab stays in {}",
                self.dir.display()
            );
            return;
        }
        // `lab down` ends every process the lab runs, also those a test
        // started with `lab exec`.
        let output = Command::new(CORRAL)
            .args(["lab", "down", "--dir"])
            .arg(&self.dir)
            .output();
        if let Ok(output) = output
            && !output.status.success()
        {
            eprintln!(
                "corral lab down failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

/// A namespace on the lab's bridge that is not a node: the "internet"
/// (removed with the lab's directory).
pub struct OutsideHost {
    pub netns: PathBuf,
    pub ipv4: String,
}

impl OutsideHost {
    pub fn create(lab: &Lab) -> OutsideHost {
        let netns = lab.dir.join("netns").join("outside");
        let hub = lab.dir.join("netns").join("hub");
        let ipv4 = "192.168.87.200".to_string();
        corral_net::netns::create(&netns).expect("create outside namespace");
        let run = |ns: &Path, args: &[&str]| {
            let status = corral_net::netns::output(Some(ns), Command::new("ip").args(args))
                .expect("enter namespace")
                .expect("run ip");
            assert!(status.status.success(), "ip {args:?}: {status:?}");
        };
        run(
            &hub,
            &[
                "link", "add", "out0", "type", "veth", "peer", "name", "out0p",
            ],
        );
        run(&hub, &["link", "set", "out0", "master", "br0", "up"]);
        // `ip link set … netns PID` needs a process inside the target namespace.
        let mut holder = corral_net::netns::spawn(Some(&netns), Command::new("sleep").arg("60"))
            .expect("enter outside namespace")
            .expect("run sleep");
        run(
            &hub,
            &["link", "set", "out0p", "netns", &holder.id().to_string()],
        );
        let _ = holder.kill();
        let _ = holder.wait();
        run(
            &netns,
            &["addr", "add", &format!("{ipv4}/24"), "dev", "out0p"],
        );
        run(&netns, &["link", "set", "out0p", "up"]);
        OutsideHost { netns, ipv4 }
    }

    pub fn listen(&self) -> TcpListener {
        let to: SocketAddr = format!("{}:9000", self.ipv4).parse().expect("address");
        corral_net::netns::run_in(&self.netns, move || TcpListener::bind(to))
            .expect("enter outside namespace")
            .expect("listen in outside namespace")
    }
}

/// Accepts one connection, answers like a web server, returns the peer.
pub fn accept_one(listener: &TcpListener) -> SocketAddr {
    listener
        .set_nonblocking(true)
        .expect("nonblocking listener");
    let (mut stream, peer) = super::wait_for(
        "a connection from the pod or VM",
        Duration::from_secs(30),
        || listener.accept().ok(),
    );
    stream.set_nonblocking(false).expect("blocking stream");
    let mut request = [0u8; 1024];
    let _ = stream.read(&mut request);
    let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\noutside\n");
    peer
}
