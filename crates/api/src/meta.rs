//! Kinds, object keys and object metadata.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The namespace an object lands in when its manifest names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Every kind the API serves.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum Kind {
    Pod,
    Node,
    PinnedDeployment,
    Policy,
    Controller,
    VirtualMachine,
    LoadBalancer,
    WorkflowDefinition,
    Secret,
    Config,
}

/// A kind name that matches no kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown kind {given:?}: expected one of pod, node, pinneddeployment (pd), policy, controller, virtualmachine (vm), loadbalancer (lb), workflowdefinition (wfd), secret, config"
)]
pub struct UnknownKind {
    pub given: String,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Pod,
        Kind::Node,
        Kind::PinnedDeployment,
        Kind::Policy,
        Kind::Controller,
        Kind::VirtualMachine,
        Kind::LoadBalancer,
        Kind::WorkflowDefinition,
        Kind::Secret,
        Kind::Config,
    ];

    /// The canonical name, as written in manifests (`Pod`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Node => "Node",
            Kind::PinnedDeployment => "PinnedDeployment",
            Kind::Policy => "Policy",
            Kind::Controller => "Controller",
            Kind::VirtualMachine => "VirtualMachine",
            Kind::LoadBalancer => "LoadBalancer",
            Kind::WorkflowDefinition => "WorkflowDefinition",
            Kind::Secret => "Secret",
            Kind::Config => "Config",
        }
    }

    /// The lowercase plural used in URLs (`pods`).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::Node => "nodes",
            Kind::PinnedDeployment => "pinneddeployments",
            Kind::Policy => "policies",
            Kind::Controller => "controllers",
            Kind::VirtualMachine => "virtualmachines",
            Kind::LoadBalancer => "loadbalancers",
            Kind::WorkflowDefinition => "workflowdefinitions",
            Kind::Secret => "secrets",
            Kind::Config => "configs",
        }
    }

    /// The short name the CLI prints and accepts (`pod`, `pd`, `vm`).
    pub fn short(self) -> &'static str {
        match self {
            Kind::Pod => "pod",
            Kind::Node => "node",
            Kind::PinnedDeployment => "pd",
            Kind::Policy => "policy",
            Kind::Controller => "controller",
            Kind::VirtualMachine => "vm",
            Kind::LoadBalancer => "lb",
            Kind::WorkflowDefinition => "wfd",
            Kind::Secret => "secret",
            Kind::Config => "config",
        }
    }

    /// Whether objects of this kind live in a namespace. Nodes, policies and
    /// controllers are cluster-wide.
    pub fn is_namespaced(self) -> bool {
        matches!(
            self,
            Kind::Pod
                | Kind::PinnedDeployment
                | Kind::VirtualMachine
                | Kind::LoadBalancer
                | Kind::Secret
                | Kind::Config
        )
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = UnknownKind;

    /// Accepts the canonical name, the plural and the short names, in any case.
    fn from_str(given: &str) -> Result<Self, Self::Err> {
        let lower = given.to_ascii_lowercase();
        let kind = match lower.as_str() {
            "pod" | "pods" | "po" => Kind::Pod,
            "node" | "nodes" | "no" => Kind::Node,
            "pinneddeployment" | "pinneddeployments" | "pd" | "pds" => Kind::PinnedDeployment,
            "policy" | "policies" => Kind::Policy,
            "controller" | "controllers" | "ctrl" => Kind::Controller,
            "virtualmachine" | "virtualmachines" | "vm" | "vms" => Kind::VirtualMachine,
            "loadbalancer" | "loadbalancers" | "lb" | "lbs" => Kind::LoadBalancer,
            "workflowdefinition" | "workflowdefinitions" | "wfd" => Kind::WorkflowDefinition,
            "secret" | "secrets" => Kind::Secret,
            "config" | "configs" | "cfg" => Kind::Config,
            _ => {
                return Err(UnknownKind {
                    given: given.to_string(),
                });
            }
        };
        Ok(kind)
    }
}

/// Identifies one object: kind, namespace (empty for cluster-wide kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    /// Builds a key, dropping the namespace for cluster-wide kinds and
    /// defaulting it for namespaced ones.
    pub fn new(kind: Kind, namespace: Option<&str>, name: &str) -> Self {
        let namespace = if kind.is_namespaced() {
            namespace
                .filter(|ns| !ns.is_empty())
                .unwrap_or(DEFAULT_NAMESPACE)
                .to_string()
        } else {
            String::new()
        };
        ObjectKey {
            kind,
            namespace,
            name: name.to_string(),
        }
    }
}

impl fmt::Display for ObjectKey {
    /// `pod/web` in the default namespace, `pod/team-a/web` elsewhere,
    /// `node/node-1` for cluster-wide kinds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() || self.namespace == DEFAULT_NAMESPACE {
            write!(f, "{}/{}", self.kind.short(), self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind.short(), self.namespace, self.name)
        }
    }
}

/// Metadata common to every object. Users write `name`, `namespace`,
/// `labels` and `annotations`; the server sets the rest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Set by the server at creation; never changes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Spec revision, 1-based; grows by one on every spec change.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub revision: u64,
    /// Store revision of the last write of any part of the object; an update
    /// that carries it succeeds only if nobody wrote in between.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resource_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// The annotation naming the controller that manages an object it created
/// (`corral.dev/managed-by: pinned-deployment`). On such an object the
/// fields people would own (labels, annotations, spec) belong to that
/// controller, which may also delete it; see `corral_ownership::managers`.
pub const MANAGED_BY: &str = "corral.dev/managed-by";

/// The controller named by `metadata.annotations["corral.dev/managed-by"]`.
pub fn manager_of(metadata: &ObjectMeta) -> Option<&str> {
    metadata.annotations.get(MANAGED_BY).map(String::as_str)
}
