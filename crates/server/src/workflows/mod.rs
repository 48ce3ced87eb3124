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
//!   history record of the move (the same spec, a new revision). A VM
//!   whose only change is a newer `spec.migration` gets a `migrate`
//!   instance instead of an `update` ([`migration`]). They also refuse a `Controller` whose registered
//!   steps would break a workflow (unknown reference, duplicate, cycle).
//! - [`drive`] is the background loop that ticks each object at its
//!   nearest deadline; [`tick_all`] ticks everything once (tests).
//! - [`act`] executes a step owner's claim / complete / fail / log;
//!   [`retry`] a person's request to run failed steps again (also made by
//!   an unchanged re-apply of an object whose newest instance failed,
//!   [`retry_failed`]).
//!
//! A node that recovered a pod from local state after a reboot reports it,
//! and [`record_recovery`] keeps it as a finished `recover` instance.
//!
//! Deleting a Pod starts its `stop` instance ([`crate::deletion`]); the
//! driver removes the pod when that instance succeeds.
//!
//! This module decides nothing about steps itself: the definitions, state
//! machine and owner rule are `corral_workflow`'s; the module persists what
//! the engine returns, with compare-and-swap on `resourceVersion`.

pub mod definitions;
mod driver;
mod migration;
mod recover;
mod retry;
pub mod rollback;
mod steps;

use std::sync::Arc;

use corral_api::kinds::ControllerSpec;
use corral_api::workflow::{
    KEPT_INSTANCES, StepLogEntry, StoredInstance, StoredWorkflows, WorkflowInstance,
    WorkflowOutcome, WorkflowStatus,
};
use corral_api::{FieldError, Kind, Object};
use corral_store::{ChangeMeta, StoreError, WatchEvent};
use corral_workflow::RegisteredController;
use serde_json::{Map, Value};

pub use driver::{drive, tick_all};
pub use recover::record_recovery;
pub use retry::{retry, retry_failed};
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
    let created = server.store.create_logged(object, change, &logs).await?;
    Ok(created)
}

/// Replaces `current` by `next` if its `resourceVersion` is still
/// `expected`. When the spec changes (a new revision), `next` gets an
/// `update` instance in the same write (a `start` one while a pod or VM is
/// bound to no node); a running instance is cancelled.
pub async fn update(
    server: &Server,
    current: &Object,
    next: Object,
    expected: u64,
    change: &ChangeMeta,
) -> Result<Object, WriteError> {
    update_event(server, current, next, expected, change)
        .await
        .map(corral_store::written_object)
}

/// [`update`], answering with the store's event of the write: the object
/// and the JSON the store wrote ([`corral_store::Store::update_logged_event`]).
pub async fn update_event(
    server: &Server,
    current: &Object,
    mut next: Object,
    expected: u64,
    change: &ChangeMeta,
) -> Result<Arc<WatchEvent>, WriteError> {
    admit_controller(server, &next).await?;
    // Only the deletion itself marks an object as being deleted.
    next.metadata.deleting = current.metadata.deleting.clone();
    if let Some(deletion) = &current.metadata.deleting
        && next.spec != current.spec
    {
        return Err(WriteError::Refused(ApiError::Conflict(format!(
            "{} is being deleted (by {} since {}; its {} workflow runs): its spec no longer changes; wait until it is gone (corral delete {} --wait), then create it again",
            current.key(),
            deletion.by,
            deletion.since.format("%Y-%m-%d %H:%M:%S UTC"),
            deletion.workflow,
            current.key()
        ))));
    }
    let unbound = next.kind == Kind::Pod
        && current.metadata.deleting.is_none()
        && bound_node(current).is_some()
        && bound_node(&next).is_none();
    let mut change = change.clone();
    if next.kind == Kind::Node && fence_reported(current, &next) {
        // A node back from a self-fence reports what it did: a revision of
        // its history, with its summary as the message.
        change.always_record = true;
    }
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
    } else if migration::asked(current, &next) {
        // `corral vm migrate`: the running guest moves to another node.
        let revision = current.metadata.revision + 1;
        begin(server, &mut next, "migrate", revision).await?
    } else if unplaced(current, &next) {
        // Not on a node yet (pending placement, or moving off one): an
        // update's node steps would have no node to run them, so the new
        // revision is placed and started from the beginning — a pending
        // pod whose request is fixed and applied again is placed again.
        let revision = current.metadata.revision + 1;
        begin(server, &mut next, "start", revision).await?
    } else {
        let revision = current.metadata.revision + 1;
        begin(server, &mut next, "update", revision).await?
    };
    let updated = server
        .store
        .update_logged_event(next, expected, &change, &logs)
        .await?;
    Ok(updated)
}

/// Whether a pod or VM is bound to no node before and after a write: a
/// new revision of it starts with `scheduler/place`, not with node steps.
fn unplaced(current: &Object, next: &Object) -> bool {
    matches!(current.kind, Kind::Pod | Kind::VirtualMachine)
        && bound_node(current).is_none()
        && bound_node(next).is_none()
}

/// Whether `next` carries a self-fence report (`status.lastFence`) that
/// `current` does not.
fn fence_reported(current: &Object, next: &Object) -> bool {
    let reported = next.status.get("lastFence");
    reported.is_some_and(|fence| !fence.is_null()) && reported != current.status.get("lastFence")
}

