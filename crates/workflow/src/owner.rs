//! Who may move a step: the rule the engine's transitions apply, and the
//! check the server applies to raw writes of `status.workflow`.
//!
//! The rule, in full:
//! - a step owned by `node` may be moved only by the node agent of the node
//!   the object is bound to: an identity with role `node` whose name is that
//!   node's name (for a `Node` object, its own name);
//! - a step owned by anything else (`scheduler`, `ipam`, a registered
//!   controller) may be moved only by the controller identity of that name;
//! - a step whose registering controller delegates it to the node
//!   (`executor: node`) may also be moved by the agent of the object's
//!   node, which executes it on the controller's behalf ([`may_move`]);
//! - targets, and the engine-derived states (`waiting`, `ready`, `blocked`,
//!   `timedOut`), are written only by the engine identity `workflow`.

use corral_api::workflow::{StepDefinition, StepExecutor, StepState, WorkflowInstance};
use corral_api::{Identity, Role};

use crate::definition::ENGINE_OWNER;

/// The owner name that stands for "the agent of the object's node".
pub const NODE_OWNER: &str = "node";

/// The owner of a VM migration's steps on the node the VM leaves: the
/// agent of the node `status.migration.from` names. The caller passes
/// that node as the `bound_node` of such a step (the server does:
/// [`acting_node_field`]); the rule is then the node rule.
pub const MIGRATION_SOURCE_OWNER: &str = "migration-source";

/// The status field whose node acts for a step of `owner`: `from` of
/// `status.migration` for [`MIGRATION_SOURCE_OWNER`], `None` (the bound
/// node, `status.node`) for every other owner.
pub fn acting_node_field(owner: &str) -> Option<(&'static str, &'static str)> {
    (owner == MIGRATION_SOURCE_OWNER).then_some(("migration", "from"))
}

/// Whether `actor` may claim, complete, fail or log for a step of `owner`.
/// `bound_node` is the node the object is bound to (for a `Node`, itself).
pub fn may_act(owner: &str, actor: &Identity, bound_node: Option<&str>) -> bool {
    if owner == NODE_OWNER || owner == MIGRATION_SOURCE_OWNER {
        actor.role == Role::Node && bound_node == Some(actor.name.as_str())
    } else {
        actor.role == Role::Controller && actor.name == owner
    }
}

/// Whether `actor` may move the step `definition`: its owner, or the agent
/// of the object's node when the owner delegated the step to it.
pub fn may_move(definition: &StepDefinition, actor: &Identity, bound_node: Option<&str>) -> bool {
    may_act(&definition.owner, actor, bound_node)
        || (definition.executor == Some(StepExecutor::Node)
            && may_act(NODE_OWNER, actor, bound_node))
}

/// Describes who may move `definition`, for error messages.
pub fn mover_description(definition: &StepDefinition, bound_node: Option<&str>) -> String {
    let owner = owner_description(&definition.owner, bound_node);
    match definition.executor {
        Some(StepExecutor::Node) => {
            format!("{owner} or {}", owner_description(NODE_OWNER, bound_node))
        }
        None => owner,
    }
}

/// Describes the identity a step's owner stands for, for error messages.
pub fn owner_description(owner: &str, bound_node: Option<&str>) -> String {
    match (owner, bound_node) {
        (NODE_OWNER | MIGRATION_SOURCE_OWNER, Some(node)) => format!("the agent of node {node}"),
        (MIGRATION_SOURCE_OWNER, None) => {
            "the agent of the node a migration leaves (status.migration.from is not set)".into()
        }
        (NODE_OWNER, None) => "the agent of the object's node (the object is not bound yet)".into(),
        (owner, _) => format!("controller {owner}"),
    }
}

/// A write of `status.workflow` that breaks the ownership rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error("only the workflow engine creates or removes workflow instances")]
    InstanceSet,
    #[error("workflow {id}: only the workflow engine writes {field}")]
    InstanceField { id: String, field: &'static str },
    #[error("workflow {id}: the steps of an instance never change after it is created")]
    DefinitionChanged { id: String },
    #[error("workflow {id}: step {step} may be set {phase} only by {owner}, not {actor}")]
    NotOwner {
        id: String,
        step: String,
        phase: &'static str,
        owner: String,
        actor: String,
    },
    #[error("workflow {id}: step {step} may be set {phase} only by the workflow engine")]
    EngineOnly {
        id: String,
        step: String,
        phase: &'static str,
    },
}

