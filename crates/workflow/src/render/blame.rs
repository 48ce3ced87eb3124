//! `corral analyze blame KIND/NAME`: steps by how long they took, longest
//! first, like `systemd-analyze blame`. Targets take no time and are left
//! out; steps that never started are too.

use chrono::{DateTime, Utc};
use corral_api::workflow::{StepKind, WorkflowInstance};
use serde_json::{Value, json};

use super::{StepView, current, millis_json, step_views};
use crate::duration::format_duration;

fn ranked(instance: &WorkflowInstance, now: DateTime<Utc>) -> (WorkflowInstance, Vec<StepView>) {
    let (instance, clock) = current(instance, now);
    let mut views: Vec<StepView> = step_views(&instance, clock)
        .into_iter()
        .filter(|view| view.kind == StepKind::Step && view.duration.is_some())
        .collect();
    views.sort_by(|a, b| {
        b.duration
            .cmp(&a.duration)
            .then_with(|| a.name.cmp(&b.name))
    });
    (instance, views)
}

/// One line per step: `     5m12s acme/slow-mount (running)`.
pub fn blame_text(object: &str, instance: &WorkflowInstance, now: DateTime<Utc>) -> String {
    let (instance, views) = ranked(instance, now);
    let mut out = format!("{object} {} workflow {}\n", instance.workflow, instance.id);
    for view in &views {
        let took = format_duration(view.duration.unwrap_or_default());
        let suffix = match view.phase {
            "done" => String::new(),
            "timedOut" => " (timed out)".to_string(),
            phase => format!(" ({phase})"),
        };
        out.push_str(&format!("{took:>10} {}{suffix}\n", view.name));
    }
    out
}

/// `{object, workflow, workflowId, steps: [{name, owner, state, durationMs, attempt?}]}`.
pub fn blame_json(object: &str, instance: &WorkflowInstance, now: DateTime<Utc>) -> Value {
    let (instance, views) = ranked(instance, now);
    let steps: Vec<Value> = views
        .iter()
        .map(|view| {
            json!({
                "name": view.name,
                "owner": view.owner,
                "state": view.phase,
                "durationMs": view.duration.map(millis_json),
                "attempt": view.attempt,
            })
        })
        .collect();
    json!({
        "object": object,
        "workflow": instance.workflow,
        "workflowId": instance.id,
        "steps": steps,
    })
}
