//! The built-in workflows of every kind that has a lifecycle.
//!
//! Owners are controller identities: `scheduler`, `ipam`, and `node` (the
//! agent of the node the object is bound to, see [`crate::owner`]).
//!
//! Targets are strict synchronisation points: a target is reached when every
//! step ordered before it is done. Some targets are *gates* named for what
//! comes after them: in the pod `start` workflow, `containers` means "every
//! prerequisite of the containers is in place", so a step registered
//! `after: [network], before: [containers]` (sidecar injection) finishes
//! before any container starts.

use corral_api::Kind;
use corral_api::workflow::{RetryPolicy, StepDefinition, StepKind};

use crate::definition::{ENGINE_OWNER, WorkflowDefinition};
use crate::node_step::{JoinStep, NodeStep, PodStep};

#[path = "builtin_vm.rs"]
mod vm;
use vm::{vm_migrate, vm_start, vm_stop, vm_update};

/// Every (kind, workflow) pair with a built-in definition.
pub const BUILTIN_WORKFLOWS: [(Kind, &str); 11] = [
    (Kind::Pod, "start"),
    (Kind::Pod, "update"),
    (Kind::Pod, "move"),
    (Kind::Pod, "stop"),
    (Kind::Pod, "recover"),
    (Kind::Node, "join"),
    (Kind::Node, "stop"),
    (Kind::VirtualMachine, "start"),
    (Kind::VirtualMachine, "update"),
    (Kind::VirtualMachine, "stop"),
    (Kind::VirtualMachine, "migrate"),
];

/// The built-in definition of `kind`'s `workflow`, without registered steps.
pub fn builtin(kind: Kind, workflow: &str) -> Option<WorkflowDefinition> {
    let (goal, steps) = match (kind, workflow) {
        (Kind::Pod, "start") => ("running", pod_start()),
        (Kind::Pod, "update") => ("running", pod_update()),
        // A pod whose node went silent (ha) or was lost is placed and
        // started again elsewhere: the start graph, from `scheduler/place`.
        // The old node stops its copy when it learns it is no longer bound
        // (fencing); it is not waited for, since it may never return.
        (Kind::Pod, "move") => ("running", pod_start()),
        (Kind::Pod, "stop") => ("deleted", pod_stop()),
        // A node found the pod's sandbox stale (a reboot) and ran it again
        // from local state; it reports the steps once the API hears it,
        // and the server records them as a finished instance.
        (Kind::Pod, "recover") => ("running", pod_recover()),
        (Kind::Node, "join") => ("ready", node_join()),
        (Kind::Node, "stop") => ("deleted", node_stop()),
        (Kind::VirtualMachine, "start") => ("running", vm_start()),
        (Kind::VirtualMachine, "update") => ("running", vm_update()),
        (Kind::VirtualMachine, "stop") => ("deleted", vm_stop()),
        (Kind::VirtualMachine, "migrate") => ("running", vm_migrate()),
        _ => return None,
    };
    Some(WorkflowDefinition {
        kind,
        workflow: workflow.to_string(),
        goal: goal.to_string(),
        steps,
    })
}

/// An unschedulable pod is placed again as the cluster changes: its
/// `scheduler/place` step is retried (with backoff) this many times.
pub const UNSCHEDULABLE_RETRIES: u32 = 10_000;

