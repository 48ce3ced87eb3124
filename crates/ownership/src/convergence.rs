//! The convergence check behind `corral controllers check`: the graph "A
//! writes a field that B reads" between registered controllers, and every
//! cycle in it.
//!
//! What counts:
//! - a controller writes the fields it owns (registered or by default);
//! - it reads the fields it declared in `reads`;
//! - a controller reading its own fields is its own fixed point, not an
//!   interaction, so self-loops are left out;
//! - moving workflow steps is not a field write here: the engine's state
//!   machine only moves a step forward within an instance, so step
//!   hand-offs cannot oscillate;
//! - node agents and people declare no reads and are not in the graph.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::mask::segment_count;
use crate::owner::{FieldRef, Owner};
use crate::registry::{Registry, overlaps};

/// At most this many cycles are enumerated; more are reported as cut off.
pub const MAX_CYCLES: usize = 1000;

/// "`writer` writes `fields`, which `reader` reads."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    pub writer: String,
    pub fields: Vec<FieldRef>,
    pub reader: String,
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fields: Vec<String> = self.fields.iter().map(ToString::to_string).collect();
        write!(
            f,
            "{} writes {} read by {}",
            self.writer,
            fields.join(" and "),
            self.reader
        )
    }
}

/// A cycle, as the edges around it starting at its smallest name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cycle {
    pub edges: Vec<Edge>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.edges.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

/// The verdict of the check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Convergence {
    /// Every edge of the graph.
    pub edges: Vec<Edge>,
    /// Every elementary cycle; empty when the controllers converge.
    pub cycles: Vec<Cycle>,
    /// True when there were more than [`MAX_CYCLES`] cycles.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl Convergence {
    pub fn converges(&self) -> bool {
        self.cycles.is_empty()
    }
}

impl Registry {
    /// Builds the write→read graph of the registered controllers and finds
    /// every cycle in it.
    pub fn check_convergence(&self) -> Convergence {
        let names: Vec<String> = self.controllers().iter().map(|c| c.name.clone()).collect();
        let rules = self.effective_rules();
        let mut edges: BTreeMap<(usize, usize), Vec<FieldRef>> = BTreeMap::new();
        for (w, writer) in names.iter().enumerate() {
            let owner = Owner::Controller(writer.clone());
            let writes: Vec<&FieldRef> = rules
                .iter()
                .filter(|rule| rule.owner == owner)
                .map(|rule| &rule.field)
                .collect();
            for (r, reader) in self.controllers().iter().enumerate() {
                if r == w {
                    continue;
                }
                for read in reader
                    .spec
                    .reads
                    .iter()
                    .filter_map(|read| read.parse::<FieldRef>().ok())
                {
                    for written in &writes {
                        if written.kind == read.kind && overlaps(&written.path, &read.path) {
                            let field = if segment_count(&read.path) > segment_count(&written.path)
                            {
                                read.clone()
                            } else {
                                (*written).clone()
                            };
                            let fields = edges.entry((w, r)).or_default();
                            if !fields.contains(&field) {
                                fields.push(field);
                            }
                        }
                    }
                }
            }
        }
        let edge = |w: usize, r: usize| Edge {
            writer: names[w].clone(),
            fields: edges.get(&(w, r)).cloned().unwrap_or_default(),
            reader: names[r].clone(),
        };
        let mut adjacency: Vec<Vec<usize>> = vec![Vec::new(); names.len()];
        for (w, r) in edges.keys() {
            adjacency[*w].push(*r);
        }
        let (raw, truncated) = elementary_cycles(&adjacency);
        let cycles = raw
            .into_iter()
            .map(|nodes| Cycle {
                edges: nodes
                    .iter()
                    .zip(nodes.iter().cycle().skip(1))
                    .map(|(w, r)| edge(*w, *r))
                    .collect(),
            })
            .collect();
        Convergence {
            edges: edges.keys().map(|(w, r)| edge(*w, *r)).collect(),
            cycles,
            truncated,
        }
    }
}

/// Every elementary cycle of a directed graph without self-loops, each as
/// its nodes starting at its smallest index, in lexicographic order.
fn elementary_cycles(adjacency: &[Vec<usize>]) -> (Vec<Vec<usize>>, bool) {
    let mut cycles = Vec::new();
    let mut truncated = false;
    for start in 0..adjacency.len() {
        let mut path = vec![start];
        let mut on_path = vec![false; adjacency.len()];
        on_path[start] = true;
        search(
            adjacency,
            start,
            start,
            &mut path,
            &mut on_path,
            &mut cycles,
            &mut truncated,
        );
    }
    (cycles, truncated)
}

/// Depth-first search for paths back to `start` through nodes greater than
/// `start` (so each cycle is found once, from its smallest node).
fn search(
    adjacency: &[Vec<usize>],
    start: usize,
    node: usize,
    path: &mut Vec<usize>,
    on_path: &mut [bool],
    cycles: &mut Vec<Vec<usize>>,
    truncated: &mut bool,
) {
    for &next in &adjacency[node] {
        if cycles.len() >= MAX_CYCLES {
            *truncated = true;
            return;
        }
        if next == start {
            cycles.push(path.clone());
        } else if next > start && !on_path[next] {
            on_path[next] = true;
            path.push(next);
            search(adjacency, start, next, path, on_path, cycles, truncated);
            path.pop();
            on_path[next] = false;
        }
    }
}
