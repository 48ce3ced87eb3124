//! Unit tests of the scheduler, one file per concern.

mod accounting;
mod decode;
mod filters;
mod scoring;

use corral_api::kinds::{NodeCapacity, RuntimeClass};
use corral_api::quantity::{Cpu, Memory};
use corral_api::{Kind, ObjectKey};

use crate::{NodeInfo, Request, Snapshot, Unschedulable};

pub(crate) fn cpu(text: &str) -> Cpu {
    text.parse().expect("cpu quantity")
}

pub(crate) fn memory(text: &str) -> Memory {
    text.parse().expect("memory quantity")
}

/// A Ready runc node.
pub(crate) fn node(name: &str, cpu_text: &str, memory_text: &str, pods: u32) -> NodeInfo {
    NodeInfo::ready(
        name,
        NodeCapacity {
            cpu: cpu(cpu_text),
            memory: memory(memory_text),
            pods,
        },
    )
}

/// A roomy Ready node offering runc and gVisor.
pub(crate) fn big_node(name: &str) -> NodeInfo {
    let mut node = node(name, "8", "16Gi", 100);
    node.runtimes = vec![RuntimeClass::Runc, RuntimeClass::Gvisor];
    node
}

pub(crate) fn pod_key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::Pod, Some("default"), name)
}

/// A pod in `default` asking for this much.
pub(crate) fn pod(name: &str, cpu_text: &str, memory_text: &str) -> Request {
    Request {
        cpu: cpu(cpu_text),
        memory: memory(memory_text),
        ..Request::new(pod_key(name))
    }
}

pub(crate) fn snapshot(nodes: Vec<NodeInfo>) -> Snapshot {
    Snapshot {
        nodes,
        ..Snapshot::default()
    }
}

/// The per-node lines of an unschedulable verdict.
pub(crate) fn lines(unschedulable: &Unschedulable) -> Vec<String> {
    unschedulable
        .reasons
        .iter()
        .map(ToString::to_string)
        .collect()
}
