//! The engine: creating instances and deriving every step's state from the
//! graph and the clock. Time is always passed in.
//!
//! Semantics, like systemd: a step becomes ready when everything ordered
//! before it has settled (done, or failed for good). A dependency that failed
//! for good blocks the dependent only if the dependent `requires` it (or is a
//! target); an `after`-only dependency just orders. Steps with no ordering
//! between them are ready at the same time and run in parallel.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use corral_api::workflow::{
    LogLevel, RetryPolicy, StepInstance, StepKind, StepLogEntry, StepState, WorkflowInstance,
    WorkflowOutcome, WorkflowStatus,
};
use serde_json::Value;

use crate::definition::WorkflowDefinition;
use crate::duration::format_duration;
use crate::graph::Graph;

/// Creates the instance of `definition` serving `revision` of the object
/// `object_uid`, snapshotting its steps, and derives the initial states.
/// `definition` must have passed [`crate::validate`] (as
/// [`crate::definition_for`] ensures).
pub fn instantiate(
    definition: &WorkflowDefinition,
    id: &str,
    object_uid: &str,
    revision: u64,
    now: DateTime<Utc>,
) -> (WorkflowInstance, Vec<StepLogEntry>) {
    let graph = Graph::lenient(&definition.steps);
    let order = graph
        .topological_order()
        .unwrap_or_else(|| (0..definition.steps.len()).collect());
    let steps = order
        .into_iter()
        .map(|index| StepInstance {
            definition: definition.steps[index].clone(),
            state: StepState::Waiting { on: Vec::new() },
            attempts: 0,
            retry_base: 0,
            first_started_at: None,
        })
        .collect();
    let mut instance = WorkflowInstance {
        id: id.to_string(),
        workflow: definition.workflow.clone(),
        object_uid: object_uid.to_string(),
        revision,
        goal: definition.goal.clone(),
        started_at: now,
        finished_at: None,
        outcome: WorkflowOutcome::Running,
        steps,
    };
    let logs = tick(&mut instance, now);
    (instance, logs)
}

/// Brings every derived state up to `now`: running steps past their deadline
/// time out, failed steps whose retry is due become ready again, waiting
/// steps become ready or blocked, targets are reached, and the outcome is
/// set when the goal is reached or can no longer be. Returns a log entry per
/// transition. A finished instance is left as it is.
pub fn tick(instance: &mut WorkflowInstance, now: DateTime<Utc>) -> Vec<StepLogEntry> {
    let mut logs = Vec::new();
    if instance.outcome != WorkflowOutcome::Running {
        return logs;
    }
    let graph = Graph::lenient(instance.steps.iter().map(|step| &step.definition));
    let order = graph
        .topological_order()
        .unwrap_or_else(|| (0..instance.steps.len()).collect());
    for index in order {
        // A step may move twice in one tick: timed out, then due for retry.
        for _ in 0..3 {
            let old_phase = instance.steps[index].state.phase();
            let Some((state, level, message)) = next_state(instance, &graph, index, now) else {
                break;
            };
            instance.steps[index].state = state;
            if instance.steps[index].state.phase() == old_phase {
                break;
            }
            logs.push(transition_log(instance, index, now, level, message));
        }
    }
    settle_outcome(instance, now, &mut logs);
    logs
}

/// Derives what follows from the graph alone — waiting, ready and blocked
/// steps, reached targets — without the clock (no timeout, no retry) and
/// whatever the outcome: for an instance read back from storage, which
/// keeps only what its steps' owners did.
pub(crate) fn derive(instance: &mut WorkflowInstance) {
    let graph = Graph::lenient(instance.steps.iter().map(|step| &step.definition));
    let order = graph
        .topological_order()
        .unwrap_or_else(|| (0..instance.steps.len()).collect());
    for index in order {
        if matches!(
            instance.steps[index].state,
            StepState::Waiting { .. } | StepState::Ready { .. }
        ) && let Some((state, _, _)) = evaluate_dependencies(instance, &graph, index)
        {
            instance.steps[index].state = state;
        }
    }
}

