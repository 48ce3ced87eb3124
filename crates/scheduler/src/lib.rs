//! corral's scheduler: a snapshot of the cluster in, a placement out.
//!
//! This crate owns the decision of the `scheduler/place` workflow step —
//! which node a Pod or VirtualMachine runs on (the value of `status.node`) —
//! and the explanation when no node can run it: one [`Reason`] per node,
//! worded for `corral why` (`node-2: insufficient memory: 64Mi free, 128Mi
//! requested`).
//!
//! Filters, in order: the node is Ready, not marked unschedulable, is the
//! pinned node (`spec.placement.node`), holds the workload's existing `local`
//! volumes, matches `spec.placement.selector`, offers the runtime, has the
//! host ports free, a pod slot, and the cpu and memory requested. Among the
//! nodes left, [`Strategy::Spread`] (default) or [`Strategy::BinPack`]
//! chooses, VMs preferring nodes with KVM; ties go to the first node by
//! name, so the same snapshot always gives the same answer.
//!
//! It is pure and must stay so: no I/O, no clock, no randomness, no store.
//! The server's scheduler controller builds the [`Snapshot`] from stored
//! objects, calls [`schedule`] or a long-lived [`Scheduler`], and writes
//! `status.node` itself.

mod node;
mod reason;
mod request;
mod scheduler;
mod snapshot;

#[cfg(test)]
mod tests;

pub use node::Free;
pub use reason::{NodeReason, Reason, Unschedulable, runtime_name};
pub use request::{BoundWorkload, DecodeError, HOST_NETWORK, HOST_PORT_PREFIX, Request};
pub use scheduler::{Placement, Scheduler, Strategy};
pub use snapshot::{KVM_FEATURE, NodeInfo, Snapshot, feature_usable};

/// Places one workload on a snapshot. For many decisions in a row, keep a
/// [`Scheduler`]: it indexes the snapshot once and accounts for each
/// placement as it goes.
pub fn schedule(
    snapshot: &Snapshot,
    request: &Request,
    strategy: Strategy,
) -> Result<Placement, Unschedulable> {
    Scheduler::new(snapshot, strategy).place(request)
}