/// Adds a new instance of `workflow` serving `revision` to `object`'s
/// status, if its kind has that workflow; a running older one is
/// cancelled, and leaves status if none of its steps was ever claimed
/// (design 0062). Returns the log entries to store once the object is
/// written.
///
/// Only the running instances are decoded and encoded again: the finished
/// ones (most of the kept ones) stay the JSON they are, as no write changes
/// a finished instance.
pub(crate) async fn begin(
    server: &Server,
    object: &mut Object,
    workflow: &str,
    revision: u64,
) -> Result<Vec<StepLogEntry>, StoreError> {
    let Some((name, definition)) = definitions::current(server, object.kind, workflow).await?
    else {
        return Ok(Vec::new());
    };
    let now = server.clock.now();
    let uid = object.metadata.uid.clone();
    let (mut kept, running) = match StoredWorkflows::running_of(&object.status) {
        Ok(running) => (take_instances(object), running),
        Err(error) => {
            tracing::warn!(object = %object.key(), %error, "unreadable status.workflow replaced");
            (Vec::new(), Vec::new())
        }
    };
    let id = format!("{workflow}-{revision}");
    let (instance, created) = server
        .definitions
        .fresh(&name, &definition)
        .instance(&id, &uid, revision, now);
    let mut logs = Vec::new();
    let reason = format!("superseded by {id}");
    // Superseded before any of its steps was claimed, an instance did
    // nothing: it leaves status (its step log keeps its lines, the last
    // one saying what superseded it), so quick changes in a row do not push
    // the instances that did something out of the kept few.
    let mut idle = Vec::new();
    for (index, mut older) in running {
        if older.never_began() {
            // Nothing of it happened: the line cancelling it is written
            // from its stored form, without hydrating it.
            match definitions::named(server, &older.definition).await {
                Ok(its) => logs.extend(corral_workflow::cancel_never_began(
                    &its, &older, &uid, now, &reason,
                )),
                Err(error) => tracing::warn!(object = %object.key(), instance = %older.id,
                    %error, "cancelled without its definition"),
            }
            idle.push(index);
            continue;
        }
        match hydrate(server, &older, &uid).await {
            Ok(mut full) => {
                logs.extend(corral_workflow::cancel(&mut full, now, &reason));
                older = corral_workflow::dehydrate(&full, &older.definition);
            }
            Err(error) => {
                tracing::warn!(object = %object.key(), instance = %older.id, %error,
                    "cancelled without its definition");
                older.outcome = WorkflowOutcome::Cancelled;
                older.finished_at = Some(now);
                older.steps.clear();
            }
        }
        kept[index] = encode(&older);
    }
    // `running` lists instances oldest first: removed newest first, each
    // index still names its instance.
    for index in idle.into_iter().rev() {
        kept.remove(index);
    }
    kept.push(encode(&instance));
    let excess = kept.len().saturating_sub(KEPT_INSTANCES);
    kept.drain(..excess);
    logs.extend(created);
    put_instances(object, kept);
    Ok(logs)
}

/// A stored instance of the object with uid `uid`, joined with its
/// definition (its steps past waiting as stored, the rest derived; a
/// finished instance's steps are not replayed here).
pub(crate) async fn hydrate(
    server: &Server,
    stored: &StoredInstance,
    uid: &str,
) -> Result<WorkflowInstance, StoreError> {
    let definition = definitions::named(server, &stored.definition).await?;
    Ok(corral_workflow::hydrate(&definition, stored, uid, &[]))
}

/// Every kept instance of `object` as `why` shows them: joined with their
/// definitions, and those that finished without keeping their steps
/// replayed from the object's step log.
pub async fn instances(server: &Server, object: &Object) -> Result<WorkflowStatus, ApiError> {
    let key = object.key();
    let stored = stored_status(object).map_err(|error| {
        ApiError::Internal(format!("{key}: status.workflow is unreadable: {error}"))
    })?;
    let replays = stored.instances.iter().any(|i| i.steps.is_empty());
    let logs = if replays {
        let filter = corral_store::StepLogFilter::default();
        server
            .store
            .step_logs(&object.metadata.uid, &filter)
            .await?
    } else {
        Vec::new()
    };
    let mut instances = Vec::with_capacity(stored.instances.len());
    for instance in &stored.instances {
        let definition = definitions::named(server, &instance.definition).await?;
        instances.push(corral_workflow::hydrate(
            &definition,
            instance,
            &object.metadata.uid,
            &logs,
        ));
    }
    Ok(WorkflowStatus { instances })
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
    let others = definitions::registered_controllers(server, Some(&key.name)).await?;
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

/// The object's `status.workflow` as stored; empty when it has none.
pub(crate) fn stored_status(object: &Object) -> Result<StoredWorkflows, serde_json::Error> {
    StoredWorkflows::of(&object.status)
}

/// Sets the object's `status.workflow`, keeping the rest of its status.
pub(crate) fn put_stored(object: &mut Object, stored: &StoredWorkflows) {
    put_instances(object, stored.instances.iter().map(encode).collect());
}

/// Takes the kept instances out of the object's `status.workflow`, as
/// stored JSON (none when it has no list of them).
fn take_instances(object: &mut Object) -> Vec<Value> {
    match object
        .status
        .pointer_mut("/workflow/instances")
        .map(Value::take)
    {
        Some(Value::Array(instances)) => instances,
        _ => Vec::new(),
    }
}

/// Sets the object's `status.workflow` to these instances (stored JSON),
/// keeping the rest of its status.
fn put_instances(object: &mut Object, instances: Vec<Value>) {
    if !object.status.is_object() {
        object.status = Value::Object(Map::new());
    }
    let mut workflow = Map::new();
    if !instances.is_empty() {
        workflow.insert("instances".to_string(), Value::Array(instances));
    }
    object.status["workflow"] = Value::Object(workflow);
}

/// One stored instance as JSON.
fn encode(instance: &StoredInstance) -> Value {
    // INVARIANT: a StoredInstance is plain data with string keys, which
    // always serializes.
    serde_json::to_value(instance).expect("a stored workflow instance serializes")
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