/// The earliest time [`tick`] would change `instance` on its own, with no
/// owner acting: a running step's deadline or a failed step's retry. `None`
/// for a finished instance or one that only waits on its owners.
pub fn next_deadline(instance: &WorkflowInstance) -> Option<DateTime<Utc>> {
    if instance.outcome != WorkflowOutcome::Running {
        return None;
    }
    instance
        .steps
        .iter()
        .filter_map(|step| match &step.state {
            StepState::Running { deadline, .. } => *deadline,
            StepState::Failed { next_retry_at, .. } | StepState::TimedOut { next_retry_at, .. } => {
                *next_retry_at
            }
            _ => None,
        })
        .min()
}

/// Marks a running instance cancelled, e.g. when a newer operation on the
/// object replaces it.
pub fn cancel(
    instance: &mut WorkflowInstance,
    now: DateTime<Utc>,
    reason: &str,
) -> Option<StepLogEntry> {
    if instance.outcome != WorkflowOutcome::Running {
        return None;
    }
    instance.outcome = WorkflowOutcome::Cancelled;
    instance.finished_at = Some(now);
    let goal = instance
        .steps
        .iter()
        .position(|s| s.definition.name == instance.goal)?;
    Some(transition_log(
        instance,
        goal,
        now,
        LogLevel::Warn,
        format!("{} workflow cancelled: {reason}", instance.workflow),
    ))
}

/// Appends `instance` to `status`, cancelling any instance still running and
/// keeping only the newest `keep` (at least one).
pub fn record(
    status: &mut WorkflowStatus,
    instance: WorkflowInstance,
    keep: usize,
    now: DateTime<Utc>,
) -> Vec<StepLogEntry> {
    let reason = format!("superseded by {}", instance.id);
    let logs = status
        .instances
        .iter_mut()
        .filter_map(|older| cancel(older, now, &reason))
        .collect();
    status.instances.push(instance);
    let excess = status.instances.len().saturating_sub(keep.max(1));
    status.instances.drain(..excess);
    logs
}

/// The wait before the attempt after failed attempt number `attempt`
/// (1-based): `backoffMs` doubled per earlier failure, capped.
pub fn backoff(policy: &RetryPolicy, attempt: u32) -> TimeDelta {
    let factor = 1u64
        .checked_shl(attempt.saturating_sub(1))
        .unwrap_or(u64::MAX);
    let millis = policy
        .backoff_ms
        .saturating_mul(factor)
        .min(policy.max_backoff_ms);
    TimeDelta::milliseconds(i64::try_from(millis).unwrap_or(i64::MAX))
}

/// When a failed attempt of `step` is retried, or `None` if it was the
/// last. The backoff counts attempts since the last person's retry.
pub(crate) fn retry_at(
    step: &StepInstance,
    attempt: u32,
    at: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    (attempt < step.max_attempts()).then(|| {
        let round = attempt.saturating_sub(step.retry_base);
        at + backoff(&step.definition.retry, round)
    })
}

/// How a dependency stands, seen from its dependents.
enum Settled {
    Done(DateTime<Utc>),
    /// Failed for good; `cause` is the step whose failure started it.
    Failed {
        at: DateTime<Utc>,
        cause: String,
    },
    Pending,
}

fn settled(step: &StepInstance) -> Settled {
    match &step.state {
        StepState::Done { finished, .. } => Settled::Done(*finished),
        StepState::Failed {
            at,
            next_retry_at: None,
            ..
        }
        | StepState::TimedOut {
            at,
            next_retry_at: None,
            ..
        } => Settled::Failed {
            at: *at,
            cause: step.definition.name.clone(),
        },
        StepState::Blocked { at, cause, .. } => Settled::Failed {
            at: *at,
            cause: cause.clone(),
        },
        _ => Settled::Pending,
    }
}

type Next = Option<(StepState, LogLevel, String)>;

fn next_state(
    instance: &WorkflowInstance,
    graph: &Graph,
    index: usize,
    now: DateTime<Utc>,
) -> Next {
    let step = &instance.steps[index];
    match &step.state {
        StepState::Running {
            since,
            attempt,
            deadline: Some(deadline),
            ..
        } if *deadline <= now => {
            let next_retry_at = retry_at(step, *attempt, *deadline);
            let took = format_duration(*deadline - *since);
            let message = match next_retry_at {
                Some(at) => format!(
                    "timed out after {took} (attempt {attempt} of {}), retry in {}",
                    step.max_attempts(),
                    format_duration(at - *deadline)
                ),
                None => format!("timed out after {took} (attempt {attempt}, the last)"),
            };
            let state = StepState::TimedOut {
                started: *since,
                at: *deadline,
                attempt: *attempt,
                next_retry_at,
            };
            Some((state, LogLevel::Error, message))
        }
        StepState::Failed {
            next_retry_at: Some(at),
            attempt,
            ..
        }
        | StepState::TimedOut {
            next_retry_at: Some(at),
            attempt,
            ..
        } if *at <= now => Some((
            StepState::Ready { since: *at },
            LogLevel::Info,
            format!("ready for attempt {}", attempt + 1),
        )),
        StepState::Waiting { .. } | StepState::Ready { .. } => {
            evaluate_dependencies(instance, graph, index)
        }
        _ => None,
    }
}

