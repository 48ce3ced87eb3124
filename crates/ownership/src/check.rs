//! The write check: which changed field paths a writer may not write, and
//! who may delete objects.

use std::collections::BTreeMap;
use std::fmt;

use corral_api::fieldpath::changed_paths;
use corral_api::workflow::WorkflowStatus;
use corral_api::{Identity, Kind, Object, ObjectKey, Role};
use corral_workflow::WriteError;
use serde_json::Value;

use crate::owner::{Owner, Subject, Writer};
use crate::registry::Registry;

/// The field whose changes the workflow engine's rule decides.
pub const WORKFLOW_PATH: &str = "status.workflow";

/// One broken rule of a refused write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// The writer changed fields someone else owns.
    NotOwner {
        paths: Vec<String>,
        owner: Owner,
        bound_node: Option<String>,
        writer: Box<Identity>,
    },
    /// A change of `status.workflow` the step rule refuses.
    Workflow(WriteError),
    /// `status.workflow` is not a workflow status.
    MalformedWorkflow(String),
    /// Only people delete, and only operators delete cluster-wide
    /// configuration (policies, controllers).
    Delete {
        key: ObjectKey,
        writer: Box<Identity>,
    },
    /// `corral.dev/managed-by` names a controller that may not manage
    /// objects of this kind.
    NotAManager { manager: String, kind: Kind },
    /// `metadata.owner` changed, and the writer is not the controller
    /// managing the object (`manager`, if it names one).
    OwnerReference {
        manager: Option<String>,
        writer: Box<Identity>,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::NotOwner {
                paths,
                owner,
                bound_node,
                writer,
            } => {
                let (list, verb, them) = match paths.as_slice() {
                    [one] => (one.clone(), "is", "it"),
                    [a, b] => (format!("{a} and {b}"), "are", "them"),
                    [a, b, rest @ ..] => {
                        (format!("{a}, {b} and {} more", rest.len()), "are", "them")
                    }
                    [] => (String::from("nothing"), "is", "it"),
                };
                let writer = Writer(writer);
                match owner {
                    Owner::Unowned => write!(
                        f,
                        "{list} {verb} owned by nobody: unowned fields are written by people only; {writer} may not write {them}"
                    ),
                    owner => write!(
                        f,
                        "{list} {verb} owned by {}; {writer} may not write {them}",
                        owner.describe(bound_node.as_deref())
                    ),
                }
            }
            Violation::Workflow(error) => write!(f, "{WORKFLOW_PATH}: {error}"),
            Violation::MalformedWorkflow(error) => {
                write!(f, "{WORKFLOW_PATH} is not a workflow status: {error}")
            }
            Violation::NotAManager { manager, kind } => {
                let allowed = crate::owner::managers(*kind);
                let allowed = if allowed.is_empty() {
                    "no controller".to_string()
                } else {
                    allowed.join(", ")
                };
                write!(
                    f,
                    "metadata.annotations.{}: controller {manager} may not manage {kind} objects (allowed: {allowed})",
                    corral_api::MANAGED_BY
                )
            }
            Violation::OwnerReference { manager, writer } => {
                let writer = Writer(writer);
                match manager {
                    Some(manager) => write!(
                        f,
                        "metadata.owner is written by controller {manager}, which manages the object; {writer} may not write it"
                    ),
                    None => write!(
                        f,
                        "metadata.owner is written by the controller managing an object, and this one names none in {}; {writer} may not write it",
                        corral_api::MANAGED_BY
                    ),
                }
            }
            Violation::Delete { key, writer } => {
                let who = if matches!(key.kind, Kind::Policy | Kind::Controller) {
                    "operators"
                } else {
                    "people (operators and users)"
                };
                write!(
                    f,
                    "only {who} delete {} objects; {} may not delete {key}",
                    key.kind,
                    Writer(writer)
                )
            }
        }
    }
}

/// A refused write: every rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Refusal {
    pub violations: Vec<Violation>,
}

