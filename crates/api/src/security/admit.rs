//! The admission rule and the effective sandbox it yields.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::relaxation::{Relaxation, RelaxationError};
use crate::kinds::{PodSpec, PolicySpec, RuntimeClass};

/// One relaxation as granted: what, and by which Policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub relaxation: String,
    pub policy: String,
}

/// One knob of the sandbox: its value, and the grants that loosened it
/// (none: the default).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Knob {
    pub name: String,
    pub value: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relaxed_by: Vec<Grant>,
}

impl Knob {
    fn new(name: &str, value: impl Into<String>, relaxed_by: Vec<Grant>) -> Self {
        Knob {
            name: name.to_string(),
            value: value.into(),
            relaxed_by,
        }
    }

    /// `default`, or `relaxed by Policy A (x), Policy B (y)`.
    pub fn source(&self) -> String {
        if self.relaxed_by.is_empty() {
            return "default".to_string();
        }
        let grants: Vec<String> = self
            .relaxed_by
            .iter()
            .map(|grant| format!("Policy {} ({})", grant.policy, grant.relaxation))
            .collect();
        format!("relaxed by {}", grants.join(", "))
    }
}

/// A Policy's grant the pod does not ask for: it changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnusedGrant {
    pub policy: String,
    pub relaxation: String,
    pub namespace: String,
}

impl fmt::Display for UnusedGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Policy {} grants {} to namespace {} but the pod does not ask for it",
            self.policy, self.relaxation, self.namespace
        )
    }
}

/// The sandbox a pod gets: every knob of the default sandbox with its
/// value and where each relaxation came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveSandbox {
    pub namespace: String,
    pub knobs: Vec<Knob>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unused_grants: Vec<UnusedGrant>,
}

impl EffectiveSandbox {
    /// The knob called `name`.
    pub fn knob(&self, name: &str) -> Option<&Knob> {
        self.knobs.iter().find(|knob| knob.name == name)
    }
}

/// Why a pod's relaxations are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A name in `spec.security.relax` is not a relaxation.
    #[error("spec.security.relax[{index}]: {error}")]
    Invalid {
        index: usize,
        error: RelaxationError,
    },
    /// Asked, but no Policy applying to the namespace grants it.
    #[error("{}", not_granted(namespace, missing))]
    NotGranted {
        namespace: String,
        missing: Vec<String>,
    },
    /// `host-network-stack` asked by a pod that does not run under gVisor.
    #[error(
        "spec.security.relax asks for host-network-stack, which only applies to runtime gvisor; this pod runs {runtime}, whose containers always use the host kernel's network stack"
    )]
    HostNetworkStackWithoutGvisor { runtime: &'static str },
    /// A gVisor pod on gVisor's network stack with more than one
    /// long-running container.
    #[error(
        "the pod runs {containers} containers under gVisor with gVisor's own network stack, which serves the pod's address from one sandbox (each container is a gVisor sandbox of its own): run one container (init containers are fine), or ask for host-network-stack where a Policy grants it"
    )]
    NetstackContainers { containers: usize },
}

/// Which network stack serves a pod's sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkStack {
    /// The host kernel's (in the pod's network namespace, or the node's
    /// with `host-network`): every runc pod, and gVisor pods granted
    /// `host-network-stack` or `host-network`.
    HostKernel,
    /// gVisor's own (netstack, inside the sandbox): the default under
    /// gVisor. runsc takes the addresses and routes of the pod's network
    /// namespace when the sandbox starts and serves them itself.
    Gvisor,
}

/// The network stack of a pod running `runtime` with `relax`.
pub fn network_stack<'a>(
    runtime: RuntimeClass,
    relax: impl IntoIterator<Item = &'a Relaxation>,
) -> NetworkStack {
    let host = relax
        .into_iter()
        .any(|r| matches!(r, Relaxation::HostNetworkStack | Relaxation::HostNetwork));
    match runtime {
        RuntimeClass::Gvisor if !host => NetworkStack::Gvisor,
        _ => NetworkStack::HostKernel,
    }
}

