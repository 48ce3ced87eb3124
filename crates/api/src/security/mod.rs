//! The two-party opt-in for loosening the sandbox: relaxation names, the
//! default sandbox and the admission rule that needs both halves.
//!
//! A pod asks for relaxations in `spec.security.relax`; a `Policy` grants
//! them to namespaces. [`admit`] grants exactly the relaxations that are
//! both asked and granted, refuses an ask no Policy grants, and reports a
//! grant the pod does not ask for (it changes nothing). Pure: callers load
//! the Policies.

mod admit;
mod relaxation;
#[cfg(test)]
mod tests;

pub use admit::{
    EffectiveSandbox, Grant, Knob, NetworkStack, Refusal, UnusedGrant, admit, admit_pod,
    namespace_runtime, network_stack,
};
pub use relaxation::{CAPABILITIES, Relaxation, RelaxationError, SHAPES};
