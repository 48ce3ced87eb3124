//! Lists and watch streams. A watch is newline-delimited JSON: one
//! `{"type": "ADDED"|"MODIFIED"|"DELETED", "object": …}` per line, starting
//! after the `resourceVersion` given (0: from the beginning of the kept
//! changes), and an `{"type": "ERROR", …}` line if the stream must end.

use std::collections::HashMap;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use corral_api::LabelSelector;
use corral_api::watch::ObjectList;
use corral_store::WatchFilter;
use futures::StreamExt;

use super::Target;
use crate::SharedServer;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::query::Params;

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
    let selector: LabelSelector = query
        .get("selector")
        .unwrap_or_default()
        .parse()
        .map_err(|e: corral_api::SelectorError| ApiError::BadRequest(e.to_string()))?;

    let view = crate::ownership::reader(&server, &caller).await?;
    if !query.flag("watch") {
        let listed = server.store.list(target.kind, namespace.as_deref()).await?;
        let items = listed
            .objects
            .into_iter()
            .filter(|o| selector.matches(&o.metadata.labels))
            .map(|o| view.serve(o))
            .collect();
        return Ok(Json(ObjectList {
            items,
            resource_version: listed.resource_version,
            continue_token: None,
        })
        .into_response());
    }

    let after = query.number("resourceVersion")?.unwrap_or(0);
    let filter = WatchFilter {
        kind: Some(target.kind),
        namespace,
        name: query.get("name").map(str::to_string),
    };
    let events = server.store.watch(filter, after).await?;
    server.metrics.watch_started();
    let guard = WatchGuard(server.clone());
    let lines = events
        .take_until(server.stopping.clone().cancelled_owned())
        .filter(move |event| {
            let keep = match event {
                Ok(event) => selector.matches(&event.object.metadata.labels),
                Err(_) => true,
            };
            std::future::ready(keep)
        })
        .map(move |event| {
            let _alive = &guard;
            let mut line = match event {
                Ok(mut event) => {
                    event.object = view.serve(event.object);
                    serde_json::to_vec(&event)
                }
                Err(error) => {
                    let error = ApiError::from(error);
                    serde_json::to_vec(&serde_json::json!({
                        "type": "ERROR",
                        "error": ErrorBody { code: "WatchEnded".into(), message: error.to_string(), fields: vec![] },
                    }))
                }
            }
            .unwrap_or_default();
            line.push(b'\n');
            Ok::<_, std::convert::Infallible>(Bytes::from(line))
        });
    Response::builder()
        .header(CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(lines))
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// Counts an open watch until the stream is dropped.
struct WatchGuard(SharedServer);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.metrics.watch_ended();
    }
}
