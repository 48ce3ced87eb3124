//! Create, read, apply, status writes and deletion of objects.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use bytes::Bytes;
use corral_api::Object;
use corral_store::StoreError;
use serde_json::Value;

use super::{Target, change, parse_object};
use crate::SharedServer;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::ownership::{self, Answer};
use crate::query::Params;
use crate::watchcache::Shared;
use crate::workflows::WriteError;

/// How many times an unconditional apply (or a rollback) retries when a
/// concurrent writer got in between its read and its write (one more for
/// an apply whose first read, from the watch cache, was behind the store).
pub(super) const APPLY_ATTEMPTS: usize = 6;

pub async fn get_one(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Json<Object>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    let view = ownership::reader(&server, &caller).await?;
    server
        .store
        .get(&key)
        .await?
        .map(|object| Json(view.serve(object)))
        .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))
}

/// `POST`: creates; refuses when the object exists.
pub async fn create(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Json<Object>, ApiError> {
    let target = Target::from_params(&params)?;
    let params = Params::parse(query.as_deref());
    let mut object = parse_object(&target, &body)?;
    crate::secrets::seal_incoming(&server, &mut object).await?;
    let change = change(&server, &caller, params.get("message"));
    let created = ownership::create(&server, &caller, fresh(&server, object), &change).await?;
    Ok(Json(created))
}

/// Readies a new object for the store: server-set metadata, no status.
pub(crate) fn fresh(server: &crate::Server, mut object: Object) -> Object {
    let key = object.key();
    object.metadata.namespace = (!key.namespace.is_empty()).then_some(key.namespace);
    object.metadata.uid = server.ids.uid();
    object.metadata.created_at = Some(server.clock.now());
    object.metadata.revision = 0;
    object.metadata.resource_version = 0;
    object.metadata.deleting = None;
    object.status = Value::Null;
    object
}

/// `PUT`: apply. Creates the object if it does not exist; otherwise replaces
/// its spec, labels and annotations and keeps its status. When the body
/// carries `metadata.resourceVersion`, the write happens only at that
/// version (409 otherwise); without it, the latest version is replaced.
/// Applying an unchanged object whose newest workflow failed retries that
/// workflow's failed steps (people only).
pub async fn apply(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Answer, ApiError> {
    let target = Target::from_params(&params)?;
    let params = Params::parse(query.as_deref());
    let mut desired = parse_object(&target, &body)?;
    crate::secrets::seal_incoming(&server, &mut desired).await?;
    let key = desired.key();
    let change = change(&server, &caller, params.get("message"));
    let pinned_version = desired.metadata.resource_version;

    for attempt in 0..APPLY_ATTEMPTS {
        // The first attempt takes the current object from the watch cache
        // when it can. Only an update conditional on exactly that version
        // rests on it: the store refuses the write if the object moved on
        // (and the next attempt reads the store); every other outcome
        // (a refusal, nothing to change) is decided on the store's copy.
        let cached = (attempt == 0).then(|| server.cache.current(&key)).flatten();
        let from_cache = cached.is_some();
        let current = match cached {
            Some(object) => Some(object),
            None => server
                .store
                .get(&key)
                .await?
                .map(|object| Shared::Decoded(Box::new(object))),
        };
        let Some(current) = current else {
            if pinned_version != 0 {
                return Err(ApiError::NotFound(format!(
                    "{key} not found (the body asks for resourceVersion {pinned_version})"
                )));
            }
            match ownership::create(&server, &caller, fresh(&server, desired.clone()), &change)
                .await
            {
                Err(WriteError::Store(StoreError::AlreadyExists { .. })) => continue,
                other => return Ok(Answer::served(other?)),
            }
        };
        if from_cache && pinned_version != 0 && pinned_version != current.metadata.resource_version
        {
            continue;
        }
        if !desired.metadata.uid.is_empty() && desired.metadata.uid != current.metadata.uid {
            if from_cache {
                continue;
            }
            return Err(ApiError::Conflict(format!(
                "{key} has uid {} but the body names uid {}: the object was deleted and created again",
                current.metadata.uid, desired.metadata.uid
            )));
        }
        // The stored spec is replaced: not copied.
        let mut next = Object {
            kind: current.kind,
            metadata: current.metadata.clone(),
            spec: desired.spec.clone(),
            status: current.status.clone(),
        };
        next.metadata.labels = desired.metadata.labels.clone();
        next.metadata.annotations = desired.metadata.annotations.clone();
        // An apply naming no owner keeps the stored one: only the server
        // clears an owner (when it orphans the object).
        if desired.metadata.owner.is_some() {
            next.metadata.owner = desired.metadata.owner.clone();
        }
        let expected = if pinned_version != 0 {
            pinned_version
        } else {
            current.metadata.resource_version
        };
        if next == *current && expected == current.metadata.resource_version {
            if from_cache {
                continue;
            }
            // Applying it again asks again: a failed start (an image that
            // was missing, say) runs its failed steps once more.
            let retried = crate::workflows::retry_failed(&server, &caller, &current).await?;
            return Ok(Answer::served(
                retried.unwrap_or_else(|| current.into_object()),
            ));
        }
        match ownership::update_answer(&server, &caller, &current, next, expected, &change).await {
            // Someone wrote in between: read it and apply again.
            Err(WriteError::Store(StoreError::Conflict { .. })) if pinned_version == 0 => continue,
            // A refusal is decided on the store's copy.
            Err(_) if from_cache => continue,
            other => {
                let updated = other?;
                prune_secret(&server, &key, true).await;
                if newly_forgotten(&current, updated.object()) {
                    // The machine is declared gone: its tokens go with it.
                    super::tokens::revoke_node(&server, &key.name).await?;
                }
                // Sent as the JSON the store wrote, when the caller sees
                // whole objects.
                return Ok(updated);
            }
        }
    }
    Err(ApiError::Conflict(format!(
        "{key} kept changing under this apply; try again"
    )))
}

/// `PUT …/status`: replaces the status only. Creates no revision, except
/// the record of a pod's move when it clears `status.node` (see
/// [`crate::workflows::update`]).
pub async fn put_status(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Json<Object>, ApiError> {
    let target = Target::from_params(&params)?;
    let key = target.key()?;
    let params = Params::parse(query.as_deref());
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("request body is not valid JSON: {e}")))?;
    let status = body.get("status").cloned().unwrap_or(Value::Null);
    let pinned_version = body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let change = change(&server, &caller, params.get("message"));
    for _ in 0..APPLY_ATTEMPTS {
        let current = server
            .store
            .get(&key)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))?;
        let expected = if pinned_version != 0 {
            pinned_version
        } else {
            current.metadata.resource_version
        };
        let mut next = current.clone();
        next.status = status.clone();
        keep_workflows(&current, &mut next);
        match ownership::update(&server, &caller, &current, next, expected, &change).await {
            Err(WriteError::Store(StoreError::Conflict { .. })) if pinned_version == 0 => continue,
            other => return Ok(Json(other?)),
        }
    }
    Err(ApiError::Conflict(format!(
        "{key} kept changing under this status write; try again"
    )))
}