/// Every leaf that differs between the old and the new object in the
/// fields writers set (labels, annotations, spec, status). Server-set
/// metadata (uid, revisions, creation time) never counts. A subtree added
/// or removed whole counts as each of its leaves, so that differently
/// owned parts of it are told apart.
pub fn changed_fields(old: Option<&Object>, new: &Object) -> Vec<String> {
    let empty = Value::Object(Default::default());
    let null = Value::Null;
    // Maps that did not change are not made JSON to be compared.
    let pair = |old: Option<&BTreeMap<String, String>>, new: &BTreeMap<String, String>| {
        if old == Some(new) {
            (Value::Null, Value::Null)
        } else {
            (old.map_or_else(|| empty.clone(), to_value), to_value(new))
        }
    };
    let (old_labels, new_labels) = pair(old.map(|o| &o.metadata.labels), &new.metadata.labels);
    let (old_annotations, new_annotations) = pair(
        old.map(|o| &o.metadata.annotations),
        &new.metadata.annotations,
    );
    // Spec and status are compared where they are, not copied.
    let parts: [(&str, &Value, &Value); 4] = [
        ("metadata.labels", &old_labels, &new_labels),
        ("metadata.annotations", &old_annotations, &new_annotations),
        ("spec", old.map_or(&empty, |o| &o.spec), &new.spec),
        ("status", old.map_or(&null, |o| &o.status), &new.status),
    ];
    let mut paths = Vec::new();
    for (root, before, after) in parts {
        for change in changed_paths(root, before, after) {
            leaves(
                &change.path,
                change.old.as_ref(),
                change.new.as_ref(),
                &mut paths,
            );
        }
    }
    paths
}

fn to_value<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Expands a change whose either side is an object or array into the
/// leaves of both sides (each once).
fn leaves(path: &str, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<String>) {
    let mut found = Vec::new();
    for side in [old, new].into_iter().flatten() {
        leaves_of(path, side, &mut found);
    }
    if found.is_empty() {
        found.push(path.to_string());
    }
    for leaf in found {
        if !out.contains(&leaf) {
            out.push(leaf);
        }
    }
}

/// The leaf paths of one value (none for an empty object or array).
fn leaves_of(path: &str, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                leaves_of(&format!("{path}.{key}"), child, out);
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                leaves_of(&format!("{path}[{index}]"), child, out);
            }
        }
        Value::Null => {}
        _ => out.push(path.to_string()),
    }
}

impl Registry {
    /// Checks the changed paths of one write of `subject` by `writer`
    /// (paths under `status.workflow` are left to [`Registry::check_write`],
    /// which knows the old and new instances).
    pub fn check_changes(
        &self,
        writer: &Identity,
        subject: &Subject<'_>,
        changes: &[String],
    ) -> Result<(), Refusal> {
        let mut refused: BTreeMap<Owner, Vec<String>> = BTreeMap::new();
        for path in changes {
            let mut owner = self.owner_of(subject.kind, path);
            if let (true, Some(manager)) = (owner.is_people(), subject.manager) {
                owner = Owner::Controller(manager.to_string());
            }
            if !owner.admits(writer, subject) {
                refused.entry(owner).or_default().push(path.clone());
            }
        }
        if refused.is_empty() {
            return Ok(());
        }
        Err(Refusal {
            violations: refused
                .into_iter()
                .map(|(owner, paths)| Violation::NotOwner {
                    paths,
                    owner,
                    bound_node: subject.bound_node.map(str::to_string),
                    writer: Box::new(writer.clone()),
                })
                .collect(),
        })
    }

    /// Checks a whole write: `old` is the stored object (`None` on create),
    /// `new` what would be stored. `status.workflow` changes go to the
    /// workflow engine's rule: its owner (the engine) writes anything, every
    /// other writer only moves the steps it owns.
    pub fn check_write(
        &self,
        writer: &Identity,
        old: Option<&Object>,
        new: &Object,
    ) -> Result<(), Refusal> {
        let bound_node = bound_node(old.unwrap_or(new));
        let manager = corral_api::manager_of(&old.unwrap_or(new).metadata);
        let subject = Subject {
            kind: new.kind,
            name: &new.metadata.name,
            bound_node: bound_node.as_deref(),
            manager,
        };
        let (workflow, others): (Vec<String>, Vec<String>) = changed_fields(old, new)
            .into_iter()
            .partition(|path| corral_api::fieldpath::path_matches(WORKFLOW_PATH, path));
        let mut violations = match self.check_changes(writer, &subject, &others) {
            Ok(()) => Vec::new(),
            Err(refusal) => refusal.violations,
        };
        if let Some(named) = corral_api::manager_of(&new.metadata)
            && !crate::owner::managers(new.kind).contains(&named)
        {
            violations.push(Violation::NotAManager {
                manager: named.to_string(),
                kind: new.kind,
            });
        }
        if let Some(violation) = check_owner_reference(writer, old, new) {
            violations.push(violation);
        }
        let engine_owner = self.owner_of(new.kind, WORKFLOW_PATH);
        if !workflow.is_empty() && !engine_owner.admits(writer, &subject) {
            let old_status = old.map_or(&Value::Null, |o| &o.status);
            if let Err(violation) = check_workflow(writer, old_status, &new.status, &subject) {
                violations.push(violation);
            }
        }
        if violations.is_empty() {
            Ok(())
        } else {
            Err(Refusal { violations })
        }
    }
}