fn pod_start() -> Vec<StepDefinition> {
    vec![
        step(
            "scheduler/place",
            "choose a node with room for the pod and bind it",
        )
        .wanted_by("scheduled")
        .timeout_secs(60)
        .attempts(UNSCHEDULABLE_RETRIES)
        .build(),
        target("scheduled", "the pod is bound to a node", &[]),
        step(
            "ipam/assign-address",
            "pick the pod's IPv6 address in its node's /64",
        )
        .requires(&["scheduled"])
        .wanted_by("network")
        .timeout_secs(30)
        .attempts(3)
        .build(),
        node_step(
            PodStep::CreateSandbox,
            "create the pod's namespaces and configure its address",
        )
        .requires(&["ipam/assign-address"])
        .wanted_by("network")
        .timeout_secs(60)
        .attempts(3)
        .build(),
        target("network", "the pod's sandbox is up with its address", &[]),
        node_step(
            PodStep::PullImage,
            "make every container image present on the node",
        )
        .requires(&["scheduled"])
        .wanted_by("image")
        .timeout_secs(600)
        .attempts(3)
        .build(),
        target("image", "every image is on the node", &[]),
        node_step(PodStep::PrepareVolumes, "create or mount the pod's volumes")
            .requires(&["scheduled"])
            .wanted_by("storage")
            .timeout_secs(300)
            .attempts(3)
            .build(),
        target("storage", "every volume is ready to mount", &[]),
        target(
            "containers",
            "every prerequisite of the containers is in place; they start after it",
            &["network", "storage", "image"],
        ),
        node_step(
            PodStep::RunInitContainers,
            "run the init containers in order, each to a successful exit",
        )
        .requires(&["containers"])
        .wanted_by("running")
        .timeout_secs(600)
        .attempts(3)
        .build(),
        node_step(PodStep::StartContainers, "start the pod's containers")
            .requires(&[PodStep::RunInitContainers.as_str()])
            .wanted_by("running")
            .timeout_secs(120)
            .attempts(2)
            .build(),
        node_step(
            PodStep::AwaitReadiness,
            "wait until every readiness probe passes",
        )
        .requires(&[PodStep::StartContainers.as_str()])
        .wanted_by("running")
        .timeout_secs(600)
        .build(),
        target("running", "the pod runs and is ready", &[]),
    ]
}

/// What a node does, from its local state alone, for a pod whose sandbox
/// a reboot took (the agent's `pods/recover.rs`). One attempt each: the
/// node runs them before it can report, so a failure is final here, and
/// supervision goes on trying on the node.
fn pod_recover() -> Vec<StepDefinition> {
    vec![
        node_step(
            PodStep::CheckSandbox,
            "tell a live sandbox from a stale record: the namespaces, mounts and processes behind its paths",
        )
        .timeout_secs(30)
        .build(),
        node_step(
            PodStep::ClearStaleSandbox,
            "delete the dead containers from the runtime, their files and the stale namespace files",
        )
        .requires(&[PodStep::CheckSandbox.as_str()])
        .timeout_secs(60)
        .build(),
        node_step(
            PodStep::CreateSandbox,
            "create the pod's namespaces again and configure its address",
        )
        .requires(&[PodStep::ClearStaleSandbox.as_str()])
        .timeout_secs(60)
        .build(),
        node_step(
            PodStep::PrepareVolumes,
            "make or mount the pod's volumes and data again",
        )
        .requires(&[PodStep::ClearStaleSandbox.as_str()])
        .timeout_secs(300)
        .build(),
        node_step(
            PodStep::StartContainers,
            "start every container meant to run",
        )
        .requires(&[
            PodStep::CreateSandbox.as_str(),
            PodStep::PrepareVolumes.as_str(),
        ])
        .wanted_by("running")
        .timeout_secs(120)
        .build(),
        target("running", "the pod runs again", &[]),
    ]
}

fn pod_update() -> Vec<StepDefinition> {
    vec![
        node_step(
            PodStep::PullImage,
            "make the new revision's images present on the node",
        )
        .wanted_by("image")
        .timeout_secs(600)
        .attempts(3)
        .build(),
        target(
            "image",
            "every image of the new revision is on the node",
            &[],
        ),
        node_step(
            PodStep::PrepareVolumes,
            "create or mount volumes the new revision adds",
        )
        .wanted_by("storage")
        .timeout_secs(300)
        .attempts(3)
        .build(),
        target("storage", "every volume of the new revision is ready", &[]),
        node_step(
            PodStep::StopChangedContainers,
            "send changed containers SIGTERM, wait their grace period, then kill",
        )
        .requires(&["image", "storage"])
        .wanted_by("draining")
        .timeout_secs(300)
        .build(),
        target("draining", "the changed containers have stopped", &[]),
        target(
            "containers",
            "every prerequisite of the new containers is in place; they start after it",
            &["draining"],
        ),
        node_step(
            PodStep::StartChangedContainers,
            "start the changed containers with the new config",
        )
        .requires(&["containers"])
        .wanted_by("running")
        .timeout_secs(120)
        .attempts(2)
        .build(),
        node_step(
            PodStep::AwaitReadiness,
            "wait until every readiness probe passes",
        )
        .requires(&[PodStep::StartChangedContainers.as_str()])
        .wanted_by("running")
        .timeout_secs(600)
        .build(),
        target("running", "the new revision runs and is ready", &[]),
    ]
}

