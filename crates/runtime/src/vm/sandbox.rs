//! The confinement QEMU runs in around its own seccomp filter: its own
//! unprivileged host uid and gid, no capabilities (bounding, inheritable
//! and ambient sets emptied, `no_new_privs`), its cgroups joined before it
//! starts, and its own mount namespace whose root is a fresh read-only
//! tmpfs holding only what the VM needs: the host's `/usr` (QEMU, its
//! libraries and firmware) read-only, the VM's directory and disks
//! writable at their host paths, its kernel, initramfs and backing disks
//! read-only, a `/proc`, and a `/dev` of a few device nodes (`/dev/kvm`
//! owned by the VM's uid when KVM is used). The VM's tap is passed as an
//! open descriptor ([`TAP_FD`]), so QEMU needs no `/dev/net/tun`.
//!
//! [`Sandbox`] is plain data, planned by [`plan`] from the VM's
//! configuration (pure) and [`system_mounts`] (reads the host). It is
//! turned into [`Prepared`] steps in the parent (every path already a C
//! string) and [`Prepared::enter`] runs them in the forked child before
//! `execve`, where only async-signal-safe calls are allowed: raw
//! syscalls, no allocation.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::libc;

use crate::vm::{Accel, VmConfig};

/// The descriptor number the VM's tap device is passed to QEMU on.
pub const TAP_FD: i32 = 3;

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

/// One step of entering the sandbox, its paths as C strings.
#[derive(Debug)]
enum Step {
    JoinCgroup(CString),
    /// Every mount of this process private: nothing propagates to the host.
    PrivateMounts,
    MountRoot(CString),
    Mkdir(CString),
    Touch(CString),
    Bind {
        source: CString,
        target: CString,
        writable: bool,
    },
    Symlink {
        target: CString,
        path: CString,
    },
    /// `owner`: the VM's uid and gid, mode 0600; else root's, 0666.
    Mknod {
        path: CString,
        major: u32,
        minor: u32,
        owner: Option<(u32, u32)>,
    },
    MountProc(CString),
    PivotRoot(CString),
}

/// A [`Sandbox`] ready to enter in a forked child.
#[derive(Debug)]
pub struct Prepared {
    uid: u32,
    gid: u32,
    steps: Vec<(Step, CString)>,
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

/// The calling process's errno as an error (no allocation).
fn last_error() -> io::Error {
    io::Error::last_os_error()
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        Err(last_error())
    } else {
        Ok(())
    }
}

/// Writes `words` and a newline to stderr (QEMU's log) without
/// allocating.
fn report(words: &[&[u8]]) {
    for bytes in words {
        // SAFETY: writing a valid buffer to fd 2; a failure is ignored.
        unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
    }
}

impl Prepared {
    /// Enters the sandbox: meant for the forked child between `fork` and
    /// `execve` (it changes this whole process: its mounts, root, ids and
    /// capabilities), so it only makes system calls. `tap`: a descriptor
    /// to hand QEMU as [`TAP_FD`].
    pub fn enter(&self, tap: Option<i32>) -> io::Result<()> {
        if let Some(fd) = tap {
            self.pass_tap(fd)?;
        }
        for (step, what) in &self.steps {
            if let Err(error) = run(step) {
                report(&[b"corral: cannot sandbox QEMU: ", what.as_bytes(), b"\n"]);
                return Err(error);
            }
        }
        if let Err(error) = self.drop_privileges() {
            report(&[b"corral: cannot sandbox QEMU: drop privileges\n"]);
            return Err(error);
        }
        Ok(())
    }

    fn pass_tap(&self, fd: i32) -> io::Result<()> {
        if fd == TAP_FD {
            // SAFETY: plain fcntl on an open descriptor: exec keeps it.
            check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) })
        } else {
            // SAFETY: dup2 onto TAP_FD; the copy does not close on exec.
            check(unsafe { libc::dup2(fd, TAP_FD) })
        }
    }

    /// No supplementary groups, the VM's gid and uid (every one of real,
    /// effective and saved), an empty bounding set, no inheritable or
    /// ambient capabilities, and `no_new_privs`.
    fn drop_privileges(&self) -> io::Result<()> {
        // SAFETY (every call below): plain system calls on integers and
        // null pointers, in a child that is about to exec.
        let zero: libc::c_ulong = 0;
        unsafe {
            for cap in 0..=63 as libc::c_ulong {
                // EINVAL past the kernel's last capability is fine.
                libc::prctl(libc::PR_CAPBSET_DROP, cap, zero, zero, zero);
            }
            check(libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                zero,
                zero,
                zero,
            ))?;
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setresgid(self.gid, self.gid, self.gid))?;
            check(libc::setresuid(self.uid, self.uid, self.uid))?;
            let mut header = libc_cap_header();
            let data = [CapData::default(); 2];
            check(libc::syscall(
                libc::SYS_capset,
                &mut header as *mut CapHeader,
                data.as_ptr(),
            ) as libc::c_int)?;
            check(libc::prctl(
                libc::PR_SET_NO_NEW_PRIVS,
                1 as libc::c_ulong,
                zero,
                zero,
                zero,
            ))?;
        }
        Ok(())
    }
}

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn libc_cap_header() -> CapHeader {
    // _LINUX_CAPABILITY_VERSION_3
    CapHeader {
        version: 0x2008_0522,
        pid: 0,
    }
}

