//! corral's explicit field ownership, as pure functions.
//!
//! This crate owns:
//! - the built-in owner table of every kind ([`default_owners`]): `spec`,
//!   labels and annotations belong to people, `status.node` to the
//!   scheduler, `status.address` to IPAM, a pod's other status to the agent
//!   of its node, `status.workflow` to the workflow engine (which lets each
//!   step's owner move that step);
//! - the [`Registry`]: defaults merged with registered `Controller`
//!   objects' `owns`; [`Registry::owner_of`], registration conflicts
//!   ([`Registry::check_registration`], the MetalLB lesson) and explicit
//!   hand-over ([`Registry::plan_transfer`]);
//! - managed objects: a controller allowed by [`managers`] creates objects
//!   naming it in `corral.dev/managed-by`, owns their people-owned fields
//!   and may delete them ([`check_delete_object`]); it alone writes their
//!   `metadata.owner` ([`check_owner_reference`]);
//! - the write check ([`Registry::check_write`], [`Registry::check_changes`],
//!   [`check_delete`]) with refusals that name the path and its owner;
//! - read masks ([`strip`], [`overlay`]) and the convergence check
//!   ([`Registry::check_convergence`]).
//!
//! It lives in its own crate rather than in `corral-api` because deciding
//! `status.workflow` writes delegates to `corral_workflow::check_write`,
//! and `corral-workflow` already depends on `corral-api`. It does no I/O:
//! the server loads `Controller` objects and enforces the verdicts; the CLI
//! renders them.

mod builtin;
mod check;
mod convergence;
mod mask;
mod owner;
mod registry;

pub use builtin::builtin_controllers;
pub use check::{
    Refusal, Violation, WORKFLOW_PATH, bound_node, changed_fields, check_delete,
    check_delete_object, check_owner_reference,
};
pub use convergence::{Convergence, Cycle, Edge, MAX_CYCLES};
pub use mask::{Mask, overlay, segment_count, strip, strip_owned};
pub use owner::{
    BadFieldRef, DefaultOwner, FieldRef, IPAM, JOB, NODE_LIFECYCLE, Owner, PER_NODE,
    PINNED_DEPLOYMENT, SCHEDULER, Subject, WORKFLOW, Writer, carvable, default_owners, managers,
    ownable,
};
pub use registry::{
    Registration, RegistrationError, Registry, Rule, Source, TransferError, TransferPlan, overlaps,
};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod managed_tests;