/// A change of `metadata.owner` is the managing controller's: the one the
/// object names in `corral.dev/managed-by` (as stored; on create, as
/// written), if [`crate::managers`] lets it manage the kind. The server
/// clears an owner itself when it orphans an object, outside this check.
pub fn check_owner_reference(
    writer: &Identity,
    old: Option<&Object>,
    new: &Object,
) -> Option<Violation> {
    if old.and_then(|o| o.metadata.owner.as_ref()) == new.metadata.owner.as_ref() {
        return None;
    }
    let manager = corral_api::manager_of(&old.unwrap_or(new).metadata)
        .filter(|manager| crate::owner::managers(new.kind).contains(manager));
    let admitted = writer.role == Role::Controller && manager == Some(writer.name.as_str());
    (!admitted).then(|| Violation::OwnerReference {
        manager: manager.map(str::to_string),
        writer: Box::new(writer.clone()),
    })
}

/// The node an object is bound to: a pod's or VM's `status.node`, a Node's
/// own name.
pub fn bound_node(object: &Object) -> Option<String> {
    match object.kind {
        Kind::Node => Some(object.metadata.name.clone()),
        _ => object
            .status
            .get("node")
            .and_then(Value::as_str)
            .map(str::to_string),
    }
}

fn workflow_status(status: &Value) -> Result<WorkflowStatus, Violation> {
    match status.get("workflow") {
        None | Some(Value::Null) => Ok(WorkflowStatus::default()),
        Some(value) => serde_json::from_value(value.clone())
            .map_err(|e| Violation::MalformedWorkflow(e.to_string())),
    }
}

fn check_workflow(
    writer: &Identity,
    old: &Value,
    new: &Value,
    subject: &Subject<'_>,
) -> Result<(), Violation> {
    let old = workflow_status(old)?;
    let new = workflow_status(new)?;
    let ids = |status: &WorkflowStatus| -> Vec<String> {
        status.instances.iter().map(|i| i.id.clone()).collect()
    };
    if ids(&old) != ids(&new) {
        return Err(Violation::Workflow(WriteError::InstanceSet));
    }
    for (before, after) in old.instances.iter().zip(&new.instances) {
        corral_workflow::check_write(before, after, writer, subject.bound_node)
            .map_err(Violation::Workflow)?;
    }
    Ok(())
}

/// Whether `writer` may delete `object`: as [`check_delete`], and besides
/// the controller named in its `corral.dev/managed-by` annotation, and the
/// job controller a Job whose `spec.ttlSecondsAfterFinished` asks it to.
pub fn check_delete_object(writer: &Identity, object: &Object) -> Result<(), Refusal> {
    let manages = writer.role == Role::Controller
        && corral_api::manager_of(&object.metadata) == Some(writer.name.as_str())
        && crate::owner::managers(object.kind).contains(&writer.name.as_str());
    let expires = writer.role == Role::Controller
        && writer.name == crate::owner::JOB
        && object.kind == Kind::Job
        && object
            .spec
            .get("ttlSecondsAfterFinished")
            .is_some_and(|ttl| !ttl.is_null());
    if manages || expires {
        return Ok(());
    }
    check_delete(writer, &object.key())
}

/// Whether `writer` may delete the object at `key`: people only; policies
/// and controllers operators only.
pub fn check_delete(writer: &Identity, key: &ObjectKey) -> Result<(), Refusal> {
    let allowed = match writer.role {
        Role::Operator => true,
        Role::User => !matches!(key.kind, Kind::Policy | Kind::Controller),
        Role::Controller | Role::Node | Role::Joiner => false,
    };
    if allowed {
        Ok(())
    } else {
        Err(Refusal {
            violations: vec![Violation::Delete {
                key: key.clone(),
                writer: Box::new(writer.clone()),
            }],
        })
    }
}
