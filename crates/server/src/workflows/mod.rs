//! Workflow instances in the server: every operation on an object with a
//! lifecycle creates an instance kept in the object's `status.workflow`,
//! the driver brings running instances up to the clock, and step owners move
//! their steps through the step API.
//!
//! - [`create`] and [`update`] wrap the store's writes of the object
//!   handlers: a new Pod or VirtualMachine gets a `start` instance, a new
//!   Node a `join` instance, a spec change (a new revision) an `update`
//!   instance — written in the same store write as the object, so the object
//!   is never without it. A pod the scheduler unbinds (`status.node`
//!   cleared: its node went silent or was lost) gets a `move` instance and a
//!   history record of the move (the same spec, a new revision). They also refuse a `Controller` whose registered
//!   steps would break a workflow (unknown reference, duplicate, cycle).
//! - [`drive`] is the background loop that ticks each object at its
//!   nearest deadline; [`tick_all`] ticks everything once (tests).
//! - [`act`] executes a step owner's claim / complete / fail / log.
//!
//! Deletion is still immediate: the `stop` workflow needs the node agent to
//! stop containers and release resources, so it is instantiated when the
//! agent lands (deletion then becomes "run stop, remove at `deleted`").
//!
//! This module decides nothing about steps itself: the definitions, state
//! machine and owner rule are `corral_workflow`'s; the module persists what
//! the engine returns, with compare-and-swap on `resourceVersion`.

mod driver;
pub mod rollback;
mod steps;

use corral_api::kinds::ControllerSpec;
use corral_api::workflow::{KEPT_INSTANCES, StepLogEntry, WorkflowStatus};
use corral_api::{FieldError, Kind, Object};
use corral_store::{ChangeMeta, StoreError};
use corral_workflow::{RegisteredController, WorkflowDefinition};
use serde_json::{Map, Value};

pub use driver::{drive, tick_all};
pub use steps::{StepAction, act, act_batch, step_logs};

use crate::Server;
use crate::error::ApiError;

/// A write through [`create`] or [`update`] that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The store refused it (conflict, exists, …); callers may retry.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Admission refused it (a `Controller` whose steps break a workflow).
    #[error(transparent)]
    Refused(ApiError),
}

impl From<WriteError> for ApiError {
    fn from(error: WriteError) -> Self {
        match error {
            WriteError::Store(error) => error.into(),
            WriteError::Refused(error) => error,
        }
    }
}

/// Creates `object` (metadata already set by the handler) with the first
/// instance of its kind's lifecycle: `join` for a Node, `start` otherwise.
pub async fn create(
    server: &Server,
    mut object: Object,
    change: &ChangeMeta,
) -> Result<Object, WriteError> {
    admit_controller(server, &object).await?;
    let workflow = if object.kind == Kind::Node {
        "join"
    } else {
        "start"
    };
    let logs = begin(server, &mut object, workflow, 1).await?;
    let created = server.store.create(object, change).await?;
    store_logs(server, &logs).await;
    Ok(created)
}

/// Replaces `current` by `next` if its `resourceVersion` is still
/// `expected`. When the spec changes (a new revision), `next` gets an
/// `update` instance in the same write; a running instance is cancelled.
pub async fn update(
    server: &Server,
    current: &Object,
    mut next: Object,
    expected: u64,
    change: &ChangeMeta,
) -> Result<Object, WriteError> {
    admit_controller(server, &next).await?;
    let unbound =
        next.kind == Kind::Pod && bound_node(current).is_some() && bound_node(&next).is_none();
    let mut change = change.clone();
    let logs = if next.spec == current.spec && unbound {
        // The scheduler unbound it from a silent or lost node: place and
        // start it again elsewhere. History records the move as a revision
        // of the unchanged spec, by whoever unbound it.
        change.always_record = true;
        if change.message.is_empty() {
            let node = bound_node(current).unwrap_or_default();
            change.message = format!("moved off {node}");
        }
        begin(server, &mut next, "move", current.metadata.revision + 1).await?
    } else if next.spec == current.spec {
        Vec::new()
    } else {
        let revision = current.metadata.revision + 1;
        begin(server, &mut next, "update", revision).await?
    };
    let updated = server.store.update(next, expected, &change).await?;
    store_logs(server, &logs).await;
    Ok(updated)
}

/// Adds a new instance of `workflow` serving `revision` to `object`'s
/// status, if its kind has that workflow. Returns the log entries to store
/// once the object is written.
async fn begin(
    server: &Server,
    object: &mut Object,
    workflow: &str,
    revision: u64,
) -> Result<Vec<StepLogEntry>, StoreError> {
    let Some(definition) = definition(server, object.kind, workflow).await? else {
        return Ok(Vec::new());
    };
    let now = server.clock.now();
    let mut status = read_status(object).unwrap_or_else(|error| {
        tracing::warn!(object = %object.key(), %error, "unreadable status.workflow replaced");
        WorkflowStatus::default()
    });
    let id = format!("{workflow}-{revision}");
    let (instance, created) =
        corral_workflow::instantiate(&definition, &id, &object.metadata.uid, revision, now);
    let mut logs = corral_workflow::record(&mut status, instance, KEPT_INSTANCES, now);
    logs.extend(created);
    write_status(object, &status);
    Ok(logs)
}

