//! Starting the systems under test (`corral up`, a single-member `etcd`) on
//! free loopback ports with temporary data dirs, and always stopping them:
//! every process is killed and reaped when its guard drops, which happens on
//! success, on error, on panic and (through `main`'s signal handling) on
//! Ctrl-C.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use corral_client::ClientConfig;
use tempfile::TempDir;

/// How long a system may take to become healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A child process that is killed and reaped when dropped. Its stderr goes
/// to a log file, shown when it fails to start.
#[derive(Debug)]
pub struct ProcessGuard {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl ProcessGuard {
    pub(crate) fn spawn(
        name: &'static str,
        mut command: Command,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let stderr = File::create(&log)
            .with_context(|| format!("cannot create log file {}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", command.get_program()))?;
        Ok(ProcessGuard { name, child, log })
    }

    /// Fails with the log's tail if the process has exited.
    pub(crate) fn ensure_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!(
                "{} exited ({status}); last lines of its log:\n{}",
                self.name,
                log_tail(&self.log)
            ),
            Err(error) => Err(error).with_context(|| format!("cannot check on {}", self.name)),
        }
    }

    fn failure(&self, what: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "{} {what}; last lines of its log:\n{}",
            self.name,
            log_tail(&self.log)
        )
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        // Errors mean it already exited; either way it is reaped below.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A free TCP port on loopback. Another process could take it before it is
/// used; on a benchmark machine that is unlikely and fails loudly.
pub fn free_loopback_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("cannot bind loopback")?;
    Ok(listener.local_addr()?.port())
}

