//! Shared end-to-end harness: a real `corral up` process on a temporary
//! data dir and a loopback port, and a way to run the real CLI against it.
//! The process is killed when the harness is dropped, even if a test fails.

#![allow(dead_code)]

pub mod agents;
pub mod lab;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

/// A running `corral up`.
pub struct Cluster {
    pub data_dir: tempfile::TempDir,
    pub config: PathBuf,
    child: Option<Child>,
    /// How long `corral up` took to print its config line.
    pub startup: Duration,
    /// The subcommand and extra flags (`up` by default).
    command: Vec<String>,
}

impl Cluster {
    /// Starts `corral up` on a fresh data dir.
    pub fn start() -> Cluster {
        Cluster::start_with(&["up"])
    }

    /// Starts `corral <command…> --listen 127.0.0.1:0 --data-dir DIR` on a
    /// fresh data dir, e.g. `["server", "--datastore", "etcd://…"]`.
    pub fn start_with(command: &[&str]) -> Cluster {
        let data_dir = tempfile::Builder::new()
            .prefix("corral-e2e-")
            .tempdir()
            .expect("create a temporary data dir");
        let mut cluster = Cluster {
            config: data_dir.path().join("admin.json"),
            data_dir,
            child: None,
            startup: Duration::ZERO,
            command: command.iter().map(|arg| arg.to_string()).collect(),
        };
        cluster.restart();
        cluster
    }

    /// Starts (again) on the same data dir; the previous process must be gone.
    pub fn restart(&mut self) {
        assert!(
            self.child.is_none(),
            "restart: the previous corral up still runs"
        );
        let started = Instant::now();
        let mut child = Command::new(CORRAL)
            .args(&self.command)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(self.data_dir.path())
            .env("CORRAL_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn corral up");
        let stdout = child.stdout.take().expect("corral up stdout");
        self.child = Some(child);
        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let line = received
            .recv_timeout(Duration::from_secs(20))
            .expect("corral up printed no config line within 20 s");
        self.startup = started.elapsed();
        let path = line
            .strip_prefix("export CORRAL_CONFIG=")
            .unwrap_or_else(|| panic!("unexpected first line from corral up: {line:?}"));
        assert_eq!(Path::new(path), self.config);
    }

    /// The process id of the running `corral`.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process with SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process with SIGTERM and waits; returns whether it exited cleanly.
    pub fn terminate(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        let pid = child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// Runs the CLI against this cluster.
    pub fn corral(&self, args: &[&str]) -> Output {
        self.corral_with_stdin(args, None)
    }

    pub fn corral_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut command = Command::new(CORRAL);
        command
            .args(args)
            .env("CORRAL_CONFIG", &self.config)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn corral");
        if let Some(text) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("write stdin");
        }
        child.wait_with_output().expect("wait for corral")
    }

    /// Runs the CLI and insists it succeeds; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.corral(args);
        assert!(
            output.status.success(),
            "corral {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs the CLI and insists it fails; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let output = self.corral(args);
        assert!(
            !output.status.success(),
            "corral {args:?} should have failed but printed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// `get KIND/NAME -o json` parsed.
    pub fn get_json(&self, target: &str) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["get", target, "-o", "json"])).expect("get -o json is JSON")
    }

    /// Writes a manifest into the data dir and returns its path.
    pub fn manifest(&self, name: &str, text: &str) -> String {
        let path = self.data_dir.path().join(name);
        std::fs::write(&path, text).expect("write manifest");
        path.to_string_lossy().into_owned()
    }

    /// The config the cluster wrote (server URL and admin token).
    pub fn client_config(&self) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&self.config).expect("read config"))
            .expect("config is JSON")
    }
}

impl Drop for Cluster {
    /// Kills `corral up` and removes what its node agent left behind (it
    /// keeps containers and pod sandboxes across its own exits by design).
    fn drop(&mut self) {
        self.kill9();
        cleanup_node(self.data_dir.path());
    }
}

