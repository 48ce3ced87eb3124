//! Deletion as a workflow. Deleting a Pod (or a VirtualMachine: the same,
//! with QEMU's clean stop, its files and its network) that a node took
//! does not remove it: the server marks it (`metadata.deleting`: who, when, why) and starts
//! its `stop` workflow in the same write — the node stops its containers
//! (preStop hooks, grace period), releases its volumes through their
//! plugins and removes its sandbox, IPAM takes the address back, the
//! scheduler frees its room, and every step a `Controller` registered into
//! `stop` (a finalizer) runs too. When the instance succeeds the object is
//! removed, recorded in history as the deleter's change. `why` follows the
//! stop instance like any other, so a stuck deletion names its step.
//!
//! A pod no node took (unscheduled), or whose node is gone (Lost,
//! forgotten, or no Node object any more), has nothing to stop: it is
//! removed at once, and so is one being deleted when its node is lost or
//! forgotten later ([`release_lost_node`]: its node steps would never be
//! claimed; the node fences the pod's processes when it returns).
//! People may skip named steps (`--skip`) or all that are left
//! (`--force`); each skipped step is done with "skipped by NAME" in the
//! step log, and the removal's history message names them.
//!
//! A Node's deletion is a drain: the scheduler places nothing more there
//! and moves its pods away (`scheduler/drain`, held by pods pinned there
//! and VMs until people move or delete them), then it is removed and its
//! agent, seeing that, stops heartbeating. A Lost or forgotten node is
//! removed at once, and so is one that becomes Lost while it drains.
//!
//! Kinds without a stop workflow (everything but Pod, VirtualMachine and
//! Node) are removed at once; objects with dependents delete them through
//! their own workflows ([`crate::cascade`]).

use corral_api::kinds::{NodePhase, NodeSpec, NodeStatus};
use corral_api::workflow::WorkflowOutcome;
use corral_api::{Deletion, Kind, Object, ObjectKey};
use corral_store::{ChangeMeta, StoreError};

use crate::Server;
use crate::error::ApiError;
use crate::workflows::{self, bound_node, hydrate, put_stored, stored_status};

/// How many times a deletion write is retried when the object changed
/// between its read and its write.
const ATTEMPTS: usize = 8;

/// What a person asked for besides the deletion itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Delete only at this `resourceVersion` (409 otherwise).
    pub expected: Option<u64>,
    /// Skip every step not done yet and remove the object now.
    pub force: bool,
    /// Skip these steps of the stop workflow; the others still run.
    pub skip: Vec<String>,
}

/// What a deletion came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The object is gone (this is its last state).
    Removed(Object),
    /// Its stop workflow runs; it is removed when that finishes.
    Stopping(Object),
}

impl Outcome {
    pub fn object(&self) -> &Object {
        match self {
            Outcome::Removed(object) | Outcome::Stopping(object) => object,
        }
    }
}

/// Whether objects of `kind` stop through their `stop` workflow.
pub fn stops_through_workflow(kind: Kind) -> bool {
    matches!(kind, Kind::Pod | Kind::VirtualMachine | Kind::Node)
}