fn not_granted(namespace: &str, missing: &[String]) -> String {
    missing
        .iter()
        .map(|relaxation| {
            format!("pod asks for {relaxation} but no Policy grants it to namespace {namespace}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The Policies applying to `namespace` (naming it or `*`), by name.
fn applicable<'a>(
    namespace: &str,
    policies: &'a [(String, PolicySpec)],
) -> Vec<&'a (String, PolicySpec)> {
    let mut applying: Vec<_> = policies
        .iter()
        .filter(|(_, spec)| spec.namespaces.iter().any(|n| n == namespace || n == "*"))
        .collect();
    applying.sort_by(|a, b| a.0.cmp(&b.0));
    applying
}

/// The runtime pods in `namespace` get when they name none, and the Policy
/// that set it (none: the cluster default, runc). The first applying
/// Policy by name with a `defaultRuntime` decides.
pub fn namespace_runtime(
    namespace: &str,
    policies: &[(String, PolicySpec)],
) -> (RuntimeClass, Option<String>) {
    applicable(namespace, policies)
        .into_iter()
        .find_map(|(name, spec)| {
            spec.default_runtime
                .map(|runtime| (runtime, Some(name.clone())))
        })
        .unwrap_or((RuntimeClass::Runc, None))
}

/// Admits a pod in `namespace` asking for `relax`: every relaxation must be
/// granted by a Policy applying to the namespace. Grants nobody asks for
/// are reported in [`EffectiveSandbox::unused_grants`] and change nothing.
pub fn admit(
    namespace: &str,
    relax: &[String],
    policies: &[(String, PolicySpec)],
) -> Result<EffectiveSandbox, Refusal> {
    let mut asks: Vec<Relaxation> = Vec::new();
    for (index, name) in relax.iter().enumerate() {
        let relaxation = name
            .parse::<Relaxation>()
            .map_err(|error| Refusal::Invalid { index, error })?;
        if !asks.contains(&relaxation) {
            asks.push(relaxation);
        }
    }
    let applying = applicable(namespace, policies);
    let grants: Vec<(&str, Relaxation)> = applying
        .iter()
        .flat_map(|(policy, spec)| {
            spec.grant
                .iter()
                .filter_map(|grant| grant.parse::<Relaxation>().ok())
                .map(move |grant| (policy.as_str(), grant))
        })
        .collect();
    let mut granted: Vec<(Relaxation, Grant)> = Vec::new();
    let mut missing = Vec::new();
    for ask in &asks {
        match grants.iter().find(|(_, grant)| grant.covers(ask)) {
            Some((policy, _)) => granted.push((
                ask.clone(),
                Grant {
                    relaxation: ask.to_string(),
                    policy: policy.to_string(),
                },
            )),
            None => missing.push(ask.to_string()),
        }
    }
    if !missing.is_empty() {
        return Err(Refusal::NotGranted {
            namespace: namespace.to_string(),
            missing,
        });
    }
    let unused_grants = grants
        .iter()
        .filter(|(_, grant)| !asks.iter().any(|ask| grant.covers(ask)))
        .map(|(policy, grant)| UnusedGrant {
            policy: policy.to_string(),
            relaxation: grant.to_string(),
            namespace: namespace.to_string(),
        })
        .collect();
    let (runtime, _) = namespace_runtime(namespace, policies);
    Ok(EffectiveSandbox {
        namespace: namespace.to_string(),
        knobs: knobs(&granted, runtime),
        unused_grants,
    })
}

/// [`admit`] for a whole pod spec: an explicit `runtime: runc` where the
/// namespace defaults to gVisor is an ask for `runtime:runc` too, and an
/// explicit runtime is the runtime knob's value.
pub fn admit_pod(
    namespace: &str,
    spec: &PodSpec,
    policies: &[(String, PolicySpec)],
) -> Result<EffectiveSandbox, Refusal> {
    let mut relax = spec.security.relax.clone();
    let (default, _) = namespace_runtime(namespace, policies);
    let runc = Relaxation::RuntimeRunc.to_string();
    if spec.runtime == Some(RuntimeClass::Runc)
        && default == RuntimeClass::Gvisor
        && !relax.contains(&runc)
    {
        relax.push(runc);
    }
    let mut sandbox = admit(namespace, &relax, policies)?;
    if let Some(runtime) = spec.runtime
        && let Some(knob) = sandbox.knobs.iter_mut().find(|k| k.name == "runtime")
    {
        knob.value = runtime_name(runtime).to_string();
        if runtime == default {
            knob.relaxed_by.clear();
        }
    }
    let runtime = match sandbox.knob("runtime").map(|k| k.value.as_str()) {
        Some("gvisor") => RuntimeClass::Gvisor,
        _ => RuntimeClass::Runc,
    };
    let asked: Vec<Relaxation> = relax.iter().filter_map(|r| r.parse().ok()).collect();
    if asked.contains(&Relaxation::HostNetworkStack) && runtime != RuntimeClass::Gvisor {
        return Err(Refusal::HostNetworkStackWithoutGvisor {
            runtime: runtime_name(runtime),
        });
    }
    if network_stack(runtime, &asked) == NetworkStack::Gvisor && spec.containers.len() > 1 {
        return Err(Refusal::NetstackContainers {
            containers: spec.containers.len(),
        });
    }
    if let Some(knob) = sandbox.knobs.iter_mut().find(|k| k.name == "network stack") {
        knob.value = stack_value(runtime, &asked).to_string();
    }
    Ok(sandbox)
}

/// The "network stack" knob's value.
fn stack_value(runtime: RuntimeClass, asked: &[Relaxation]) -> &'static str {
    match (runtime, network_stack(runtime, asked)) {
        (RuntimeClass::Runc, _) => "host kernel (runc)",
        (_, NetworkStack::Gvisor) => "gVisor netstack (in the sandbox)",
        (_, NetworkStack::HostKernel) if asked.contains(&Relaxation::HostNetwork) => {
            "host kernel (host-network)"
        }
        (_, NetworkStack::HostKernel) => "host kernel (through the pod's namespace)",
    }
}

fn runtime_name(runtime: RuntimeClass) -> &'static str {
    match runtime {
        RuntimeClass::Runc => "runc",
        RuntimeClass::Gvisor => "gvisor",
    }
}

