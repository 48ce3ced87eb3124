//! OCI runtime bundles: a [`ContainerConfig`] (every security and resource
//! knob explicit) becomes an `oci_spec` [`Spec`] and a `config.json`.
//! Pure apart from [`write_bundle`]; the defaults of
//! [`ContainerConfig::new`] lean secure, and policy (what a pod may loosen)
//! is decided by the caller.

mod process;
mod seccomp;
mod spec;

use std::path::PathBuf;

pub use oci_spec::runtime::{Arch, Capability, LinuxSeccomp, Spec};
pub use process::{
    DEFAULT_PATH, MergedProcess, ProcessError, ProcessOverrides, UserIds, merge_process,
    resolve_user, resolve_user_in_rootfs,
};
pub use seccomp::{
    CLONE_NAMESPACE_FLAGS, SeccompError, SyscallAbis, default_allowed_syscalls, default_profile,
};
pub use spec::{BundleError, generate_spec, write_bundle};

/// Everything the runtime needs to know to run one container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerConfig {
    /// The runtime's container id (unique per runtime state root).
    pub id: String,
    pub args: Vec<String>,
    /// `NAME=value`.
    pub env: Vec<String>,
    /// Absolute working directory.
    pub cwd: String,
    pub user: UserIds,
    /// Supplementary groups.
    pub additional_gids: Vec<u32>,
    pub hostname: Option<String>,
    /// The mounted rootfs (absolute), e.g. [`crate::image::MountedRootfs::rootfs`].
    pub rootfs: PathBuf,
    pub readonly_rootfs: bool,
    pub network: NetworkNamespace,
    /// A user namespace; `None` runs in the host's (see [`SysfsMount`]).
    pub user_namespace: Option<UserNamespace>,
    /// Cgroup path relative to each hierarchy's root, e.g. `/corral/<pod>/<ctr>`.
    pub cgroup_path: Option<String>,
    pub memory_limit_bytes: Option<i64>,
    /// Memory + swap; equal to the memory limit means no swap.
    pub memory_swap_limit_bytes: Option<i64>,
    /// CPU limit in millicores, enforced as CFS quota per [`CPU_PERIOD_US`].
    pub cpu_limit_millicores: Option<u64>,
    /// CPU weight in millicores (Kubernetes' request), as cgroup v1 shares.
    pub cpu_shares_millicores: Option<u64>,
    pub pids_limit: Option<i64>,
    /// `RLIMIT_NOFILE` soft and hard.
    pub nofile_limit: Option<u64>,
    pub mounts: Vec<BindMount>,
    pub tmpfs: Vec<TmpfsMount>,
    pub sysfs: SysfsMount,
    pub capabilities: Vec<Capability>,
    pub no_new_privileges: bool,
    pub seccomp: Option<LinuxSeccomp>,
    pub masked_paths: Vec<String>,
    pub readonly_paths: Vec<String>,
}

/// CFS period used for CPU limits (100 ms, as Kubernetes).
pub const CPU_PERIOD_US: u64 = 100_000;

/// Which network namespace the container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkNamespace {
    /// A fresh, empty one (only `lo`, down).
    New,
    /// Join a persistent one (a pod's; see [`crate::oci::netns`]).
    Join(PathBuf),
    /// The host's: no network namespace entry at all.
    Host,
}

/// A user namespace with its id mappings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserNamespace {
    /// Join an existing one instead of creating one (its mappings, when
    /// given, must be the ones it has).
    pub path: Option<PathBuf>,
    pub uid_mappings: Vec<IdMapping>,
    pub gid_mappings: Vec<IdMapping>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMapping {
    pub container_id: u32,
    pub host_id: u32,
    pub size: u32,
}

/// How `/sys` appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysfsMount {
    /// A fresh read-only sysfs (shows the container's network namespace).
    /// Fails in a user namespace that joins a root-created network namespace.
    FreshReadOnly,
    /// The host's `/sys` bound read-only: works in any user namespace.
    HostBindReadOnly,
    /// No `/sys` at all.
    None,
}

/// A bind mount of a host path into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    pub source: PathBuf,
    pub destination: String,
    pub read_only: bool,
}

/// A tmpfs in the container (e.g. `/tmp` over a read-only rootfs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmpfsMount {
    pub destination: String,
    pub size_bytes: u64,
    /// Octal mode, e.g. `0o1777`.
    pub mode: u32,
}

/// The capabilities a container keeps by default: enough for common
/// images that start as root and drop privileges; no `NET_RAW`, `MKNOD`,
/// `SYS_CHROOT` or `AUDIT_WRITE`. The security work narrows this to none.
pub fn default_capabilities() -> Vec<Capability> {
    vec![
        Capability::Chown,
        Capability::DacOverride,
        Capability::Fowner,
        Capability::Fsetid,
        Capability::Kill,
        Capability::NetBindService,
        Capability::Setgid,
        Capability::Setuid,
        Capability::Setpcap,
    ]
}

/// Paths masked (bound over with `/dev/null` or an empty tmpfs).
pub fn default_masked_paths() -> Vec<String> {
    [
        "/proc/acpi",
        "/proc/asound",
        "/proc/interrupts",
        "/proc/kcore",
        "/proc/keys",
        "/proc/latency_stats",
        "/proc/sched_debug",
        "/proc/scsi",
        "/proc/timer_list",
        "/proc/timer_stats",
        "/sys/firmware",
        "/sys/devices/virtual/powercap",
    ]
    .map(String::from)
    .to_vec()
}

/// Paths made read-only.
pub fn default_readonly_paths() -> Vec<String> {
    [
        "/proc/bus",
        "/proc/fs",
        "/proc/irq",
        "/proc/sys",
        "/proc/sysrq-trigger",
    ]
    .map(String::from)
    .to_vec()
}

impl ContainerConfig {
    /// A container running `args` as root in `rootfs` with secure-leaning
    /// defaults: no new privileges, [`default_capabilities`], masked and
    /// read-only `/proc` paths, a fresh network namespace, a 64 MiB `/tmp`
    /// tmpfs, read-write rootfs, 1024 pids and open files. Every field is
    /// public: set what the pod and policy decide.
    pub fn new(id: impl Into<String>, rootfs: impl Into<PathBuf>, args: Vec<String>) -> Self {
        Self {
            id: id.into(),
            args,
            env: vec![format!("PATH={DEFAULT_PATH}")],
            cwd: "/".to_string(),
            user: UserIds { uid: 0, gid: 0 },
            additional_gids: Vec::new(),
            hostname: None,
            rootfs: rootfs.into(),
            readonly_rootfs: false,
            network: NetworkNamespace::New,
            user_namespace: None,
            cgroup_path: None,
            memory_limit_bytes: None,
            memory_swap_limit_bytes: None,
            cpu_limit_millicores: None,
            cpu_shares_millicores: None,
            pids_limit: Some(1024),
            nofile_limit: Some(1024),
            mounts: Vec::new(),
            tmpfs: vec![TmpfsMount {
                destination: "/tmp".to_string(),
                size_bytes: 64 << 20,
                mode: 0o1777,
            }],
            sysfs: SysfsMount::FreshReadOnly,
            capabilities: default_capabilities(),
            no_new_privileges: true,
            seccomp: None,
            masked_paths: default_masked_paths(),
            readonly_paths: default_readonly_paths(),
        }
    }

    /// Applies a merged image/pod process (args, env, cwd).
    pub fn with_process(mut self, process: MergedProcess) -> Self {
        self.args = process.args;
        self.env = process.env;
        self.cwd = process.cwd;
        self
    }
}
