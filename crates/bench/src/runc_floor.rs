//! The floors of pod start: bare `runc run -d` (and, for gVisor pods, bare
//! `runsc run -detach` with the flags corral's agent gives runsc) of a
//! bundle running the same busybox `sleep 3600`, with no API, no watch, no
//! image handling and no per-container rootfs mount. The bundle's
//! `config.json` comes from `runc spec` (namespaces including a fresh
//! network namespace, read-only rootfs) with the command set and no
//! terminal; the rootfs is one shared directory holding the image's files
//! (`/bin/busybox` and its applet links). Dropping it deletes every
//! container, its cgroups and the temp dir.
//!
//! The sandboxed runc floor is the same bundle with what corral's default
//! sandbox adds that costs runc time: the agent's seccomp allowlist
//! (compiled by runc for every container), no capabilities, no new
//! privileges, an unprivileged user, and a user namespace of its own. It
//! shows how much of a pod start is the runtime's price of the sandbox
//! rather than corral's.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::node;

/// The flags corral's agent runs runsc with (crates/agent/src/lib.rs):
/// root, no cgroups of its own; and the kernel network stack of the
/// namespace the sandbox joins, which the agent gives only pods granted
/// `host-network-stack`. Its default, gVisor's own stack, copies the
/// namespace's interfaces at `runsc start`; the floor's fresh namespace
/// has only `lo`, so that copy is next to nothing, and the Debian runsc
/// would refuse it here without the agent's hidden `/proc/sys/net`.
const RUNSC_FLAGS: [&str; 3] = ["--rootless=false", "--ignore-cgroups", "--network=host"];

#[derive(Debug)]
pub struct RuncFloor {
    /// `runc` or `runsc`.
    binary: &'static str,
    /// Flags before the subcommand (besides `--root`).
    global_args: Vec<String>,
    dir: TempDir,
    template: Value,
    /// `corral-bench-floor-<pid>`: the cgroup parent of every container.
    cgroup_parent: String,
}

/// The host ids the sandboxed floor's user namespace maps root to (far
/// above the agent's pod ranges).
const FLOOR_HOST_IDS: u32 = 1 << 31;

impl RuncFloor {
    /// The runc floor: builds the rootfs and the `runc spec` template.
    pub async fn new() -> anyhow::Result<Self> {
        Self::with_runtime("runc", Vec::new()).await
    }

    /// The gVisor floor: the same bundle under `runsc` with the agent's
    /// flags (fails if runsc is not installed).
    pub async fn runsc() -> anyhow::Result<Self> {
        let found = tokio::process::Command::new("runsc")
            .arg("--version")
            .output()
            .await
            .context("cannot run `runsc --version` (is gVisor's runsc installed?)")?;
        if !found.status.success() {
            bail!("runsc --version failed");
        }
        let flags = RUNSC_FLAGS.iter().map(|flag| flag.to_string()).collect();
        Self::with_runtime("runsc", flags).await
    }

    /// The runc floor with corral's default sandbox in its bundle.
    pub async fn sandboxed() -> anyhow::Result<Self> {
        let mut floor = Self::with_runtime("runc", Vec::new()).await?;
        floor.template["process"]["user"] = json!({"uid": 65534, "gid": 65534});
        floor.template["process"]["noNewPrivileges"] = json!(true);
        floor.template["process"]["capabilities"] = json!({
            "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []
        });
        let profile =
            corral_runtime::bundle::default_profile(corral_runtime::bundle::SyscallAbis::Native)
                .context("cannot build corral's seccomp profile")?;
        floor.template["linux"]["seccomp"] = serde_json::to_value(profile)?;
        let mapping = json!([{"containerID": 0, "hostID": FLOOR_HOST_IDS, "size": 65536}]);
        floor.template["linux"]["uidMappings"] = mapping.clone();
        floor.template["linux"]["gidMappings"] = mapping;
        if let Some(namespaces) = floor.template["linux"]["namespaces"].as_array_mut() {
            namespaces.push(json!({"type": "user"}));
        }
        Ok(floor)
    }

    async fn with_runtime(binary: &'static str, global_args: Vec<String>) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("corral-bench-runc-")
            .tempdir()?;
        // A user namespace's root (the sandboxed floor) must reach the
        // rootfs: a temp dir is 0700.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
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
            binary,
            global_args,
            dir,
            template,
            cgroup_parent: format!("corral-bench-floor-{}", std::process::id()),
        })
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Writes the bundle of container `id` (untimed), then times
    /// `runc run -d` (`runsc run -detach`), which returns once the
    /// container's process runs.
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
        let status = tokio::process::Command::new(self.binary)
            .arg(format!("--root={}", self.root().display()))
            .args(&self.global_args)
            .args(["run", "--detach", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .status()
            .await
            .with_context(|| format!("cannot run {}", self.binary))?;
        let elapsed = started.elapsed();
        if !status.success() {
            bail!(
                "{} run {id} failed ({status}): {}",
                self.binary,
                std::fs::read_to_string(&log).unwrap_or_default().trim()
            );
        }
        Ok(elapsed)
    }

    /// Deletes every container (untimed).
    pub async fn remove_all(&self) -> anyhow::Result<()> {
        let root = self.root();
        let binary = self.binary;
        tokio::task::spawn_blocking(move || node::delete_all_containers(binary, &root)).await?;
        Ok(())
    }
}

impl Drop for RuncFloor {
    fn drop(&mut self) {
        node::delete_all_containers(self.binary, &self.root());
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
