//! The step graph as a self-contained SVG — the same nodes, colours,
//! labels and edges as [`super::dot`], laid out without Graphviz: each step
//! in the column of its longest chain of dependencies, left to right, so
//! the dashboard can show it with no tool on the server.

use std::fmt::Write;

use chrono::{DateTime, Utc};
use corral_api::workflow::{StepKind, WorkflowInstance};

use super::dot::{fill, label};
use super::{current, step_views};
use crate::graph::Graph;

const BOX_WIDTH: usize = 190;
const BOX_HEIGHT: usize = 44;
const COLUMN_GAP: usize = 50;
const ROW_GAP: usize = 16;
const MARGIN: usize = 10;

/// An `<svg>` element of the instance's steps (no XML prolog: it is
/// meant to sit inside an HTML page). Text is escaped; styling is by
/// presentation attributes only, so a strict Content-Security-Policy
/// that forbids inline styles still shows it.
pub fn svg(object: &str, instance: &WorkflowInstance, now: DateTime<Utc>) -> String {
    let (instance, clock) = current(instance, now);
    let views = step_views(&instance, clock);
    let graph = Graph::lenient(instance.steps.iter().map(|step| &step.definition));
    let columns = columns(&graph);
    let mut rows_used = vec![0usize; columns.iter().max().map_or(1, |c| c + 1)];
    let mut position = vec![(0usize, 0usize); graph.len()];
    for (index, column) in columns.iter().enumerate() {
        position[index] = (*column, rows_used[*column]);
        rows_used[*column] += 1;
    }
    let width = MARGIN * 2 + rows_used.len() * (BOX_WIDTH + COLUMN_GAP) - COLUMN_GAP;
    let height =
        MARGIN * 2 + rows_used.iter().max().copied().unwrap_or(1).max(1) * (BOX_HEIGHT + ROW_GAP);
    let at = |index: usize| {
        let (column, row) = position[index];
        (
            MARGIN + column * (BOX_WIDTH + COLUMN_GAP),
            MARGIN + row * (BOX_HEIGHT + ROW_GAP),
        )
    };
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"workflow\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"11\" role=\"img\">\
         <title>{}</title>",
        escape(&format!(
            "{object} {} workflow {} (revision {}): {}",
            instance.workflow,
            instance.id,
            instance.revision,
            instance.outcome.as_str()
        ))
    );
    for index in 0..graph.len() {
        for edge in graph.dependencies(index) {
            let (from_x, from_y) = at(edge.from);
            let (to_x, to_y) = at(index);
            let dash = if edge.required {
                "stroke=\"#333\""
            } else {
                "stroke=\"#2e7d32\" stroke-dasharray=\"4 3\""
            };
            let _ = write!(
                out,
                "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" {dash}/>",
                from_x + BOX_WIDTH,
                from_y + BOX_HEIGHT / 2,
                to_x,
                to_y + BOX_HEIGHT / 2
            );
        }
    }
    for view in &views {
        let Some(index) = graph.index(&view.name) else {
            continue;
        };
        let (x, y) = at(index);
        let radius = match view.kind {
            StepKind::Target => 20,
            StepKind::Step => 5,
        };
        let text = label(view);
        let (name, detail) = text.split_once('\n').unwrap_or((&text, ""));
        let _ = write!(
            out,
            "<g class=\"step\" data-step=\"{}\" data-phase=\"{}\"><title>{}</title>\
             <rect x=\"{x}\" y=\"{y}\" width=\"{BOX_WIDTH}\" height=\"{BOX_HEIGHT}\" rx=\"{radius}\" \
             fill=\"{}\" stroke=\"#555\"/>\
             <text x=\"{}\" y=\"{}\" font-weight=\"bold\">{}</text><text x=\"{}\" y=\"{}\">{}</text></g>",
            escape(&view.name),
            view.phase,
            escape(&text),
            fill(view.phase),
            x + 8,
            y + 18,
            escape(&shorten(name)),
            x + 8,
            y + 34,
            escape(&shorten(detail)),
        );
    }
    out.push_str("</svg>");
    out
}

/// Each step's column: one past its deepest dependency's.
fn columns(graph: &Graph) -> Vec<usize> {
    let mut column = vec![0usize; graph.len()];
    // Relax until stable; a cycle (which `lenient` may keep) stops at len.
    for _ in 0..graph.len() {
        let mut changed = false;
        for index in 0..graph.len() {
            let deepest = graph
                .dependencies(index)
                .iter()
                .map(|edge| column[edge.from] + 1)
                .max()
                .unwrap_or(0)
                .min(graph.len());
            if deepest > column[index] {
                column[index] = deepest;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    column
}

/// At most 30 characters, ending in `…` when cut.
fn shorten(text: &str) -> String {
    if text.chars().count() <= 30 {
        return text.to_string();
    }
    let mut short: String = text.chars().take(29).collect();
    short.push('…');
    short
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
