//! The step API's behaviour: a step owner's claim, complete, fail and log,
//! applied by the engine's transitions (which enforce the owner rule) and
//! persisted with compare-and-swap; and reading an object's step log.

use std::collections::BTreeMap;

use corral_api::workflow::{
    LogLevel, StepActionKind, StepActionRequest, StepLogEntry, StoredWorkflows, WorkflowInstance,
    WorkflowOutcome,
};
use corral_api::{Identity, Object, ObjectKey};
use corral_store::{StepLogFilter, StoreError};
use corral_workflow::TransitionError;
use serde_json::{Map, Value};

use super::{bound_node, hydrate, put_stored, stored_status};
use crate::Server;
use crate::error::ApiError;

/// How many times a transition is retried when the object changed between
/// its read and its write.
const ATTEMPTS: usize = 5;

/// One request of a step owner, checked for the fields its action needs.
#[derive(Debug, Clone, PartialEq)]
pub enum StepAction {
    Claim {
        step: String,
        workflow: Option<String>,
        /// Left alone, not refused, while the step still waits.
        if_ready: bool,
    },
    Complete {
        step: String,
        workflow: Option<String>,
        note: Option<String>,
    },
    Fail {
        step: String,
        workflow: Option<String>,
        error: String,
    },
    Log {
        step: String,
        workflow: Option<String>,
        level: LogLevel,
        message: String,
        fields: BTreeMap<String, Value>,
    },
}

impl TryFrom<StepActionRequest> for StepAction {
    type Error = ApiError;

    fn try_from(request: StepActionRequest) -> Result<Self, ApiError> {
        let action = request.action;
        let unexpected = |field: &str, present: bool| {
            if present {
                Err(ApiError::BadRequest(format!(
                    "{field}: the {} action takes no {field}",
                    action.as_str()
                )))
            } else {
                Ok(())
            }
        };
        let required = |field: &str, value: Option<String>| {
            value.filter(|v| !v.trim().is_empty()).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "{field}: the {} action needs a non-empty {field}",
                    action.as_str()
                ))
            })
        };
        if request.step.is_empty() {
            return Err(ApiError::BadRequest(
                "step: name the step, like acme/slow-mount".into(),
            ));
        }
        let (step, workflow) = (request.step, request.workflow);
        if action != StepActionKind::Log {
            unexpected("message", request.message.is_some())?;
            unexpected("level", request.level.is_some())?;
            unexpected("fields", !request.fields.is_empty())?;
        }
        if action != StepActionKind::Complete {
            unexpected("note", request.note.is_some())?;
        }
        if action != StepActionKind::Fail {
            unexpected("error", request.error.is_some())?;
        }
        if action != StepActionKind::Claim {
            unexpected("ifReady", request.if_ready)?;
        }
        Ok(match action {
            StepActionKind::Claim => StepAction::Claim {
                step,
                workflow,
                if_ready: request.if_ready,
            },
            StepActionKind::Complete => StepAction::Complete {
                step,
                workflow,
                note: request.note,
            },
            StepActionKind::Fail => StepAction::Fail {
                step,
                workflow,
                error: required("error", request.error)?,
            },
            StepActionKind::Log => StepAction::Log {
                step,
                workflow,
                level: request.level.unwrap_or(LogLevel::Info),
                message: required("message", request.message)?,
                fields: request.fields,
            },
        })
    }
}

impl StepAction {
    fn workflow(&self) -> Option<&str> {
        match self {
            StepAction::Claim { workflow, .. }
            | StepAction::Complete { workflow, .. }
            | StepAction::Fail { workflow, .. }
            | StepAction::Log { workflow, .. } => workflow.as_deref(),
        }
    }

    fn step(&self) -> &str {
        match self {
            StepAction::Claim { step, .. }
            | StepAction::Complete { step, .. }
            | StepAction::Fail { step, .. }
            | StepAction::Log { step, .. } => step,
        }
    }
}

/// Applies `action` by `caller` to the object at `key` and returns the
/// instance as stored afterwards. Refusals: 403 when the caller does not
/// own the step (or did not claim it), 409 when the step's state or the
/// instance's outcome does not allow it, 404 for an unknown step or
/// instance.
pub async fn act(
    server: &Server,
    caller: &Identity,
    key: &ObjectKey,
    action: StepAction,
) -> Result<WorkflowInstance, ApiError> {
    act_batch(server, caller, key, vec![action], Map::new()).await
}