fn run(step: &Step) -> io::Result<()> {
    let null = std::ptr::null::<libc::c_char>();
    // SAFETY (every call below): system calls on NUL-terminated strings
    // that live in `step` for the call, and null pointers where the kernel
    // takes them.
    unsafe {
        match step {
            Step::JoinCgroup(procs) => {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(last_error());
                }
                // "0" is the writing process itself.
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written < 0 {
                    return Err(last_error());
                }
                Ok(())
            }
            Step::PrivateMounts => {
                check(libc::unshare(libc::CLONE_NEWNS))?;
                check(libc::mount(
                    null,
                    c"/".as_ptr(),
                    null,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))
            }
            Step::MountRoot(root) => check(libc::mount(
                c"tmpfs".as_ptr(),
                root.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID,
                c"mode=0755,size=1m,nr_inodes=4096".as_ptr().cast(),
            )),
            Step::Mkdir(path) => match libc::mkdir(path.as_ptr(), 0o755) {
                0 => Ok(()),
                _ if *libc::__errno_location() == libc::EEXIST => Ok(()),
                _ => Err(last_error()),
            },
            Step::Touch(path) => {
                let fd = libc::open(
                    path.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                if fd < 0 {
                    return Err(last_error());
                }
                libc::close(fd);
                Ok(())
            }
            Step::Bind {
                source,
                target,
                writable,
            } => {
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV;
                if !writable {
                    flags |= libc::MS_RDONLY;
                } else {
                    flags |= libc::MS_NOEXEC;
                }
                check(libc::mount(
                    null,
                    target.as_ptr(),
                    null,
                    flags,
                    std::ptr::null(),
                ))
            }
            Step::Symlink { target, path } => check(libc::symlink(target.as_ptr(), path.as_ptr())),
            Step::Mknod {
                path,
                major,
                minor,
                owner,
            } => {
                let mode = if owner.is_some() { 0o600 } else { 0o666 };
                check(libc::mknod(
                    path.as_ptr(),
                    libc::S_IFCHR | mode,
                    libc::makedev(*major, *minor),
                ))?;
                // mknod's mode went through the umask.
                check(libc::chmod(path.as_ptr(), mode))?;
                if let Some((uid, gid)) = owner {
                    check(libc::chown(path.as_ptr(), *uid, *gid))?;
                }
                Ok(())
            }
            Step::MountProc(path) => check(libc::mount(
                c"proc".as_ptr(),
                path.as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            )),
            Step::PivotRoot(root) => {
                check(libc::chdir(root.as_ptr()))?;
                // pivot_root(".", "."): the old root ends up on top of the
                // new one, and is detached right away.
                check(
                    libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr())
                        as libc::c_int,
                )?;
                check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))?;
                check(libc::chdir(c"/".as_ptr()))?;
                // The root itself is read-only: QEMU writes only where a
                // writable bind is.
                check(libc::mount(
                    null,
                    c"/".as_ptr(),
                    null,
                    libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID,
                    std::ptr::null(),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> VmConfig {
        VmConfig {
            name: "corral-u".into(),
            cpus: 1,
            memory_bytes: 128 << 20,
            accel: Accel::Tcg,
            kernel: Some("/img/l1/boot/vmlinuz".into()),
            initrd: Some("/img/l1/boot/initrd.img".into()),
            cmdline: None,
            disk: Some("/data/volumes/v/disk.qcow2".into()),
            data_disks: vec![("scratch".into(), "/data/vms/u/disks/scratch.qcow2".into())],
            tap: Some("tap0".into()),
            mac: "52:54:00:00:00:01".into(),
            console_socket: "/data/vms/u/console.sock".into(),
            console_log: "/data/vms/u/console.log".into(),
            qmp_socket: "/data/vms/u/qmp.sock".into(),
            incoming: None,
            sandboxed: true,
        }
    }

    fn bind(path: &str, writable: bool) -> Mount {
        Mount::Bind {
            path: path.into(),
            writable,
        }
    }

    #[test]
    fn the_vm_dir_and_disks_are_writable_and_boot_files_read_only() {
        let mounts = plan(&config(), &["/img/l2/disk.qcow2".into()]);
        let binds: Vec<&Mount> = mounts
            .iter()
            .filter(|m| matches!(m, Mount::Bind { .. }))
            .collect();
        assert_eq!(
            binds,
            [
                &bind("/data/vms/u", true),
                // The data disk is in the VM's directory: not bound again.
                &bind("/data/volumes/v/disk.qcow2", true),
                &bind("/img/l1/boot/vmlinuz", false),
                &bind("/img/l1/boot/initrd.img", false),
                &bind("/img/l2/disk.qcow2", false),
            ]
        );
        assert!(mounts.contains(&Mount::Proc));
        let devices: Vec<&str> = mounts
            .iter()
            .filter_map(|m| match m {
                Mount::Device { name, .. } => Some(*name),
                _ => None,
            })
            .collect();
        assert_eq!(devices, ["null", "zero", "full", "random", "urandom"]);
    }

    #[test]
    fn kvm_gets_a_device_node_only_the_vm_may_open() {
        let mut config = config();
        config.accel = Accel::Kvm;
        let mounts = plan(&config, &[]);
        assert!(mounts.contains(&Mount::Device {
            name: "kvm",
            major: 10,
            minor: 232,
            owned: true
        }));
    }

    #[test]
    fn seccomp_and_the_tap_descriptor_only_when_sandboxed() {
        let args = crate::vm::qemu_args(&config());
        let joined = args.join(" ");
        assert!(
            joined.contains(&format!("-sandbox {SECCOMP_OPTIONS}")),
            "{joined}"
        );
        assert!(joined.contains("tap,id=net0,fd=3"), "{joined}");
        let mut plain = config();
        plain.sandboxed = false;
        let joined = crate::vm::qemu_args(&plain).join(" ");
        assert!(!joined.contains("-sandbox"), "{joined}");
        assert!(joined.contains("ifname=tap0"), "{joined}");
    }

    #[test]
    fn preparing_makes_parents_before_each_mount_and_pivots_last() {
        let host = tempfile::tempdir().unwrap();
        let vm_dir = host.path().join("vms/u");
        std::fs::create_dir_all(&vm_dir).unwrap();
        let kernel = host.path().join("img/vmlinuz");
        std::fs::create_dir_all(kernel.parent().unwrap()).unwrap();
        std::fs::write(&kernel, b"k").unwrap();
        let root = PathBuf::from("/r");
        let sandbox = Sandbox {
            uid: 1 << 20,
            gid: 1 << 20,
            root: root.clone(),
            mounts: vec![
                Mount::Symlink {
                    path: "/lib".into(),
                    target: "usr/lib".into(),
                },
                bind(vm_dir.to_str().unwrap(), true),
                bind(kernel.to_str().unwrap(), false),
            ],
            cgroups: vec!["/sys/fs/cgroup/memory/corral/vm-u/cgroup.procs".into()],
        };
        let prepared = sandbox.prepare().unwrap();
        let words: Vec<String> = prepared
            .steps
            .iter()
            .map(|(_, what)| what.to_string_lossy().into_owned())
            .collect();
        let position = |wanted: &str| {
            words
                .iter()
                .position(|w| w == wanted)
                .unwrap_or_else(|| panic!("no step {wanted} in {words:?}"))
        };
        assert_eq!(
            words[0],
            "join cgroup /sys/fs/cgroup/memory/corral/vm-u/cgroup.procs"
        );
        assert_eq!(words[1], "make mounts private");
        assert_eq!(words[2], "mount a tmpfs on /r");
        let inside = |p: &Path| under(&root, p).unwrap().display().to_string();
        assert!(
            position(&format!("make {}", inside(&vm_dir)))
                < position(&format!("bind {}", vm_dir.display()))
        );
        assert!(
            position(&format!("make {}", inside(kernel.parent().unwrap())))
                < position(&format!("make {}", inside(&kernel)))
        );
        assert!(matches!(
            prepared.steps.last(),
            Some((Step::PivotRoot(_), _))
        ));
        // The kernel is a file: its mount point is touched, not made a
        // directory.
        assert!(prepared.steps.iter().any(
            |(step, _)| matches!(step, Step::Touch(p) if p.to_str().unwrap() == inside(&kernel))
        ));
        let relative = Sandbox {
            mounts: vec![bind("relative/path", false)],
            ..sandbox
        };
        assert!(matches!(relative.prepare(), Err(SandboxError::Relative(_))));
    }
}
