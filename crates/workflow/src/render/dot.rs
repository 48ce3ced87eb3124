//! `corral analyze dot KIND/NAME`: the instance's graph in Graphviz, with
//! each node coloured by state. Edges point from a dependency to its
//! dependent; solid black edges also propagate failure (`requires`, or into
//! a target), dashed green ones only order (`after` / `before`), as in
//! `systemd-analyze dot`.

use std::fmt::Write;

use chrono::{DateTime, Utc};
use corral_api::workflow::{StepKind, WorkflowInstance};

use super::{StepView, current, step_views};
use crate::duration::format_duration;
use crate::graph::Graph;

/// A complete `digraph` that `dot -Tsvg` renders.
pub fn dot(object: &str, instance: &WorkflowInstance, now: DateTime<Utc>) -> String {
    let (instance, clock) = current(instance, now);
    let views = step_views(&instance, clock);
    let graph = Graph::lenient(instance.steps.iter().map(|step| &step.definition));
    let title = format!(
        "{object} {} workflow {} (revision {}): {}",
        instance.workflow,
        instance.id,
        instance.revision,
        instance.outcome.as_str()
    );
    let mut out = String::from("digraph workflow {\n");
    let _ = writeln!(out, "  label={};", quote(&title));
    out.push_str("  labelloc=t;\n  rankdir=LR;\n");
    out.push_str("  node [fontname=\"Helvetica\", fontsize=10];\n");
    out.push_str("  edge [fontname=\"Helvetica\", fontsize=9];\n");
    for view in &views {
        let shape = match view.kind {
            StepKind::Target => "ellipse",
            StepKind::Step => "box",
        };
        let _ = writeln!(
            out,
            "  {} [shape={shape}, style=\"rounded,filled\", fillcolor=\"{}\", label={}];",
            quote(&view.name),
            fill(view.phase),
            quote(&label(view))
        );
    }
    for index in 0..graph.len() {
        for edge in graph.dependencies(index) {
            let style = if edge.required {
                "color=black"
            } else {
                "color=darkgreen, style=dashed"
            };
            let _ = writeln!(
                out,
                "  {} -> {} [{style}];",
                quote(graph.name(edge.from)),
                quote(graph.name(index))
            );
        }
    }
    out.push_str("}\n");
    out
}

pub(super) fn label(view: &StepView) -> String {
    let detail = match (view.phase, view.duration, view.at) {
        ("done", Some(duration), _) => format!("done +{}", format_duration(duration)),
        ("done", None, Some(at)) => format!("reached @{}", format_duration(at)),
        ("running", _, _) => format!(
            "running {}",
            format_duration(view.for_how_long.unwrap_or_default())
        ),
        ("failed" | "timedOut", _, _) => view.error.clone().unwrap_or_else(|| view.phase.into()),
        ("blocked", _, _) => format!(
            "blocked by {}",
            view.blocked_by.as_deref().unwrap_or("a dependency")
        ),
        (phase, _, _) => phase.to_string(),
    };
    format!("{}\n{detail}", view.name)
}

pub(super) fn fill(phase: &str) -> &'static str {
    match phase {
        "done" => "#b7e1b0",
        "running" => "#ffe08a",
        "ready" => "#cfe2ff",
        "failed" | "timedOut" => "#f4a6a6",
        "blocked" => "#e0c3f0",
        _ => "#eeeeee",
    }
}

/// A Graphviz double-quoted string; newlines become `\n` line breaks.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
