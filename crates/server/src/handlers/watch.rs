//! Lists and watch streams. A watch is newline-delimited JSON: one
//! `{"type": "ADDED"|"MODIFIED"|"DELETED", "object": …}` per line, starting
//! after the `resourceVersion` given (0: from the beginning of the kept
//! changes), and an `{"type": "ERROR", …}` line if the stream must end.
//!
//! A list with `limit=N` is paged: at most N items (after the selector)
//! and a `continue` token while more may follow; `continue=TOKEN` asks for
//! the next page. The token is opaque to clients (hex of JSON naming the
//! last object looked at and the first page's revision), and every page
//! carries the *first* page's `resourceVersion`, so a watch from it after
//! the last page misses nothing.

use std::collections::HashMap;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use corral_api::LabelSelector;
use corral_api::watch::ObjectList;
use corral_store::{ListContinue, WatchFilter};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

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
    let limit = query.number("limit")?.filter(|limit| *limit > 0);
    let position = query
        .get("continue")
        .filter(|token| !token.is_empty())
        .map(ContinueToken::decode)
        .transpose()?;
    if !query.flag("watch") && (limit.is_some() || position.is_some()) {
        let limit = limit.map_or(DEFAULT_PAGE, |limit| {
            usize::try_from(limit).unwrap_or(usize::MAX)
        });
        let mut after = position.as_ref().map(ContinueToken::position);
        let mut resource_version = position.map(|token| token.rv);
        let mut items = Vec::new();
        let mut more = true;
        // Fill the page: the selector may leave a store page short.
        'pages: while more {
            let page = server
                .store
                .list_page(target.kind, namespace.as_deref(), limit, after.as_ref())
                .await?;
            resource_version.get_or_insert(page.resource_version);
            let scanned = page.objects.len();
            more = page.next.is_some();
            for (index, object) in page.objects.into_iter().enumerate() {
                after = Some(ListContinue::after(&object));
                if selector.matches(&object.metadata.labels) {
                    items.push(view.serve(object));
                }
                if items.len() == limit {
                    more = more || index + 1 < scanned;
                    break 'pages;
                }
            }
        }
        let resource_version = resource_version.unwrap_or_default();
        let continue_token = match after {
            Some(after) if more => Some(ContinueToken::new(after, resource_version).encode()),
            _ => None,
        };
        return Ok(Json(ObjectList {
            items,
            resource_version,
            continue_token,
        })
        .into_response());
    }
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

/// Page size of a `continue` request that names no `limit`.
const DEFAULT_PAGE: usize = 500;

/// Where a paged list goes on, as the client carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ContinueToken {
    /// Namespace and name of the last object looked at.
    ns: String,
    name: String,
    /// The first page's store revision.
    rv: u64,
}

impl ContinueToken {
    fn new(after: ListContinue, rv: u64) -> ContinueToken {
        ContinueToken {
            ns: after.namespace,
            name: after.name,
            rv,
        }
    }

    fn position(&self) -> ListContinue {
        ListContinue {
            namespace: self.ns.clone(),
            name: self.name.clone(),
        }
    }

    fn encode(&self) -> String {
        // INVARIANT: two strings and a number always serialise.
        hex::encode(serde_json::to_vec(self).unwrap_or_default())
    }

    fn decode(token: &str) -> Result<ContinueToken, ApiError> {
        hex::decode(token)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "query parameter continue: {token:?} is not a token from a previous page of this list"
                ))
            })
    }
}

/// Counts an open watch until the stream is dropped.
struct WatchGuard(SharedServer);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.metrics.watch_ended();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_garbage_is_refused() {
        let token = ContinueToken::new(
            ListContinue {
                namespace: "team-a".into(),
                name: "web-7".into(),
            },
            42,
        );
        let encoded = token.encode();
        assert!(encoded.bytes().all(|b| b.is_ascii_hexdigit()), "{encoded}");
        assert_eq!(ContinueToken::decode(&encoded).expect("decode"), token);
        for bad in ["zz", "7b7d", "not a token"] {
            match ContinueToken::decode(bad) {
                Err(ApiError::BadRequest(message)) => {
                    assert!(message.contains("continue"), "{message}")
                }
                other => panic!("{bad:?} must be refused, got {other:?}"),
            }
        }
    }
}
