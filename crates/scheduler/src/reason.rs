//! Why a workload cannot run: one reason per node, worded for `corral why`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use corral_api::ObjectKey;
use corral_api::kinds::{NodePhase, RuntimeClass};
use corral_api::quantity::{Cpu, Memory};

/// How many node reasons the one-line summary spells out before counting
/// the rest by cause.
const SUMMARY_NODES: usize = 8;

/// The first filter a node failed. Filters run in the order of the variants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Only from [`crate::Scheduler::fits`], asked about a node the cluster
    /// does not have.
    NoSuchNode,
    NotReady {
        phase: NodePhase,
    },
    Unschedulable,
    PinnedElsewhere {
        node: String,
    },
    VolumeElsewhere {
        volume: String,
        node: String,
    },
    SelectorMismatch {
        selector: BTreeMap<String, String>,
    },
    RuntimeUnavailable {
        runtime: RuntimeClass,
    },
    HostPortInUse {
        port: u16,
        holder: ObjectKey,
    },
    NoPodSlots {
        capacity: u32,
    },
    InsufficientCpu {
        free: Cpu,
        requested: Cpu,
    },
    InsufficientMemory {
        free: Memory,
        requested: Memory,
    },
}

impl Reason {
    /// A short name of the cause, for counting many nodes at once.
    pub fn cause(&self) -> &'static str {
        match self {
            Reason::NoSuchNode => "no such node",
            Reason::NotReady { .. } => "not Ready",
            Reason::Unschedulable => "unschedulable",
            Reason::PinnedElsewhere { .. } => "pinned elsewhere",
            Reason::VolumeElsewhere { .. } => "local volume elsewhere",
            Reason::SelectorMismatch { .. } => "label selector",
            Reason::RuntimeUnavailable { .. } => "runtime not available",
            Reason::HostPortInUse { .. } => "host port in use",
            Reason::NoPodSlots { .. } => "no pod slots",
            Reason::InsufficientCpu { .. } => "insufficient cpu",
            Reason::InsufficientMemory { .. } => "insufficient memory",
        }
    }
}

/// `runc` or `gvisor`, as written in manifests.
pub fn runtime_name(runtime: RuntimeClass) -> &'static str {
    match runtime {
        RuntimeClass::Runc => "runc",
        RuntimeClass::Gvisor => "gvisor",
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoSuchNode => f.write_str("no such node"),
            Reason::NotReady { phase } => write!(f, "not Ready ({phase:?})"),
            Reason::Unschedulable => f.write_str("marked unschedulable"),
            Reason::PinnedElsewhere { node } => write!(f, "pinned to {node}"),
            Reason::VolumeElsewhere { volume, node } => {
                write!(f, "local volume {volume} lives on {node}")
            }
            Reason::SelectorMismatch { selector } => {
                f.write_str("label selector ")?;
                for (index, (key, value)) in selector.iter().enumerate() {
                    let comma = if index == 0 { "" } else { "," };
                    write!(f, "{comma}{key}={value}")?;
                }
                f.write_str(" does not match")
            }
            Reason::RuntimeUnavailable { runtime } => {
                write!(f, "runtime {} not available", runtime_name(*runtime))
            }
            Reason::HostPortInUse { port, holder } => write!(
                f,
                "host port {port} already used by {} {}/{}",
                holder.kind.short(),
                holder.namespace,
                holder.name
            ),
            Reason::NoPodSlots { capacity } => {
                write!(f, "no pod slots free: {capacity} of {capacity} used")
            }
            Reason::InsufficientCpu { free, requested } => {
                write!(f, "insufficient cpu: {free} free, {requested} requested")
            }
            Reason::InsufficientMemory { free, requested } => {
                write!(f, "insufficient memory: {free} free, {requested} requested")
            }
        }
    }
}

/// One node and why it was refused: `node-2: insufficient memory: …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReason {
    pub node: String,
    pub reason: Reason,
}

impl fmt::Display for NodeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.reason)
    }
}

/// No node can run the workload. `reasons` has one entry per node, in node
/// name order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unschedulable {
    pub workload: ObjectKey,
    pub reasons: Vec<NodeReason>,
}

impl Unschedulable {
    /// How many nodes refused it for each cause, most common first.
    pub fn causes(&self) -> Vec<(&'static str, usize)> {
        let mut counts: HashMap<&'static str, usize> = HashMap::new();
        for node in &self.reasons {
            *counts.entry(node.reason.cause()).or_default() += 1;
        }
        let mut causes: Vec<_> = counts.into_iter().collect();
        causes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        causes
    }
}

impl fmt::Display for Unschedulable {
    /// `0/3 nodes can run pod/web: node-1: pinned to node-4; node-2: …`;
    /// past eight nodes the rest are counted by cause.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.reasons.len();
        write!(f, "0/{total} nodes can run {}: ", self.workload)?;
        if total == 0 {
            return f.write_str("the cluster has no nodes");
        }
        for (index, node) in self.reasons.iter().take(SUMMARY_NODES).enumerate() {
            let separator = if index == 0 { "" } else { "; " };
            write!(f, "{separator}{node}")?;
        }
        if total > SUMMARY_NODES {
            write!(f, "; and {} more (", total - SUMMARY_NODES)?;
            for (index, (cause, count)) in self.causes().iter().enumerate() {
                let separator = if index == 0 { "" } else { ", " };
                write!(f, "{separator}{cause}: {count}")?;
            }
            f.write_str(" in all)")?;
        }
        Ok(())
    }
}

impl std::error::Error for Unschedulable {}
