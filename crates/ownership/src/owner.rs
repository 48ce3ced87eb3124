//! Owners, field references and the built-in owner table of every kind.

use std::fmt;
use std::str::FromStr;

use corral_api::{Identity, Kind, Role};
use serde::{Deserialize, Serialize};

/// The identity of the workflow engine; it owns `status.workflow` and lets
/// each step's owner move that step (see `corral_workflow::check_write`).
pub const WORKFLOW: &str = corral_workflow::ENGINE_OWNER;
/// The built-in scheduler.
pub const SCHEDULER: &str = "scheduler";
/// The built-in address manager.
pub const IPAM: &str = "ipam";
/// The built-in controller that declares silent nodes lost.
pub const NODE_LIFECYCLE: &str = "node-lifecycle";
/// The built-in PinnedDeployment controller.
pub const PINNED_DEPLOYMENT: &str = "pinned-deployment";
/// The built-in Job controller.
pub const JOB: &str = "job";
/// The built-in PerNodeDeployment controller.
pub const PER_NODE: &str = "per-node";

/// Who may write a field.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type", content = "name")]
pub enum Owner {
    /// Operators and users (external writers). Controllers never.
    People,
    /// Operators only.
    Operators,
    /// Operators, or the controller a `Controller` object registers (a
    /// controller registers itself).
    Registrant,
    /// The controller identity of this name.
    Controller(String),
    /// The agent of the node the object is bound to (`status.node`).
    BoundNode,
    /// The agent of the `Node` object itself.
    OwnNode,
    /// Nobody: such fields are written by people only, never by controllers.
    Unowned,
}

/// What a write check needs to know about the object beyond its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject<'a> {
    pub kind: Kind,
    pub name: &'a str,
    /// The node the object is bound to: a pod's or VM's stored
    /// `status.node`, a Node's own name.
    pub bound_node: Option<&'a str>,
    /// The controller managing the object (its `corral.dev/managed-by`
    /// annotation, as stored; on create, as written). It owns the fields
    /// people would own otherwise.
    pub manager: Option<&'a str>,
}

impl Owner {
    /// Whether `writer` is this owner for `subject`.
    pub fn admits(&self, writer: &Identity, subject: &Subject<'_>) -> bool {
        let person = matches!(writer.role, Role::Operator | Role::User);
        match self {
            Owner::People | Owner::Unowned => person,
            Owner::Operators => writer.role == Role::Operator,
            Owner::Registrant => {
                writer.role == Role::Operator
                    || (writer.role == Role::Controller && writer.name == subject.name)
            }
            Owner::Controller(name) => writer.role == Role::Controller && writer.name == *name,
            Owner::BoundNode => {
                writer.role == Role::Node && subject.bound_node == Some(writer.name.as_str())
            }
            Owner::OwnNode => writer.role == Role::Node && writer.name == subject.name,
        }
    }

    /// The controller name, for controller owners.
    pub fn controller(&self) -> Option<&str> {
        match self {
            Owner::Controller(name) => Some(name),
            _ => None,
        }
    }

    /// Whether people are the owner (registrations may not take such
    /// fields, except sub-keys of labels and annotations).
    pub fn is_people(&self) -> bool {
        matches!(self, Owner::People)
    }

    /// The owner in words, for messages; `bound_node` names the node when
    /// the owner is the bound node's agent.
    pub fn describe(&self, bound_node: Option<&str>) -> String {
        match (self, bound_node) {
            (Owner::BoundNode, Some(node)) => format!("the agent of node {node}"),
            (owner, _) => owner.to_string(),
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::People => f.write_str("people (operators and users)"),
            Owner::Operators => f.write_str("operators"),
            Owner::Registrant => f.write_str("operators and the registered controller itself"),
            Owner::Controller(name) => write!(f, "controller {name}"),
            Owner::BoundNode => f.write_str("the agent of the object's node (status.node)"),
            Owner::OwnNode => f.write_str("the node's own agent"),
            Owner::Unowned => f.write_str("nobody (unowned fields are written by people only)"),
        }
    }
}

/// An identity as messages show it: `admin (operator)`.
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a>(pub &'a Identity);

impl fmt::Display for Writer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = match self.0.role {
            Role::Operator => "operator",
            Role::User => "user",
            Role::Controller => "controller",
            Role::Node => "node",
            Role::Joiner => "join token",
        };
        write!(f, "{} ({role})", self.0.name)
    }
}

/// A field of a kind, written `Pod:status.node` in registrations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct FieldRef {
    pub kind: Kind,
    pub path: String,
}

/// A string that is not `Kind:path`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not a field reference: expected Kind:path like Pod:status.node")]
pub struct BadFieldRef {
    pub given: String,
}

impl FieldRef {
    pub fn new(kind: Kind, path: impl Into<String>) -> Self {
        FieldRef {
            kind,
            path: path.into(),
        }
    }
}

impl FromStr for FieldRef {
    type Err = BadFieldRef;

