//! A person skips steps of an instance (`corral delete --skip STEP`, and
//! `--force`, which skips all that are left): each becomes done with a note
//! naming who skipped it, so `why` and `logs --steps` keep the record.
//! Unlike a transition this is not the owner's move: the server decides who
//! may skip (whoever may delete the object) before calling it.

use chrono::{DateTime, Utc};
use corral_api::workflow::WorkflowOutcome;
use corral_api::workflow::{LogLevel, StepKind, StepLogEntry, StepState, WorkflowInstance};
use serde_json::Value;

use crate::engine::{tick, transition_log};
use crate::transition::TransitionError;

/// Marks `step` done as skipped by `by` (its claim, if running, is
/// dropped: the owner's late report is refused). A step already done is
/// left alone and returns no entries.
pub fn skip(
    instance: &mut WorkflowInstance,
    step: &str,
    by: &str,
    now: DateTime<Utc>,
) -> Result<Vec<StepLogEntry>, TransitionError> {
    let mut logs = tick(instance, now);
    if instance.outcome != WorkflowOutcome::Running {
        return Err(TransitionError::Finished {
            id: instance.id.clone(),
            outcome: instance.outcome.as_str(),
        });
    }
    let Some(index) = instance
        .steps
        .iter()
        .position(|candidate| candidate.definition.name == step)
    else {
        return Err(TransitionError::UnknownStep {
            id: instance.id.clone(),
            step: step.to_string(),
        });
    };
    let entry = &mut instance.steps[index];
    if entry.definition.kind == StepKind::Target {
        return Err(TransitionError::Target {
            step: step.to_string(),
        });
    }
    let started = match &entry.state {
        StepState::Done { .. } => return Ok(logs),
        StepState::Running { since, .. } => *since,
        _ => now,
    };
    let note = format!("skipped by {by}");
    entry.state = StepState::Done {
        started,
        finished: now,
        attempt: entry.attempts,
        note: Some(note.clone()),
    };
    let mut log = transition_log(instance, index, now, LogLevel::Warn, note);
    log.fields.insert("skippedBy".to_string(), Value::from(by));
    logs.push(log);
    logs.extend(tick(instance, now));
    Ok(logs)
}

/// The steps of `instance` not done yet (targets excluded), in graph order:
/// what `--force` skips.
pub fn unfinished_steps(instance: &WorkflowInstance) -> Vec<String> {
    instance
        .steps
        .iter()
        .filter(|step| step.definition.kind != StepKind::Target)
        .filter(|step| !matches!(step.state, StepState::Done { .. }))
        .map(|step| step.definition.name.clone())
        .collect()
}