/// Applies `actions` in order, and sets the top-level `status` fields
/// given, in one write of the object: all or none. Returns the instance the
/// last action moved, as stored. The status fields are checked against
/// field ownership like any status write.
pub async fn act_batch(
    server: &Server,
    caller: &Identity,
    key: &ObjectKey,
    actions: Vec<StepAction>,
    status: Map<String, Value>,
) -> Result<WorkflowInstance, ApiError> {
    if actions.is_empty() {
        return Err(ApiError::BadRequest(
            "actions: name at least one step action".into(),
        ));
    }
    if status.contains_key("workflow") {
        return Err(ApiError::BadRequest(
            "status.workflow: steps move only through actions".into(),
        ));
    }
    for _ in 0..ATTEMPTS {
        let object = server
            .store
            .get(key)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))?;
        let mut next = object.clone();
        if !status.is_empty() {
            if !next.status.is_object() {
                next.status = Value::Object(Map::new());
            }
            if let Some(fields) = next.status.as_object_mut() {
                for (field, value) in &status {
                    if value.is_null() {
                        fields.remove(field);
                    } else {
                        fields.insert(field.clone(), value.clone());
                    }
                }
            }
            let registry = crate::ownership::registry(server).await?;
            registry
                .check_write(caller, Some(&object), &next)
                .map_err(|refusal| ApiError::Forbidden(refusal.to_string()))?;
        }
        let mut workflows = stored_status(&object).map_err(|error| {
            ApiError::Internal(format!("{key}: status.workflow is unreadable: {error}"))
        })?;
        let bound = bound_node(&next);
        let now = server.clock.now();
        let mut logs = Vec::new();
        let mut lines = Vec::new();
        // The instances the actions touch, joined with their definitions.
        let mut touched: BTreeMap<usize, WorkflowInstance> = BTreeMap::new();
        let mut moved = None;
        let mut changed = !status.is_empty();
        for action in &actions {
            let index = choose(&workflows, key, action.workflow())?;
            if let std::collections::btree_map::Entry::Vacant(slot) = touched.entry(index) {
                let full =
                    hydrate(server, &workflows.instances[index], &object.metadata.uid).await?;
                slot.insert(full);
            }
            // INVARIANT: inserted just above if it was missing.
            let instance = touched.get_mut(&index).expect("a touched instance");
            moved = Some(index);
            let acting = acting_node(instance, action.step(), &next).or_else(|| bound.clone());
            match apply(instance, action, caller, acting.as_deref(), now)? {
                Applied::Moved(entries) => {
                    logs.extend(entries);
                    changed = true;
                }
                Applied::Line(entry) => lines.push(entry),
                Applied::Nothing => {}
            }
        }
        // INVARIANT: `actions` is not empty, so some instance was chosen.
        let moved = moved.expect("an action chose an instance");
        let result = touched[&moved].clone();
        if !changed {
            // Only log lines (or a claim if ready of a waiting step): they
            // change no state, so no object is written.
            if !lines.is_empty() {
                server.store.append_step_logs(&lines).await?;
            }
            return Ok(result);
        }
        for (index, instance) in &touched {
            let definition = workflows.instances[*index].definition.clone();
            workflows.instances[*index] = corral_workflow::dehydrate(instance, &definition);
        }
        let mut change = crate::handlers::change(server, caller, None);
        if let Some(message) = super::migration::moved(&object, &next) {
            // A live migration's rebind: the move is a system revision of
            // the VM's history, like a pod's, and the migration that runs
            // on serves it (its agents act for the newest revision).
            change.always_record = true;
            change.message = message;
            let revision = object.metadata.revision;
            for instance in &mut workflows.instances {
                if instance.revision == revision && instance.outcome == WorkflowOutcome::Running {
                    instance.revision = revision + 1;
                }
            }
        }
        let expected = object.metadata.resource_version;
        put_stored(&mut next, &workflows);
        logs.extend(lines);
        match server
            .store
            .update_logged(next, expected, &change, &logs)
            .await
        {
            Err(StoreError::Conflict { .. }) => continue,
            Err(error) => return Err(error.into()),
            Ok(_) => return Ok(result),
        }
    }
    Err(ApiError::Conflict(format!(
        "{key} kept changing under this step action; try again"
    )))
}

