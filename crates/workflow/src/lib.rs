//! corral's explicit lifecycle workflows: step graphs, the engine state
//! machine and the analyses behind `corral why` and `corral analyze`.
//!
//! This crate owns:
//! - the built-in workflow definitions of every kind ([`builtin`]), whose
//!   node steps are typed ([`PodStep`], [`VmStep`], [`JoinStep`]), and the
//!   merging of steps registered by `Controller` objects ([`definition_for`]);
//! - validation: unknown references and ordering cycles are errors that name
//!   them ([`validate`]);
//! - the engine ([`instantiate`], [`tick`]; [`Fresh`] and
//!   [`cancel_never_began`], the same without the graph work, for the
//!   instances most writes begin and cancel), the owners' transitions
//!   ([`claim`], [`complete`], [`fail`], [`append_log`]), a person's
//!   [`retry`] and [`skip`], with the rule of who may move which step ([`may_act`],
//!   [`check_write`]);
//! - the verdict and the renderers ([`why_text`], [`blame_text`],
//!   [`critical_chain_text`], [`dot`], and their JSON forms).
//!
//! It is pure: no I/O, no clock (time is always passed in), no randomness
//! (instance ids come from the caller). The stored types live in
//! `corral_api::workflow`; the server persists instances and log entries.

mod builtin;
mod definition;
mod duration;
mod engine;
mod fresh;
mod graph;
mod node_step;
mod owner;
mod registration;
mod render;
mod retry;
mod skip;
mod stored;
mod transition;
mod verdict;

pub use builtin::{BUILTIN_WORKFLOWS, builtin};
pub use definition::{DefinitionError, ENGINE_OWNER, WorkflowDefinition, validate};
pub use duration::format_duration;
pub use engine::{backoff, cancel, instantiate, next_deadline, record, tick};
pub use fresh::{Fresh, cancel_never_began};
pub use node_step::{JoinStep, NodeStep, PodStep, UnknownNodeStep, VmStep};
pub use owner::{
    MIGRATION_SOURCE_OWNER, NODE_OWNER, WriteError, acting_node_field, check_write, may_act,
    may_move, mover_description, owner_description,
};
pub use registration::{
    RegisteredController, check_controller, definition_for, step_from_registration,
};
pub use render::{
    blame_json, blame_text, critical_chain_json, critical_chain_text, dot, svg, verdict_line,
    why_json, why_text,
};
pub use retry::retry;
pub use skip::{skip, unfinished_steps};
pub use stored::{
    definition_from_spec, definition_name, definition_spec, dehydrate, hydrate, stored_deadline,
};
pub use transition::{TransitionError, append_log, claim, claim_if_ready, complete, fail};
pub use verdict::{
    DEFAULT_STUCK_AFTER_SECS, Unfinished, Verdict, VerdictState, unfinished_before,
    unfinished_text, verdict,
};

#[cfg(test)]
mod tests;
