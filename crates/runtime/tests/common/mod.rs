//! Shared set-up for the root integration tests: a store holding the
//! busybox image, per-container rootfs mounts and runtime containers that
//! are removed on drop (also when a test fails).

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use corral_runtime::bundle::{ContainerConfig, write_bundle};
use corral_runtime::image::{Image, ImageStore, MountedRootfs};
use corral_runtime::oci::{ContainerIo, OciRuntime, RuncCli};
use corral_testkit::{
    BUSYBOX_IMAGE, Defer, ImageFormat, busybox_image_tar, require_root, unique_name,
};

/// A temp dir with an image store holding the busybox image.
pub struct Fixture {
    pub store: ImageStore,
    pub image: Image,
    // Dropped last: everything else lives inside it.
    pub dir: tempfile::TempDir,
}

pub fn busybox_fixture() -> Fixture {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = busybox_image_tar(dir.path(), ImageFormat::OciLayout);
    let store = ImageStore::open(dir.path().join("store")).expect("open store");
    store.import(&tar, None).expect("import busybox");
    let image = store.resolve(BUSYBOX_IMAGE).expect("resolve busybox");
    Fixture { store, image, dir }
}

/// A mounted container rootfs, unmounted on drop.
pub struct Rootfs {
    pub mounted: MountedRootfs,
    pub container_dir: PathBuf,
    _unmount: Defer,
}

impl Fixture {
    pub fn mount(&self, name: &str) -> Rootfs {
        let container_dir = self.dir.path().join("containers").join(name);
        let mounted = self
            .store
            .mount_rootfs(&self.image, &container_dir)
            .expect("mount rootfs");
        let target = container_dir.clone();
        Rootfs {
            mounted,
            container_dir,
            _unmount: Defer::new(move || {
                let _ = corral_runtime::image::unmount_rootfs(&target);
            }),
        }
    }

    pub fn runc(&self) -> RuncCli {
        corral_testkit::require_tool("runc");
        // As the agent runs it: from a sealed in-memory copy.
        RuncCli::new("runc", self.dir.path().join("runc-state")).with_sealed_binary()
    }
}

/// A created container, force-deleted on drop.
pub struct Container<'a> {
    pub runtime: &'a dyn OciRuntime,
    pub id: String,
    pub pid: u32,
    pub log: PathBuf,
    pub bundle: PathBuf,
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.runtime.delete(&self.id, true) {
            eprintln!("cleanup: failed to delete container {}: {e}", self.id);
        }
    }
}

/// Writes a bundle for `config` beside the rootfs and creates the container.
pub fn create<'a>(
    runtime: &'a dyn OciRuntime,
    rootfs: &Rootfs,
    config: &ContainerConfig,
) -> Container<'a> {
    launch(runtime, rootfs, config, false)
}

/// Writes a bundle for `config` beside the rootfs and creates and starts
/// the container in one runtime command (`run --detach`).
#[allow(dead_code)]
pub fn run_detached<'a>(
    runtime: &'a dyn OciRuntime,
    rootfs: &Rootfs,
    config: &ContainerConfig,
) -> Container<'a> {
    launch(runtime, rootfs, config, true)
}

fn launch<'a>(
    runtime: &'a dyn OciRuntime,
    rootfs: &Rootfs,
    config: &ContainerConfig,
    detached: bool,
) -> Container<'a> {
    let bundle = rootfs.container_dir.join("bundle");
    write_bundle(&bundle, config).expect("write bundle");
    let log = rootfs.container_dir.join("container.log");
    let io = ContainerIo::combined(&log);
    let pid = if detached {
        runtime.run_detached(&config.id, &bundle, &io)
    } else {
        runtime.create(&config.id, &bundle, &io)
    }
    .unwrap_or_else(|e| panic!("launch {}: {e}", config.id));
    Container {
        runtime,
        id: config.id.clone(),
        pid,
        log,
        bundle,
    }
}

pub fn container_id(prefix: &str) -> String {
    unique_name(prefix)
}

pub fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Polls `check` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    check()
}

pub fn read_log(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

/// Removes a (leaf) cgroup in every v1 hierarchy and in the v2 tree.
pub fn remove_cgroup(path: &str) {
    let Ok(hierarchies) = fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for hierarchy in hierarchies.flatten() {
        let _ = fs::remove_dir(hierarchy.path().join(path.trim_start_matches('/')));
    }
}

/// Waits (at most 30 s, then panics) for a container init to exit; the
/// test process must be its subreaper.
pub fn wait_exit(pid: u32) -> corral_runtime::oci::reap::ExitStatus {
    use corral_runtime::oci::reap;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = reap::try_wait(pid).expect("waitpid") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} did not exit within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
