//! One `corral server` and real agents (`corral agent`) on this host, each
//! with its own data dir and no pod network (they share the host's network
//! namespace); all killed and their nodes cleaned up on drop, even when a
//! test fails.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{CORRAL, cleanup_node, wait_for};

pub struct Agents {
    pub dir: tempfile::TempDir,
    pub port: u16,
    server: Option<Child>,
    pub agents: Vec<(String, Child)>,
}

impl Agents {
    /// Starts `corral server` on a free loopback port and a fresh data dir
    /// (prefixed `prefix`).
    pub fn start(prefix: &str) -> Agents {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("create a temporary dir");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        let mut agents = Agents {
            dir,
            port,
            server: None,
            agents: Vec::new(),
        };
        let mut server = Command::new(CORRAL)
            .args(["server", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(agents.path("server"))
            .env(
                "CORRAL_LOG",
                std::env::var("DRAIN_LOG").unwrap_or("warn".into()),
            )
            .stdout(Stdio::piped())
            .spawn()
            .expect("start corral server");
        // Its first line says it serves.
        let mut line = String::new();
        BufReader::new(server.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read the server's first line");
        agents.server = Some(server);
        agents
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn try_corral(&self, args: &[&str]) -> Result<String, String> {
        let output = Command::new(CORRAL)
            .args(args)
            .env("CORRAL_CONFIG", self.path("server").join("admin.json"))
            .output()
            .expect("run corral");
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    pub fn corral(&self, args: &[&str]) -> String {
        self.try_corral(args)
            .unwrap_or_else(|error| panic!("corral {args:?}: {error}"))
    }

    /// `get TARGET -o json` parsed.
    pub fn json(&self, target: &str) -> Value {
        serde_json::from_str(&self.corral(&["get", target, "-o", "json"]))
            .expect("get -o json is JSON")
    }

    /// Starts node `name`'s agent with a join token, after importing the
    /// image archive `tar` into its data dir.
    pub fn start_agent(&mut self, name: &str, join: &str, tar: &Path) {
        let dir = self.path(name);
        self.corral(&[
            "image",
            "import",
            &tar.to_string_lossy(),
            "--data-dir",
            &dir.to_string_lossy(),
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
            // The agents share this host's network namespace: no pod network.
            .arg("--no-pod-network")
            .arg("--data-dir")
            .arg(&dir)
            .env("CORRAL_LOG", "warn")
            .spawn()
            .expect("start corral agent");
        self.agents.push((name.to_string(), child));
    }

    /// The running agent process of node `name`.
    pub fn agent(&mut self, name: &str) -> &mut Child {
        self.agents
            .iter_mut()
            .find(|(node, _)| node == name)
            .map(|(_, child)| child)
            .unwrap_or_else(|| panic!("no agent {name} was started"))
    }

    pub fn wait_ready(&self, name: &str) {
        wait_for(
            &format!("{name} to be Ready"),
            Duration::from_secs(60),
            || {
                let node: Value = serde_json::from_str(
                    &self
                        .try_corral(&["get", &format!("node/{name}"), "-o", "json"])
                        .ok()?,
                )
                .ok()?;
                (node["status"]["phase"] == "Ready").then_some(())
            },
        );
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for (_, agent) in &mut self.agents {
            let _ = agent.kill();
            let _ = agent.wait();
        }
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        for (name, _) in &self.agents {
            cleanup_node(&self.path(name));
        }
    }
}
