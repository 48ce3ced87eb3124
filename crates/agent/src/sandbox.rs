//! The default container sandbox, and what a pod's granted relaxations
//! loosen. Pure: [`apply`] turns a container's runtime config into the
//! sandboxed one; the caller supplies the pod's host uid range.
//!
//! The relaxations in `spec.security.relax` were admitted by the API
//! server only when a Policy grants each of them (two-party opt-in), so
//! the agent applies what the admitted spec asks.

use std::collections::BTreeSet;
use std::path::PathBuf;

use corral_api::kinds::{PodSpec, RuntimeClass};
use corral_api::security::Relaxation;
use corral_runtime::bundle::{
    Capability, ContainerConfig, IdMapping, NetworkNamespace, SyscallAbis, SysfsMount, TmpfsMount,
    UserIds, UserNamespace, default_profile,
};

/// The uid and gid a container runs as when its image's user is root.
pub const NOBODY: u32 = 65_534;

/// How many ids each pod's user namespace maps (the whole 16-bit range, so
/// `nobody` and every image user exist inside).
pub const IDS_PER_POD: u32 = 65_536;

/// Why a pod's sandbox cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    #[error("spec.security.relax[{index}]: {message}")]
    Relaxation { index: usize, message: String },
    #[error("capability {0:?} is not one this runtime knows")]
    Capability(String),
    #[error("the default seccomp profile does not build: {0}")]
    Seccomp(String),
}

/// What the sandbox of one pod is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSandbox {
    /// The pod's network namespace, which its containers join.
    pub netns: PathBuf,
    /// The relaxations the admitted spec asks for.
    pub relax: BTreeSet<Relaxation>,
    /// The first host uid (and gid) of the pod's range; `None` when the
    /// pod runs without a user namespace.
    pub host_id_base: Option<u32>,
    /// The pod's pinned user namespace, which its containers join.
    pub user_namespace: Option<PathBuf>,
    pub runtime: RuntimeClass,
}

/// The relaxations `spec` asks for, parsed.
pub fn relaxations(spec: &PodSpec) -> Result<BTreeSet<Relaxation>, SandboxError> {
    spec.security
        .relax
        .iter()
        .enumerate()
        .map(|(index, name)| {
            name.parse::<Relaxation>()
                .map_err(|error| SandboxError::Relaxation {
                    index,
                    message: error.to_string(),
                })
        })
        .collect()
}

/// Whether a pod with these relaxations gets its own user namespace.
/// gVisor pods do not: runsc's sentry is the sandbox there, and it runs
/// unprivileged in its own user namespace.
pub fn wants_user_namespace(relax: &BTreeSet<Relaxation>, runtime: RuntimeClass) -> bool {
    runtime == RuntimeClass::Runc && !relax.contains(&Relaxation::NoUserNamespace)
}

/// What [`apply`] decided about the user, for status messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserChoice {
    pub user: UserIds,
    /// The image's user was root and the pod may not run as root: it runs
    /// as [`NOBODY`] instead.
    pub substituted_root: bool,
}

/// The uid a container runs as: the image's user unless it is root and
/// the pod has no `run-as-root` grant, then [`NOBODY`].
pub fn choose_user(image_user: UserIds, relax: &BTreeSet<Relaxation>) -> UserChoice {
    if image_user.uid == 0 && !relax.contains(&Relaxation::RunAsRoot) {
        UserChoice {
            user: UserIds {
                uid: NOBODY,
                gid: NOBODY,
            },
            substituted_root: true,
        }
    } else {
        UserChoice {
            user: image_user,
            substituted_root: false,
        }
    }
}

/// Scratch directories a read-only root gets as tmpfs mounts, besides
/// `/tmp` (every container has that).
pub const SCRATCH_DIRS: [&str; 2] = ["/var/tmp", "/run"];

/// The size of each scratch tmpfs (it counts against the container's
/// memory limit as it fills).
const SCRATCH_BYTES: u64 = 64 << 20;

