//! A person's retry of an object's newest workflow instance
//! (`POST …/{name}/retry`, and an unchanged re-apply of an object whose
//! newest instance failed): the engine's [`corral_workflow::retry`],
//! persisted with compare-and-swap like a step action.

use corral_api::workflow::{WorkflowInstance, WorkflowOutcome};
use corral_api::{Identity, Object, ObjectKey, Role};
use corral_store::StoreError;

use super::{hydrate, put_stored, stored_status};
use crate::Server;
use crate::error::ApiError;

/// How many times a retry is attempted when the object changed between its
/// read and its write.
const ATTEMPTS: usize = 5;

/// Retries what failed in the newest instance of the object at `key`, on
/// behalf of `caller` (a person), and returns that instance as stored.
/// 409 when it has nothing to retry, 403 for controllers and nodes (their
/// steps retry through their own claims).
pub async fn retry(
    server: &Server,
    caller: &Identity,
    key: &ObjectKey,
) -> Result<WorkflowInstance, ApiError> {
    if !matches!(caller.role, Role::Operator | Role::User) {
        return Err(ApiError::Forbidden(format!(
            "{} may not retry {key}: a retry is a person's request (a step's owner claims a failed step again instead)",
            caller.name
        )));
    }
    for _ in 0..ATTEMPTS {
        let object = server
            .store
            .get(key)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))?;
        match retried(server, caller, &object).await? {
            Retried::Nothing(why) => return Err(ApiError::Conflict(format!("{key}: {why}"))),
            Retried::Written(instance) => return Ok(instance),
            Retried::Raced => continue,
        }
    }
    Err(ApiError::Conflict(format!(
        "{key} kept changing under this retry; try again"
    )))
}

/// Retries `current`'s newest instance if it failed (or brings forward the
/// retry of steps waiting out their backoff), for an unchanged re-apply by
/// a person: `Some` with the object as written, `None` when there is
/// nothing to retry (the apply is then simply unchanged).
pub async fn retry_failed(
    server: &Server,
    caller: &Identity,
    current: &Object,
) -> Result<Option<Object>, ApiError> {
    if !matches!(caller.role, Role::Operator | Role::User) {
        return Ok(None);
    }
    let newest = stored_status(current)
        .ok()
        .and_then(|stored| stored.instances.last().map(|i| i.outcome));
    if !matches!(
        newest,
        Some(WorkflowOutcome::Failed | WorkflowOutcome::Running)
    ) {
        return Ok(None);
    }
    match retried(server, caller, current).await? {
        Retried::Written(_) => Ok(server.store.get(&current.key()).await?),
        // Someone else moved it first (another retry, a delete): the apply
        // changed nothing either way.
        Retried::Nothing(_) | Retried::Raced => Ok(None),
    }
}

enum Retried {
    Written(WorkflowInstance),
    Nothing(String),
    Raced,
}

/// One compare-and-swap attempt at retrying `object`'s newest instance.
async fn retried(server: &Server, caller: &Identity, object: &Object) -> Result<Retried, ApiError> {
    let key = object.key();
    let mut workflows = stored_status(object).map_err(|error| {
        ApiError::Internal(format!("{key}: status.workflow is unreadable: {error}"))
    })?;
    let Some(stored) = workflows.instances.last_mut() else {
        return Ok(Retried::Nothing(format!(
            "{key} has no workflow instances to retry"
        )));
    };
    let mut instance = hydrate(server, stored, &object.metadata.uid).await?;
    let logs = match corral_workflow::retry(&mut instance, &caller.name, server.clock.now()) {
        Ok(logs) => logs,
        Err(error) => return Ok(Retried::Nothing(error.to_string())),
    };
    *stored = corral_workflow::dehydrate(&instance, &stored.definition);
    let mut next = object.clone();
    put_stored(&mut next, &workflows);
    let change = crate::handlers::change(server, caller, None);
    match server
        .store
        .update_logged(next, object.metadata.resource_version, &change, &logs)
        .await
    {
        Ok(_) => Ok(Retried::Written(instance)),
        Err(StoreError::Conflict { .. }) => Ok(Retried::Raced),
        Err(error) => Err(error.into()),
    }
}
