//! `corral why KIND/NAME`: a verdict line, then every step of the instance
//! in graph order with what it is doing.

use std::fmt::Write;

use chrono::{DateTime, TimeDelta, Utc};
use corral_api::workflow::{StepKind, WorkflowInstance};
use serde_json::{Value, json};

use super::{StepView, current, display_name, step_json, step_views, time_json};
use crate::duration::format_duration;
use crate::verdict::{DEFAULT_STUCK_AFTER_SECS, Verdict, VerdictState, verdict};

/// The verdict line, as `why` prints it first:
/// `pod/web (revision 3) is not running: step acme/slow-mount running for 5m12s (timeout 10m)`.
pub fn verdict_line(object: &str, instance: &WorkflowInstance, verdict: &Verdict) -> String {
    let negation = if verdict.state == VerdictState::Succeeded {
        ""
    } else {
        "not "
    };
    format!(
        "{object} (revision {}) is {negation}{}: {}",
        instance.revision, instance.goal, verdict.message
    )
}

/// The text `corral why` prints.
pub fn why_text(object: &str, instance: &WorkflowInstance, now: DateTime<Utc>) -> String {
    let verdict = verdict(instance, now, TimeDelta::seconds(DEFAULT_STUCK_AFTER_SECS));
    let (instance, clock) = current(instance, now);
    let views = step_views(&instance, clock);
    let mut out = String::new();
    out.push_str(&verdict_line(object, &instance, &verdict));
    out.push('\n');
    let _ = write!(
        out,
        "{} workflow {}, begun {} ago",
        instance.workflow,
        instance.id,
        format_duration(now - instance.started_at)
    );
    if let Some(finished) = instance.finished_at {
        let _ = write!(
            out,
            ", {} after {}",
            instance.outcome.as_str(),
            format_duration(finished - instance.started_at)
        );
    }
    out.push('\n');
    let width = views
        .iter()
        .map(|view| display_name(view).chars().count() + 2)
        .max()
        .unwrap_or(0)
        .max(29);
    for view in &views {
        let name = display_name(view);
        let detail = detail(view);
        let line = format!("  {} {name:<width$}{detail}", marker(view));
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `corral why -o json`: the verdict, the instance header, and per step its
/// name, owner, kind, state and timing fields.
pub fn why_json(object: &str, instance: &WorkflowInstance, now: DateTime<Utc>) -> Value {
    let verdict = verdict(instance, now, TimeDelta::seconds(DEFAULT_STUCK_AFTER_SECS));
    let (instance, clock) = current(instance, now);
    let steps: Vec<Value> = step_views(&instance, clock).iter().map(step_json).collect();
    json!({
        "object": object,
        "revision": instance.revision,
        "workflow": instance.workflow,
        "workflowId": instance.id,
        "goal": instance.goal,
        "outcome": instance.outcome.as_str(),
        "startedAt": time_json(instance.started_at),
        "finishedAt": instance.finished_at.map(time_json),
        "verdict": {
            "state": verdict.state.as_str(),
            "step": verdict.step,
            "message": verdict.message,
            "line": verdict_line(object, &instance, &verdict),
        },
        "steps": steps,
    })
}

fn marker(view: &StepView) -> &'static str {
    match view.phase {
        "done" => "✓",
        "running" => "●",
        "failed" | "timedOut" => "✗",
        "blocked" => "⊘",
        _ => "○",
    }
}

fn detail(view: &StepView) -> String {
    let attempts = |attempt: Option<u32>| match attempt {
        Some(attempt) if view.max_attempts > 1 => {
            format!(" (attempt {attempt} of {})", view.max_attempts)
        }
        _ => String::new(),
    };
    let retry = match (view.next_retry_at, view.since) {
        (Some(at), Some(failed)) => format!(", retry {} later", format_duration(at - failed)),
        _ => String::new(),
    };
    match view.phase {
        "done" if view.kind == StepKind::Target => {
            format!("@{}", format_duration(view.at.unwrap_or_default()))
        }
        "done" => {
            let took = format!("+{}", format_duration(view.duration.unwrap_or_default()));
            format!("{took:<9} {}", view.note.as_deref().unwrap_or(""))
        }
        "running" => {
            let elapsed = view.for_how_long.unwrap_or_default();
            let mut text = format!("running {}", format_duration(elapsed));
            if let Some(timeout) = view.timeout {
                let _ = write!(text, " of {}", format_duration(timeout));
            }
            if let Some(left) = view.time_left {
                let _ = write!(text, ", {} left", format_duration(left));
            }
            text.push_str(&attempts(view.attempt));
            let _ = write!(text, "   (owner {})", view.owner);
            text
        }
        "ready" => format!(
            "ready for {}, not yet claimed   (owner {})",
            format_duration(view.for_how_long.unwrap_or_default()),
            view.owner
        ),
        "waiting" if view.waiting_on.is_empty() => String::new(),
        "waiting" => format!("waiting on {}", view.waiting_on.join(", ")),
        "failed" | "timedOut" => format!(
            "{}{}{retry}   (owner {})",
            match view.phase {
                "failed" => format!("failed: {}", view.error.as_deref().unwrap_or("")),
                _ => view.error.clone().unwrap_or_default(),
            },
            attempts(view.attempt),
            view.owner
        ),
        "blocked" => match (&view.blocked_by, &view.cause) {
            (Some(dependency), Some(cause)) if dependency != cause => {
                format!("blocked: {dependency} is blocked by failed {cause}")
            }
            (Some(dependency), _) => format!("blocked: required {dependency} failed"),
            _ => "blocked".to_string(),
        },
        _ => String::new(),
    }
}