fn evaluate_dependencies(instance: &WorkflowInstance, graph: &Graph, index: usize) -> Next {
    let step = &instance.steps[index];
    let mut waiting_on = Vec::new();
    let mut blocked = None;
    let mut settled_at = instance.started_at;
    for edge in graph.dependencies(index) {
        let dependency = &instance.steps[edge.from];
        match settled(dependency) {
            Settled::Done(at) => settled_at = settled_at.max(at),
            Settled::Failed { at, cause } if edge.required => {
                blocked.get_or_insert((dependency.definition.name.clone(), cause, at));
            }
            Settled::Failed { at, .. } => settled_at = settled_at.max(at),
            Settled::Pending => waiting_on.push(dependency.definition.name.clone()),
        }
    }
    if let Some((dependency, cause, at)) = blocked {
        let message = if dependency == cause {
            format!("blocked: required {dependency} failed")
        } else {
            format!("blocked: required {dependency} is blocked by the failure of {cause}")
        };
        let state = StepState::Blocked {
            dependency,
            cause,
            at,
        };
        return Some((state, LogLevel::Warn, message));
    }
    if !waiting_on.is_empty() {
        let state = StepState::Waiting { on: waiting_on };
        return Some((state, LogLevel::Debug, "waiting".into()));
    }
    match (&step.state, step.definition.kind) {
        (StepState::Ready { .. }, StepKind::Step) => None,
        (_, StepKind::Step) => Some((
            StepState::Ready { since: settled_at },
            LogLevel::Info,
            "ready".into(),
        )),
        (_, StepKind::Target) => Some((
            StepState::Done {
                started: settled_at,
                finished: settled_at,
                attempt: 1,
                note: None,
            },
            LogLevel::Info,
            "target reached".into(),
        )),
    }
}

fn settle_outcome(
    instance: &mut WorkflowInstance,
    now: DateTime<Utc>,
    logs: &mut Vec<StepLogEntry>,
) {
    let Some(goal) = instance
        .steps
        .iter()
        .position(|step| step.definition.name == instance.goal)
    else {
        return;
    };
    let (outcome, at) = match settled(&instance.steps[goal]) {
        Settled::Done(at) => (WorkflowOutcome::Succeeded, at),
        Settled::Failed { at, .. } => (WorkflowOutcome::Failed, at),
        Settled::Pending => return,
    };
    instance.outcome = outcome;
    instance.finished_at = Some(at);
    let (level, verb) = match outcome {
        WorkflowOutcome::Succeeded => (LogLevel::Info, "succeeded"),
        _ => (LogLevel::Error, "failed"),
    };
    let message = format!(
        "{} workflow {verb} after {}",
        instance.workflow,
        format_duration(at - instance.started_at)
    );
    logs.push(transition_log(instance, goal, now, level, message));
}

/// A log entry about step `index` of `instance`, carrying its phase.
pub(crate) fn transition_log(
    instance: &WorkflowInstance,
    index: usize,
    time: DateTime<Utc>,
    level: LogLevel,
    message: String,
) -> StepLogEntry {
    let step = &instance.steps[index];
    let mut fields = BTreeMap::new();
    fields.insert("phase".to_string(), Value::from(step.state.phase()));
    if step.attempts > 0 {
        fields.insert("attempt".to_string(), Value::from(step.attempts));
    }
    StepLogEntry {
        time,
        object_uid: instance.object_uid.clone(),
        workflow_id: instance.id.clone(),
        workflow: instance.workflow.clone(),
        step: step.definition.name.clone(),
        owner: step.definition.owner.clone(),
        level,
        message,
        fields,
    }
}
