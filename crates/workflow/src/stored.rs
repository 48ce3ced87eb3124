//! Instances as objects store them, and back.
//!
//! An object's `status.workflow` keeps, per instance, the name of its
//! definition and the state of each step that left `waiting`; steps still
//! waiting and targets follow from the graph. A succeeded or cancelled
//! instance keeps no steps at all: its step log holds every transition,
//! and [`hydrate`] replays it. So a running pod's status carries a few
//! hundred bytes of workflow, not the whole graph of every instance.
//!
//! [`hydrate`] joins a stored instance with its definition into the full
//! [`WorkflowInstance`] the engine and the renderers work on;
//! [`dehydrate`] is the way back. Both are pure.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use corral_api::workflow::{
    StepInstance, StepKind, StepLogEntry, StepState, StoredInstance, StoredStep,
    WorkflowDefinitionSpec, WorkflowInstance, WorkflowOutcome,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::definition::WorkflowDefinition;
use crate::engine::derive;
use crate::graph::Graph;

/// The name a definition is stored under: its kind, workflow and a hash
/// of its content (`pod-start-3f2a9c1d4e5f`), so equal definitions share
/// one object and a changed one gets another.
pub fn definition_name(definition: &WorkflowDefinition) -> String {
    let spec = definition_spec(definition);
    // INVARIANT: the spec is plain data with string keys, which always
    // serializes.
    let bytes = serde_json::to_vec(&spec).expect("a definition serializes");
    let digest = Sha256::digest(&bytes);
    format!(
        "{}-{}-{}",
        definition.kind.short(),
        definition.workflow,
        hex::encode(&digest[..6])
    )
}

/// The spec of the `WorkflowDefinition` object that stores `definition`.
pub fn definition_spec(definition: &WorkflowDefinition) -> WorkflowDefinitionSpec {
    WorkflowDefinitionSpec {
        kind: definition.kind,
        workflow: definition.workflow.clone(),
        goal: definition.goal.clone(),
        steps: definition.steps.clone(),
    }
}

/// The definition a `WorkflowDefinition` object's spec stores.
pub fn definition_from_spec(spec: WorkflowDefinitionSpec) -> WorkflowDefinition {
    WorkflowDefinition {
        kind: spec.kind,
        workflow: spec.workflow,
        goal: spec.goal,
        steps: spec.steps,
    }
}

/// What an object stores of `instance`: its steps past `waiting`, targets
/// left out — none at all once it succeeded or was cancelled.
pub fn dehydrate(instance: &WorkflowInstance, definition: &str) -> StoredInstance {
    let keeps_steps = !matches!(
        instance.outcome,
        WorkflowOutcome::Succeeded | WorkflowOutcome::Cancelled
    );
    let steps = instance
        .steps
        .iter()
        .filter(|_| keeps_steps)
        .filter(|step| step.definition.kind == StepKind::Step)
        // A waiting step is derived from the graph, unless it ran before
        // (a person's retry reset it): its attempts must survive.
        .filter(|step| !matches!(step.state, StepState::Waiting { .. }) || step.attempts > 0)
        .map(|step| {
            let started = started_at(&step.state);
            let stored = StoredStep {
                state: step.state.clone(),
                attempts: step.attempts,
                retry_base: step.retry_base,
                first_started_at: step
                    .first_started_at
                    .filter(|first| Some(*first) != started),
            };
            (step.definition.name.clone(), stored)
        })
        .collect();
    StoredInstance {
        id: instance.id.clone(),
        workflow: instance.workflow.clone(),
        definition: definition.to_string(),
        revision: instance.revision,
        started_at: instance.started_at,
        finished_at: instance.finished_at,
        outcome: instance.outcome,
        steps,
    }
}

/// When the step's current attempt started, if it did.
fn started_at(state: &StepState) -> Option<DateTime<Utc>> {
    match state {
        StepState::Running { since, .. } => Some(*since),
        StepState::Done { started, .. }
        | StepState::Failed { started, .. }
        | StepState::TimedOut { started, .. } => Some(*started),
        _ => None,
    }
}

