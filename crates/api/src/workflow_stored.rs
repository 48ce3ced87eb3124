//! `status.workflow` as objects store it: each instance names its
//! definition and keeps only what happened to its steps (the rest follows
//! from the definition's graph; `corral_workflow::hydrate` joins the two).

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::*;

/// `status.workflow` as stored in an object: its latest instances, oldest
/// first, each naming its definition (a `WorkflowDefinition` object) and
/// keeping only what happened to its steps. `corral_workflow::hydrate`
/// joins an instance with its definition into a [`WorkflowInstance`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoredWorkflows {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<StoredInstance>,
}

impl StoredWorkflows {
    /// The object's `status.workflow`; empty when it has none.
    pub fn of(status: &Value) -> Result<Self, serde_json::Error> {
        match status.get("workflow") {
            None | Some(Value::Null) => Ok(StoredWorkflows::default()),
            Some(value) => StoredWorkflows::deserialize(value),
        }
    }

    /// Only the newest instance of the object's `status.workflow`, read
    /// without decoding the older ones (what the controllers reacting to
    /// every change ask: is my step ready in the newest operation?).
    pub fn latest_of(status: &Value) -> Result<Option<StoredInstance>, serde_json::Error> {
        let instances = match status.get("workflow") {
            None | Some(Value::Null) => return Ok(None),
            Some(workflow) => workflow.get("instances"),
        };
        match instances {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(instances)) => instances
                .last()
                .map(StoredInstance::deserialize)
                .transpose(),
            // Not a list: the same error decoding the whole status gives.
            Some(_) => Self::of(status).map(|mut stored| stored.instances.pop()),
        }
    }

    /// The running instances of the object's `status.workflow`, each with
    /// its index among the kept instances, read without decoding those that
    /// finished (what a write that only cancels or ticks running instances
    /// needs). The shapes [`StoredWorkflows::of`] refuses are refused.
    pub fn running_of(status: &Value) -> Result<Vec<(usize, StoredInstance)>, serde_json::Error> {
        match status
            .get("workflow")
            .map(|workflow| (workflow, workflow.get("instances")))
        {
            None | Some((Value::Null, _)) | Some((Value::Object(_), None | Some(Value::Null))) => {
                Ok(Vec::new())
            }
            Some((Value::Object(_), Some(Value::Array(instances)))) => instances
                .iter()
                .enumerate()
                .filter(|(_, instance)| StoredInstance::may_run(instance))
                .map(|(index, instance)| StoredInstance::deserialize(instance).map(|i| (index, i)))
                .collect(),
            // Not an object with a list: the error decoding it whole gives.
            Some(_) => Self::of(status).map(|stored| {
                stored
                    .instances
                    .into_iter()
                    .enumerate()
                    .filter(|(_, i)| i.outcome == WorkflowOutcome::Running)
                    .collect()
            }),
        }
    }

    /// The newest instance, the one `why` explains.
    pub fn latest(&self) -> Option<&StoredInstance> {
        self.instances.last()
    }

    /// The newest instance serving `revision`.
    pub fn for_revision(&self, revision: u64) -> Option<&StoredInstance> {
        self.instances.iter().rev().find(|i| i.revision == revision)
    }
}

/// One workflow instance as stored: which definition it runs and where each
/// step that left `waiting` stands. Steps still waiting and targets are not
/// stored: they follow from the definition's graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoredInstance {
    /// `start-1`, `update-3`.
    pub id: String,
    /// `start`, `update`, `move`, `stop`, `join`.
    pub workflow: String,
    /// The `WorkflowDefinition` object it runs.
    pub definition: String,
    /// The spec revision this operation serves.
    pub revision: u64,
    pub started_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub outcome: WorkflowOutcome,
    /// Each step past `waiting`, by name. Empty once the instance succeeded
    /// or was cancelled: what its steps did is in the step log, which
    /// `why` and `analyze` replay.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub steps: BTreeMap<String, StoredStep>,
}

impl StoredInstance {
    /// Whether the stored JSON `instance` may be running: any but one whose
    /// `outcome` names a finished one (a missing outcome is `running`, and
    /// one that is not an outcome is left for decoding to refuse).
    pub fn may_run(instance: &Value) -> bool {
        const FINISHED: [WorkflowOutcome; 3] = [
            WorkflowOutcome::Succeeded,
            WorkflowOutcome::Failed,
            WorkflowOutcome::Cancelled,
        ];
        let outcome = instance.get("outcome").and_then(Value::as_str);
        !outcome.is_some_and(|outcome| FINISHED.iter().any(|f| f.as_str() == outcome))
    }

    /// Whether `step` is ready in this running instance.
    pub fn is_ready(&self, step: &str) -> bool {
        self.outcome == WorkflowOutcome::Running
            && self
                .steps
                .get(step)
                .is_some_and(|s| matches!(s.state, StepState::Ready { .. }))
    }