/// The node whose agent acts for `step` when its owner is not the bound
/// node's: `status.migration.from` for a migration's source steps
/// ([`corral_workflow::acting_node_field`]). `None`: the bound node.
fn acting_node(instance: &WorkflowInstance, step: &str, object: &Object) -> Option<String> {
    let owner = &instance.step(step)?.definition.owner;
    let (field, sub) = corral_workflow::acting_node_field(owner)?;
    object
        .status
        .get(field)
        .and_then(|value| value.get(sub))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// What one action did to an instance.
enum Applied {
    /// A transition, with its log entries.
    Moved(Vec<StepLogEntry>),
    /// A log line, which changes no state.
    Line(StepLogEntry),
    /// A claim if ready of a step still waiting: nothing changed.
    Nothing,
}

fn apply(
    instance: &mut WorkflowInstance,
    action: &StepAction,
    caller: &Identity,
    bound: Option<&str>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Applied, ApiError> {
    let moved = match action {
        StepAction::Claim {
            step,
            if_ready: true,
            ..
        } => {
            let (logs, _) = corral_workflow::claim_if_ready(instance, step, caller, bound, now)
                .map_err(refusal)?;
            return Ok(if logs.is_empty() {
                Applied::Nothing
            } else {
                Applied::Moved(logs)
            });
        }
        StepAction::Claim { step, .. } => {
            corral_workflow::claim(instance, step, caller, bound, now)
        }
        StepAction::Complete { step, note, .. } => {
            corral_workflow::complete(instance, step, caller, bound, now, note.clone())
        }
        StepAction::Fail { step, error, .. } => {
            corral_workflow::fail(instance, step, caller, bound, now, error)
        }
        StepAction::Log {
            step,
            level,
            message,
            fields,
            ..
        } => {
            let entry = corral_workflow::append_log(
                instance,
                step,
                caller,
                bound,
                now,
                *level,
                message,
                fields.clone(),
            )
            .map_err(refusal)?;
            return Ok(Applied::Line(entry));
        }
    };
    moved.map(Applied::Moved).map_err(refusal)
}

/// The instance a request is about: the one named, else the newest running
/// one, else the newest.
fn choose(status: &StoredWorkflows, key: &ObjectKey, id: Option<&str>) -> Result<usize, ApiError> {
    if status.instances.is_empty() {
        return Err(ApiError::NotFound(format!(
            "{key} has no workflow instances"
        )));
    }
    if let Some(id) = id {
        return status
            .instances
            .iter()
            .position(|instance| instance.id == id)
            .ok_or_else(|| {
                let kept: Vec<&str> = status.instances.iter().map(|i| i.id.as_str()).collect();
                let kept = kept.join(", ");
                // An instance older than the newest was superseded and left
                // (it never began, or the kept few moved past it): it is
                // finished, as a cancelled one still kept is.
                match status.latest() {
                    Some(newest) if superseded(id, newest.revision) => ApiError::Conflict(format!(
                        "{key}: workflow instance {id} was superseded by {} (kept: {kept})",
                        newest.id
                    )),
                    _ => ApiError::NotFound(format!(
                        "{key} has no workflow instance {id} (kept: {kept})"
                    )),
                }
            });
    }
    let newest = status.instances.len() - 1;
    Ok(status
        .instances
        .iter()
        .rposition(|instance| instance.outcome == WorkflowOutcome::Running)
        .unwrap_or(newest))
}

/// Whether instance `id` (`{workflow}-{revision}`) serves a revision
/// older than `newest`.
fn superseded(id: &str, newest: u64) -> bool {
    id.rsplit_once('-')
        .and_then(|(_, revision)| revision.parse::<u64>().ok())
        .is_some_and(|revision| revision < newest)
}

/// The status a refused transition maps to, with the engine's message.
pub(super) fn refusal(error: TransitionError) -> ApiError {
    let message = error.to_string();
    match error {
        TransitionError::NotOwner { .. } | TransitionError::NotClaimant { .. } => {
            ApiError::Forbidden(message)
        }
        TransitionError::UnknownStep { .. } => ApiError::NotFound(message),
        TransitionError::Finished { .. }
        | TransitionError::NothingToRetry { .. }
        | TransitionError::Target { .. }
        | TransitionError::WrongState { .. } => ApiError::Conflict(message),
    }
}

/// The step log of the object at `key` (or of the last object deleted under
/// that key), filtered, in time order.
pub async fn step_logs(
    server: &Server,
    key: &ObjectKey,
    filter: &StepLogFilter,
) -> Result<Vec<StepLogEntry>, ApiError> {
    let uid = match server.store.get(key).await? {
        Some(object) => object.metadata.uid,
        None => server
            .store
            .recent_history(key, 1)
            .await?
            .last()
            .map(|record| record.uid.clone())
            .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))?,
    };
    Ok(server.store.step_logs(&uid, filter).await?)
}