/// The full instance: `stored` joined with `definition`. The steps it
/// stored keep their state, the others are derived from the graph. An
/// instance that stored no steps (it succeeded or was cancelled) gets them
/// from `logs`, the object's step log (entries of other instances are
/// skipped); without logs its steps show as waiting.
pub fn hydrate(
    definition: &WorkflowDefinition,
    stored: &StoredInstance,
    object_uid: &str,
    logs: &[StepLogEntry],
) -> WorkflowInstance {
    let graph = Graph::lenient(&definition.steps);
    let order = graph
        .topological_order()
        .unwrap_or_else(|| (0..definition.steps.len()).collect());
    let replayed = if stored.steps.is_empty() {
        replay(stored, logs)
    } else {
        BTreeMap::new()
    };
    let steps = order
        .into_iter()
        .map(|index| {
            let step = &definition.steps[index];
            let record = stored.steps.get(&step.name).or(replayed.get(&step.name));
            match record {
                Some(record) if step.kind == StepKind::Step => StepInstance {
                    definition: step.clone(),
                    state: record.state.clone(),
                    attempts: record.attempts,
                    retry_base: record.retry_base,
                    first_started_at: record
                        .first_started_at
                        .or_else(|| started_at(&record.state)),
                },
                _ => StepInstance {
                    definition: step.clone(),
                    state: StepState::Waiting { on: Vec::new() },
                    attempts: 0,
                    retry_base: 0,
                    first_started_at: None,
                },
            }
        })
        .collect();
    let mut instance = WorkflowInstance {
        id: stored.id.clone(),
        workflow: stored.workflow.clone(),
        object_uid: object_uid.to_string(),
        revision: stored.revision,
        goal: definition.goal.clone(),
        started_at: stored.started_at,
        finished_at: stored.finished_at,
        outcome: stored.outcome,
        steps,
    };
    derive(&mut instance);
    instance
}

/// The last state of each step, as the step log of instance `stored.id`
/// tells it.
fn replay(stored: &StoredInstance, logs: &[StepLogEntry]) -> BTreeMap<String, StoredStep> {
    let mut steps: BTreeMap<String, StoredStep> = BTreeMap::new();
    let mut since: HashMap<String, DateTime<Utc>> = HashMap::new();
    for entry in logs.iter().filter(|entry| entry.workflow_id == stored.id) {
        let Some(phase) = entry.fields.get("phase").and_then(Value::as_str) else {
            continue;
        };
        let attempt = entry
            .fields
            .get("attempt")
            .and_then(Value::as_u64)
            .and_then(|a| u32::try_from(a).ok())
            .unwrap_or(1);
        let text = |field: &str| {
            entry
                .fields
                .get(field)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let started = *since.get(&entry.step).unwrap_or(&entry.time);
        let state = match phase {
            "running" => {
                since.insert(entry.step.clone(), entry.time);
                StepState::Running {
                    claimed_by: text("claimedBy").unwrap_or_else(|| entry.owner.clone()),
                    since: entry.time,
                    attempt,
                    deadline: None,
                }
            }
            "done" => StepState::Done {
                started,
                finished: entry.time,
                attempt,
                note: text("note"),
            },
            "failed" => StepState::Failed {
                error: text("error").unwrap_or_else(|| entry.message.clone()),
                started,
                at: entry.time,
                attempt,
                next_retry_at: None,
            },
            "timedOut" => StepState::TimedOut {
                started,
                at: entry.time,
                attempt,
                next_retry_at: None,
            },
            // Ready, blocked and targets follow from the graph.
            _ => continue,
        };
        let step = steps.entry(entry.step.clone()).or_insert(StoredStep {
            state: state.clone(),
            attempts: 0,
            retry_base: 0,
            first_started_at: Some(entry.time),
        });
        step.state = state;
        step.attempts = step.attempts.max(attempt);
    }
    steps
}

/// The earliest time the driver must look at a stored instance: a running
/// step's deadline or a failed step's retry.
pub fn stored_deadline(stored: &StoredInstance) -> Option<DateTime<Utc>> {
    if stored.outcome != WorkflowOutcome::Running {
        return None;
    }
    stored
        .steps
        .values()
        .filter_map(|step| match &step.state {
            StepState::Running { deadline, .. } => *deadline,
            StepState::Failed { next_retry_at, .. } | StepState::TimedOut { next_retry_at, .. } => {
                *next_retry_at
            }
            _ => None,
        })
        .min()
}