/// Tightens `config` (built for the image, joining the pod's network
/// namespace) into the pod's sandbox.
pub fn apply(
    config: &mut ContainerConfig,
    image_user: UserIds,
    sandbox: &PodSandbox,
) -> Result<UserChoice, SandboxError> {
    let relax = &sandbox.relax;
    let choice = choose_user(image_user, relax);
    config.user = choice.user;
    if choice.user.uid != 0 || choice.substituted_root {
        config.additional_gids.clear();
    }
    config.capabilities = relax
        .iter()
        .filter_map(|r| match r {
            Relaxation::Capability(name) => Some(name),
            _ => None,
        })
        .map(|name| {
            serde_json::from_value::<Capability>(serde_json::Value::String(format!("CAP_{name}")))
                .map_err(|_| SandboxError::Capability(name.clone()))
        })
        .collect::<Result<_, _>>()?;
    config.no_new_privileges = true;
    let abis = if relax.contains(&Relaxation::Syscalls32Bit) {
        SyscallAbis::With32Bit
    } else {
        SyscallAbis::Native
    };
    config.seccomp = if relax.contains(&Relaxation::UnconfinedSeccomp) {
        None
    } else {
        Some(default_profile(abis).map_err(|e| SandboxError::Seccomp(e.to_string()))?)
    };
    config.readonly_rootfs = !relax.contains(&Relaxation::WritableRootfs);
    // A read-only root still has the scratch directories programs expect
    // to write, each a tmpfs anyone may write (as podman's --read-only).
    if config.readonly_rootfs {
        for destination in SCRATCH_DIRS {
            if !config.tmpfs.iter().any(|t| t.destination == destination) {
                config.tmpfs.push(TmpfsMount {
                    destination: destination.to_string(),
                    size_bytes: SCRATCH_BYTES,
                    mode: 0o1777,
                });
            }
        }
    }
    if relax.contains(&Relaxation::HostNetwork) {
        config.network = NetworkNamespace::Host;
    }
    config.user_namespace = match sandbox.host_id_base {
        Some(base) if wants_user_namespace(relax, sandbox.runtime) => {
            let mapping = vec![IdMapping {
                container_id: 0,
                host_id: base,
                size: IDS_PER_POD,
            }];
            Some(UserNamespace {
                path: sandbox.user_namespace.clone(),
                uid_mappings: mapping.clone(),
                gid_mappings: mapping,
            })
        }
        _ => None,
    };
    // A fresh sysfs cannot be mounted from a user namespace into a network
    // namespace it does not own, and the host's /sys would show the host:
    // a user-namespaced container gets none.
    config.sysfs = if config.user_namespace.is_some() {
        SysfsMount::None
    } else {
        SysfsMount::FreshReadOnly
    };
    Ok(choice)
}