/// Every knob of the default sandbox, loosened by `granted`.
fn knobs(granted: &[(Relaxation, Grant)], default_runtime: RuntimeClass) -> Vec<Knob> {
    let by = |pick: &dyn Fn(&Relaxation) -> bool| -> Vec<Grant> {
        granted
            .iter()
            .filter(|(relaxation, _)| pick(relaxation))
            .map(|(_, grant)| grant.clone())
            .collect()
    };
    let values = |pick: &dyn Fn(&Relaxation) -> Option<String>| -> Vec<String> {
        granted.iter().filter_map(|(r, _)| pick(r)).collect()
    };
    let toggle = |name: &str, relaxation: Relaxation, on: &str, off: &str| {
        let relaxed_by = by(&|r| *r == relaxation);
        let value = if relaxed_by.is_empty() { on } else { off };
        Knob::new(name, value, relaxed_by)
    };
    let listed = |name: &str, empty: &str, prefix: &str, items: Vec<String>, from: Vec<Grant>| {
        let value = if items.is_empty() {
            empty.to_string()
        } else {
            format!("{prefix}{}", items.join(", "))
        };
        Knob::new(name, value, from)
    };
    let capabilities = values(&|r| match r {
        Relaxation::Capability(name) => Some(name.clone()),
        _ => None,
    });
    let devices = values(&|r| match r {
        Relaxation::Device(path) => Some(path.clone()),
        _ => None,
    });
    let host_paths = values(&|r| match r {
        Relaxation::HostPath(path) => Some(path.clone()),
        _ => None,
    });
    let runtime_grants = by(&|r| *r == Relaxation::RuntimeRunc);
    let runtime = if runtime_grants.is_empty() {
        default_runtime
    } else {
        RuntimeClass::Runc
    };
    vec![
        toggle(
            "user namespace",
            Relaxation::NoUserNamespace,
            "on",
            "off (container uids are host uids)",
        ),
        toggle("uid", Relaxation::RunAsRoot, "non-root", "root (0)"),
        listed(
            "capabilities",
            "none",
            "",
            capabilities,
            by(&|r| matches!(r, Relaxation::Capability(_))),
        ),
        Knob::new("no_new_privs", "on", Vec::new()),
        toggle(
            "seccomp",
            Relaxation::UnconfinedSeccomp,
            "default profile",
            "unconfined",
        ),
        toggle(
            "32-bit system calls",
            Relaxation::Syscalls32Bit,
            "refused (x86_64 only)",
            "allowed (i386, x32)",
        ),
        toggle(
            "read-only rootfs",
            Relaxation::WritableRootfs,
            "on (writable tmpfs: /tmp, /var/tmp, /run)",
            "off",
        ),
        Knob::new("masked /proc", "on", Vec::new()),
        listed(
            "devices",
            "default set",
            "default set + ",
            devices,
            by(&|r| matches!(r, Relaxation::Device(_))),
        ),
        toggle("host network", Relaxation::HostNetwork, "off", "on"),
        Knob::new(
            "network stack",
            stack_value(
                runtime,
                &granted.iter().map(|(r, _)| r.clone()).collect::<Vec<_>>(),
            ),
            by(&|r| *r == Relaxation::HostNetworkStack),
        ),
        listed(
            "host paths",
            "none",
            "",
            host_paths,
            by(&|r| matches!(r, Relaxation::HostPath(_))),
        ),
        Knob::new("runtime", runtime_name(runtime), runtime_grants),
    ]
}
