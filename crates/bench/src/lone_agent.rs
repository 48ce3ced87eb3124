//! A `corral server` and one `corral agent` on data dirs of their own, as
//! the reboot-recovery end-to-end test runs them: the agent is a lone node
//! that keeps its pods in local state, so it can be killed and started
//! again, with the server stopped for good, any number of times.
//!
//! Dropping it kills the agent, then removes every container, mount and
//! pod cgroup it left ([`crate::node::cleanup`]) and the data dirs; the
//! server is stopped by its own guard.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use corral_client::Client;
use tempfile::TempDir;

use crate::processes::{CorralProcess, ProcessGuard};

/// The lone node's name (a node token is made for it).
pub const NODE: &str = "node-1";

#[derive(Debug)]
pub struct LoneAgent {
    binary: PathBuf,
    /// `None` once stopped (for good: the agent runs alone from then on).
    server: Option<CorralProcess>,
    client: Client,
    server_url: String,
    node_token: String,
    /// Declared before the dir: the agent dies before its dir is removed.
    agent: Option<ProcessGuard>,
    /// How many times the agent was started (names its log files).
    starts: usize,
    /// Holds the agent's data dir and the cluster CA; mode 0755, or the
    /// pods' unprivileged users could not reach their root filesystems.
    dir: TempDir,
}

impl LoneAgent {
    /// Starts the server, makes the node's token, imports `image_tar` into
    /// the agent's data dir and starts the agent.
    pub async fn start(binary: &Path, image_tar: &Path) -> anyhow::Result<Self> {
        let server = CorralProcess::start_with(binary, &["server"]).await?;
        let dir = tempfile::Builder::new()
            .prefix("corral-bench-agent-")
            .tempdir()?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        // The CA stays readable after the server and its dir are gone.
        std::fs::copy(
            server.data_dir().join("tls").join("ca.pem"),
            dir.path().join("ca.pem"),
        )
        .context("cannot copy the server's CA")?;
        let token = corral(
            binary,
            &["token", "create", "--node", NODE],
            Some(&server.config_path()),
        )
        .await?;
        let mut lone = LoneAgent {
            binary: binary.to_path_buf(),
            client: Client::new(&server.config)?,
            server_url: server.config.server.clone(),
            server: Some(server),
            node_token: token.trim().to_string(),
            agent: None,
            starts: 0,
            dir,
        };
        let data_dir = lone.data_dir();
        corral(
            binary,
            &[
                "image",
                "import",
                &image_tar.to_string_lossy(),
                "--data-dir",
                &data_dir.to_string_lossy(),
            ],
            None,
        )
        .await?;
        lone.start_agent()?;
        Ok(lone)
    }

    /// The agent's data dir.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("agent")
    }

    /// A client of the server (until it is stopped).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Starts `corral agent` on the data dir (returns at once). Its log is
    /// `agent-N.log` in the temp dir, or `$CORRAL_BENCH_LOG.N` to keep it.
    pub fn start_agent(&mut self) -> anyhow::Result<()> {
        if self.agent.is_some() {
            bail!("the agent is running already");
        }
        self.starts += 1;
        let log = std::env::var_os("CORRAL_BENCH_LOG").map_or_else(
            || self.dir.path().join(format!("agent-{}.log", self.starts)),
            |path| PathBuf::from(format!("{}.{}", path.to_string_lossy(), self.starts)),
        );
        let mut command = Command::new(&self.binary);
        command
            .args(["agent", "--server", &self.server_url])
            .arg("--ca")
            .arg(self.dir.path().join("ca.pem"))
            // In the host's own namespace: never turn on its forwarding.
            .args(["--forwarding", "pod-links", "--token", &self.node_token])
            .args(["--name", NODE, "--data-dir"])
            .arg(self.data_dir())
            .env(
                "CORRAL_LOG",
                std::env::var("CORRAL_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(std::process::Stdio::null());
        self.agent = Some(ProcessGuard::spawn("corral agent", command, log)?);
        Ok(())
    }

    /// Kills the agent (SIGKILL, as a power cut would) and reaps it; its
    /// containers keep running.
    pub fn kill_agent(&mut self) {
        self.agent = None;
    }

    /// Fails with the log's tail if the agent exited.
    pub fn ensure_agent_running(&mut self) -> anyhow::Result<()> {
        match self.agent.as_mut() {
            Some(agent) => agent.ensure_running(),
            None => bail!("the agent is not running"),
        }
    }

    /// Stops the server for good.
    pub fn stop_server(&mut self) {
        self.server = None;
    }
}

impl Drop for LoneAgent {
    fn drop(&mut self) {
        // Stop the agent first so it cannot restart what is removed below.
        self.agent = None;
        crate::node::cleanup(&self.data_dir(), &[]);
    }
}

/// Runs `corral ARGS` (with `CORRAL_CONFIG=config`) and returns its stdout.
async fn corral(binary: &Path, args: &[&str], config: Option<&Path>) -> anyhow::Result<String> {
    let mut command = tokio::process::Command::new(binary);
    command.args(args).kill_on_drop(true);
    if let Some(config) = config {
        command.env("CORRAL_CONFIG", config);
    }
    let output = command
        .output()
        .await
        .with_context(|| format!("cannot run corral {args:?}"))?;
    if !output.status.success() {
        bail!(
            "corral {args:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
