//! The confinement QEMU runs in around its own seccomp filter: its own
//! unprivileged host uid and gid, no capabilities (bounding, inheritable
//! and ambient sets emptied, `no_new_privs`), its cgroups joined before it
//! starts, and its own mount namespace whose root is a fresh read-only
//! tmpfs holding only what the VM needs: the host's `/usr` (QEMU, its
//! libraries and firmware) read-only, the VM's directory and disks
//! writable at their host paths, its kernel, initramfs and backing disks
//! read-only, a `/proc`, and a `/dev` of a few device nodes (`/dev/kvm`
//! owned by the VM's uid when KVM is used). The VM's taps are passed as
//! open descriptors ([`TAP_FD`] and the numbers after it, in NIC order),
//! so QEMU needs no `/dev/net/tun`.
//!
//! [`Sandbox`] is plain data, planned by [`plan`] from the VM's
//! configuration (pure) and [`system_mounts`] (reads the host). It is
//! turned into [`Prepared`] steps in the parent (every path already a C
//! string) and [`Prepared::enter`] runs them in the forked child before
//! `execve`, where only async-signal-safe calls are allowed: raw
//! syscalls, no allocation.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::vm::{Accel, VmConfig};

/// The descriptor number the VM's first tap device is passed to QEMU on;
/// further taps follow on the next numbers.
pub const TAP_FD: i32 = 3;

/// The most taps a sandboxed QEMU is handed (the first NIC and seven
/// more, as the API allows).
pub const MAX_TAP_FDS: usize = 8;

/// QEMU's own seccomp filter (`-sandbox`): the obsolete system calls,
/// privilege changes, fork/exec and scheduling/priority changes are
/// refused.
pub const SECCOMP_OPTIONS: &str =
    "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// One thing QEMU's mount namespace holds, at the same path as on the
/// host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// A host file or directory bound at its own path.
    Bind { path: PathBuf, writable: bool },
    /// A symbolic link as on the host (`/lib` → `usr/lib`).
    Symlink { path: PathBuf, target: PathBuf },
    /// A character device node under `/dev`; `owned`: it belongs to the
    /// VM's uid and only it may open it, else it is 0666 root's.
    Device {
        name: &'static str,
        major: u32,
        minor: u32,
        owned: bool,
    },
    /// A `/proc` (nosuid, nodev, noexec).
    Proc,
}

/// How QEMU is confined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub uid: u32,
    pub gid: u32,
    /// An empty directory that the private root's tmpfs is mounted on (in
    /// QEMU's mount namespace only; the host never sees the mount).
    pub root: PathBuf,
    pub mounts: Vec<Mount>,
    /// `cgroup.procs` files QEMU joins before it starts.
    pub cgroups: Vec<PathBuf>,
}

/// The harmless device nodes every QEMU gets (0666, like the host's).
const DEVICES: [(&str, u32, u32); 5] = [
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
];

/// The mounts `config` needs beyond the system ones: the directories of
/// its sockets and logs and its disks writable, its kernel, initramfs and
/// `backing` files (the disks' backing chains) read-only, the device
/// nodes, and `/proc`. A path under a writable directory is not bound
/// again.
pub fn plan(config: &VmConfig, backing: &[PathBuf]) -> Vec<Mount> {
    let mut mounts = Vec::new();
    let mut writable_dirs: Vec<PathBuf> = Vec::new();
    for path in [
        &config.console_socket,
        &config.console_log,
        &config.qmp_socket,
    ]
    .into_iter()
    .chain(config.incoming.as_ref())
    {
        if let Some(dir) = path.parent()
            && !writable_dirs.iter().any(|d| dir.starts_with(d))
        {
            writable_dirs.retain(|d| !d.starts_with(dir));
            writable_dirs.push(dir.to_path_buf());
        }
    }
    let covered = |path: &Path| writable_dirs.iter().any(|dir| path.starts_with(dir));
    for dir in &writable_dirs {
        mounts.push(Mount::Bind {
            path: dir.clone(),
            writable: true,
        });
    }
    let disks = config
        .disk
        .iter()
        .chain(config.data_disks.iter().map(|(_, path)| path));
    for disk in disks {
        if !covered(disk) {
            mounts.push(Mount::Bind {
                path: disk.clone(),
                writable: true,
            });
        }
    }
    let read_only = config.kernel.iter().chain(&config.initrd).chain(backing);
    for path in read_only {
        let bound = mounts
            .iter()
            .any(|m| matches!(m, Mount::Bind { path: p, .. } if p == path));
        if !covered(path) && !bound {
            mounts.push(Mount::Bind {
                path: path.clone(),
                writable: false,
            });
        }
    }
    for (name, major, minor) in DEVICES {
        mounts.push(Mount::Device {
            name,
            major,
            minor,
            owned: false,
        });
    }
    if config.accel == Accel::Kvm {
        mounts.push(Mount::Device {
            name: "kvm",
            major: 10,
            minor: 232,
            owned: true,
        });
    }
    mounts.push(Mount::Proc);
    mounts
}

