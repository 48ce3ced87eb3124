//! Relaxation names: parsing, validation and their canonical spelling.

use std::fmt;
use std::str::FromStr;

/// The shapes of every relaxation name, for error messages.
pub const SHAPES: &str = "run-as-root, capability:NAME, host-network, host-network-stack, host-path:/PREFIX, writable-rootfs, unconfined-seccomp, 32-bit-syscalls, no-user-namespace, device:/dev/NAME, runtime:runc";

/// The Linux capability names `capability:NAME` accepts (without `CAP_`).
pub const CAPABILITIES: &[&str] = &[
    "AUDIT_CONTROL",
    "AUDIT_READ",
    "AUDIT_WRITE",
    "BLOCK_SUSPEND",
    "BPF",
    "CHECKPOINT_RESTORE",
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "IPC_LOCK",
    "IPC_OWNER",
    "KILL",
    "LEASE",
    "LINUX_IMMUTABLE",
    "MAC_ADMIN",
    "MAC_OVERRIDE",
    "MKNOD",
    "NET_ADMIN",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_RAW",
    "PERFMON",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYSLOG",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_CHROOT",
    "SYS_MODULE",
    "SYS_NICE",
    "SYS_PACCT",
    "SYS_PTRACE",
    "SYS_RAWIO",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "WAKE_ALARM",
];

/// One named loosening of the default sandbox.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Relaxation {
    RunAsRoot,
    /// A Linux capability, without the `CAP_` prefix.
    Capability(String),
    HostNetwork,
    /// A gVisor pod's sockets served by the host kernel's network stack
    /// (through the pod's own network namespace) instead of gVisor's.
    HostNetworkStack,
    /// An absolute host path prefix.
    HostPath(String),
    WritableRootfs,
    UnconfinedSeccomp,
    /// The kernel's 32-bit system call ABIs (i386, x32) besides x86_64,
    /// for programs built for them: the default seccomp profile admits
    /// only 64-bit calls (a 32-bit program is killed by `SIGSYS`).
    Syscalls32Bit,
    NoUserNamespace,
    /// A device node under `/dev/`.
    Device(String),
    /// `runc` where the namespace default is gVisor.
    RuntimeRunc,
}

/// Why a relaxation name is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelaxationError {
    #[error("unknown relaxation {name:?}: expected one of {SHAPES}")]
    Unknown { name: String },
    #[error(
        "unknown capability {name:?} in {given:?}: expected an uppercase Linux capability name such as NET_BIND_SERVICE"
    )]
    Capability { given: String, name: String },
    #[error("host path {path:?} in {given:?} must be absolute, without '..' or empty parts")]
    HostPath { given: String, path: String },
    #[error("device {path:?} in {given:?} must be /dev/NAME")]
    Device { given: String, path: String },
    #[error("only runtime:runc is a relaxation; {given:?} is not")]
    Runtime { given: String },
}

impl FromStr for Relaxation {
    type Err = RelaxationError;

    fn from_str(given: &str) -> Result<Self, Self::Err> {
        let owned = || given.to_string();
        match given {
            "run-as-root" => return Ok(Relaxation::RunAsRoot),
            "host-network" => return Ok(Relaxation::HostNetwork),
            "host-network-stack" => return Ok(Relaxation::HostNetworkStack),
            "writable-rootfs" => return Ok(Relaxation::WritableRootfs),
            "unconfined-seccomp" => return Ok(Relaxation::UnconfinedSeccomp),
            "32-bit-syscalls" => return Ok(Relaxation::Syscalls32Bit),
            "no-user-namespace" => return Ok(Relaxation::NoUserNamespace),
            "runtime:runc" => return Ok(Relaxation::RuntimeRunc),
            _ => {}
        }
        let Some((shape, value)) = given.split_once(':') else {
            return Err(RelaxationError::Unknown { name: owned() });
        };
        match shape {
            "capability" => {
                let name = value.strip_prefix("CAP_").unwrap_or(value);
                if CAPABILITIES.contains(&name) {
                    Ok(Relaxation::Capability(name.to_string()))
                } else {
                    Err(RelaxationError::Capability {
                        given: owned(),
                        name: value.to_string(),
                    })
                }
            }
            "host-path" => {
                if is_clean_absolute(value) {
                    Ok(Relaxation::HostPath(normalise_path(value)))
                } else {
                    Err(RelaxationError::HostPath {
                        given: owned(),
                        path: value.to_string(),
                    })
                }
            }
            "device" => {
                let valid = value
                    .strip_prefix("/dev/")
                    .is_some_and(|rest| !rest.is_empty() && is_clean_absolute(value));
                if valid {
                    Ok(Relaxation::Device(normalise_path(value)))
                } else {
                    Err(RelaxationError::Device {
                        given: owned(),
                        path: value.to_string(),
                    })
                }
            }
            "runtime" => Err(RelaxationError::Runtime { given: owned() }),
            _ => Err(RelaxationError::Unknown { name: owned() }),
        }
    }
}

/// Absolute, and no `.`/`..` or empty parts (a trailing `/` is allowed).
fn is_clean_absolute(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    rest.is_empty()
        || rest
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

fn normalise_path(path: &str) -> String {
    match path.strip_suffix('/') {
        Some(stripped) if !stripped.is_empty() => stripped.to_string(),
        _ => path.to_string(),
    }
}

impl fmt::Display for Relaxation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Relaxation::RunAsRoot => f.write_str("run-as-root"),
            Relaxation::Capability(name) => write!(f, "capability:{name}"),
            Relaxation::HostNetwork => f.write_str("host-network"),
            Relaxation::HostNetworkStack => f.write_str("host-network-stack"),
            Relaxation::HostPath(path) => write!(f, "host-path:{path}"),
            Relaxation::WritableRootfs => f.write_str("writable-rootfs"),
            Relaxation::UnconfinedSeccomp => f.write_str("unconfined-seccomp"),
            Relaxation::Syscalls32Bit => f.write_str("32-bit-syscalls"),
            Relaxation::NoUserNamespace => f.write_str("no-user-namespace"),
            Relaxation::Device(path) => write!(f, "device:{path}"),
            Relaxation::RuntimeRunc => f.write_str("runtime:runc"),
        }
    }
}

impl Relaxation {
    /// Whether a Policy granting `self` covers a pod asking for `asked`:
    /// equal, or for host paths the asked path lies under the granted
    /// prefix.
    pub fn covers(&self, asked: &Relaxation) -> bool {
        match (self, asked) {
            (Relaxation::HostPath(prefix), Relaxation::HostPath(path)) => {
                prefix == "/"
                    || path == prefix
                    || path
                        .strip_prefix(prefix.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            }
            _ => self == asked,
        }
    }
}
