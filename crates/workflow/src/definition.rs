//! Workflow definitions (a kind's named graph of steps and targets) and
//! their validation.

use std::collections::BTreeSet;

use corral_api::Kind;
use corral_api::workflow::{StepDefinition, StepKind};

use crate::graph::Graph;

/// The identity that owns targets: the engine reaches them itself.
pub const ENGINE_OWNER: &str = "workflow";

/// A kind's workflow: the graph every new instance snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowDefinition {
    pub kind: Kind,
    /// `start`, `update`, `stop`, `join`.
    pub workflow: String,
    /// The target whose completion completes the workflow.
    pub goal: String,
    pub steps: Vec<StepDefinition>,
}

impl WorkflowDefinition {
    pub fn step(&self, name: &str) -> Option<&StepDefinition> {
        self.steps.iter().find(|step| step.name == name)
    }
}

/// Why a definition (built in, or merged with registered steps) is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    #[error("step name {name:?} is invalid: {expected}")]
    InvalidName {
        name: String,
        expected: &'static str,
    },
    #[error("step {name} is declared twice")]
    DuplicateStep { name: String },
    #[error(
        "step {step}: {field} names {reference:?}, which is no step or target of this workflow"
    )]
    UnknownReference {
        step: String,
        field: &'static str,
        reference: String,
    },
    #[error("step {step}: wantedBy names {reference}, which is a step, not a target")]
    WantedByStep { step: String, reference: String },
    #[error("step {step}: owner must not be empty")]
    MissingOwner { step: String },
    #[error("step {step}: retry.maxAttempts must be at least 1")]
    NoAttempts { step: String },
    #[error("ordering cycle: {cycle}")]
    Cycle {
        /// The cycle in "runs before" order, first step repeated at the end:
        /// `a -> b -> c -> a`.
        cycle: String,
    },
    #[error("goal {goal:?} of the {workflow} workflow is not a target of it")]
    BadGoal { workflow: String, goal: String },
    #[error("{kind} has no {workflow} workflow to add step {step} to")]
    UnknownWorkflow {
        kind: String,
        workflow: String,
        step: String,
    },
    #[error("step {step}: timeout {value:?} is not a duration like 30s or 10m")]
    InvalidTimeout { step: String, value: String },
}

/// Checks names, owners, references, the goal and acyclicity.
pub fn validate(definition: &WorkflowDefinition) -> Result<(), DefinitionError> {
    let mut seen = BTreeSet::new();
    for step in &definition.steps {
        check_name(step)?;
        if step.owner.is_empty() {
            return Err(DefinitionError::MissingOwner {
                step: step.name.clone(),
            });
        }
        if step.retry.max_attempts == 0 {
            return Err(DefinitionError::NoAttempts {
                step: step.name.clone(),
            });
        }
        if !seen.insert(step.name.as_str()) {
            return Err(DefinitionError::DuplicateStep {
                name: step.name.clone(),
            });
        }
    }
    let graph =
        Graph::build(&definition.steps).map_err(|dangling| DefinitionError::UnknownReference {
            step: dangling.step,
            field: dangling.field,
            reference: dangling.reference,
        })?;
    for step in &definition.steps {
        if let Some(target) = &step.wanted_by
            && definition
                .step(target)
                .is_some_and(|t| t.kind != StepKind::Target)
        {
            return Err(DefinitionError::WantedByStep {
                step: step.name.clone(),
                reference: target.clone(),
            });
        }
    }
    if !definition
        .step(&definition.goal)
        .is_some_and(|goal| goal.kind == StepKind::Target)
    {
        return Err(DefinitionError::BadGoal {
            workflow: definition.workflow.clone(),
            goal: definition.goal.clone(),
        });
    }
    if let Some(cycle) = graph.find_cycle() {
        return Err(DefinitionError::Cycle {
            cycle: cycle.join(" -> "),
        });
    }
    Ok(())
}

fn check_name(step: &StepDefinition) -> Result<(), DefinitionError> {
    let valid_word = |word: &str| {
        !word.is_empty()
            && word
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
    };
    let (valid, expected) = match step.kind {
        StepKind::Step => (
            step.name
                .split_once('/')
                .is_some_and(|(owner, verb)| valid_word(owner) && valid_word(verb)),
            "a step is named owner/verb, like acme/inject-sidecar",
        ),
        StepKind::Target => (
            valid_word(&step.name),
            "a target is one word of letters, digits and dashes, like network",
        ),
    };
    if valid {
        Ok(())
    } else {
        Err(DefinitionError::InvalidName {
            name: step.name.clone(),
            expected,
        })
    }
}
