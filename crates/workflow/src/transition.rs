//! The transitions a step's owner makes: claim, complete, fail, and log.
//!
//! Each first brings the instance up to `now` (see [`crate::tick`]), then
//! checks that the actor may act for the step's owner and that the step's
//! state allows the transition, and returns the log entries to store. On
//! error the instance may have been ticked; nothing else has changed.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use corral_api::Identity;
use corral_api::workflow::{
    LogLevel, StepKind, StepLogEntry, StepState, WorkflowInstance, WorkflowOutcome,
};
use serde_json::Value;

use crate::engine::{retry_at, tick, transition_log};
use crate::owner::{may_move, mover_description};

/// A transition that is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("workflow {id} has no step {step}")]
    UnknownStep { id: String, step: String },
    #[error("workflow {id} is {outcome}; its steps no longer change")]
    Finished { id: String, outcome: &'static str },
    #[error("{step} is a target; the engine reaches it when everything before it is done")]
    Target { step: String },
    #[error("{actor} may not {action} step {step}: it belongs to {owner}")]
    NotOwner {
        step: String,
        action: &'static str,
        actor: String,
        owner: String,
    },
    #[error("cannot {action} step {step}: it is {phase}{expected}")]
    WrongState {
        step: String,
        action: &'static str,
        phase: &'static str,
        expected: &'static str,
    },
    #[error("workflow {id} has nothing to retry: {why}")]
    NothingToRetry { id: String, why: String },
    #[error("cannot {action} step {step}: it was claimed by {claimed_by}, not {actor}")]
    NotClaimant {
        step: String,
        action: &'static str,
        claimed_by: String,
        actor: String,
    },
}

/// The owner takes a ready step: it becomes running with a deadline of
/// `now + timeout`. A step that failed and waits for its retry may be
/// claimed too, before its backoff ends: the owner knows when what made it
/// fail has changed (the scheduler, when a node becomes Ready).
pub fn claim(
    instance: &mut WorkflowInstance,
    step: &str,
    actor: &Identity,
    bound_node: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Vec<StepLogEntry>, TransitionError> {
    let mut logs = tick(instance, now);
    let index = authorize(instance, step, actor, bound_node, "claim")?;
    let entry = &mut instance.steps[index];
    let early = entry.state.awaits_retry();
    if !matches!(entry.state, StepState::Ready { .. }) && !early {
        return Err(wrong_state(
            step,
            "claim",
            &entry.state,
            ": only a ready step, or a failed one awaiting its retry, can be claimed",
        ));
    }
    entry.attempts += 1;
    entry.first_started_at.get_or_insert(now);
    let deadline = entry
        .definition
        .timeout_ms
        .map(|ms| now + TimeDelta::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX)));
    entry.state = StepState::Running {
        claimed_by: actor.name.clone(),
        since: now,
        attempt: entry.attempts,
        deadline,
    };
    let message = format!(
        "claimed by {} (attempt {}{})",
        actor.name,
        entry.attempts,
        if early {
            ", retried before its backoff"
        } else {
            ""
        }
    );
    let mut log = transition_log(instance, index, now, LogLevel::Info, message);
    log.fields
        .insert("claimedBy".to_string(), Value::from(actor.name.clone()));
    logs.push(log);
    Ok(logs)
}

