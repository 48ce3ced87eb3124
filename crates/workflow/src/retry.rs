//! A person's "try again": a new round of attempts for the steps of an
//! instance that failed, without redoing what is done.
//!
//! - A **failed** instance runs again: each step that failed for good (or
//!   timed out for good) gets a fresh retry budget and is ready once what is
//!   ordered before it is settled; the steps it blocked wait again; done
//!   steps stay done. The instance keeps its id, so `why` and `logs --steps`
//!   show one story: the failure, the retry and who asked for it, the new
//!   attempts.
//! - A **running** instance with steps waiting out their backoff retries
//!   them now instead of at `nextRetryAt`.
//! - Anything else has nothing to retry, and says why.

use chrono::{DateTime, Utc};
use corral_api::workflow::{
    LogLevel, StepKind, StepLogEntry, StepState, WorkflowInstance, WorkflowOutcome,
};

use crate::engine::{tick, transition_log};
use crate::transition::TransitionError;

/// Retries what failed in `instance` at `now`, on behalf of `requested_by`,
/// and returns the log entries (the request, then the transitions it set
/// off). Refused when nothing failed.
pub fn retry(
    instance: &mut WorkflowInstance,
    requested_by: &str,
    now: DateTime<Utc>,
) -> Result<Vec<StepLogEntry>, TransitionError> {
    let mut logs = tick(instance, now);
    let retried: Vec<usize> = match instance.outcome {
        WorkflowOutcome::Failed => restart_failed(instance),
        WorkflowOutcome::Running => hurry_backoffs(instance, now),
        WorkflowOutcome::Succeeded | WorkflowOutcome::Cancelled => Vec::new(),
    };
    if retried.is_empty() {
        return Err(TransitionError::NothingToRetry {
            id: instance.id.clone(),
            why: nothing_to_retry(instance),
        });
    }
    let names: Vec<&str> = retried
        .iter()
        .map(|&index| instance.steps[index].definition.name.as_str())
        .collect();
    let message = if instance.outcome == WorkflowOutcome::Failed {
        format!(
            "{} workflow retried by {requested_by}: {} start again with a fresh retry budget",
            instance.workflow,
            names.join(", ")
        )
    } else {
        format!(
            "retry of {} brought forward by {requested_by}: ready now instead of after the backoff",
            names.join(", ")
        )
    };
    let first = retried[0];
    logs.push(transition_log(
        instance,
        first,
        now,
        LogLevel::Warn,
        message,
    ));
    instance.outcome = WorkflowOutcome::Running;
    instance.finished_at = None;
    logs.extend(tick(instance, now));
    Ok(logs)
}

/// Resets every step that failed for good, and every step or target it
/// blocked, to waiting; returns the indices of the failed steps.
fn restart_failed(instance: &mut WorkflowInstance) -> Vec<usize> {
    let mut failed = Vec::new();
    for (index, step) in instance.steps.iter_mut().enumerate() {
        let final_failure = matches!(
            step.state,
            StepState::Failed {
                next_retry_at: None,
                ..
            } | StepState::TimedOut {
                next_retry_at: None,
                ..
            }
        );
        if final_failure && step.definition.kind == StepKind::Step {
            failed.push(index);
            step.retry_base = step.attempts;
        }
        if final_failure || matches!(step.state, StepState::Blocked { .. }) {
            step.state = StepState::Waiting { on: Vec::new() };
        }
    }
    failed
}

/// Makes every step waiting out its backoff due now; returns their indices.
fn hurry_backoffs(instance: &mut WorkflowInstance, now: DateTime<Utc>) -> Vec<usize> {
    let mut hurried = Vec::new();
    for (index, step) in instance.steps.iter_mut().enumerate() {
        if let StepState::Failed { next_retry_at, .. } | StepState::TimedOut { next_retry_at, .. } =
            &mut step.state
            && next_retry_at.is_some_and(|at| at > now)
        {
            *next_retry_at = Some(now);
            hurried.push(index);
        }
    }
    hurried
}

fn nothing_to_retry(instance: &WorkflowInstance) -> String {
    match instance.outcome {
        WorkflowOutcome::Succeeded => "it succeeded".to_string(),
        WorkflowOutcome::Cancelled => {
            "it was cancelled by a newer operation on the object".to_string()
        }
        WorkflowOutcome::Running | WorkflowOutcome::Failed => {
            "it is running and no step has failed: its steps wait on their owners".to_string()
        }
    }
}