/// The host's system directories QEMU runs from, read-only: `/usr`, the
/// top-level library and binary directories (or their symlinks, on a
/// merged-/usr host), the dynamic loader's cache, and `qemu`'s own
/// directory when it is not under `/usr`.
pub fn system_mounts(qemu: &Path) -> Vec<Mount> {
    let mut mounts = Vec::new();
    for top in [
        "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    ] {
        let path = PathBuf::from(top);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(&path) {
                    mounts.push(Mount::Symlink { path, target });
                }
            }
            Ok(meta) if meta.is_dir() => mounts.push(Mount::Bind {
                path,
                writable: false,
            }),
            _ => {}
        }
    }
    let cache = PathBuf::from("/etc/ld.so.cache");
    if cache.is_file() {
        mounts.push(Mount::Bind {
            path: cache,
            writable: false,
        });
    }
    if let Ok(real) = std::fs::canonicalize(qemu)
        && let Some(dir) = real.parent()
        && !dir.starts_with("/usr")
    {
        mounts.push(Mount::Bind {
            path: dir.to_path_buf(),
            writable: false,
        });
    }
    mounts
}

/// Why a sandbox cannot be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox path {0} has a NUL byte")]
    Nul(PathBuf),
    #[error("sandbox path {0} is not absolute")]
    Relative(PathBuf),
}

fn c_path(path: &Path) -> Result<CString, SandboxError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| SandboxError::Nul(path.to_path_buf()))
}

fn c_text(text: &str) -> CString {
    // INVARIANT: descriptions are built from C-string-safe paths and words.
    CString::new(text.replace('\0', "")).expect("INVARIANT: NUL bytes were removed")
}

/// `path` re-rooted under `root`.
fn under(root: &Path, path: &Path) -> Result<PathBuf, SandboxError> {
    if !path.is_absolute() {
        return Err(SandboxError::Relative(path.to_path_buf()));
    }
    let mut inside = root.to_path_buf();
    for component in path.components() {
        if let Component::Normal(part) = component {
            inside.push(part);
        }
    }
    Ok(inside)
}

/// Collects steps, making each mount's parent directories first.
struct Planner {
    steps: Vec<(Step, CString)>,
    made: Vec<PathBuf>,
}

impl Planner {
    fn push(&mut self, step: Step, what: String) {
        self.steps.push((step, c_text(&what)));
    }

    /// Makes the directories above `path` that are not made yet.
    fn parents(&mut self, path: &Path) -> Result<(), SandboxError> {
        let mut missing = Vec::new();
        let mut dir = path.parent();
        while let Some(d) = dir {
            if self.made.iter().any(|m| m == d) {
                break;
            }
            missing.push(d.to_path_buf());
            dir = d.parent();
        }
        for d in missing.into_iter().rev() {
            self.push(Step::Mkdir(c_path(&d)?), format!("make {}", d.display()));
            self.made.push(d);
        }
        Ok(())
    }
}

impl Sandbox {
    /// The sandbox as syscall-ready steps (the directories each mount
    /// needs made first, in order).
    pub fn prepare(&self) -> Result<Prepared, SandboxError> {
        let mut plan = Planner {
            steps: Vec::new(),
            made: vec![self.root.clone()],
        };
        for procs in &self.cgroups {
            plan.push(
                Step::JoinCgroup(c_path(procs)?),
                format!("join cgroup {}", procs.display()),
            );
        }
        plan.push(Step::PrivateMounts, "make mounts private".into());
        plan.push(
            Step::MountRoot(c_path(&self.root)?),
            format!("mount a tmpfs on {}", self.root.display()),
        );
        for mount in &self.mounts {
            match mount {
                Mount::Bind { path, writable } => {
                    let target = under(&self.root, path)?;
                    plan.parents(&target)?;
                    let what = format!("make {}", target.display());
                    if path.is_dir() {
                        plan.push(Step::Mkdir(c_path(&target)?), what);
                        plan.made.push(target.clone());
                    } else {
                        plan.push(Step::Touch(c_path(&target)?), what);
                    }
                    plan.push(
                        Step::Bind {
                            source: c_path(path)?,
                            target: c_path(&target)?,
                            writable: *writable,
                        },
                        format!("bind {}", path.display()),
                    );
                }
                Mount::Symlink { path, target } => {
                    let link = under(&self.root, path)?;
                    plan.parents(&link)?;
                    plan.push(
                        Step::Symlink {
                            target: c_path(target)?,
                            path: c_path(&link)?,
                        },
                        format!("link {}", path.display()),
                    );
                }
                Mount::Device {
                    name,
                    major,
                    minor,
                    owned,
                } => {
                    let path = self.root.join("dev").join(name);
                    plan.parents(&path)?;
                    plan.push(
                        Step::Mknod {
                            path: c_path(&path)?,
                            major: *major,
                            minor: *minor,
                            owner: owned.then_some((self.uid, self.gid)),
                        },
                        format!("make /dev/{name}"),
                    );
                }
                Mount::Proc => {
                    let path = self.root.join("proc");
                    plan.parents(&path)?;
                    plan.push(Step::Mkdir(c_path(&path)?), "make /proc".into());
                    plan.push(Step::MountProc(c_path(&path)?), "mount /proc".into());
                }
            }
        }
        plan.push(
            Step::PivotRoot(c_path(&self.root)?),
            format!("pivot to {}", self.root.display()),
        );
        Ok(Prepared {
            uid: self.uid,
            gid: self.gid,
            steps: plan.steps,
        })
    }
}

mod enter;
#[cfg(test)]
mod tests;

pub use enter::Prepared;
use enter::Step;
