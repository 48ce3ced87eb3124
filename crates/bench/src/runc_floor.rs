//! The floor of pod start: bare `runc run -d` of a bundle running the same
//! busybox `sleep 3600`, with no API, no watch, no image handling and no
//! per-container rootfs mount. The bundle's `config.json` comes from
//! `runc spec` (namespaces including a fresh network namespace, read-only
//! rootfs) with the command set and no terminal; the rootfs is one shared
//! directory holding the image's files (`/bin/busybox` and its applet links).
//! Dropping it deletes every container, its cgroups and the temp dir.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::node;

#[derive(Debug)]
pub struct RuncFloor {
    dir: TempDir,
    template: Value,
    /// `corral-bench-floor-<pid>`: the cgroup parent of every container.
    cgroup_parent: String,
}

impl RuncFloor {
    /// Builds the rootfs and the `runc spec` template.
    pub async fn new() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("corral-bench-runc-")
            .tempdir()?;
        build_rootfs(&dir.path().join("rootfs"))?;
        let template_dir = dir.path().join("template");
        std::fs::create_dir_all(&template_dir)?;
        let output = tokio::process::Command::new("runc")
            .args(["spec", "--bundle"])
            .arg(&template_dir)
            .kill_on_drop(true)
            .output()
            .await
            .context("cannot run `runc spec` (is runc installed?)")?;
        if !output.status.success() {
            bail!(
                "runc spec failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let template: Value =
            serde_json::from_slice(&std::fs::read(template_dir.join("config.json"))?)
                .context("runc spec wrote no JSON")?;
        Ok(RuncFloor {
            dir,
            template,
            cgroup_parent: format!("corral-bench-floor-{}", std::process::id()),
        })
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Writes the bundle of container `id` (untimed), then times
    /// `runc run -d`, which returns once the container's process runs.
    pub async fn run(&self, id: String) -> anyhow::Result<Duration> {
        let bundle = self.dir.path().join("bundles").join(&id);
        std::fs::create_dir_all(&bundle)?;
        let mut config = self.template.clone();
        config["root"] = json!({"path": self.dir.path().join("rootfs"), "readonly": true});
        config["process"]["terminal"] = json!(false);
        config["process"]["args"] = json!(["sleep", "3600"]);
        config["process"]["env"] = json!(["PATH=/bin", "BENCH=0"]);
        config["hostname"] = json!(&id);
        config["linux"]["cgroupsPath"] = json!(format!("/{}/{id}", self.cgroup_parent));
        std::fs::write(bundle.join("config.json"), serde_json::to_vec(&config)?)?;
        // With -d and no terminal the container inherits runc's stdio: a
        // pipe would stay open as long as it runs, so use files.
        let log = bundle.join("runc.log");
        let started = Instant::now();
        let status = tokio::process::Command::new("runc")
            .arg(format!("--root={}", self.root().display()))
            .args(["run", "-d", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .status()
            .await
            .context("cannot run runc")?;
        let elapsed = started.elapsed();
        if !status.success() {
            bail!(
                "runc run {id} failed ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default().trim()
            );
        }
        Ok(elapsed)
    }

    /// Deletes every container (untimed).
    pub async fn remove_all(&self) -> anyhow::Result<()> {
        let root = self.root();
        tokio::task::spawn_blocking(move || node::delete_all_containers("runc", &root)).await?;
        Ok(())
    }
}

impl Drop for RuncFloor {
    fn drop(&mut self) {
        node::delete_all_containers("runc", &self.root());
        corral_runtime::mounts::unmount_all_under(self.dir.path());
        node::remove_cgroup(Path::new(&self.cgroup_parent));
    }
}

/// The busybox image's files: `/bin/busybox` with `sleep` and `sh` linked
/// to it, and the directories the runtime mounts over.
fn build_rootfs(rootfs: &Path) -> anyhow::Result<()> {
    for dir in ["bin", "dev", "proc", "sys", "tmp", "etc", "root", "var"] {
        std::fs::create_dir_all(rootfs.join(dir))?;
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox"))
        .context("cannot copy /bin/busybox (Debian: apt-get install busybox-static)")?;
    for applet in corral_testkit::BUSYBOX_APPLETS {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    Ok(())
}