/// A status write keeps the stored `status.workflow`: steps move only
/// through the step API, so a writer's copy of it (perhaps older) is
/// ignored.
fn keep_workflows(current: &Object, next: &mut Object) {
    let Some(workflows) = current.status.get("workflow") else {
        if let Some(status) = next.status.as_object_mut() {
            status.remove("workflow");
        }
        return;
    };
    if !next.status.is_object() {
        next.status = Value::Object(serde_json::Map::new());
    }
    next.status["workflow"] = workflows.clone();
}

/// `DELETE`: deletes the object, then its dependents (`?cascade=orphan`
/// keeps them and clears their owner instead; see [`crate::cascade`]). A
/// Pod a node took is not removed yet: its `stop` workflow starts, and the
/// answer is the pod with `metadata.deleting` set (202); `?skip=STEP`
/// (repeated) skips steps of it, `?force=true` all that are left (see
/// [`crate::deletion`]).
pub async fn delete(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
) -> Result<(StatusCode, Json<Object>), ApiError> {
    let key = Target::from_params(&params)?.key()?;
    let params = Params::parse(query.as_deref());
    let request = crate::deletion::Request {
        expected: params.number("resourceVersion")?,
        force: params.flag("force"),
        skip: params.all("skip"),
    };
    let cascade = crate::cascade::parse(params.get("cascade"))?;
    let change = change(&server, &caller, params.get("message"));
    let outcome = if crate::deletion::stops_through_workflow(key.kind) {
        ownership::authorize_delete(&server, &caller, &key).await?;
        crate::deletion::delete(&server, &key, &request, &change).await?
    } else {
        crate::deletion::check_skips(&key, &request)?;
        let removed = ownership::delete(&server, &caller, &key, request.expected, &change).await?;
        crate::deletion::Outcome::Removed(removed)
    };
    let (status, deleted) = match outcome {
        crate::deletion::Outcome::Removed(object) => (StatusCode::OK, object),
        crate::deletion::Outcome::Stopping(object) => (StatusCode::ACCEPTED, object),
    };
    prune_secret(&server, &key, false).await;
    let outcome = crate::cascade::follow(&server, &deleted, cascade, &change).await?;
    if !outcome.deleted.is_empty() || !outcome.orphaned.is_empty() {
        tracing::info!(
            owner = %key,
            deleted = outcome.deleted.len(),
            orphaned = outcome.orphaned.len(),
            "dependents followed their owner"
        );
    }
    Ok((status, Json(deleted)))
}

/// Whether an apply just forgot a Node (`spec.forgotten` turned on).
fn newly_forgotten(before: &Object, after: &Object) -> bool {
    let forgotten = |object: &Object| {
        object.kind == corral_api::Kind::Node
            && object
                .typed_spec::<corral_api::kinds::NodeSpec>()
                .is_ok_and(|spec| spec.forgotten)
    };
    forgotten(after) && !forgotten(before)
}

/// Drops a Secret's sealed values no revision names any more. The write
/// that made them unneeded has happened: a failure here only leaves
/// unreadable bytes behind, so it is logged, not returned.
async fn prune_secret(server: &crate::Server, key: &corral_api::ObjectKey, live: bool) {
    if let Err(error) = crate::secrets::prune(server, key, live).await {
        tracing::warn!(%key, %error, "cannot drop a Secret's unneeded sealed values");
    }
}
