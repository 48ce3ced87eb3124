//! Lists and watch streams, served from the watch cache
//! ([`crate::watchcache`]). A watch is newline-delimited JSON: one
//! `{"type": "ADDED"|"MODIFIED"|"DELETED", "object": …}` per line, after the
//! `resourceVersion` given, and an `{"type": "ERROR", …}` line if the stream
//! must end (`code` `Gone`: list again).
//!
//! Parameters: `selector` (labels), `node` (pods and VirtualMachines bound
//! to that node; one that leaves the node arrives as a deletion),
//! `managedBy` (objects whose `corral.dev/managed-by` annotation names that
//! controller; one that stops naming it arrives as a deletion), `limit`
//! and `continue` for lists in pages, `watch`, `resourceVersion`, and
//! `name` for a watch of one object.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use corral_api::watch::{EventType, WatchEvent};
use corral_api::{Kind, LabelSelector};
use corral_store::WatchFilter;
use futures::StreamExt;

use super::Target;
use crate::SharedServer;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::ownership::ReadView;
use crate::query::Params;
use crate::watchcache::{CachedObject, ListRequest, Scope};

pub async fn list_or_watch(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let target = Target::from_params(&params)?;
    let query = Params::parse(query.as_deref());
    let namespace = target.namespace.clone().or_else(|| {
        query
            .get("namespace")
            .filter(|n| !n.is_empty())
            .map(str::to_string)
    });
    let scope = scope(
        target.kind,
        namespace,
        query.get("node").filter(|n| !n.is_empty()),
        query.get("selector").unwrap_or_default(),
        query.get("managedBy").filter(|m| !m.is_empty()),
    )?;
    let view = crate::ownership::reader(&server, &caller).await?;
    if query.flag("watch") {
        let scope = Scope {
            name: query.get("name").map(str::to_string),
            ..scope
        };
        let after = query.number("resourceVersion")?.unwrap_or(0);
        return watch(server, target.kind, scope, after, view).await;
    }
    let request = ListRequest {
        kind: target.kind,
        scope,
        limit: query
            .number("limit")?
            .map(|limit| usize::try_from(limit).unwrap_or(usize::MAX)),
        continue_token: query
            .get("continue")
            .filter(|token| !token.is_empty())
            .map(str::to_string),
    };
    let page = server.cache.list(&request).await?;
    let mut body =
        BytesMut::with_capacity(64 + page.items.iter().map(|o| o.json.len() + 1).sum::<usize>());
    body.put_slice(b"{\"items\":[");
    for (index, object) in page.items.iter().enumerate() {
        if index > 0 {
            body.put_u8(b',');
        }
        put_object(&mut body, &view, object)?;
    }
    body.put_slice(format!("],\"resourceVersion\":{}", page.resource_version).as_bytes());
    if let Some(token) = &page.continue_token {
        body.put_slice(b",\"continue\":");
        body.put_slice(&serde_json::to_vec(token).map_err(internal)?);
    }
    body.put_u8(b'}');
    json_response(body.freeze(), "application/json")
}

/// The scope of a list or watch of `kind` from its parameters.
pub(crate) fn scope(
    kind: Kind,
    namespace: Option<String>,
    node: Option<&str>,
    selector: &str,
    manager: Option<&str>,
) -> Result<Scope, ApiError> {
    let selector: LabelSelector = selector
        .parse()
        .map_err(|e: corral_api::SelectorError| ApiError::BadRequest(e.to_string()))?;
    if node.is_some() && !matches!(kind, Kind::Pod | Kind::VirtualMachine) {
        return Err(ApiError::BadRequest(format!(
            "node: only pods and virtualmachines are bound to nodes, not {}",
            kind.plural()
        )));
    }
    Ok(Scope {
        namespace,
        name: None,
        node: node.map(str::to_string),
        selector,
        manager: manager.map(str::to_string),
    })
}

/// Writes `object` as `view` may see it: its cached JSON as it is, or
/// decoded, masked and encoded again for a controller.
fn put_object(body: &mut BytesMut, view: &ReadView, object: &CachedObject) -> Result<(), ApiError> {
    if view.sees_everything() {
        body.put_slice(&object.json);
        return Ok(());
    }
    let decoded = object.decode().map_err(internal)?;
    body.put_slice(&serde_json::to_vec(&view.serve(decoded)).map_err(internal)?);
    Ok(())
}