/// The definition new instances of `kind`'s `workflow` snapshot: the
/// built-in steps and those of every `Controller` in the store. A
/// controller whose steps do not fit (it slipped past admission, or two
/// were registered at once) is left out with a warning, never the object.
async fn definition(
    server: &Server,
    kind: Kind,
    workflow: &str,
) -> Result<Option<WorkflowDefinition>, StoreError> {
    if corral_workflow::builtin(kind, workflow).is_none() {
        return Ok(None);
    }
    let controllers = registered_controllers(server, None).await?;
    let mut accepted: Vec<RegisteredController<'_>> = Vec::new();
    for (name, spec) in &controllers {
        accepted.push(RegisteredController { name, spec });
        if let Err(error) = corral_workflow::definition_for(kind, workflow, &accepted) {
            accepted.pop();
            tracing::warn!(controller = %name, %kind, workflow, %error,
                "registered steps left out of new workflow instances");
        }
    }
    Ok(corral_workflow::definition_for(kind, workflow, &accepted)
        .ok()
        .flatten())
}

/// Every registered controller's name and spec except `except`, by name.
async fn registered_controllers(
    server: &Server,
    except: Option<&str>,
) -> Result<Vec<(String, ControllerSpec)>, StoreError> {
    let listed = server.store.list(Kind::Controller, None).await?;
    Ok(listed
        .objects
        .into_iter()
        .filter(|object| Some(object.metadata.name.as_str()) != except)
        .filter_map(|object| match object.typed_spec::<ControllerSpec>() {
            Ok(spec) => Some((object.metadata.name, spec)),
            Err(error) => {
                tracing::warn!(controller = %object.metadata.name, %error, "unreadable controller spec ignored");
                None
            }
        })
        .collect())
}

/// Refuses a `Controller` whose steps land in no workflow or break one
/// together with the controllers already registered.
async fn admit_controller(server: &Server, object: &Object) -> Result<(), WriteError> {
    if object.kind != Kind::Controller {
        return Ok(());
    }
    let key = object.key();
    let spec: ControllerSpec = object.typed_spec().map_err(|error| {
        WriteError::Refused(ApiError::invalid(
            &key.to_string(),
            vec![FieldError::new("spec", error.to_string())],
        ))
    })?;
    let others = registered_controllers(server, Some(&key.name)).await?;
    let others: Vec<RegisteredController<'_>> = others
        .iter()
        .map(|(name, spec)| RegisteredController { name, spec })
        .collect();
    let candidate = RegisteredController {
        name: &key.name,
        spec: &spec,
    };
    corral_workflow::check_controller(candidate, &others).map_err(|error| {
        WriteError::Refused(ApiError::invalid(
            &key.to_string(),
            vec![FieldError::new("spec.steps", error.to_string())],
        ))
    })
}

/// The object's `status.workflow`; empty when it has none.
pub(crate) fn read_status(object: &Object) -> Result<WorkflowStatus, serde_json::Error> {
    match object.status.get("workflow") {
        None | Some(Value::Null) => Ok(WorkflowStatus::default()),
        Some(value) => serde_json::from_value(value.clone()),
    }
}

/// Sets the object's `status.workflow`, keeping the rest of its status.
pub(crate) fn write_status(object: &mut Object, status: &WorkflowStatus) {
    if !object.status.is_object() {
        object.status = Value::Object(Map::new());
    }
    // INVARIANT: WorkflowStatus is plain data with string keys, which
    // always serializes.
    let value = serde_json::to_value(status).expect("workflow status serializes");
    object.status["workflow"] = value;
}

/// The node whose agent owns the object's `node` steps: a Node itself, or
/// the node a Pod or VirtualMachine is bound to (`status.node`).
pub(crate) fn bound_node(object: &Object) -> Option<String> {
    match object.kind {
        Kind::Node => Some(object.metadata.name.clone()),
        _ => object
            .status
            .get("node")
            .and_then(Value::as_str)
            .map(str::to_string),
    }
}

/// Stores log entries of a write that already happened. A failure cannot
/// undo the write, so it is reported in the server log.
async fn store_logs(server: &Server, logs: &[StepLogEntry]) {
    if let Err(error) = server.store.append_step_logs(logs).await {
        tracing::error!(%error, entries = logs.len(), "workflow step log entries were lost");
    }
}
