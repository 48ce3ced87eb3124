//! The one-line verdict on an instance: running (and on what), stuck,
//! succeeded, failed (and why), or cancelled.

use std::collections::BTreeSet;
use std::fmt::Write;

use chrono::{DateTime, TimeDelta, Utc};
use corral_api::workflow::{
    StepInstance, StepState, WorkflowInstance, WorkflowOutcome, WorkflowStatus,
};

use crate::duration::format_duration;
use crate::engine::tick;

/// A ready step nobody claimed for this long makes the instance stuck,
/// unless the caller picks another threshold.
pub const DEFAULT_STUCK_AFTER_SECS: i64 = 120;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerdictState {
    Running,
    /// A ready step has gone unclaimed longer than the threshold.
    Stuck,
    Succeeded,
    Failed,
    Cancelled,
}

impl VerdictState {
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictState::Running => "running",
            VerdictState::Stuck => "stuck",
            VerdictState::Succeeded => "succeeded",
            VerdictState::Failed => "failed",
            VerdictState::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub state: VerdictState,
    /// The step the verdict is about, if one is.
    pub step: Option<String>,
    /// `step acme/slow-mount running for 5m12s (timeout 10m)`.
    pub message: String,
}

/// Judges `instance` as of `now` (derived states are brought up to date on a
/// copy first).
pub fn verdict(instance: &WorkflowInstance, now: DateTime<Utc>, stuck_after: TimeDelta) -> Verdict {
    let mut instance = instance.clone();
    tick(&mut instance, now);
    let workflow = &instance.workflow;
    match instance.outcome {
        WorkflowOutcome::Succeeded => {
            let took = instance.finished_at.unwrap_or(now) - instance.started_at;
            plain(
                VerdictState::Succeeded,
                format!("{workflow} workflow finished in {}", format_duration(took)),
            )
        }
        WorkflowOutcome::Cancelled => plain(
            VerdictState::Cancelled,
            format!("{workflow} workflow was cancelled"),
        ),
        WorkflowOutcome::Failed => failed(&instance),
        WorkflowOutcome::Running => running(&instance, now, stuck_after),
    }
}

fn plain(state: VerdictState, message: String) -> Verdict {
    Verdict {
        state,
        step: None,
        message,
    }
}

fn about(state: VerdictState, step: &StepInstance, message: String) -> Verdict {
    Verdict {
        state,
        step: Some(step.definition.name.clone()),
        message,
    }
}

fn failed(instance: &WorkflowInstance) -> Verdict {
    let cause = match instance.step(&instance.goal).map(|goal| &goal.state) {
        Some(StepState::Blocked { cause, .. }) => instance.step(cause),
        _ => None,
    };
    let Some(cause) = cause else {
        return plain(
            VerdictState::Failed,
            format!("{} workflow failed", instance.workflow),
        );
    };
    let name = &cause.definition.name;
    let max = cause.max_attempts();
    let message = match &cause.state {
        StepState::Failed { error, attempt, .. } => {
            format!("step {name} failed: {error} (attempt {attempt} of {max})")
        }
        StepState::TimedOut {
            started,
            at,
            attempt,
            ..
        } => format!(
            "step {name} timed out after {} (attempt {attempt} of {max})",
            format_duration(*at - *started)
        ),
        other => format!("step {name} is {}", other.phase()),
    };
    about(VerdictState::Failed, cause, message)
}

