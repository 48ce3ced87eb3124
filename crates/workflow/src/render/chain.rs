//! `corral analyze critical-chain KIND/NAME`: from the goal target back to
//! the start, the dependency that settled last at each step (or, while the
//! workflow runs, the one still holding things up), like
//! `systemd-analyze critical-chain`.

use chrono::{DateTime, Utc};
use corral_api::workflow::{StepKind, StepState, WorkflowInstance};
use serde_json::{Value, json};

use super::{StepView, current, display_name, millis_json, step_view};
use crate::duration::format_duration;
use crate::graph::Graph;

/// The chain, goal first, as step views.
fn chain(instance: &WorkflowInstance, now: DateTime<Utc>) -> (WorkflowInstance, Vec<StepView>) {
    let (instance, clock) = current(instance, now);
    let graph = Graph::lenient(instance.steps.iter().map(|step| &step.definition));
    let mut links = Vec::new();
    let mut current_index = graph.index(&instance.goal);
    while let Some(index) = current_index {
        if links.len() > instance.steps.len() {
            break; // only a corrupt, cyclic instance gets here
        }
        links.push(index);
        current_index = graph
            .dependencies(index)
            .iter()
            .map(|edge| edge.from)
            .max_by_key(|&from| rank(&instance.steps[from].state));
    }
    let views = links
        .into_iter()
        .map(|index| step_view(&instance, &instance.steps[index], clock))
        .collect();
    (instance, views)
}

/// Orders dependencies by how much they hold up their dependent: a pending
/// one (running longest first) beats any settled one; among settled ones the
/// latest wins.
fn rank(state: &StepState) -> (u8, i64) {
    let later = |time: DateTime<Utc>| time.timestamp_millis();
    let earlier = |time: DateTime<Utc>| -time.timestamp_millis();
    match state {
        StepState::Running { since, .. } => (6, earlier(*since)),
        StepState::Failed {
            at,
            next_retry_at: Some(_),
            ..
        }
        | StepState::TimedOut {
            at,
            next_retry_at: Some(_),
            ..
        } => (5, earlier(*at)),
        StepState::Ready { since } => (4, earlier(*since)),
        StepState::Waiting { .. } => (3, 0),
        StepState::Done { finished, .. } => (1, later(*finished)),
        StepState::Failed { at, .. } | StepState::TimedOut { at, .. } => (1, later(*at)),
        StepState::Blocked { at, .. } => (1, later(*at)),
    }
}

fn timing(view: &StepView) -> String {
    match (view.at, view.phase) {
        (Some(at), _) => {
            let mut text = format!(" @{}", format_duration(at));
            if view.kind == StepKind::Step
                && let Some(duration) = view.duration
            {
                text.push_str(&format!(" +{}", format_duration(duration)));
            }
            if view.phase != "done" {
                text.push_str(&format!(" ({})", view.phase));
            }
            text
        }
        (None, "running") => format!(
            " (running {})",
            format_duration(view.for_how_long.unwrap_or_default())
        ),
        (None, phase) => format!(" ({phase})"),
    }
}

/// The chain as text, goal first, each dependency indented below.
pub fn critical_chain_text(
    object: &str,
    instance: &WorkflowInstance,
    now: DateTime<Utc>,
) -> String {
    let (instance, views) = chain(instance, now);
    let mut out = format!(
        "{object} {} workflow {}\n\
         The time when a step settled is printed after the \"@\" character.\n\
         The time a step took is printed after the \"+\" character.\n\n",
        instance.workflow, instance.id
    );
    for (depth, view) in views.iter().enumerate() {
        let prefix = if depth == 0 {
            String::new()
        } else {
            format!("{}└─", "  ".repeat(depth - 1))
        };
        out.push_str(&format!("{prefix}{}{}\n", display_name(view), timing(view)));
    }
    out
}

/// `{object, workflow, workflowId, chain: [{name, kind, state, atMs?, durationMs?}]}`, goal first.
pub fn critical_chain_json(object: &str, instance: &WorkflowInstance, now: DateTime<Utc>) -> Value {
    let (instance, views) = chain(instance, now);
    let links: Vec<Value> = views
        .iter()
        .map(|view| {
            json!({
                "name": view.name,
                "kind": view.kind.as_str(),
                "state": view.phase,
                "atMs": view.at.map(millis_json),
                "durationMs": view.duration.map(millis_json),
            })
        })
        .collect();
    json!({
        "object": object,
        "workflow": instance.workflow,
        "workflowId": instance.id,
        "chain": links,
    })
}