/// Polls `url` until it answers 2xx, the process exits, or time runs out.
async fn wait_healthy(guard: &mut ProcessGuard, url: &str, ca: Option<&str>) -> anyhow::Result<()> {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(2));
    if let Some(ca) = ca {
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes())?);
    }
    let http = builder.build()?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        guard.ensure_running()?;
        if let Ok(response) = http.get(url).send().await
            && response.status().is_success()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(guard.failure(&format!("did not become healthy at {url}")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `corral up` on a temporary data dir and a free loopback port. Its node
/// agent may have started containers, which outlive the agent by design:
/// dropping this kills `corral up`, then removes every container, mount and
/// pod cgroup it left ([`crate::node::cleanup`]), then the data dir.
#[derive(Debug)]
pub struct CorralProcess {
    // Declared before the dir so the process dies before its dir is removed.
    guard: ProcessGuard,
    pub config: ClientConfig,
    /// Where `config` is on disk (the admin config corral wrote).
    config_path: PathBuf,
    /// UIDs of pods the benchmark created, whose cgroups are removed at the
    /// end even if the agent already forgot the pod.
    pod_uids: std::sync::Mutex<Vec<String>>,
    temp_dir: TempDir,
}

impl CorralProcess {
    pub async fn start(binary: &Path) -> anyhow::Result<Self> {
        Self::start_with(binary, &["up"]).await
    }

    /// Starts `corral <command…>` (e.g. `server --datastore etcd://…`).
    pub async fn start_with(binary: &Path, command_args: &[&str]) -> anyhow::Result<Self> {
        if !binary.is_file() {
            bail!(
                "corral binary not found at {}; build it with `cargo build --release -p corral-cli` \
                 (same CARGO_TARGET_DIR) or pass --corral PATH",
                binary.display()
            );
        }
        let data_dir = tempfile::Builder::new().prefix("corral-bench-").tempdir()?;
        let mut command = Command::new(binary);
        command
            .args(command_args)
            .arg("--data-dir")
            .arg(data_dir.path().join("corral"))
            .args(["--listen", "127.0.0.1:0"])
            .env(
                "CORRAL_LOG",
                std::env::var("CORRAL_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped());
        // CORRAL_BENCH_LOG=PATH keeps corral's log after the run (with
        // CORRAL_LOG=debug, to see where time goes).
        let log = std::env::var_os("CORRAL_BENCH_LOG")
            .map_or_else(|| data_dir.path().join("corral.log"), PathBuf::from);
        let mut guard = ProcessGuard::spawn("corral", command, log)?;
        let stdout = guard
            .child
            .stdout
            .take()
            .context("corral has no stdout pipe")?;
        let first_line = first_line_then_drain(stdout);
        let line = tokio::task::spawn_blocking(move || first_line.recv_timeout(START_TIMEOUT))
            .await?
            .map_err(|_| guard.failure("printed no `export CORRAL_CONFIG=` line"))?;
        let config_path = line
            .trim()
            .strip_prefix("export CORRAL_CONFIG=")
            .with_context(|| format!("unexpected first line from corral up: {line:?}"))?;
        let config_path = PathBuf::from(config_path);
        let config = ClientConfig::load(&config_path)?;
        wait_healthy(
            &mut guard,
            &format!("{}/healthz", config.server),
            config.ca.as_deref(),
        )
        .await?;
        Ok(CorralProcess {
            guard,
            config,
            config_path,
            pod_uids: std::sync::Mutex::default(),
            temp_dir: data_dir,
        })
    }

    /// Fails if corral died during the benchmark.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        self.guard.ensure_running()
    }

    /// The node's data dir (`--data-dir` of `corral up`).
    pub fn data_dir(&self) -> PathBuf {
        self.temp_dir.path().join("corral")
    }

    /// The process id of `corral up`.
    pub fn pid(&self) -> u32 {
        self.guard.child.id()
    }

    /// The admin client config `corral` wrote (for `corral --config`).
    pub fn config_path(&self) -> PathBuf {
        self.config_path.clone()
    }

    /// Notes a pod the benchmark created, for the cleanup of its cgroups.
    pub fn remember_pod(&self, uid: &str) {
        if let Ok(mut uids) = self.pod_uids.lock() {
            uids.push(uid.to_string());
        }
    }
}

impl Drop for CorralProcess {
    fn drop(&mut self) {
        // Stop the agent first so it cannot restart what is removed below.
        let _ = self.guard.child.kill();
        let _ = self.guard.child.wait();
        let uids = self
            .pod_uids
            .lock()
            .map(|uids| uids.clone())
            .unwrap_or_default();
        crate::node::cleanup(&self.data_dir(), &uids);
    }
}

/// Sends the first line of `stdout` on the returned channel, then keeps
/// reading so the child never blocks or fails on a full or closed pipe.
fn first_line_then_drain(stdout: std::process::ChildStdout) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        if reader.read_line(&mut line).is_ok() && !line.is_empty() {
            let _ = sender.send(line);
        }
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    receiver
}

/// A single-member `etcd` on free loopback ports with a temporary data dir.
#[derive(Debug)]
pub struct EtcdProcess {
    guard: ProcessGuard,
    /// `http://127.0.0.1:PORT`, the client URL (gRPC and the HTTP/JSON gateway).
    pub client_url: String,
    data_dir: TempDir,
}

impl EtcdProcess {
    pub async fn start() -> anyhow::Result<Self> {
        let data_dir = tempfile::Builder::new()
            .prefix("corral-bench-etcd-")
            .tempdir()?;
        let client_url = format!("http://127.0.0.1:{}", free_loopback_port()?);
        let peer_url = format!("http://127.0.0.1:{}", free_loopback_port()?);
        let mut command = Command::new("etcd");
        command
            .args(["--name", "bench"])
            .arg("--data-dir")
            .arg(data_dir.path().join("etcd"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("bench={peer_url}")])
            .args(["--log-level", "warn"])
            .stdout(Stdio::null());
        let log = data_dir.path().join("etcd.log");
        let mut guard = ProcessGuard::spawn("etcd", command, log)
            .context("is etcd installed? (Debian: apt-get install etcd-server etcd-client)")?;
        wait_healthy(&mut guard, &format!("{client_url}/health"), None).await?;
        Ok(EtcdProcess {
            guard,
            client_url,
            data_dir,
        })
    }

    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        self.guard.ensure_running()
    }

    /// The process id of `etcd`.
    pub fn pid(&self) -> u32 {
        self.guard.child.id()
    }

    /// etcd's `--data-dir` (its database is `member/snap/db` below it).
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.path().join("etcd")
    }
}
