//! Field ownership in the server: every write is checked against the
//! owner of each field it changes, `Controller` registrations are checked
//! for conflicts, and what a controller is served is cut down to the
//! fields it declared.
//!
//! - [`create`], [`update`] and [`delete`] wrap the object handlers'
//!   writes: they check the caller's change (before the workflow module
//!   adds instances on the server's behalf), then hand over to
//!   [`crate::workflows`]. A refusal is 403 naming the path and its owner; a
//!   second owner of a field is 409 naming the first.
//! - [`reader`] gives the handlers that serve objects (get, list, watch,
//!   and these writes' answers) the mask for the caller.
//! - [`transfer`] is the one way a field changes hands.
//! - [`register_builtins`] registers the built-in controllers at start
//!   through the same handler as any request.
//!
//! The rules themselves are `corral_ownership`'s; this module loads the
//! registry (cached, rebuilt after every `Controller` write, which all pass
//! through here) and maps verdicts to [`ApiError`]s. `Controller` writes are
//! serialized so two registrations of one field cannot both pass.

mod builtin;
mod read;
mod transfer;

use std::sync::{Arc, RwLock};

use axum::Json;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use corral_api::{Identity, Kind, Object, ObjectKey, Role};
use corral_ownership::{Registry, check_delete, check_delete_object, overlay};
use corral_store::{ChangeMeta, WatchEvent};

pub use builtin::{BuiltinTokens, register_builtins};
pub use read::{ReadView, reader};
pub use transfer::{TransferRequest, TransferResponse, transfer};

use crate::Server;
use crate::error::ApiError;
use crate::workflows::{self, WriteError};

/// The cached registry and the lock that serializes registrations.
#[derive(Debug, Default)]
pub struct Ownership {
    cache: RwLock<Option<Arc<Registry>>>,
    registrations: tokio::sync::Mutex<()>,
}

/// The registry in effect: cached, or loaded from the stored `Controller`
/// objects.
pub async fn registry(server: &Server) -> Result<Arc<Registry>, ApiError> {
    if let Ok(cache) = server.ownership.cache.read()
        && let Some(registry) = cache.as_ref()
    {
        return Ok(registry.clone());
    }
    let registry = Arc::new(load(server).await?);
    if let Ok(mut cache) = server.ownership.cache.write() {
        *cache = Some(registry.clone());
    }
    Ok(registry)
}

async fn load(server: &Server) -> Result<Registry, ApiError> {
    let listed = server.store.list(Kind::Controller, None).await?;
    Ok(Registry::from_objects(&listed.objects))
}

/// Forgets the cached registry (and the current workflow definitions,
/// which registrations add steps to); the next use reloads them.
fn invalidate(server: &Server) {
    if let Ok(mut cache) = server.ownership.cache.write() {
        *cache = None;
    }
    server.definitions.invalidate();
}

/// Creates `object` if `caller` may set every field it sets.
pub async fn create(
    server: &Server,
    caller: &Identity,
    mut object: Object,
    change: &ChangeMeta,
) -> Result<Object, WriteError> {
    let registering = object.kind == Kind::Controller;
    let _serial = if registering {
        Some(server.ownership.registrations.lock().await)
    } else {
        None
    };
    let registry = fresh_registry(server, registering)
        .await
        .map_err(WriteError::Refused)?;
    admit(&registry, caller, None, &object)?;
    crate::cascade::check_owner(server, &object)
        .await
        .map_err(WriteError::Refused)?;
    crate::security::admit(server, None, &mut object)
        .await
        .map_err(WriteError::Refused)?;
    let created = workflows::create(server, object, change).await;
    finish(server, caller, registering, created).await
}

/// Replaces `current` by `next` (at `expected`) if `caller` may change
/// every field that differs. A controller's write is read as a write of
/// the fields it is served: fields it never saw keep their stored values.
pub async fn update(
    server: &Server,
    caller: &Identity,
    current: &Object,
    next: Object,
    expected: u64,
    change: &ChangeMeta,
) -> Result<Object, WriteError> {
    update_answer(server, caller, current, next, expected, change)
        .await
        .map(Answer::into_object)
}

/// An object a write answers with, as its caller may see it.
#[derive(Debug)]
pub enum Answer {
    /// The store's event of the write, for a caller who sees whole
    /// objects: sent as the JSON the store wrote, not encoded again.
    Stored(Arc<WatchEvent>),
    /// The object as the caller is served it.
    Served(Box<Object>),
}

impl Answer {
    pub fn served(object: Object) -> Self {
        Answer::Served(Box::new(object))
    }

    pub fn object(&self) -> &Object {
        match self {
            Answer::Stored(event) => &event.object,
            Answer::Served(object) => object,
        }
    }

    pub fn into_object(self) -> Object {
        match self {
            Answer::Stored(event) => corral_store::written_object(event),
            Answer::Served(object) => *object,
        }
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        match self {
            Answer::Stored(event) => match &event.encoded {
                Some(json) => (
                    [(CONTENT_TYPE, "application/json")],
                    Bytes::copy_from_slice(json.as_bytes()),
                )
                    .into_response(),
                None => Json(&event.object).into_response(),
            },
            Answer::Served(object) => Json(object).into_response(),
        }
    }
}