/// Deletes the object at `key` (already authorised) as `request` says,
/// authored by `change`.
pub async fn delete(
    server: &Server,
    key: &ObjectKey,
    request: &Request,
    change: &ChangeMeta,
) -> Result<Outcome, ApiError> {
    if !stops_through_workflow(key.kind) {
        check_skips(key, request)?;
        let removed = server.store.delete(key, request.expected, change).await?;
        return Ok(Outcome::Removed(removed));
    }
    for _ in 0..ATTEMPTS {
        let current = server
            .store
            .get(key)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))?;
        if let Some(expected) = request.expected
            && current.metadata.deleting.is_none()
            && expected != current.metadata.resource_version
        {
            return Err(StoreError::Conflict {
                key: key.clone(),
                expected,
                actual: current.metadata.resource_version,
            }
            .into());
        }
        if current.metadata.deleting.is_none()
            && let Some(reason) = nothing_to_stop(server, &current).await?
        {
            tracing::info!(object = %key, %reason, "removed without a stop workflow");
            let expected = current.metadata.resource_version;
            match server.store.delete(key, Some(expected), change).await {
                Ok(removed) => return Ok(Outcome::Removed(removed)),
                Err(StoreError::Conflict { .. }) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        let (next, logs) = mark(server, current.clone(), request, change).await?;
        if next == current {
            return Ok(finish(server, next).await?);
        }
        let expected = current.metadata.resource_version;
        let status_change = ChangeMeta {
            message: String::new(),
            always_record: false,
            ..change.clone()
        };
        match server
            .store
            .update_logged(next, expected, &status_change, &logs)
            .await
        {
            Ok(written) => return Ok(finish(server, written).await?),
            Err(StoreError::Conflict { .. }) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(ApiError::Conflict(format!(
        "{key} kept changing under this deletion; try again"
    )))
}

/// Refuses steps to skip for a kind that has no stop workflow.
pub fn check_skips(key: &ObjectKey, request: &Request) -> Result<(), ApiError> {
    match request.skip.first() {
        Some(step) if !stops_through_workflow(key.kind) => Err(ApiError::BadRequest(format!(
            "skip: {key} has no stop workflow (it is removed at once), so there is no step {step} to skip"
        ))),
        _ => Ok(()),
    }
}

/// Why `object` has nothing a stop workflow could stop, if so: no node
/// took it, or its node is gone.
async fn nothing_to_stop(server: &Server, object: &Object) -> Result<Option<String>, StoreError> {
    let Some(node) = bound_node(object) else {
        return Ok(Some("no node took it".into()));
    };
    let node_key = ObjectKey::new(Kind::Node, None, &node);
    Ok(match server.store.get(&node_key).await? {
        None => Some(format!("its node {node} is gone")),
        Some(stored) => {
            let status: NodeStatus = stored.typed_status().unwrap_or_default();
            let forgotten = stored
                .typed_spec::<NodeSpec>()
                .is_ok_and(|spec| spec.forgotten);
            (forgotten || status.phase == NodePhase::Lost)
                .then(|| format!("its node {node} is lost or forgotten"))
        }
    })
}

/// `object` marked as being deleted (its stop instance begun, if it was
/// not yet) with the steps `request` skips skipped; and the log entries.
async fn mark(
    server: &Server,
    mut object: Object,
    request: &Request,
    change: &ChangeMeta,
) -> Result<(Object, Vec<corral_api::workflow::StepLogEntry>), ApiError> {
    let mut logs = Vec::new();
    if object.metadata.deleting.is_none() {
        let revision = object.metadata.revision;
        logs.extend(workflows::begin(server, &mut object, "stop", revision).await?);
        object.metadata.deleting = Some(Deletion {
            since: server.clock.now(),
            by: change.author.clone(),
            class: change.class,
            message: change.message.clone(),
            workflow: format!("stop-{revision}"),
            skipped: Vec::new(),
        });
    }
    if !request.force && request.skip.is_empty() {
        return Ok((object, logs));
    }
    let key = object.key();
    // INVARIANT: set just above when it was missing.
    let mut deletion = object.metadata.deleting.clone().expect("being deleted");
    let mut stored = stored_status(&object).map_err(|error| {
        ApiError::Internal(format!("{key}: status.workflow is unreadable: {error}"))
    })?;
    let Some(index) = stored
        .instances
        .iter()
        .position(|instance| instance.id == deletion.workflow)
    else {
        return Err(ApiError::Conflict(format!(
            "{key}: its stop workflow {} is no longer kept",
            deletion.workflow
        )));
    };
    let mut instance = hydrate(server, &stored.instances[index], &object.metadata.uid).await?;
    if instance.outcome != WorkflowOutcome::Running {
        return Ok((object, logs));
    }
    let skipping = if request.force {
        corral_workflow::unfinished_steps(&instance)
    } else {
        request.skip.clone()
    };
    let now = server.clock.now();
    for step in &skipping {
        let skipped = corral_workflow::skip(&mut instance, step, &change.author, now)
            .map_err(skip_refused)?;
        if !skipped.is_empty() {
            deletion
                .skipped
                .push(format!("{step} (by {})", change.author));
        }
        logs.extend(skipped);
    }
    stored.instances[index] =
        corral_workflow::dehydrate(&instance, &stored.instances[index].definition);
    put_stored(&mut object, &stored);
    object.metadata.deleting = Some(deletion);
    Ok((object, logs))
}

/// The status a refused skip maps to.
fn skip_refused(error: corral_workflow::TransitionError) -> ApiError {
    use corral_workflow::TransitionError;
    let message = format!("skip: {error}");
    match error {
        TransitionError::UnknownStep { .. } => ApiError::NotFound(message),
        TransitionError::Target { .. } => ApiError::BadRequest(message),
        _ => ApiError::Conflict(message),
    }
}

/// Removes `object` if it is being deleted and its stop workflow
/// succeeded; otherwise returns it as it is. The removal is the deleter's
/// change in history. Safe to call more than once.
pub async fn finish(server: &Server, mut object: Object) -> Result<Outcome, StoreError> {
    let key = object.key();
    for _ in 0..ATTEMPTS {
        let Some(deletion) = object.metadata.deleting.clone() else {
            return Ok(Outcome::Stopping(object));
        };
        let finished = stored_status(&object).ok().is_some_and(|status| {
            status.instances.iter().any(|instance| {
                instance.id == deletion.workflow && instance.outcome == WorkflowOutcome::Succeeded
            })
        });
        if !finished {
            return Ok(Outcome::Stopping(object));
        }
        let change = removal(&deletion, server.clock.now());
        let expected = object.metadata.resource_version;
        match server.store.delete(&key, Some(expected), &change).await {
            Ok(removed) => {
                tracing::info!(object = %key, by = %deletion.by, "stop workflow finished; removed");
                return Ok(Outcome::Removed(removed));
            }
            Err(StoreError::NotFound { .. }) => return Ok(Outcome::Removed(object)),
            Err(StoreError::Conflict { .. }) => match server.store.get(&key).await? {
                Some(fresh) => object = fresh,
                None => return Ok(Outcome::Removed(object)),
            },
            Err(error) => return Err(error),
        }
    }
    Ok(Outcome::Stopping(object))
}

/// Removes what is being deleted on `node`, now Lost or forgotten —
/// its pods and VMs, and the Node itself if it is being deleted: nothing
/// is left to stop them. Each removal is the deleter's change, its message
/// saying why the rest of the stop workflow did not run. Returns how many
/// objects were removed.
pub async fn release_lost_node(server: &Server, node: &Object) -> Result<usize, ApiError> {
    let name = node.metadata.name.clone();
    let mut removed = 0;
    for kind in [Kind::Pod, Kind::VirtualMachine] {
        let request = crate::watchcache::ListRequest {
            kind,
            scope: crate::watchcache::Scope {
                node: Some(name.clone()),
                ..Default::default()
            },
            limit: None,
            continue_token: None,
        };
        for cached in server.cache.list(&request).await?.items {
            if let Ok(object) = cached.decode()
                && remove_lost(server, &object, &name).await?
            {
                removed += 1;
            }
        }
    }
    if remove_lost(server, node, &name).await? {
        removed += 1;
    }
    Ok(removed)
}

/// Removes `object` if it is being deleted, since its node `node` is lost;
/// whether it did.
async fn remove_lost(server: &Server, object: &Object, node: &str) -> Result<bool, ApiError> {
    let Some(deletion) = &object.metadata.deleting else {
        return Ok(false);
    };
    let mut change = removal(deletion, server.clock.now());
    let why = format!("its node {node} is lost: nothing left to stop");
    change.message = if change.message.is_empty() {
        why
    } else {
        format!("{} ({why})", change.message)
    };
    let key = object.key();
    match server
        .store
        .delete(&key, Some(object.metadata.resource_version), &change)
        .await
    {
        Ok(_) => {
            tracing::info!(object = %key, %node, "being deleted on a lost node: removed");
            Ok(true)
        }
        // Changed meanwhile: its next change brings it back here.
        Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// The history change of the removal: the deleter's, with the steps
/// people skipped named.
fn removal(deletion: &Deletion, now: chrono::DateTime<chrono::Utc>) -> ChangeMeta {
    let mut message = deletion.message.clone();
    if !deletion.skipped.is_empty() {
        let skipped = format!("skipped {}", deletion.skipped.join(", "));
        message = if message.is_empty() {
            skipped
        } else {
            format!("{message} ({skipped})")
        };
    }
    ChangeMeta {
        author: deletion.by.clone(),
        class: deletion.class,
        message,
        time: now,
        always_record: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::AuthorClass;

    #[test]
    fn the_removal_is_the_deleters_and_names_what_was_skipped() {
        let mut deletion = Deletion {
            since: chrono::DateTime::UNIX_EPOCH,
            by: "alice".into(),
            class: AuthorClass::External,
            message: String::new(),
            workflow: "stop-2".into(),
            skipped: Vec::new(),
        };
        let change = removal(&deletion, chrono::DateTime::UNIX_EPOCH);
        assert_eq!(
            (change.author.as_str(), change.message.as_str()),
            ("alice", "")
        );
        deletion.message = "node retired".into();
        deletion.skipped = vec!["acme/backup (by bob)".into()];
        let change = removal(&deletion, chrono::DateTime::UNIX_EPOCH);
        assert_eq!(
            change.message,
            "node retired (skipped acme/backup (by bob))"
        );
        assert_eq!(change.class, AuthorClass::External);
    }
}
