//! The steps the node agent executes, as types: one enum per kind of
//! object a node runs (a pod, a VirtualMachine, the node itself joining).
//!
//! The built-in definitions ([`crate::builtin`]) take their node steps'
//! names from these enums, and the agent parses the names it is handed back
//! into them and `match`es exhaustively, so renaming or adding a node step
//! fails to compile until the agent handles it. Steps a `Controller`
//! delegates to the node (`executor: node`, any name) are not here: they
//! stay strings and go to the agent's plugin path.

use std::fmt;
use std::str::FromStr;

/// A name that is none of a kind's node steps.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} is not a {kind} node step")]
pub struct UnknownNodeStep {
    pub kind: &'static str,
    pub name: String,
}

/// A typed node step of any kind: what the built-in definitions name
/// their node steps by.
pub trait NodeStep: Copy {
    fn name(self) -> &'static str;
}

/// Declares a node-step enum with the step name of every variant, its
/// `ALL` list, `as_str`, `Display` and `FromStr`.
macro_rules! node_steps {
    (
        $(#[$meta:meta])*
        $enum:ident ($kind:literal) {
            $($(#[$variant_meta:meta])* $variant:ident => $name:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $enum {
            $($(#[$variant_meta])* $variant,)*
        }

        impl $enum {
            /// Every step of this kind.
            pub const ALL: &'static [$enum] = &[$($enum::$variant,)*];

            /// The step's name in workflow definitions (`node/…`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($enum::$variant => $name,)*
                }
            }
        }

        impl NodeStep for $enum {
            fn name(self) -> &'static str {
                self.as_str()
            }
        }

        impl fmt::Display for $enum {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $enum {
            type Err = UnknownNodeStep;

            fn from_str(name: &str) -> Result<Self, UnknownNodeStep> {
                match name {
                    $($name => Ok($enum::$variant),)*
                    _ => Err(UnknownNodeStep {
                        kind: $kind,
                        name: name.to_string(),
                    }),
                }
            }
        }
    };
}

node_steps! {
    /// The node's steps in a pod's workflows (`start`, `move`, `update`,
    /// `stop`, `recover`).
    PodStep ("pod") {
        /// start, recover: the pod's namespaces, wired to the node with its
        /// address.
        CreateSandbox => "node/create-sandbox",
        /// recover: whether the sandbox behind the pod's record is live.
        CheckSandbox => "node/check-sandbox",
        /// recover: what a reboot left of the dead sandbox removed.
        ClearStaleSandbox => "node/clear-stale-sandbox",
        /// start, update: every container image on the node.
        PullImage => "node/pull-image",
        /// start, update: the pod's volumes made or mounted.
        PrepareVolumes => "node/prepare-volumes",
        /// start: the init containers run one after another, each to a
        /// successful exit.
        RunInitContainers => "node/run-init-containers",
        /// start: every container started.
        StartContainers => "node/start-containers",
        /// start, update: every readiness probe passes.
        AwaitReadiness => "node/await-readiness",
        /// update: the containers whose config changed stopped.
        StopChangedContainers => "node/stop-changed-containers",
        /// update: the changed containers started with their new config.
        StartChangedContainers => "node/start-changed-containers",
        /// stop: the pod marked not ready.
        MarkUnready => "node/mark-unready",
        /// stop: every container stopped.
        StopContainers => "node/stop-containers",
        /// stop: volumes unmounted, emptyDirs removed.
        ReleaseVolumes => "node/release-volumes",
        /// stop: the pod's namespaces removed.
        RemoveSandbox => "node/remove-sandbox",
    }
}

node_steps! {
    /// The node's steps in a VirtualMachine's workflows (`start`,
    /// `update`, `stop`, `migrate`; the migration's source steps are owned
    /// by [`crate::MIGRATION_SOURCE_OWNER`]).
    VmStep ("VM") {
        /// start: the VM's namespace, tap device and veth to the node.
        CreateTap => "node/create-tap",
        /// start, update: kernel, initramfs or disk image on the node.
        FetchKernel => "node/fetch-kernel",
        /// start, update: the VM's disk made or kept.
        PrepareDisk => "node/prepare-disk",
        /// start: QEMU started.
        StartVm => "node/start-vm",
        /// update: QEMU restarted with the new configuration.
        RestartVm => "node/restart-vm",
        /// start, update: the guest printed its boot marker.
        AwaitBoot => "node/await-boot",
        /// stop: QEMU stopped.
        StopVm => "node/stop-vm",
        /// stop: the disk detached.
        ReleaseDisk => "node/release-disk",
        /// stop: the tap device removed.
        RemoveTap => "node/remove-tap",
        /// migrate (target): disks made, QEMU waiting for the guest.
        PrepareIncoming => "node/prepare-incoming",
        /// migrate (source): the disks sent to the target.
        CopyDisk => "node/copy-disk",
        /// migrate (source): the memory sent; the guest paused here.
        MigrateRam => "node/migrate-ram",
        /// migrate (target): the guest runs on the target.
        SwitchOver => "node/switch-over",
        /// migrate (source): the source's QEMU, tap and files gone.
        CleanupSource => "node/cleanup-source",
    }
}

node_steps! {
    /// The node's steps in its own `join` workflow.
    JoinStep ("join") {
        /// The node is registered with its capacity.
        Register => "node/register",
        /// Every other node with a WireGuard tunnel is a peer.
        ConfigureTunnel => "node/configure-tunnel",
        /// Routes to the node's own and the other nodes' /64s.
        ConfigureRoutes => "node/configure-routes",
        /// The pods' IPv4 egress range is masqueraded.
        ConfigureEgress => "node/configure-egress",
        /// The OCI runtimes answer.
        CheckRuntime => "node/check-runtime",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builtin::{BUILTIN_WORKFLOWS, builtin};
    use corral_api::Kind;
    use std::collections::BTreeSet;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for step in PodStep::ALL {
            assert_eq!(step.as_str().parse::<PodStep>(), Ok(*step));
        }
        for step in VmStep::ALL {
            assert_eq!(step.as_str().parse::<VmStep>(), Ok(*step));
        }
        for step in JoinStep::ALL {
            assert_eq!(step.as_str().parse::<JoinStep>(), Ok(*step));
        }
        let error = "node/create-tap".parse::<PodStep>().unwrap_err();
        assert_eq!(error.to_string(), "node/create-tap is not a pod node step");
    }

    /// Every node step of every built-in workflow is one of the kind's
    /// typed steps, and every typed step is used by some workflow.
    #[test]
    fn the_enums_are_exactly_the_builtin_node_steps() {
        let mut used = BTreeSet::new();
        for (kind, workflow) in BUILTIN_WORKFLOWS {
            let definition = builtin(kind, workflow).expect("listed workflow exists");
            for step in definition
                .steps
                .iter()
                .filter(|s| s.owner == "node" || s.owner == crate::MIGRATION_SOURCE_OWNER)
            {
                let known = match kind {
                    Kind::Pod => step.name.parse::<PodStep>().is_ok(),
                    Kind::VirtualMachine => step.name.parse::<VmStep>().is_ok(),
                    Kind::Node => step.name.parse::<JoinStep>().is_ok(),
                    other => panic!("no node steps expected for {other}"),
                };
                assert!(known, "{kind} {workflow}: {} is not typed", step.name);
                used.insert(step.name.clone());
            }
        }
        let typed: BTreeSet<String> = PodStep::ALL
            .iter()
            .map(|s| s.as_str())
            .chain(VmStep::ALL.iter().map(|s| s.as_str()))
            .chain(JoinStep::ALL.iter().map(|s| s.as_str()))
            .map(str::to_string)
            .collect();
        assert_eq!(typed, used);
    }
}
