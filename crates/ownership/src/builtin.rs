//! The built-in controllers' registrations: what each owns and reads. The
//! server applies them at start through the ordinary API, so they pass the
//! same admission as any controller; together they converge.

use corral_api::kinds::ControllerSpec;

use crate::owner::{IPAM, JOB, NODE_LIFECYCLE, PER_NODE, PINNED_DEPLOYMENT, SCHEDULER, WORKFLOW};
use crate::registry::Registration;

fn spec(owns: &[&str], reads: &[&str]) -> ControllerSpec {
    ControllerSpec {
        owns: owns.iter().map(|s| s.to_string()).collect(),
        reads: reads.iter().map(|s| s.to_string()).collect(),
        steps: Vec::new(),
    }
}

/// The built-in controllers, in the order they register.
pub fn builtin_controllers() -> Vec<Registration> {
    let entries = [
        (
            WORKFLOW,
            spec(
                &[
                    "Pod:status.workflow",
                    "VirtualMachine:status.workflow",
                    "Node:status.workflow",
                ],
                &[
                    "Pod:spec",
                    "VirtualMachine:spec",
                    "Node:spec",
                    "Controller:spec.steps",
                ],
            ),
        ),
        (
            SCHEDULER,
            spec(
                &["Pod:status.node", "VirtualMachine:status.node"],
                &[
                    "Pod:spec",
                    "Pod:status.workflow",
                    "Pod:status.phase",
                    "VirtualMachine:spec",
                    "VirtualMachine:status.workflow",
                    "Node:spec",
                    "Node:status.phase",
                    "Node:status.silentSince",
                    "Node:status.fencedBy",
                    "Node:status.capacity",
                    "Node:status.runtimes",
                    "Node:status.features",
                    // A node's deletion: its `scheduler/drain` step.
                    "Node:status.workflow",
                ],
            ),
        ),
        (
            IPAM,
            spec(
                &[
                    "Pod:status.address",
                    "VirtualMachine:status.address",
                    "VirtualMachine:status.interfaces",
                    "Node:status.prefix",
                ],
                &[
                    "Pod:status.node",
                    "Pod:status.workflow",
                    "VirtualMachine:status.node",
                    "VirtualMachine:status.workflow",
                    "VirtualMachine:spec.interfaces",
                    "Node:status.workflow",
                ],
            ),
        ),
        (
            NODE_LIFECYCLE,
            spec(
                &[
                    "Node:status.phase",
                    "Node:status.silentSince",
                    "Node:status.fencedBy",
                ],
                &["Node:status.heartbeat", "Node:status.workflow"],
            ),
        ),
        (
            PINNED_DEPLOYMENT,
            spec(
                &["PinnedDeployment:status"],
                &[
                    "PinnedDeployment:spec",
                    "Pod:spec",
                    "Pod:status.phase",
                    "Pod:status.containers",
                    "Pod:status.observedRevision",
                ],
            ),
        ),
        (
            JOB,
            spec(
                &["Job:status"],
                &[
                    "Job:spec",
                    "Pod:spec",
                    "Pod:status.phase",
                    "Pod:status.containers",
                ],
            ),
        ),
        (
            PER_NODE,
            spec(
                &["PerNodeDeployment:status"],
                &[
                    "PerNodeDeployment:spec",
                    "Node:spec",
                    "Node:status.phase",
                    "Pod:spec",
                    "Pod:status.phase",
                    "Pod:status.containers",
                    "Pod:status.observedRevision",
                ],
            ),
        ),
    ];
    entries
        .into_iter()
        .map(|(name, spec)| Registration {
            name: name.to_string(),
            spec,
        })
        .collect()
}