    fn from_str(given: &str) -> Result<Self, Self::Err> {
        let bad = || BadFieldRef {
            given: given.to_string(),
        };
        let (kind, path) = given.split_once(':').ok_or_else(bad)?;
        let kind: Kind = kind.parse().map_err(|_| bad())?;
        if path.is_empty() {
            return Err(bad());
        }
        Ok(FieldRef::new(kind, path))
    }
}

impl TryFrom<String> for FieldRef {
    type Error = BadFieldRef;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<FieldRef> for String {
    fn from(field: FieldRef) -> String {
        field.to_string()
    }
}

impl fmt::Display for FieldRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.path)
    }
}

/// One row of the built-in owner table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultOwner {
    pub path: &'static str,
    pub owner: Owner,
}

fn row(path: &'static str, owner: Owner) -> DefaultOwner {
    DefaultOwner { path, owner }
}

fn controller(name: &str) -> Owner {
    Owner::Controller(name.to_string())
}

/// The built-in owner table of a kind. Paths not covered by any row (nor
/// by a registration) are unowned.
pub fn default_owners(kind: Kind) -> Vec<DefaultOwner> {
    let people_meta = |owner: Owner| {
        vec![
            row("metadata.labels", owner.clone()),
            row("metadata.annotations", owner.clone()),
            row("spec", owner),
        ]
    };
    match kind {
        Kind::Pod | Kind::VirtualMachine => {
            let mut rows = people_meta(Owner::People);
            rows.extend([
                row("status.node", controller(SCHEDULER)),
                row("status.address", controller(IPAM)),
                row("status.phase", Owner::BoundNode),
                row("status.containers", Owner::BoundNode),
                row("status.observedRevision", Owner::BoundNode),
                row("status.message", Owner::BoundNode),
                row("status.workflow", controller(WORKFLOW)),
            ]);
            if kind == Kind::VirtualMachine {
                // QEMU's run state and the snapshots in the VM's disk.
                // The last live migration (source and target), written with
                // the binding it changes.
                // The further interfaces' addresses, beside `address`.
                rows.extend([
                    row("status.runState", Owner::BoundNode),
                    row("status.snapshots", Owner::BoundNode),
                    row("status.sandbox", Owner::BoundNode),
                    row("status.migration", controller(SCHEDULER)),
                    row("status.interfaces", controller(IPAM)),
                ]);
            }
            rows
        }
        Kind::Node => {
            let mut rows = people_meta(Owner::People);
            rows.extend([
                row("status", Owner::OwnNode),
                row("status.prefix", controller(IPAM)),
                row("status.phase", controller(NODE_LIFECYCLE)),
                row("status.silentSince", controller(NODE_LIFECYCLE)),
                row("status.fencedBy", controller(NODE_LIFECYCLE)),
                row("status.workflow", controller(WORKFLOW)),
            ]);
            rows
        }
        Kind::PinnedDeployment => {
            let mut rows = people_meta(Owner::People);
            rows.push(row("status", controller(PINNED_DEPLOYMENT)));
            rows
        }
        // The status belongs to whichever LB controller registers for it;
        // until one does, nobody serves LoadBalancers.
        Kind::LoadBalancer => people_meta(Owner::People),
        Kind::Policy => people_meta(Owner::Operators),
        Kind::Controller => people_meta(Owner::Registrant),
        // Written once by the server when an instance first needs it, and
        // never changed: an instance refers to it by name.
        Kind::WorkflowDefinition => people_meta(controller(WORKFLOW)),
        // Written by people; a Secret's values are sealed by the server on
        // the way in, which keeps only their sizes and hashes in the spec.
        Kind::Secret | Kind::Config => people_meta(Owner::People),
        Kind::Job => {
            let mut rows = people_meta(Owner::People);
            rows.push(row("status", controller(JOB)));
            rows
        }
        Kind::PerNodeDeployment => {
            let mut rows = people_meta(Owner::People);
            rows.push(row("status", controller(PER_NODE)));
            rows
        }
    }
}

/// The controllers that may create, manage and delete objects of `kind`
/// (naming themselves in `corral.dev/managed-by`). Built in for now:
/// registered controllers cannot claim this right yet.
pub fn managers(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Pod => &[PINNED_DEPLOYMENT, JOB, PER_NODE],
        // A scheduled Job's runs.
        Kind::Job => &[JOB],
        _ => &[],
    }
}

/// Whether a path may be named in `owns` at all: only labels, annotations,
/// spec and status fields are ownable; the rest of metadata is the server's.
pub fn ownable(path: &str) -> bool {
    let root = path.split(['.', '[']).next().unwrap_or_default();
    match root {
        "spec" | "status" => true,
        "metadata" => {
            path.starts_with("metadata.labels.") || path.starts_with("metadata.annotations.")
        }
        _ => false,
    }
}

/// Whether a people-owned default row may be carved up by a registration
/// claiming `path` strictly inside it: sub-keys of labels and annotations
/// may be; spec fields may not (spec belongs to people).
pub fn carvable(row_path: &str, path: &str) -> bool {
    matches!(row_path, "metadata.labels" | "metadata.annotations") && path.len() > row_path.len()
}