/// The host uid a container's user runs as, for status and tests.
pub fn host_uid(choice: &UserChoice, sandbox: &PodSandbox) -> u32 {
    match sandbox.host_id_base {
        Some(base) if wants_user_namespace(&sandbox.relax, sandbox.runtime) => {
            base + choice.user.uid
        }
        _ => choice.user.uid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_runtime::bundle::Arch;

    fn sandbox(relax: &[&str]) -> PodSandbox {
        PodSandbox {
            netns: "/run/netns/pod".into(),
            relax: relax
                .iter()
                .map(|r| r.parse().expect("relaxation"))
                .collect(),
            host_id_base: Some(1 << 20),
            user_namespace: Some("/run/netns/pod.user".into()),
            runtime: RuntimeClass::Runc,
        }
    }

    fn config() -> ContainerConfig {
        let mut config = ContainerConfig::new("c1", "/rootfs", vec!["sh".into()]);
        config.network = NetworkNamespace::Join("/run/netns/pod".into());
        config
    }

    const ROOT: UserIds = UserIds { uid: 0, gid: 0 };

    #[test]
    fn the_default_sandbox_is_tight() {
        let mut config = config();
        let choice = apply(&mut config, ROOT, &sandbox(&[])).expect("sandbox");
        assert!(choice.substituted_root);
        assert_eq!(
            config.user,
            UserIds {
                uid: NOBODY,
                gid: NOBODY
            }
        );
        assert!(config.capabilities.is_empty());
        assert!(config.no_new_privileges);
        assert!(config.seccomp.is_some());
        assert!(config.readonly_rootfs);
        assert_eq!(config.sysfs, SysfsMount::None);
        let userns = config.user_namespace.expect("a user namespace");
        assert_eq!(userns.path, Some("/run/netns/pod.user".into()));
        assert_eq!(
            userns.uid_mappings,
            vec![IdMapping {
                container_id: 0,
                host_id: 1 << 20,
                size: IDS_PER_POD
            }]
        );
        assert_eq!(userns.uid_mappings, userns.gid_mappings);
        assert!(matches!(config.network, NetworkNamespace::Join(_)));
        for scratch in ["/tmp", "/var/tmp", "/run"] {
            let tmpfs = config.tmpfs.iter().find(|t| t.destination == scratch);
            assert_eq!(tmpfs.map(|t| t.mode), Some(0o1777), "{scratch}");
        }
        assert!(config.masked_paths.iter().any(|p| p == "/proc/kcore"));
        assert_eq!(host_uid(&choice, &sandbox(&[])), (1 << 20) + NOBODY);
    }

    #[test]
    fn a_non_root_image_user_is_kept() {
        let mut config = config();
        let user = UserIds {
            uid: 1000,
            gid: 100,
        };
        let choice = apply(&mut config, user, &sandbox(&[])).expect("sandbox");
        assert!(!choice.substituted_root);
        assert_eq!(config.user, user);
    }

    #[test]
    fn each_relaxation_loosens_only_its_knob() {
        let relaxed = sandbox(&[
            "run-as-root",
            "capability:NET_ADMIN",
            "writable-rootfs",
            "unconfined-seccomp",
        ]);
        let mut config = config();
        let choice = apply(&mut config, ROOT, &relaxed).expect("sandbox");
        assert_eq!(config.user, ROOT);
        assert!(!choice.substituted_root);
        assert_eq!(config.capabilities, vec![Capability::NetAdmin]);
        assert!(config.seccomp.is_none());
        assert!(!config.readonly_rootfs);
        assert!(
            config.tmpfs.iter().all(|t| t.destination == "/tmp"),
            "a writable root needs no scratch mounts"
        );
        assert!(config.no_new_privileges, "never relaxed");
        assert!(
            config.user_namespace.is_some(),
            "still its own user namespace"
        );
        assert_eq!(host_uid(&choice, &relaxed), 1 << 20);
    }

    #[test]
    fn only_the_relaxation_admits_32_bit_system_calls() {
        let abis = |relax: &[&str]| {
            let mut config = config();
            apply(&mut config, ROOT, &sandbox(relax)).expect("sandbox");
            config
                .seccomp
                .and_then(|profile| profile.architectures().clone())
        };
        assert_eq!(abis(&[]), Some(vec![Arch::ScmpArchX86_64]));
        let relaxed = abis(&["32-bit-syscalls"]).expect("a profile");
        assert!(relaxed.contains(&Arch::ScmpArchX86), "{relaxed:?}");
        assert!(relaxed.contains(&Arch::ScmpArchX32), "{relaxed:?}");
    }

    #[test]
    fn no_user_namespace_and_host_network() {
        let relaxed = sandbox(&["no-user-namespace", "host-network"]);
        let mut config = config();
        let choice = apply(&mut config, ROOT, &relaxed).expect("sandbox");
        assert!(config.user_namespace.is_none());
        assert_eq!(config.network, NetworkNamespace::Host);
        assert_eq!(config.sysfs, SysfsMount::FreshReadOnly);
        assert_eq!(host_uid(&choice, &relaxed), NOBODY);
    }

    #[test]
    fn gvisor_pods_get_no_user_namespace_of_ours() {
        let mut gvisor = sandbox(&[]);
        gvisor.runtime = RuntimeClass::Gvisor;
        let mut config = config();
        apply(&mut config, ROOT, &gvisor).expect("sandbox");
        assert!(config.user_namespace.is_none());
        assert_eq!(config.user.uid, NOBODY, "still not root inside");
    }

    #[test]
    fn relaxations_parse_with_the_index_of_a_bad_one() {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "security": {"relax": ["run-as-root", "fly"]},
            "containers": [],
        }))
        .expect("a pod spec");
        let error = relaxations(&spec).expect_err("unknown");
        assert!(
            error.to_string().starts_with("spec.security.relax[1]: "),
            "{error}"
        );
    }
}