/// [`update`], answering with the store's JSON of the object when the
/// caller sees whole objects.
pub async fn update_answer(
    server: &Server,
    caller: &Identity,
    current: &Object,
    next: Object,
    expected: u64,
    change: &ChangeMeta,
) -> Result<Answer, WriteError> {
    // A stale write is refused as stale before it is judged: its diff
    // against a newer object would name changes the caller never made.
    if expected != current.metadata.resource_version {
        return Err(WriteError::Store(corral_store::StoreError::Conflict {
            key: current.key(),
            expected,
            actual: current.metadata.resource_version,
        }));
    }
    let registering = current.kind == Kind::Controller;
    let _serial = if registering {
        Some(server.ownership.registrations.lock().await)
    } else {
        None
    };
    let registry = fresh_registry(server, registering)
        .await
        .map_err(WriteError::Refused)?;
    let mut next = match visible(&registry, caller, current) {
        Some(paths) => overlay(current, &next, &paths),
        None => next,
    };
    crate::security::keep_runtime(current, &mut next);
    if next == *current && expected == current.metadata.resource_version {
        return Ok(Answer::served(ReadView::new(caller, registry).serve(next)));
    }
    admit(&registry, caller, Some(current), &next)?;
    // What a change may not do (a VM's disk only grows), whoever writes it.
    corral_api::validate_update(current, &next).map_err(|fields| {
        WriteError::Refused(ApiError::invalid(&current.key().to_string(), fields))
    })?;
    if next.metadata.owner != current.metadata.owner {
        crate::cascade::check_owner(server, &next)
            .await
            .map_err(WriteError::Refused)?;
    }
    crate::security::admit(server, Some(current), &mut next)
        .await
        .map_err(WriteError::Refused)?;
    let updated = workflows::update_event(server, current, next, expected, change).await;
    let (updated, view) = written_view(server, caller, registering, updated).await?;
    if view.sees_everything() {
        Ok(Answer::Stored(updated))
    } else {
        Ok(Answer::served(
            view.serve(corral_store::written_object(updated)),
        ))
    }
}

/// Deletes the object at `key`: people, and the controller managing it;
/// policies and controllers operators only.
pub async fn delete(
    server: &Server,
    caller: &Identity,
    key: &ObjectKey,
    expected: Option<u64>,
    change: &ChangeMeta,
) -> Result<Object, ApiError> {
    authorize_delete(server, caller, key).await?;
    let registering = key.kind == Kind::Controller;
    let _serial = if registering {
        Some(server.ownership.registrations.lock().await)
    } else {
        None
    };
    let deleted = server.store.delete(key, expected, change).await;
    if registering {
        invalidate(server);
    }
    Ok(deleted?)
}

/// Whether `caller` may delete the object at `key`: people, and the
/// controller managing it; policies and controllers operators only.
pub async fn authorize_delete(
    server: &Server,
    caller: &Identity,
    key: &ObjectKey,
) -> Result<(), ApiError> {
    // A controller may delete only what it manages, so look at the object.
    let verdict = match (caller.role, server.store.get(key).await?) {
        (Role::Controller, Some(stored)) => check_delete_object(caller, &stored),
        _ => check_delete(caller, key),
    };
    verdict.map_err(|refusal| ApiError::Forbidden(refusal.to_string()))
}

/// The registry, reloaded from the store when a registration is being
/// decided (under the registration lock) so it is never stale.
async fn fresh_registry(server: &Server, registering: bool) -> Result<Arc<Registry>, ApiError> {
    if registering {
        invalidate(server);
    }
    registry(server).await
}

/// The field patterns `caller` is served of `object`; `None` for all of
/// them (people, nodes, a controller's own registration).
fn visible(registry: &Registry, caller: &Identity, object: &Object) -> Option<Vec<String>> {
    if caller.role != Role::Controller {
        return None;
    }
    registry.visible_paths(&caller.name, object.kind, &object.metadata.name)
}

/// The ownership verdict on one write, and for a `Controller` the
/// registration check.
fn admit(
    registry: &Registry,
    caller: &Identity,
    old: Option<&Object>,
    new: &Object,
) -> Result<(), WriteError> {
    registry
        .check_write(caller, old, new)
        .map_err(|refusal| WriteError::Refused(ApiError::Forbidden(refusal.to_string())))?;
    if new.kind == Kind::Controller {
        let spec = new
            .typed_spec()
            .map_err(|error| WriteError::Refused(ApiError::BadRequest(format!("spec: {error}"))))?;
        registry
            .check_registration(&new.metadata.name, &spec)
            .map_err(|error| {
                WriteError::Refused(match error {
                    corral_ownership::RegistrationError::AlreadyOwned { .. } => {
                        ApiError::Conflict(error.to_string())
                    }
                    _ => ApiError::BadRequest(error.to_string()),
                })
            })?;
    }
    Ok(())
}

/// After a write: forget the registry if a registration changed, and serve
/// the answer through the caller's mask.
async fn finish(
    server: &Server,
    caller: &Identity,
    registering: bool,
    written: Result<Object, WriteError>,
) -> Result<Object, WriteError> {
    let (written, view) = written_view(server, caller, registering, written).await?;
    Ok(view.serve(written))
}

/// After a write: forget the registry if a registration changed (whether
/// or not the write went through), then the write's result with the mask
/// the caller's answer is served through.
async fn written_view<T>(
    server: &Server,
    caller: &Identity,
    registering: bool,
    written: Result<T, WriteError>,
) -> Result<(T, ReadView), WriteError> {
    if registering {
        invalidate(server);
    }
    let written = written?;
    let view = reader(server, caller).await.map_err(WriteError::Refused)?;
    Ok((written, view))
}