/// Checks a raw write that replaces instance `old` by `new` (same id). Each
/// changed step must be changed by the identity the rule allows for its new
/// phase; definitions and instance-level fields are the engine's.
pub fn check_write(
    old: &WorkflowInstance,
    new: &WorkflowInstance,
    actor: &Identity,
    bound_node: Option<&str>,
) -> Result<(), WriteError> {
    let engine = actor.role == Role::Controller && actor.name == ENGINE_OWNER;
    if old.id != new.id {
        return Err(WriteError::InstanceSet);
    }
    if engine {
        return Ok(());
    }
    let same_header = old.workflow == new.workflow
        && old.object_uid == new.object_uid
        && old.revision == new.revision
        && old.goal == new.goal
        && old.started_at == new.started_at;
    if !same_header || old.steps.len() != new.steps.len() {
        return Err(WriteError::DefinitionChanged { id: old.id.clone() });
    }
    if old.outcome != new.outcome || old.finished_at != new.finished_at {
        return Err(WriteError::InstanceField {
            id: old.id.clone(),
            field: "outcome and finishedAt",
        });
    }
    for (before, after) in old.steps.iter().zip(&new.steps) {
        if before.definition != after.definition {
            return Err(WriteError::DefinitionChanged { id: old.id.clone() });
        }
        if before.state == after.state
            && before.attempts == after.attempts
            && before.first_started_at == after.first_started_at
        {
            continue;
        }
        let phase = after.state.phase();
        let owner_phase = matches!(
            after.state,
            StepState::Running { .. } | StepState::Done { .. } | StepState::Failed { .. }
        );
        let step = &before.definition;
        if !owner_phase || step.owner == ENGINE_OWNER {
            return Err(WriteError::EngineOnly {
                id: old.id.clone(),
                step: step.name.clone(),
                phase,
            });
        }
        if !may_move(step, actor, bound_node) {
            return Err(WriteError::NotOwner {
                id: old.id.clone(),
                step: step.name.clone(),
                phase,
                owner: mover_description(step, bound_node),
                actor: actor.name.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_steps_belong_to_the_bound_nodes_agent() {
        let agent = Identity::new("node-1", Role::Node);
        assert!(may_act("node", &agent, Some("node-1")));
        assert!(!may_act("node", &agent, Some("node-2")));
        assert!(!may_act("node", &agent, None));
        let impostor = Identity::new("node-1", Role::Controller);
        assert!(!may_act("node", &impostor, Some("node-1")));
    }

    #[test]
    fn a_delegated_step_is_moved_by_its_owner_or_the_bound_nodes_agent() {
        let mut definition: StepDefinition = serde_json::from_value(serde_json::json!({
            "name": "dirvol/prepare", "owner": "dirvol"
        }))
        .expect("definition");
        let agent = Identity::new("node-1", Role::Node);
        let plugin = Identity::new("dirvol", Role::Controller);
        assert!(!may_move(&definition, &agent, Some("node-1")));
        assert!(may_move(&definition, &plugin, Some("node-1")));
        definition.executor = Some(StepExecutor::Node);
        assert!(may_move(&definition, &agent, Some("node-1")));
        assert!(may_move(&definition, &plugin, Some("node-1")));
        assert!(!may_move(&definition, &agent, Some("node-2")));
        assert!(!may_move(
            &definition,
            &Identity::new("other", Role::Controller),
            Some("node-1")
        ));
        assert_eq!(
            mover_description(&definition, Some("node-1")),
            "controller dirvol or the agent of node node-1"
        );
    }

    #[test]
    fn controller_steps_belong_to_the_controller_of_that_name() {
        assert!(may_act(
            "ipam",
            &Identity::new("ipam", Role::Controller),
            None
        ));
        assert!(!may_act(
            "ipam",
            &Identity::new("scheduler", Role::Controller),
            None
        ));
        assert!(!may_act(
            "ipam",
            &Identity::new("ipam", Role::Operator),
            None
        ));
    }
}