fn running(instance: &WorkflowInstance, now: DateTime<Utc>, stuck_after: TimeDelta) -> Verdict {
    let ready = instance
        .steps
        .iter()
        .filter_map(|step| match step.state {
            StepState::Ready { since } => Some((since, step)),
            _ => None,
        })
        .min_by_key(|(since, _)| *since);
    if let Some((since, step)) = ready
        && now - since >= stuck_after
    {
        let message = format!(
            "step {} ready for {} but nobody claimed it (owner {})",
            step.definition.name,
            format_duration(now - since),
            step.definition.owner
        );
        return about(VerdictState::Stuck, step, message);
    }
    for step in &instance.steps {
        let max = step.max_attempts();
        let name = &step.definition.name;
        let message = match &step.state {
            StepState::Failed {
                error,
                attempt,
                next_retry_at: Some(at),
                ..
            } => format!(
                "step {name} failed (attempt {attempt} of {max}), retry in {}: {error}",
                format_duration(*at - now)
            ),
            StepState::TimedOut {
                attempt,
                next_retry_at: Some(at),
                ..
            } => format!(
                "step {name} timed out (attempt {attempt} of {max}), retry in {}",
                format_duration(*at - now)
            ),
            _ => continue,
        };
        return about(VerdictState::Running, step, message);
    }
    let longest = instance
        .steps
        .iter()
        .filter_map(|step| match &step.state {
            StepState::Running {
                since, deadline, ..
            } => Some((*since, *deadline, step)),
            _ => None,
        })
        .min_by_key(|(since, _, _)| *since);
    if let Some((since, deadline, step)) = longest {
        let limit = match deadline {
            Some(deadline) => format!("timeout {}", format_duration(deadline - since)),
            None => "no timeout".to_string(),
        };
        let message = format!(
            "step {} running for {} ({limit})",
            step.definition.name,
            format_duration(now - since)
        );
        return about(VerdictState::Running, step, message);
    }
    if let Some((since, step)) = ready {
        let message = format!(
            "step {} ready for {}, not yet claimed (owner {})",
            step.definition.name,
            format_duration(now - since),
            step.definition.owner
        );
        return about(VerdictState::Running, step, message);
    }
    plain(
        VerdictState::Running,
        format!("{} workflow is waiting", instance.workflow),
    )
}

/// A step of an earlier instance, cancelled while its owner was at it, that
/// the owner never reported ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// The cancelled instance (`update-2`).
    pub workflow_id: String,
    pub step: String,
    pub owner: String,
    /// When the owner claimed it.
    pub claimed_at: DateTime<Utc>,
    /// When its instance was cancelled.
    pub cancelled_at: Option<DateTime<Utc>>,
}

/// The steps of cancelled instances in `status` whose owner claimed them
/// and has not reported them ended (before their timeout), where that
/// owner has a ready step in `latest` and is at work on none of it. An
/// owner finishes a step it began — a node stopping containers honours
/// their grace period — before it takes the next instance's, so those
/// steps are what `latest`'s ready steps wait for.
pub fn unfinished_before(
    status: &WorkflowStatus,
    latest: &WorkflowInstance,
    now: DateTime<Utc>,
) -> Vec<Unfinished> {
    if latest.outcome != WorkflowOutcome::Running {
        return Vec::new();
    }
    let owners = |phase: fn(&StepState) -> bool| -> BTreeSet<&str> {
        latest
            .steps
            .iter()
            .filter(|step| phase(&step.state))
            .map(|step| step.definition.owner.as_str())
            .collect()
    };
    let waiting = owners(|state| matches!(state, StepState::Ready { .. }));
    let working = owners(|state| matches!(state, StepState::Running { .. }));
    let mut found = Vec::new();
    for older in &status.instances {
        if older.id == latest.id || older.outcome != WorkflowOutcome::Cancelled {
            continue;
        }
        for step in &older.steps {
            let StepState::Running {
                since, deadline, ..
            } = &step.state
            else {
                continue;
            };
            let owner = step.definition.owner.as_str();
            let expired = deadline.is_some_and(|deadline| deadline <= now);
            if waiting.contains(owner) && !working.contains(owner) && !expired {
                found.push(Unfinished {
                    workflow_id: older.id.clone(),
                    step: step.definition.name.clone(),
                    owner: owner.to_string(),
                    claimed_at: *since,
                    cancelled_at: older.finished_at,
                });
            }
        }
    }
    found
}

/// `why`'s lines about [`unfinished_before`]'s steps, one each:
/// `  node/stop-changed-containers of update-2 (cancelled 4.6s ago): claimed by node 4.7s ago, not reported ended; node finishes it before it claims a step of update-3`.
pub fn unfinished_text(
    unfinished: &[Unfinished],
    latest: &WorkflowInstance,
    now: DateTime<Utc>,
) -> String {
    let mut out = String::new();
    for step in unfinished {
        let cancelled = step
            .cancelled_at
            .map(|at| format!(" (cancelled {} ago)", format_duration(now - at)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {} of {}{cancelled}: claimed by {} {} ago, not reported ended; {} finishes it before it claims a step of {}",
            step.step,
            step.workflow_id,
            step.owner,
            format_duration(now - step.claimed_at),
            step.owner,
            latest.id
        );
    }
    out
}