/// Deletion of a node: a drain. The scheduler places nothing more there and
/// moves every pod that may leave (not pinned to it); pods pinned there and
/// VMs hold the drain until they are deleted, re-pinned or migrated (the
/// step's log names them). Then the Node is removed, and its agent, seeing
/// its Node gone, stops heartbeating (it does not register again until it
/// is started again); a stopped agent does not hold the deletion.
fn node_stop() -> Vec<StepDefinition> {
    vec![
        step(
            "scheduler/drain",
            "place nothing more on the node, move its pods elsewhere, wait for pinned pods and VMs",
        )
        .wanted_by("deleted")
        .timeout_secs(3600)
        .build(),
        target(
            "deleted",
            "no pod or VM is bound to the node: its object can go",
            &[],
        ),
    ]
}

/// Deletion of a pod that a node took. Finalizers are steps: a
/// `Controller` registers one into `stop` (`requires: [stopped], wantedBy:
/// deleted`, say) and the pod is removed only when it is done; volume
/// plugins register `PLUGIN/unmount` and `PLUGIN/release` before
/// `volumes-released`, so the pod's directory goes only after them.
fn pod_stop() -> Vec<StepDefinition> {
    vec![
        node_step(
            PodStep::MarkUnready,
            "mark the pod not ready so DNS and load balancers stop sending to it",
        )
        .wanted_by("draining")
        .timeout_secs(30)
        .attempts(3)
        .build(),
        target("draining", "the pod receives no new traffic", &[]),
        node_step(
            PodStep::StopContainers,
            "run each container's preStop hook, send SIGTERM, wait the grace period, then kill",
        )
        .requires(&["draining"])
        .wanted_by("stopped")
        .timeout_secs(300)
        .attempts(2)
        .build(),
        target("stopped", "no process of the pod runs", &[]),
        node_step(
            PodStep::ReleaseVolumes,
            "unmount the pod's volumes and Secret/Config files, remove emptyDirs",
        )
        .requires(&["stopped"])
        .wanted_by("volumes-released")
        .timeout_secs(120)
        .attempts(3)
        .build(),
        target(
            "volumes-released",
            "every volume is unmounted and released; the pod's directory can go",
            &[],
        ),
        node_step(
            PodStep::RemoveSandbox,
            "remove the pod's namespaces, veth, cgroups, id range and directory",
        )
        .requires(&["volumes-released"])
        .wanted_by("released")
        .timeout_secs(60)
        .attempts(3)
        .build(),
        step(
            "ipam/release-address",
            "return the pod's address to its node's /64",
        )
        .requires(&[PodStep::RemoveSandbox.as_str()])
        .wanted_by("released")
        .timeout_secs(30)
        .attempts(3)
        .build(),
        step(
            "scheduler/release",
            "free the pod's reservation on its node and unbind it",
        )
        .requires(&["ipam/release-address"])
        .wanted_by("released")
        .timeout_secs(30)
        .attempts(3)
        .build(),
        target("released", "the pod holds no node resource", &[]),
        target(
            "deleted",
            "every finalizer is done; the object is removed",
            &["released"],
        ),
    ]
}

