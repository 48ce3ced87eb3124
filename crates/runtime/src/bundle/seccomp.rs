//! The default seccomp profile. The profile itself is data
//! (`seccomp-default.json`, an allowlist grouped by purpose, with what it
//! leaves out and why); this module turns it into an OCI [`LinuxSeccomp`].

use std::collections::BTreeMap;

use oci_spec::OciSpecError;
use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder,
    LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};
use serde::Deserialize;

/// The profile as kept in the repository.
const DEFAULT_PROFILE: &str = include_str!("seccomp-default.json");

/// The namespace flags of `clone(2)`: `CLONE_NEWNS | CLONE_NEWCGROUP |
/// CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
/// CLONE_NEWNET`. A clone with any of them is refused like `unshare`.
pub const CLONE_NAMESPACE_FLAGS: u64 = 0x7E02_0000;

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProfileData {
    #[allow(dead_code)]
    comment: String,
    default_errno: String,
    allow: BTreeMap<String, Vec<String>>,
    allow_clone_without_namespace_flags: bool,
    enosys: Vec<String>,
}

/// Why the profile data does not make a profile. A test parses the
/// shipped profile, so this never reaches a user.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("the seccomp profile data does not parse")]
    Data(#[source] serde_json::Error),
    #[error("the seccomp profile's defaultErrno {0:?} must be EPERM")]
    Errno(String),
    #[error("failed to build the seccomp profile")]
    Spec(#[from] OciSpecError),
}

fn data() -> Result<ProfileData, SeccompError> {
    let data: ProfileData = serde_json::from_str(DEFAULT_PROFILE).map_err(SeccompError::Data)?;
    if data.default_errno != "EPERM" {
        return Err(SeccompError::Errno(data.default_errno));
    }
    Ok(data)
}

/// Every syscall the default profile allows unconditionally, sorted.
pub fn default_allowed_syscalls() -> Result<Vec<String>, SeccompError> {
    let mut names: Vec<String> = data()?.allow.into_values().flatten().collect();
    names.sort();
    names.dedup();
    Ok(names)
}

fn rule(names: Vec<String>, action: LinuxSeccompAction) -> Result<LinuxSyscall, OciSpecError> {
    LinuxSyscallBuilder::default()
        .names(names)
        .action(action)
        .build()
}

/// Which system call ABIs a profile admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyscallAbis {
    /// x86_64 alone: a call through a 32-bit ABI (`int 0x80`, an i386 or
    /// x32 program) kills the thread with `SIGSYS`. The default: the
    /// compat ABIs are kernel attack surface most containers never use
    /// (gVisor does not offer them at all), and the runtime compiles the
    /// filter for every listed ABI at every container start.
    Native,
    /// x86_64, i386 and x32, each with the same allowlist (the
    /// `32-bit-syscalls` relaxation).
    With32Bit,
}

/// The default profile: the allowlist, `clone` without namespace flags,
/// `clone3` answered with `ENOSYS` (so libc falls back to `clone`, whose
/// flags the filter can see), everything else `EPERM`; for the system
/// call ABIs `abis` names.
pub fn default_profile(abis: SyscallAbis) -> Result<LinuxSeccomp, SeccompError> {
    let data = data()?;
    let mut syscalls = vec![rule(
        default_allowed_syscalls()?,
        LinuxSeccompAction::ScmpActAllow,
    )?];
    if data.allow_clone_without_namespace_flags {
        let mut clone = rule(vec!["clone".into()], LinuxSeccompAction::ScmpActAllow)?;
        clone.set_args(Some(vec![
            LinuxSeccompArgBuilder::default()
                .index(0usize)
                .value(CLONE_NAMESPACE_FLAGS)
                .value_two(0u64)
                .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
                .build()?,
        ]));
        syscalls.push(clone);
    }
    if !data.enosys.is_empty() {
        let mut enosys = rule(data.enosys, LinuxSeccompAction::ScmpActErrno)?;
        enosys.set_errno_ret(Some(ENOSYS));
        syscalls.push(enosys);
    }
    Ok(LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(EPERM)
        .architectures(match abis {
            SyscallAbis::Native => vec![Arch::ScmpArchX86_64],
            SyscallAbis::With32Bit => {
                vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
            }
        })
        .syscalls(syscalls)
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_profile_parses_and_refuses_what_the_sandbox_promises() {
        let allowed = default_allowed_syscalls().expect("profile data parses");
        for refused in [
            "mount",
            "umount2",
            "unshare",
            "setns",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "perf_event_open",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "ptrace",
            "reboot",
            "swapon",
            "swapoff",
            "userfaultfd",
            "open_by_handle_at",
            "pivot_root",
            "fsopen",
            "move_mount",
            "io_uring_setup",
            "clone",
            "clone3",
        ] {
            assert!(
                !allowed.iter().any(|name| name == refused),
                "{refused} must not be allowed unconditionally"
            );
        }
        for needed in [
            "read",
            "write",
            "execve",
            "openat",
            "mmap",
            "exit_group",
            "socket",
        ] {
            assert!(
                allowed.iter().any(|name| name == needed),
                "{needed} allowed"
            );
        }
    }

    #[test]
    fn every_name_is_listed_once() {
        let data = data().expect("profile data parses");
        let all: Vec<&String> = data.allow.values().flatten().collect();
        let mut unique = all.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(all.len(), unique.len(), "a syscall is listed in two groups");
    }

    #[test]
    fn clone_is_allowed_only_without_namespace_flags_and_clone3_gets_enosys() {
        let profile = default_profile(SyscallAbis::Native).expect("profile");
        assert_eq!(profile.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(profile.default_errno_ret(), Some(EPERM));
        let syscalls = profile.syscalls().clone().expect("rules");
        let clone = syscalls
            .iter()
            .find(|rule| rule.names() == &["clone".to_string()])
            .expect("clone rule");
        let args = clone.args().clone().expect("clone has an argument filter");
        assert_eq!(args[0].value(), CLONE_NAMESPACE_FLAGS);
        assert_eq!(args[0].value_two(), Some(0));
        assert_eq!(args[0].op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
        let clone3 = syscalls
            .iter()
            .find(|rule| rule.names() == &["clone3".to_string()])
            .expect("clone3 rule");
        assert_eq!(clone3.errno_ret(), Some(ENOSYS));
    }

    #[test]
    fn only_the_relaxed_profile_admits_the_32_bit_abis_with_the_same_rules() {
        let native = default_profile(SyscallAbis::Native).expect("profile");
        let wide = default_profile(SyscallAbis::With32Bit).expect("profile");
        assert_eq!(
            native.architectures().as_deref(),
            Some(&[Arch::ScmpArchX86_64][..])
        );
        assert_eq!(
            wide.architectures().as_deref(),
            Some(&[Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32][..])
        );
        assert_eq!(native.syscalls(), wide.syscalls());
    }
}
