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
    Job,
    PerNodeDeployment,
}

/// A kind name that matches no kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown kind {given:?}: expected one of pod, node, pinneddeployment (pd), policy, controller, virtualmachine (vm), loadbalancer (lb), workflowdefinition (wfd), secret, config, job, pernodedeployment (pnd)"
)]
pub struct UnknownKind {
    pub given: String,
}

impl Kind {
    pub const ALL: [Kind; 12] = [
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
        Kind::Job,
        Kind::PerNodeDeployment,
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
            Kind::Job => "Job",
            Kind::PerNodeDeployment => "PerNodeDeployment",
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
            Kind::Job => "jobs",
            Kind::PerNodeDeployment => "pernodedeployments",
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
            Kind::Job => "job",
            Kind::PerNodeDeployment => "pnd",
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
                | Kind::Job
                | Kind::PerNodeDeployment
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
            "job" | "jobs" => Kind::Job,
            "pernodedeployment" | "pernodedeployments" | "pnd" | "pnds" => Kind::PerNodeDeployment,
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
    /// The object that created this one, in the same namespace: deleting
    /// it deletes this one too (unless the deletion orphans its
    /// dependents). Written by the controller managing the object; the
    /// server clears it when it orphans the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerReference>,
    /// Set by the server when someone deleted an object whose kind stops
    /// through a workflow (a Pod): its `stop` instance runs, and the object
    /// is removed when that finishes. Never written by clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleting: Option<Deletion>,
}

/// A deletion under way: who asked, when and why, and the steps people
/// skipped. The removal is recorded in history as theirs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Deletion {
    pub since: DateTime<Utc>,
    /// The author of the deletion.
    pub by: String,
    pub class: crate::AuthorClass,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The `stop` workflow instance that runs it (`stop-3`).
    pub workflow: String,
    /// Steps skipped by people (`delete --skip`, `--force`), each as
    /// `STEP (by NAME)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// Names an object's owner: kind, name and uid. The owner lives in the
/// namespace of its dependent (or, for cluster-wide kinds, in none); the
/// uid tells it apart from a later object of the same name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OwnerReference {
    pub kind: Kind,
    pub name: String,
    pub uid: String,
}

impl OwnerReference {
    /// A reference to `owner` (its stored uid).
    pub fn to(owner: &crate::Object) -> Self {
        OwnerReference {
            kind: owner.kind,
            name: owner.metadata.name.clone(),
            uid: owner.metadata.uid.clone(),
        }
    }

    /// The owner's key, seen from a dependent in `namespace`.
    pub fn key(&self, namespace: Option<&str>) -> ObjectKey {
        ObjectKey::new(self.kind, namespace, &self.name)
    }

    /// Whether this reference names `object` (same kind, name and uid).
    pub fn names(&self, object: &crate::Object) -> bool {
        self.kind == object.kind
            && self.name == object.metadata.name
            && self.uid == object.metadata.uid
    }
}

impl fmt::Display for OwnerReference {
    /// `pd/web`, as the CLI names objects.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind.short(), self.name)
    }
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// What deleting an owner does to its dependents (the `cascade` query
/// parameter of a delete, `corral delete --cascade`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Cascade {
    /// Delete them, and their dependents in turn (the default).
    #[default]
    Delete,
    /// Keep them, and clear their `metadata.owner`.
    Orphan,
}

/// A cascade policy that is not `delete` or `orphan`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cascade: {given:?} is not a cascade policy; expected delete or orphan")]
pub struct UnknownCascade {
    pub given: String,
}

impl Cascade {
    pub fn as_str(self) -> &'static str {
        match self {
            Cascade::Delete => "delete",
            Cascade::Orphan => "orphan",
        }
    }
}

impl fmt::Display for Cascade {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Cascade {
    type Err = UnknownCascade;

    /// `delete` or `orphan`, in any case.
    fn from_str(given: &str) -> Result<Self, Self::Err> {
        match given.to_ascii_lowercase().as_str() {
            "delete" => Ok(Cascade::Delete),
            "orphan" => Ok(Cascade::Orphan),
            _ => Err(UnknownCascade {
                given: given.to_string(),
            }),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Object;
    use serde_json::json;

    #[test]
    fn metadata_stored_before_owners_still_decodes() {
        let stored = json!({"name": "web-0", "namespace": "default", "uid": "u-9", "labels": {}});
        let meta: ObjectMeta = serde_json::from_value(stored).expect("old metadata decodes");
        assert_eq!(meta.owner, None);
        let written = serde_json::to_value(&meta).expect("metadata encodes");
        assert!(
            written.get("owner").is_none(),
            "no owner, no field: {written}"
        );
    }

    #[test]
    fn owner_references_round_trip_and_refuse_unknown_fields() {
        let meta: ObjectMeta = serde_json::from_value(json!({
            "name": "web-0",
            "owner": {"kind": "PinnedDeployment", "name": "web", "uid": "u-1"}
        }))
        .expect("an owner decodes");
        let owner = meta.owner.clone().expect("owner kept");
        assert_eq!(owner.to_string(), "pd/web");
        assert_eq!(
            owner.key(Some("team-a")),
            ObjectKey::new(Kind::PinnedDeployment, Some("team-a"), "web")
        );
        let again: ObjectMeta =
            serde_json::from_value(serde_json::to_value(&meta).expect("encodes")).expect("decodes");
        assert_eq!(again, meta);
        let unknown = serde_json::from_value::<ObjectMeta>(json!({
            "name": "web-0",
            "owner": {"kind": "PinnedDeployment", "name": "web", "uid": "u-1", "controller": true}
        }));
        assert!(unknown.is_err(), "an unknown owner field is refused");
    }

    #[test]
    fn cascade_policies_parse_in_any_case() {
        assert_eq!("orphan".parse(), Ok(Cascade::Orphan));
        assert_eq!("Delete".parse(), Ok(Cascade::Delete));
        let error = "foreground".parse::<Cascade>().expect_err("not a policy");
        assert_eq!(
            error.to_string(),
            "cascade: \"foreground\" is not a cascade policy; expected delete or orphan"
        );
        assert_eq!(Cascade::default().to_string(), "delete");
    }

    #[test]
    fn a_reference_names_one_object_by_uid() {
        let mut deployment = Object::new(Kind::PinnedDeployment, None, "web", json!({}));
        deployment.metadata.uid = "u-1".into();
        let owner = OwnerReference::to(&deployment);
        assert!(owner.names(&deployment));
        deployment.metadata.uid = "u-2".into();
        assert!(
            !owner.names(&deployment),
            "a later object of that name is not the owner"
        );
    }
}