fn node_join() -> Vec<StepDefinition> {
    vec![
        node_step(
            JoinStep::Register,
            "register the node and report its capacity",
        )
        .wanted_by("registered")
        .timeout_secs(60)
        .attempts(5)
        .build(),
        target("registered", "the node is known to the cluster", &[]),
        step(
            "ipam/assign-prefix",
            "give the node a /64 of the cluster prefix",
        )
        .requires(&["registered"])
        .wanted_by("network")
        .timeout_secs(30)
        .attempts(3)
        .build(),
        node_step(
            JoinStep::ConfigureTunnel,
            "make every other node with a WireGuard tunnel a peer (with --wireguard)",
        )
        .requires(&["ipam/assign-prefix"])
        .wanted_by("network")
        .timeout_secs(60)
        .attempts(3)
        .build(),
        node_step(
            JoinStep::ConfigureRoutes,
            "route the node's /64 and the other nodes' /64s",
        )
        .requires(&[JoinStep::ConfigureTunnel.as_str()])
        .wanted_by("network")
        .timeout_secs(60)
        .attempts(3)
        .build(),
        node_step(
            JoinStep::ConfigureEgress,
            "masquerade the pods' IPv4 egress range",
        )
        .requires(&["registered"])
        .wanted_by("network")
        .timeout_secs(60)
        .attempts(3)
        .build(),
        target(
            "network",
            "pods on the node can reach every other node's pods",
            &[],
        ),
        node_step(
            JoinStep::CheckRuntime,
            "check that the OCI runtimes and the image store work",
        )
        .requires(&["registered"])
        .wanted_by("ready")
        .timeout_secs(60)
        .attempts(3)
        .build(),
        target("ready", "the node accepts pods", &["network"]),
    ]
}

/// Starts a built-in step; the owner is the part of the name before `/`.
fn step(name: &str, description: &str) -> StepBuilder {
    let owner = name.split_once('/').map_or(name, |(owner, _)| owner);
    StepBuilder(StepDefinition {
        name: name.to_string(),
        owner: owner.to_string(),
        executor: None,
        kind: StepKind::Step,
        description: Some(description.to_string()),
        after: Vec::new(),
        before: Vec::new(),
        requires: Vec::new(),
        wanted_by: None,
        timeout_ms: None,
        retry: RetryPolicy::default(),
    })
}

/// Starts a built-in step of the node agent, named by its typed step so
/// the agent's `match` on it stays exhaustive.
fn node_step(step: impl NodeStep, description: &str) -> StepBuilder {
    self::step(step.name(), description)
}

/// A target that requires `requires` besides its members.
fn target(name: &str, description: &str, requires: &[&str]) -> StepDefinition {
    StepDefinition {
        name: name.to_string(),
        owner: ENGINE_OWNER.to_string(),
        executor: None,
        kind: StepKind::Target,
        description: Some(description.to_string()),
        after: Vec::new(),
        before: Vec::new(),
        requires: strings(requires),
        wanted_by: None,
        timeout_ms: None,
        retry: RetryPolicy::default(),
    }
}

struct StepBuilder(StepDefinition);

impl StepBuilder {
    fn requires(mut self, names: &[&str]) -> Self {
        self.0.requires = strings(names);
        self
    }

    /// Another owner than the name's prefix says.
    fn owned_by(mut self, owner: &str) -> Self {
        self.0.owner = owner.to_string();
        self
    }

    fn wanted_by(mut self, target: &str) -> Self {
        self.0.wanted_by = Some(target.to_string());
        self
    }

    fn timeout_secs(mut self, seconds: u64) -> Self {
        self.0.timeout_ms = Some(seconds * 1_000);
        self
    }

    fn attempts(mut self, max_attempts: u32) -> Self {
        self.0.retry.max_attempts = max_attempts;
        self
    }

    fn build(self) -> StepDefinition {
        self.0
    }
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::validate;

    #[test]
    fn every_builtin_is_valid() {
        for (kind, workflow) in BUILTIN_WORKFLOWS {
            let definition = builtin(kind, workflow).expect("listed workflow exists");
            validate(&definition).unwrap_or_else(|error| panic!("{kind} {workflow}: {error}"));
        }
    }

    #[test]
    fn pod_start_has_the_documented_targets() {
        let definition = builtin(Kind::Pod, "start").expect("pod start");
        for target in [
            "scheduled",
            "network",
            "storage",
            "image",
            "containers",
            "running",
        ] {
            let step = definition.step(target).expect(target);
            assert_eq!(step.kind, StepKind::Target);
        }
        assert_eq!(definition.goal, "running");
        assert_eq!(
            definition.step("scheduler/place").map(|s| s.owner.as_str()),
            Some("scheduler")
        );
    }

    #[test]
    fn pod_stop_ends_in_deleted() {
        let definition = builtin(Kind::Pod, "stop").expect("pod stop");
        for target in ["draining", "stopped", "released", "deleted"] {
            assert!(definition.step(target).is_some(), "{target}");
        }
        assert!(builtin(Kind::Policy, "start").is_none());
    }
}
