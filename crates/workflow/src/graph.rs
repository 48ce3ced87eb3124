//! The ordering graph of a list of steps: which steps must settle before
//! which, and which of those edges also propagate failure.
//!
//! Edges point from a dependency to its dependent ("runs before"). They come
//! from `after` and `requires` of the dependent, `before` of the dependency,
//! and `wantedBy` (a member runs before its target). Every edge into a target
//! is required: a target means "all of this succeeded".

use corral_api::workflow::{StepDefinition, StepKind};

/// One dependency of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Edge {
    /// Index of the step that must settle first.
    pub from: usize,
    /// Whether its failure blocks the dependent (`requires`, or a target).
    pub required: bool,
}

/// A reference to a step name that does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DanglingReference {
    pub step: String,
    pub field: &'static str,
    pub reference: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Graph {
    names: Vec<String>,
    /// `dependencies[i]`: the steps that must settle before step `i`.
    dependencies: Vec<Vec<Edge>>,
}

impl Graph {
    /// Builds the graph, failing on the first reference to an unknown step.
    pub fn build<'a>(
        steps: impl IntoIterator<Item = &'a StepDefinition>,
    ) -> Result<Graph, DanglingReference> {
        let steps: Vec<&StepDefinition> = steps.into_iter().collect();
        let mut graph = Graph {
            names: steps.iter().map(|step| step.name.clone()).collect(),
            dependencies: vec![Vec::new(); steps.len()],
        };
        let mut dangling = None;
        graph.add_edges(&steps, |reference| {
            dangling.get_or_insert(reference);
        });
        match dangling {
            Some(reference) => Err(reference),
            None => Ok(graph),
        }
    }

    /// Builds the graph skipping references to unknown steps. Used on stored
    /// instances, which were validated when they were created.
    pub fn lenient<'a>(steps: impl IntoIterator<Item = &'a StepDefinition>) -> Graph {
        let steps: Vec<&StepDefinition> = steps.into_iter().collect();
        let mut graph = Graph {
            names: steps.iter().map(|step| step.name.clone()).collect(),
            dependencies: vec![Vec::new(); steps.len()],
        };
        graph.add_edges(&steps, |_| {});
        graph
    }

    fn add_edges(
        &mut self,
        steps: &[&StepDefinition],
        mut on_dangling: impl FnMut(DanglingReference),
    ) {
        for (index, step) in steps.iter().enumerate() {
            let references = [
                ("after", &step.after, false),
                ("requires", &step.requires, true),
            ];
            for (field, names, required) in references {
                for name in names {
                    match self.index(name) {
                        Some(from) => self.add(index, from, required),
                        None => on_dangling(dangling(step, field, name)),
                    }
                }
            }
            for name in &step.before {
                match self.index(name) {
                    Some(to) => self.add(to, index, false),
                    None => on_dangling(dangling(step, "before", name)),
                }
            }
            if let Some(name) = &step.wanted_by {
                match self.index(name) {
                    Some(to) => self.add(to, index, true),
                    None => on_dangling(dangling(step, "wantedBy", name)),
                }
            }
        }
        for (index, step) in steps.iter().enumerate() {
            if step.kind == StepKind::Target {
                for edge in &mut self.dependencies[index] {
                    edge.required = true;
                }
            }
        }
    }

    fn add(&mut self, to: usize, from: usize, required: bool) {
        let edges = &mut self.dependencies[to];
        match edges.iter_mut().find(|edge| edge.from == from) {
            Some(edge) => edge.required |= required,
            None => edges.push(Edge { from, required }),
        }
    }

    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|candidate| candidate == name)
    }

    pub fn name(&self, index: usize) -> &str {
        &self.names[index]
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn dependencies(&self, index: usize) -> &[Edge] {
        &self.dependencies[index]
    }

    /// A topological order, stable with respect to the given order (among
    /// steps free to go next, the earliest listed goes first). `None` if the
    /// graph has a cycle.
    pub fn topological_order(&self) -> Option<Vec<usize>> {
        let mut remaining: Vec<usize> = self.dependencies.iter().map(Vec::len).collect();
        let mut placed = vec![false; self.len()];
        let mut order = Vec::with_capacity(self.len());
        while order.len() < self.len() {
            let next = (0..self.len()).find(|&index| !placed[index] && remaining[index] == 0)?;
            placed[next] = true;
            order.push(next);
            for (index, edges) in self.dependencies.iter().enumerate() {
                remaining[index] -= edges.iter().filter(|edge| edge.from == next).count();
            }
        }
        Some(order)
    }

    /// The first cycle found, as step names in "runs before" order with the
    /// first name repeated at the end: `[a, b, c, a]`.
    pub fn find_cycle(&self) -> Option<Vec<String>> {
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); self.len()];
        for (index, edges) in self.dependencies.iter().enumerate() {
            for edge in edges {
                dependents[edge.from].push(index);
            }
        }
        // 0 = unvisited, 1 = on the current path, 2 = finished.
        let mut color = vec![0u8; self.len()];
        let mut path = Vec::new();
        for start in 0..self.len() {
            if color[start] == 0
                && let Some(cycle) = visit(start, &dependents, &mut color, &mut path)
            {
                let mut names: Vec<String> = cycle
                    .iter()
                    .map(|&index| self.names[index].clone())
                    .collect();
                names.push(names[0].clone());
                return Some(names);
            }
        }
        None
    }
}

fn visit(
    node: usize,
    dependents: &[Vec<usize>],
    color: &mut [u8],
    path: &mut Vec<usize>,
) -> Option<Vec<usize>> {
    color[node] = 1;
    path.push(node);
    for &next in &dependents[node] {
        if color[next] == 1 {
            let start = path
                .iter()
                .position(|&on_path| on_path == next)
                .unwrap_or(0);
            return Some(path[start..].to_vec());
        }
        if color[next] == 0
            && let Some(cycle) = visit(next, dependents, color, path)
        {
            return Some(cycle);
        }
    }
    path.pop();
    color[node] = 2;
    None
}

fn dangling(step: &StepDefinition, field: &'static str, reference: &str) -> DanglingReference {
    DanglingReference {
        step: step.name.clone(),
        field,
        reference: reference.to_string(),
    }
}