/// A one-container pod manifest with the given image and message-free env.
pub fn pod_manifest(name: &str, image: &str) -> String {
    format!(
        "kind: Pod\nmetadata: {{name: {name}, labels: {{app: {name}}}}}\nspec:\n  containers:\n    - name: {name}\n      image: {image}\n      command: [httpd, -f, -p, \"8080\"]\n      env: {{GREETING: hello}}\n      ports: [8080]\n"
    )
}

/// Removes what a node agent left on this machine under `data_dir`:
/// containers of both runtimes, then every mount below the data dir
/// (overlay rootfs, network namespace files). The agent keeps containers
/// running across its own restarts by design, so tests must do this.
pub fn cleanup_node(data_dir: &Path) {
    for (binary, state) in [("runc", "runc"), ("runsc", "runsc")] {
        let root = data_dir.join(state);
        if !root.exists() {
            continue;
        }
        let listed = Command::new(binary)
            .arg(format!("--root={}", root.display()))
            // runsc knows only `--quiet` (`-q` prints its usage, no ids).
            .args(["list", "--quiet"])
            .output();
        if let Ok(listed) = listed {
            for id in String::from_utf8_lossy(&listed.stdout).lines() {
                let _ = Command::new(binary)
                    .arg(format!("--root={}", root.display()))
                    .args(["delete", "--force", id.trim()])
                    .status();
            }
        }
    }
    let prefix = data_dir.to_string_lossy().into_owned();
    // QEMU processes of the node's VMs (their sockets are under the data
    // dir), and any gVisor sandbox or gofer runsc left behind.
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if (cmdline.starts_with("qemu-system") || cmdline.starts_with("runsc"))
            && cmdline.contains(&prefix)
        {
            let _ = Command::new("kill")
                .arg("-9")
                .arg(entry.file_name())
                .status();
        }
    }
    corral_runtime::mounts::unmount_all_under(data_dir);
    corral_agent::leftover_cgroups::remove(data_dir);
}

/// Polls `check` every 100 ms until it returns `Some`, or panics with
/// `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, check: impl FnMut() -> Option<T>) -> T {
    wait_for_explained(what, timeout, check, String::new)
}

/// [`wait_for`], adding to the failure what `explain` finds once the time
/// is up (`corral why` of what did not happen, say).
pub fn wait_for_explained<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
    explain: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                explain()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A `corral up` whose node can run pods: root and runc are required (the
/// test fails, never skips, without them) and the busybox image
/// (`local/busybox:1`) is imported. Dropping it removes everything.
pub fn start_node() -> Cluster {
    corral_testkit::require_root();
    corral_testkit::require_tool("runc");
    let cluster = Cluster::start();
    import_busybox(&cluster, None);
    cluster
}

/// Applies Policy `name`, granting `relaxations` to namespace `default`
/// (the cluster's half of a two-party opt-in).
pub fn grant(cluster: &Cluster, name: &str, relaxations: &[&str]) {
    let policy = format!(
        "kind: Policy\nmetadata: {{name: {name}}}\nspec:\n  namespaces: [default]\n  grant: [{}]\n",
        relaxations.join(", ")
    );
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest(&format!("policy-{name}.yaml"), &policy),
    ]);
}

/// Imports the busybox image into the node's store (`local/busybox:1`, or
/// `name`), straight into its data dir.
pub fn import_busybox(cluster: &Cluster, name: Option<&str>) {
    let tar = corral_testkit::busybox_image_tar(
        cluster.data_dir.path(),
        corral_testkit::ImageFormat::OciLayout,
    );
    let data_dir = cluster.data_dir.path().to_string_lossy().into_owned();
    let tar = tar.to_string_lossy().into_owned();
    let mut args = vec!["image", "import", tar.as_str(), "--data-dir", &data_dir];
    if let Some(name) = name {
        args.extend(["--name", name]);
    }
    cluster.ok(&args);
}