fn internal(error: serde_json::Error) -> ApiError {
    ApiError::Internal(format!("cannot encode an object: {error}"))
}

fn json_response(body: Bytes, content_type: &'static str) -> Result<Response, ApiError> {
    Response::builder()
        .header(CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .map_err(|e| ApiError::Internal(e.to_string()))
}

async fn watch(
    server: SharedServer,
    kind: Kind,
    scope: Scope,
    after: u64,
    view: ReadView,
) -> Result<Response, ApiError> {
    let current = server.store.current_revision().await?;
    if after > current {
        return Err(ApiError::Gone(format!(
            "watch from resourceVersion {after} is not possible: the store is at {current}; list again"
        )));
    }
    let lines = match server.cache.watch(kind, scope.clone(), after).await? {
        Some(changes) => changes
            .map(move |change| match change {
                Ok((event_type, object)) => event_line(event_type, &object, &view),
                Err(gone) => error_line("Gone", &gone.0),
            })
            .boxed(),
        // Before the cache's window: the store replays its own kept
        // changes, unless the watch needs to know what left its scope.
        None if scope.node.is_some() || scope.manager.is_some() => {
            return Err(ApiError::Gone(format!(
                "watch from resourceVersion {after} is older than the server's window of changes; list again"
            )));
        }
        None => {
            let filter = WatchFilter {
                kind: Some(kind),
                namespace: scope.namespace.clone(),
                name: scope.name.clone(),
            };
            let selector = scope.selector.clone();
            server
                .store
                .watch(filter, after)
                .await?
                .filter(move |event| {
                    let keep = match event {
                        Ok(event) => selector.matches(&event.object.metadata.labels),
                        Err(_) => true,
                    };
                    std::future::ready(keep)
                })
                .map(move |event| match event {
                    Ok(mut event) => {
                        event.object = view.serve(event.object);
                        serde_json::to_vec(&event)
                            .map(|mut line| {
                                line.push(b'\n');
                                Bytes::from(line)
                            })
                            .unwrap_or_default()
                    }
                    Err(error) => {
                        let error = ApiError::from(error);
                        error_line(error.code(), &error.to_string())
                    }
                })
                .boxed()
        }
    };
    server.metrics.watch_started();
    let guard = WatchGuard(server.clone());
    let lines = lines
        .take_until(server.stopping.clone().cancelled_owned())
        .map(move |line| {
            let _alive = &guard;
            Ok::<_, std::convert::Infallible>(line)
        });
    Response::builder()
        .header(CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(lines))
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// One event line, from the cached JSON when the caller sees everything.
fn event_line(event_type: EventType, object: &Arc<CachedObject>, view: &ReadView) -> Bytes {
    let type_text = match event_type {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    };
    if view.sees_everything() {
        let mut line = BytesMut::with_capacity(object.json.len() + 40);
        line.put_slice(b"{\"type\":\"");
        line.put_slice(type_text.as_bytes());
        line.put_slice(b"\",\"object\":");
        line.put_slice(&object.json);
        line.put_slice(b"}\n");
        return line.freeze();
    }
    match object.decode() {
        Ok(decoded) => {
            let event = WatchEvent::new(event_type, view.serve(decoded));
            serde_json::to_vec(&event)
                .map(|mut line| {
                    line.push(b'\n');
                    Bytes::from(line)
                })
                .unwrap_or_else(|error| error_line("Internal", &error.to_string()))
        }
        Err(error) => error_line(
            "Internal",
            &format!("a cached object is unreadable: {error}"),
        ),
    }
}

fn error_line(code: &str, message: &str) -> Bytes {
    let mut line = serde_json::to_vec(&serde_json::json!({
        "type": "ERROR",
        "error": ErrorBody { code: code.into(), message: message.into(), fields: vec![] },
    }))
    .unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// Counts an open watch until the stream is dropped.
pub(crate) struct WatchGuard(pub(crate) SharedServer);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.metrics.watch_ended();
    }
}
