//! The scheduler's input: nodes, the workloads already on them, and where
//! `local` volumes live.

use std::collections::BTreeMap;

use corral_api::kinds::{NodeCapacity, NodePhase, NodeSpec, NodeStatus, RuntimeClass};
use corral_api::{Kind, Object};

use crate::request::{BoundWorkload, DecodeError};

/// The node feature that says whether KVM is usable (`status.features.kvm`).
pub const KVM_FEATURE: &str = "kvm";

/// Whether a `status.features` value means the feature is usable.
pub fn feature_usable(value: &str) -> bool {
    matches!(value, "usable" | "true" | "yes")
}

/// What the scheduler needs to know of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub phase: NodePhase,
    /// `spec.unschedulable` (a cordon), or the node is being deleted (its
    /// drain): no new workloads.
    pub unschedulable: bool,
    /// Everything the node offers; reservations of bound workloads are
    /// subtracted by the scheduler.
    pub capacity: NodeCapacity,
    pub runtimes: Vec<RuntimeClass>,
    pub features: BTreeMap<String, String>,
}

impl NodeInfo {
    /// A Ready node with this capacity, runc only, no labels.
    pub fn ready(name: &str, capacity: NodeCapacity) -> Self {
        NodeInfo {
            name: name.to_string(),
            labels: BTreeMap::new(),
            phase: NodePhase::Ready,
            unschedulable: false,
            capacity,
            runtimes: vec![RuntimeClass::Runc],
            features: BTreeMap::new(),
        }
    }

    /// Reads a Node object: labels from metadata, `spec.unschedulable`, and
    /// the agent's status (phase, capacity, runtimes, features).
    pub fn from_node(object: &Object) -> Result<Self, DecodeError> {
        let key = object.key();
        if object.kind != Kind::Node {
            return Err(DecodeError::NotANode { key });
        }
        let spec: NodeSpec = if object.spec.is_null() {
            NodeSpec::default()
        } else {
            object.typed_spec().map_err(|source| DecodeError::Spec {
                key: key.clone(),
                source,
            })?
        };
        let status: NodeStatus = object
            .typed_status()
            .map_err(|source| DecodeError::Status { key, source })?;
        Ok(NodeInfo {
            name: object.metadata.name.clone(),
            labels: object.metadata.labels.clone(),
            phase: status.phase,
            unschedulable: spec.unschedulable || object.metadata.deleting.is_some(),
            capacity: status.capacity,
            runtimes: status.runtimes,
            features: status.features,
        })
    }

    /// Whether `status.features.kvm` says KVM is usable.
    pub fn kvm_usable(&self) -> bool {
        self.features
            .get(KVM_FEATURE)
            .is_some_and(|value| feature_usable(value))
    }
}

/// Everything one scheduling decision looks at. Order does not matter: the
/// scheduler sorts nodes by name, so equal snapshots give equal answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub nodes: Vec<NodeInfo>,
    pub bound: Vec<BoundWorkload>,
    /// `local` volume name → the node it lives on. Volumes held by bound
    /// workloads are added from `bound`.
    pub volumes: BTreeMap<String, String>,
}

impl Snapshot {
    /// Builds a snapshot from stored objects: Nodes become nodes, Pods and
    /// VirtualMachines with `status.node` become bound workloads, anything
    /// else is ignored. Unbound workloads are the caller's to place.
    pub fn from_objects<'a>(
        objects: impl IntoIterator<Item = &'a Object>,
    ) -> Result<Self, DecodeError> {
        let mut snapshot = Snapshot::default();
        for object in objects {
            match object.kind {
                Kind::Node => snapshot.nodes.push(NodeInfo::from_node(object)?),
                Kind::Pod | Kind::VirtualMachine => {
                    if let Some(bound) = BoundWorkload::from_object(object)? {
                        snapshot.bound.push(bound);
                    }
                }
                _ => {}
            }
        }
        Ok(snapshot)
    }
}