    /// Whether `step` failed in this running instance and waits for its
    /// retry ([`StepState::awaits_retry`]).
    pub fn awaits_retry(&self, step: &str) -> bool {
        self.outcome == WorkflowOutcome::Running
            && self.steps.get(step).is_some_and(|s| s.state.awaits_retry())
    }

    /// Whether nothing of this instance ever happened: no step was claimed
    /// or reached, each one it keeps only ready (or still waiting). Such an
    /// instance, superseded, leaves `status.workflow`.
    pub fn never_began(&self) -> bool {
        self.steps
            .values()
            .all(|step| matches!(step.state, StepState::Ready { .. }) && step.attempts == 0)
    }

    /// The steps in `phase` (`ready`, `running`, …), by name.
    pub fn steps_in(&self, phase: &str) -> impl Iterator<Item = &str> {
        self.steps
            .iter()
            .filter(move |(_, step)| step.state.phase() == phase)
            .map(|(name, _)| name.as_str())
    }
}

/// A stored step's state and its attempts so far. It decodes in one pass
/// (its own `Deserialize`, below), as every write reads the running
/// instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoredStep {
    #[serde(flatten)]
    pub state: StepState,
    /// Attempts started so far (claims).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// Attempts made before a person's retry gave the step a fresh budget.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_base: u32,
    /// When the first attempt started, when a retry made it earlier than
    /// the current attempt's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_started_at: Option<DateTime<Utc>>,
}

/// A stored step as its JSON has it: the state's fields beside the
/// step's own, decoded in one pass. Derived, `#[serde(flatten)]` with the
/// state's `phase` tag buffers the step's map, then the state's, on every
/// decode; this reads each field once and builds the state from `phase`.
/// It accepts and refuses what the derived form would: unknown fields are
/// ignored, a field the phase needs is required, an unknown phase is
/// refused (`workflow_tests.rs` holds the two side by side).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FlatStep {
    phase: Phase,
    #[serde(default)]
    on: Vec<String>,
    since: Option<DateTime<Utc>>,
    claimed_by: Option<String>,
    attempt: Option<u32>,
    deadline: Option<DateTime<Utc>>,
    started: Option<DateTime<Utc>>,
    finished: Option<DateTime<Utc>>,
    note: Option<String>,
    error: Option<String>,
    at: Option<DateTime<Utc>>,
    next_retry_at: Option<DateTime<Utc>>,
    dependency: Option<String>,
    cause: Option<String>,
    #[serde(default)]
    attempts: u32,
    #[serde(default)]
    retry_base: u32,
    first_started_at: Option<DateTime<Utc>>,
}

/// The tag of [`StepState`].
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
enum Phase {
    Waiting,
    Ready,
    Running,
    Done,
    Failed,
    TimedOut,
    Blocked,
}

impl<'de> Deserialize<'de> for StoredStep {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        fn needs<T, E: Error>(value: Option<T>, field: &'static str) -> Result<T, E> {
            value.ok_or_else(|| E::missing_field(field))
        }
        let flat = FlatStep::deserialize(deserializer)?;
        let state = match flat.phase {
            Phase::Waiting => StepState::Waiting { on: flat.on },
            Phase::Ready => StepState::Ready {
                since: needs(flat.since, "since")?,
            },
            Phase::Running => StepState::Running {
                claimed_by: needs(flat.claimed_by, "claimedBy")?,
                since: needs(flat.since, "since")?,
                attempt: needs(flat.attempt, "attempt")?,
                deadline: flat.deadline,
            },
            Phase::Done => StepState::Done {
                started: needs(flat.started, "started")?,
                finished: needs(flat.finished, "finished")?,
                attempt: needs(flat.attempt, "attempt")?,
                note: flat.note,
            },
            Phase::Failed => StepState::Failed {
                error: needs(flat.error, "error")?,
                started: needs(flat.started, "started")?,
                at: needs(flat.at, "at")?,
                attempt: needs(flat.attempt, "attempt")?,
                next_retry_at: flat.next_retry_at,
            },
            Phase::TimedOut => StepState::TimedOut {
                started: needs(flat.started, "started")?,
                at: needs(flat.at, "at")?,
                attempt: needs(flat.attempt, "attempt")?,
                next_retry_at: flat.next_retry_at,
            },
            Phase::Blocked => StepState::Blocked {
                dependency: needs(flat.dependency, "dependency")?,
                cause: needs(flat.cause, "cause")?,
                at: needs(flat.at, "at")?,
            },
        };
        Ok(StoredStep {
            state,
            attempts: flat.attempts,
            retry_base: flat.retry_base,
            first_started_at: flat.first_started_at,
        })
    }
}
