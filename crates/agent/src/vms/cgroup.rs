//! Each VM's QEMU in its own cgroup, `/corral/vm-UID`, beside the pods'
//! `/corral/UID` that runc makes, with the VM spec's limits: memory (the
//! guest's RAM plus [`MEMORY_OVERHEAD`] for QEMU itself) and CPU (a CFS
//! quota of `cpus` whole CPUs). On a cgroup v2 host the unified hierarchy
//! holds both controllers; on a v1 or hybrid host (v2 mounted beside, at
//! `unified`, without controllers, as on this project's machines) the
//! `memory` and `cpu` hierarchies do, as they do for runc. Only
//! directories are made and files written: nothing is ever mounted.

use std::path::{Path, PathBuf};

/// What QEMU may use beyond the guest's RAM: its own code and heap, the
/// TCG translation cache, device buffers.
pub const MEMORY_OVERHEAD: u64 = 256 << 20;

/// The CFS period a CPU quota is a share of, in µs.
const CPU_PERIOD_US: u64 = 100_000;

/// The host's cgroup filesystems.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A VM's limits, from its spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub cpus: u32,
}

impl Limits {
    /// The memory QEMU's cgroup may hold.
    pub fn memory_limit(&self) -> u64 {
        self.memory_bytes + MEMORY_OVERHEAD
    }

    /// The CPU quota per [`CPU_PERIOD_US`].
    pub fn cpu_quota_us(&self) -> u64 {
        u64::from(self.cpus.max(1)) * CPU_PERIOD_US
    }
}

/// The VM's cgroup, made and limited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmCgroup {
    /// Its path inside each hierarchy (`/corral/vm-UID`).
    pub path: String,
    /// The `cgroup.procs` files QEMU joins.
    pub procs: Vec<PathBuf>,
    pub limits: Limits,
}

/// Why the VM's cgroup could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no memory or cpu cgroup controller under {0}")]
    NoControllers(PathBuf),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The cgroup path of the VM with `uid`.
pub fn path(uid: &str) -> String {
    format!("/corral/vm-{uid}")
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn make(dir: &Path) -> Result<(), CgroupError> {
    std::fs::create_dir_all(dir).map_err(|source| CgroupError::Write {
        path: dir.to_path_buf(),
        source,
    })
}

/// Makes (or keeps) the cgroup of VM `uid` under `root` and writes
/// `limits` into it.
pub fn ensure(root: &Path, uid: &str, limits: Limits) -> Result<VmCgroup, CgroupError> {
    let relative = path(uid);
    let inside = relative.trim_start_matches('/');
    let mut procs = Vec::new();
    if root.join("cgroup.controllers").is_file() {
        // cgroup v2: both controllers in one hierarchy, enabled for the
        // children of the root and of /corral.
        let corral = root.join("corral");
        make(&corral)?;
        write(&root.join("cgroup.subtree_control"), "+memory +cpu")?;
        write(&corral.join("cgroup.subtree_control"), "+memory +cpu")?;
        let dir = root.join(inside);
        make(&dir)?;
        write(&dir.join("memory.max"), &limits.memory_limit().to_string())?;
        write(
            &dir.join("cpu.max"),
            &format!("{} {CPU_PERIOD_US}", limits.cpu_quota_us()),
        )?;
        procs.push(dir.join("cgroup.procs"));
    } else {
        let memory = root.join("memory");
        if memory.join("memory.limit_in_bytes").is_file() {
            let dir = memory.join(inside);
            make(&dir)?;
            write(
                &dir.join("memory.limit_in_bytes"),
                &limits.memory_limit().to_string(),
            )?;
            procs.push(dir.join("cgroup.procs"));
        }
        let cpu = root.join("cpu");
        if cpu.join("cpu.cfs_quota_us").is_file() {
            let dir = cpu.join(inside);
            make(&dir)?;
            write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            write(
                &dir.join("cpu.cfs_quota_us"),
                &limits.cpu_quota_us().to_string(),
            )?;
            procs.push(dir.join("cgroup.procs"));
        }
        if procs.is_empty() {
            return Err(CgroupError::NoControllers(root.to_path_buf()));
        }
    }
    Ok(VmCgroup {
        path: relative,
        procs,
        limits,
    })
}

/// Removes the VM's cgroup directories under `root` (each empty once
/// QEMU is gone; a busy one is left).
pub fn remove(root: &Path, uid: &str) {
    let relative = path(uid);
    let inside = relative.trim_start_matches('/');
    let _ = std::fs::remove_dir(root.join(inside));
    for hierarchy in ["memory", "cpu"] {
        let _ = std::fs::remove_dir(root.join(hierarchy).join(inside));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        memory_bytes: 128 << 20,
        cpus: 2,
    };

    #[test]
    fn v1_hierarchies_get_the_memory_and_cpu_limits() {
        let root = tempfile::tempdir().unwrap();
        for (hierarchy, file) in [
            ("memory", "memory.limit_in_bytes"),
            ("cpu", "cpu.cfs_quota_us"),
        ] {
            std::fs::create_dir_all(root.path().join(hierarchy)).unwrap();
            std::fs::write(root.path().join(hierarchy).join(file), "-1").unwrap();
        }
        let cgroup = ensure(root.path(), "u1", LIMITS).unwrap();
        let read = |p: &str| std::fs::read_to_string(root.path().join(p)).unwrap();
        assert_eq!(
            read("memory/corral/vm-u1/memory.limit_in_bytes"),
            ((128 << 20) + MEMORY_OVERHEAD).to_string()
        );
        assert_eq!(read("cpu/corral/vm-u1/cpu.cfs_quota_us"), "200000");
        assert_eq!(read("cpu/corral/vm-u1/cpu.cfs_period_us"), "100000");
        assert_eq!(cgroup.path, "/corral/vm-u1");
        assert_eq!(
            cgroup.procs,
            [
                root.path().join("memory/corral/vm-u1/cgroup.procs"),
                root.path().join("cpu/corral/vm-u1/cgroup.procs")
            ]
        );
    }

    #[test]
    fn v2_gets_memory_max_and_cpu_max_with_controllers_enabled() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("cgroup.controllers"), "cpu memory").unwrap();
        let cgroup = ensure(root.path(), "u2", LIMITS).unwrap();
        let read = |p: &str| std::fs::read_to_string(root.path().join(p)).unwrap();
        assert_eq!(read("corral/cgroup.subtree_control"), "+memory +cpu");
        assert_eq!(read("corral/vm-u2/cpu.max"), "200000 100000");
        assert_eq!(
            read("corral/vm-u2/memory.max"),
            ((128 << 20) + MEMORY_OVERHEAD).to_string()
        );
        assert_eq!(
            cgroup.procs,
            [root.path().join("corral/vm-u2/cgroup.procs")]
        );
    }

    #[test]
    fn a_host_without_controllers_is_named() {
        let root = tempfile::tempdir().unwrap();
        let error = ensure(root.path(), "u3", LIMITS).unwrap_err();
        assert!(error.to_string().contains("no memory or cpu"), "{error}");
    }
}
