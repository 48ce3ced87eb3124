//! The peer of pod start: `podman run -d` of the same busybox image tar,
//! `sleep 3600`, in podman storage of its own (`--root`, `--runroot` and
//! `--tmpdir` in a temp dir), so the machine's podman images and containers
//! are never touched. `--network none` because a corral pod's network
//! namespace has only `lo` (as `--network none` gives) and podman's default
//! bridge would change the host's network. This machine also needs
//! `--cgroup-manager cgroupfs` and the two `--ulimit`s. Dropping it removes
//! every container and image and unmounts anything left under its dir.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tempfile::TempDir;

/// Flags of every `podman run` in this benchmark, after `run -d --name N`.
pub const RUN_FLAGS: &[&str] = &[
    "--network",
    "none",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

#[derive(Debug)]
pub struct Podman {
    dir: TempDir,
    /// The loaded image's name, e.g. `localhost/local/busybox:1`.
    pub image: String,
}

impl Podman {
    /// Loads `image_tar` into fresh storage; the error says why podman
    /// cannot be used.
    pub async fn start(image_tar: &Path) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("corral-bench-podman-")
            .tempdir()?;
        let mut podman = Podman {
            dir,
            image: String::new(),
        };
        let output = podman.run_podman(&["load", "-i"], Some(image_tar)).await?;
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        podman.image = printed
            .lines()
            .find_map(|line| line.strip_prefix("Loaded image: "))
            .map(|name| name.trim().to_string())
            .with_context(|| format!("podman load printed no image name: {printed}"))?;
        Ok(podman)
    }

    /// `--root`, `--runroot`, `--tmpdir` in this benchmark's dir and the
    /// cgroup manager this machine needs.
    fn global_args(&self) -> Vec<std::ffi::OsString> {
        let dir = self.dir.path();
        vec![
            "--root".into(),
            dir.join("root").into(),
            "--runroot".into(),
            dir.join("run").into(),
            "--tmpdir".into(),
            dir.join("tmp").into(),
            "--cgroup-manager".into(),
            "cgroupfs".into(),
        ]
    }

    fn command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("podman");
        command
            .args(self.global_args())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    async fn run_podman(
        &self,
        args: &[&str],
        path: Option<&Path>,
    ) -> anyhow::Result<std::process::Output> {
        let mut command = self.command();
        command.args(args);
        if let Some(path) = path {
            command.arg(path);
        }
        let output = command
            .output()
            .await
            .context("cannot run podman (Debian: apt-get install podman)")?;
        if !output.status.success() {
            bail!(
                "podman {} failed ({}): {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(output)
    }

    /// Times `podman run -d` of container `name`, which returns once the
    /// container runs.
    pub async fn run(&self, name: String) -> anyhow::Result<Duration> {
        let mut args = vec!["run", "-d", "--name", &name];
        args.extend_from_slice(RUN_FLAGS);
        args.extend_from_slice(&[&self.image, "sleep", "3600"]);
        let started = Instant::now();
        self.run_podman(&args, None).await?;
        Ok(started.elapsed())
    }

    /// Times `podman rm -f NAME` then `podman run -d` of the same name: the
    /// peer of deleting and creating a pod.
    pub async fn replace(&self, name: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.run_podman(&["rm", "-f", "-t", "0", name], None)
            .await?;
        let mut args = vec!["run", "-d", "--name", name];
        args.extend_from_slice(RUN_FLAGS);
        args.extend_from_slice(&[&self.image, "sleep", "3600"]);
        self.run_podman(&args, None).await?;
        Ok(started.elapsed())
    }

    /// Summed `VmRSS` of the `conmon` monitors of every running container,
    /// in KiB: podman's resident cost per running container (it has no
    /// daemon).
    pub async fn conmon_rss_kib(&self) -> anyhow::Result<(usize, u64)> {
        let output = self
            .run_podman(&["ps", "-q", "--format", "{{.ID}}"], None)
            .await?;
        let ids: Vec<String> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        if ids.is_empty() {
            return Ok((0, 0));
        }
        let mut args = vec!["inspect", "--format", "{{.State.ConmonPid}}"];
        args.extend(ids.iter().map(String::as_str));
        let output = self.run_podman(&args, None).await?;
        let mut total = 0;
        for pid in String::from_utf8_lossy(&output.stdout).lines() {
            let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim()))
                .with_context(|| format!("cannot read the status of conmon {pid}"))?;
            total += status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<u64>().ok())
                .unwrap_or(0);
        }
        Ok((ids.len(), total))
    }

    /// Removes every container (untimed).
    pub async fn remove_all(&self) -> anyhow::Result<()> {
        self.run_podman(&["rm", "-a", "-f", "-t", "0"], None)
            .await
            .map(drop)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for args in [&["rm", "-a", "-f", "-t", "0"][..], &["rmi", "-a", "-f"]] {
            let _ = std::process::Command::new("podman")
                .args(self.global_args())
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        // conmon runs `podman container cleanup` when a container exits,
        // which can start after the commands above and mount the storage
        // again: wait for every process naming this dir to end (killing
        // what is left after a few seconds), then unmount.
        let dir = self.dir.path();
        let deadline = std::time::Instant::now() + CLEANUP_WAIT;
        loop {
            let left = crate::node::processes_naming(dir);
            if left.is_empty() {
                break;
            }
            if std::time::Instant::now() >= deadline {
                left.iter().for_each(|(pid, _)| crate::node::kill(pid));
                std::thread::sleep(std::time::Duration::from_millis(100));
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        corral_runtime::mounts::unmount_all_under(dir);
    }
}

/// How long dropping the peer waits for podman's own clean-up processes.
const CLEANUP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
