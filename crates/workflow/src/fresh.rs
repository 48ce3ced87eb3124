//! The two ends of an instance that never began, without the engine's
//! graph work on every write.
//!
//! Every change of a pod's spec starts an `update` instance and cancels
//! the one before, often before any owner claimed a step of it (design
//! 0062). [`Fresh`] is a definition's new instance worked out once and
//! stamped for each object; [`cancel_never_began`] is the line
//! [`crate::cancel`] writes of such an instance, without hydrating it.
//! Both give exactly what the engine gives: the tests compare them with
//! [`instantiate`] + [`dehydrate`] and [`hydrate`] + [`crate::cancel`].

use chrono::{DateTime, Utc};
use corral_api::workflow::{
    LogLevel, StepKind, StepLogEntry, StepState, StoredInstance, WorkflowOutcome,
};

use crate::definition::WorkflowDefinition;
use crate::engine::instantiate;
use crate::stored::dehydrate;

/// A definition's new instance as stored, with the log of its first
/// transitions, worked out once. The engine reads the clock only against
/// the instance's start, so an instance begun at another time is the same
/// with its times moved: [`Fresh::instance`] stamps the id, object,
/// revision and time in. A definition whose new instance is not just ready
/// and waiting steps (one whose goal is reached at once) is instantiated
/// each time instead.
#[derive(Debug, Clone)]
pub enum Fresh {
    /// The stored instance and its log at a reference time, to stamp.
    Stamped(StoredInstance, Vec<StepLogEntry>),
    /// The definition and the name it is stored under, to instantiate.
    Instantiated(WorkflowDefinition, String),
}

/// The time [`Fresh`] works a new instance out at.
const REFERENCE: DateTime<Utc> = DateTime::UNIX_EPOCH;

impl Fresh {
    /// Works out the new instance of `definition`, stored under `name`.
    pub fn new(definition: &WorkflowDefinition, name: &str) -> Fresh {
        let (instance, logs) = instantiate(definition, "", "", 0, REFERENCE);
        let stored = dehydrate(&instance, name);
        let exact = stored.outcome == WorkflowOutcome::Running
            && stored.finished_at.is_none()
            && stored.steps.values().all(|step| {
                step.state == StepState::Ready { since: REFERENCE }
                    && step.attempts == 0
                    && step.retry_base == 0
                    && step.first_started_at.is_none()
            })
            && logs.iter().all(|entry| entry.time == REFERENCE);
        if exact {
            Fresh::Stamped(stored, logs)
        } else {
            Fresh::Instantiated(definition.clone(), name.to_string())
        }
    }

    /// The new instance `id` serving `revision` of the object `object_uid`,
    /// begun at `now`, as stored, and the log entries of its first
    /// transitions: what [`instantiate`] then [`dehydrate`] give.
    pub fn instance(
        &self,
        id: &str,
        object_uid: &str,
        revision: u64,
        now: DateTime<Utc>,
    ) -> (StoredInstance, Vec<StepLogEntry>) {
        let (stored, logs) = match self {
            Fresh::Stamped(stored, logs) => (stored, logs),
            Fresh::Instantiated(definition, name) => {
                let (instance, logs) = instantiate(definition, id, object_uid, revision, now);
                return (dehydrate(&instance, name), logs);
            }
        };
        let mut stored = stored.clone();
        stored.id = id.to_string();
        stored.revision = revision;
        stored.started_at = now;
        for step in stored.steps.values_mut() {
            step.state = StepState::Ready { since: now };
        }
        let logs = logs
            .iter()
            .map(|entry| StepLogEntry {
                time: now,
                object_uid: object_uid.to_string(),
                workflow_id: id.to_string(),
                ..entry.clone()
            })
            .collect();
        (stored, logs)
    }
}

/// The log entry [`crate::cancel`] writes of `stored` once hydrated, for
/// an instance that never began ([`StoredInstance::never_began`]), worked
/// out without hydrating it: nothing of it settled, so its goal is where
/// the instance left it — a target still waits (reached, the instance
/// would have succeeded; blocked, something would have failed), a step
/// is as stored. `None` for a finished instance, one that began, or a
/// definition without its goal.
pub fn cancel_never_began(
    definition: &WorkflowDefinition,
    stored: &StoredInstance,
    object_uid: &str,
    now: DateTime<Utc>,
    reason: &str,
) -> Option<StepLogEntry> {
    if stored.outcome != WorkflowOutcome::Running || !stored.never_began() {
        return None;
    }
    let goal = definition.step(&definition.goal)?;
    let phase = match (goal.kind, stored.steps.get(&goal.name)) {
        (StepKind::Step, Some(step)) => step.state.phase(),
        _ => "waiting",
    };
    Some(StepLogEntry {
        time: now,
        object_uid: object_uid.to_string(),
        workflow_id: stored.id.clone(),
        workflow: stored.workflow.clone(),
        step: goal.name.clone(),
        owner: goal.owner.clone(),
        level: LogLevel::Warn,
        message: format!("{} workflow cancelled: {reason}", stored.workflow),
        fields: [("phase".to_string(), phase.into())].into(),
    })
}