/// [`claim`] of a step that may still be waiting on steps ordered before
/// it: such a step is left as it is (`false`, with what bringing the
/// instance up to `now` logged), any other is claimed or refused as by
/// [`claim`]. The owner rule holds either way.
pub fn claim_if_ready(
    instance: &mut WorkflowInstance,
    step: &str,
    actor: &Identity,
    bound_node: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(Vec<StepLogEntry>, bool), TransitionError> {
    let mut logs = tick(instance, now);
    let index = authorize(instance, step, actor, bound_node, "claim")?;
    if matches!(instance.steps[index].state, StepState::Waiting { .. }) {
        return Ok((logs, false));
    }
    logs.extend(claim(instance, step, actor, bound_node, now)?);
    Ok((logs, true))
}

/// The claimant reports success, optionally with a note for `why` (the
/// chosen node, the address). Dependents are re-evaluated at once.
pub fn complete(
    instance: &mut WorkflowInstance,
    step: &str,
    actor: &Identity,
    bound_node: Option<&str>,
    now: DateTime<Utc>,
    note: Option<String>,
) -> Result<Vec<StepLogEntry>, TransitionError> {
    let mut logs = tick(instance, now);
    let index = authorize(instance, step, actor, bound_node, "complete")?;
    let (since, attempt) = running_claim(instance, index, actor, "complete")?;
    let message = match &note {
        Some(note) => format!("done: {note}"),
        None => "done".to_string(),
    };
    instance.steps[index].state = StepState::Done {
        started: since,
        finished: now,
        attempt,
        note: note.clone(),
    };
    let mut log = transition_log(instance, index, now, LogLevel::Info, message);
    if let Some(note) = note {
        log.fields.insert("note".to_string(), Value::from(note));
    }
    logs.push(log);
    logs.extend(tick(instance, now));
    Ok(logs)
}

/// The claimant reports an error. The step is retried after its backoff if
/// attempts remain; otherwise the failure is final and blocks the steps that
/// require it.
pub fn fail(
    instance: &mut WorkflowInstance,
    step: &str,
    actor: &Identity,
    bound_node: Option<&str>,
    now: DateTime<Utc>,
    error: &str,
) -> Result<Vec<StepLogEntry>, TransitionError> {
    let mut logs = tick(instance, now);
    let index = authorize(instance, step, actor, bound_node, "fail")?;
    let (since, attempt) = running_claim(instance, index, actor, "fail")?;
    let next_retry_at = retry_at(&instance.steps[index], attempt, now);
    let max = instance.steps[index].max_attempts();
    let message = match next_retry_at {
        Some(at) => format!(
            "failed (attempt {attempt} of {max}), retry in {}: {error}",
            crate::duration::format_duration(at - now)
        ),
        None => format!("failed (attempt {attempt}, the last): {error}"),
    };
    instance.steps[index].state = StepState::Failed {
        error: error.to_string(),
        started: since,
        at: now,
        attempt,
        next_retry_at,
    };
    let mut log = transition_log(instance, index, now, LogLevel::Error, message);
    log.fields
        .insert("error".to_string(), Value::from(error.to_string()));
    logs.push(log);
    logs.extend(tick(instance, now));
    Ok(logs)
}

/// A log line the step's owner appends, with structured fields. Allowed in
/// any state, and after the instance finished (late cleanup output).
#[allow(clippy::too_many_arguments)]
pub fn append_log(
    instance: &WorkflowInstance,
    step: &str,
    actor: &Identity,
    bound_node: Option<&str>,
    now: DateTime<Utc>,
    level: LogLevel,
    message: &str,
    fields: BTreeMap<String, Value>,
) -> Result<StepLogEntry, TransitionError> {
    let index = find(instance, step)?;
    check_owner(instance, index, actor, bound_node, "log for")?;
    let mut entry = transition_log(instance, index, now, level, message.to_string());
    entry.fields.extend(fields);
    Ok(entry)
}

fn authorize(
    instance: &WorkflowInstance,
    step: &str,
    actor: &Identity,
    bound_node: Option<&str>,
    action: &'static str,
) -> Result<usize, TransitionError> {
    let index = find(instance, step)?;
    if instance.outcome != WorkflowOutcome::Running {
        return Err(TransitionError::Finished {
            id: instance.id.clone(),
            outcome: instance.outcome.as_str(),
        });
    }
    if instance.steps[index].definition.kind == StepKind::Target {
        return Err(TransitionError::Target {
            step: step.to_string(),
        });
    }
    check_owner(instance, index, actor, bound_node, action)?;
    Ok(index)
}

fn find(instance: &WorkflowInstance, step: &str) -> Result<usize, TransitionError> {
    instance
        .steps
        .iter()
        .position(|candidate| candidate.definition.name == step)
        .ok_or_else(|| TransitionError::UnknownStep {
            id: instance.id.clone(),
            step: step.to_string(),
        })
}

fn check_owner(
    instance: &WorkflowInstance,
    index: usize,
    actor: &Identity,
    bound_node: Option<&str>,
    action: &'static str,
) -> Result<(), TransitionError> {
    let definition = &instance.steps[index].definition;
    if may_move(definition, actor, bound_node) {
        return Ok(());
    }
    Err(TransitionError::NotOwner {
        step: definition.name.clone(),
        action,
        actor: actor.name.clone(),
        owner: mover_description(definition, bound_node),
    })
}

/// The running attempt's start and number, if `actor` holds the claim.
fn running_claim(
    instance: &WorkflowInstance,
    index: usize,
    actor: &Identity,
    action: &'static str,
) -> Result<(DateTime<Utc>, u32), TransitionError> {
    let step = &instance.steps[index];
    match &step.state {
        StepState::Running {
            claimed_by,
            since,
            attempt,
            ..
        } => {
            if *claimed_by != actor.name {
                return Err(TransitionError::NotClaimant {
                    step: step.definition.name.clone(),
                    action,
                    claimed_by: claimed_by.clone(),
                    actor: actor.name.clone(),
                });
            }
            Ok((*since, *attempt))
        }
        other => Err(wrong_state(
            &step.definition.name,
            action,
            other,
            ": only a running step can be completed or failed",
        )),
    }
}

fn wrong_state(
    step: &str,
    action: &'static str,
    state: &StepState,
    expected: &'static str,
) -> TransitionError {
    TransitionError::WrongState {
        step: step.to_string(),
        action,
        phase: state.phase(),
        expected,
    }
}
