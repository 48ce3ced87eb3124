//! Lists and watches served from the cache.

use std::collections::VecDeque;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use corral_api::Kind;
use corral_api::watch::EventType;
use futures::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::{CachedObject, Live, Scope, WatchCache};
use crate::error::ApiError;

/// Objects per page when a list asks for none.
const DEFAULT_LIMIT: usize = 100_000;

/// How long a watch waits for the cache to reach its `resourceVersion`.
const WATCH_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(2);

/// One list request.
#[derive(Debug, Clone)]
pub struct ListRequest {
    pub kind: Kind,
    pub scope: Scope,
    /// At most this many objects; the rest follow through `continue`.
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// One page of a list.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<Arc<CachedObject>>,
    /// The first page's revision: a watch from it misses nothing.
    pub resource_version: u64,
    pub continue_token: Option<String>,
}

/// Where the next page starts, as the opaque `continue` token carries it.
#[derive(Debug, Serialize, Deserialize)]
struct Position {
    #[serde(rename = "ns")]
    namespace: String,
    name: String,
    #[serde(rename = "rv")]
    resource_version: u64,
}

impl Position {
    fn encode(&self) -> String {
        // INVARIANT: three plain fields always serialize.
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).expect("position serializes"))
    }

    fn decode(token: &str) -> Result<Self, ApiError> {
        URL_SAFE_NO_PAD
            .decode(token)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| {
                ApiError::BadRequest(
                    "continue: not a token this server gave out; list again from the start".into(),
                )
            })
    }
}

/// A change a watcher is sent: its type in the watcher's scope and the
/// object.
pub type Sent = (EventType, Arc<CachedObject>);

/// Why a cached watch ended early: the watcher must list again.
#[derive(Debug)]
pub struct Gone(pub String);

impl WatchCache {
    /// A page of `request`'s objects, after the cache has applied every
    /// write this server had made when it was asked.
    pub async fn list(&self, request: &ListRequest) -> Result<ListPage, ApiError> {
        self.has_own_writes().await?;
        let after = request
            .continue_token
            .as_deref()
            .map(Position::decode)
            .transpose()?;
        let limit = request.limit.unwrap_or(DEFAULT_LIMIT).max(1);
        let state = self.read();
        let resource_version = after
            .as_ref()
            .map_or(state.resource_version, |p| p.resource_version);
        let Some(objects) = state.kinds.get(&request.kind) else {
            return Ok(ListPage {
                items: Vec::new(),
                resource_version,
                continue_token: None,
            });
        };
        let range = match &after {
            Some(position) => objects.range((
                std::ops::Bound::Excluded((position.namespace.clone(), position.name.clone())),
                std::ops::Bound::Unbounded,
            )),
            None => objects.range::<(String, String), _>(..),
        };
        let mut items = Vec::new();
        let mut more = false;
        for (_, object) in range {
            if !request.scope.admits_object(object) {
                continue;
            }
            if items.len() == limit {
                more = true;
                break;
            }
            items.push(object.clone());
        }
        let continue_token =
            more.then(|| items.last())
                .flatten()
                .map(|last: &Arc<CachedObject>| {
                    Position {
                        namespace: last.namespace.clone(),
                        name: last.name.clone(),
                        resource_version,
                    }
                    .encode()
                });
        Ok(ListPage {
            items,
            resource_version,
            continue_token,
        })
    }

    /// The changes of `kind` in `scope` after store revision `after`, then
    /// live ones. `Ok(None)` when `after` is before the window (the caller
    /// falls back to the store, or answers Gone).
    pub async fn watch(
        self: &Arc<Self>,
        kind: Kind,
        scope: Scope,
        after: u64,
    ) -> Result<Option<impl Stream<Item = Result<Sent, Gone>> + Send + use<>>, ApiError> {
        // A watch from a revision the store has but the cache not yet
        // (another server wrote it a moment ago) waits a little for the
        // cache; on etcd the revision may be no object's (a step log's), so
        // past the wait it goes on, skipping what it has up to `after`.
        let _ = self.caught_up(after, WATCH_CATCH_UP).await;
        let receiver = self.live.subscribe();
        let (backlog, cursor, generation) = {
            let state = self.read();
            if after < state.window_start {
                return Ok(None);
            }
            let backlog: VecDeque<Sent> = state
                .window
                .iter()
                .filter(|(event_kind, event)| {
                    *event_kind == kind && event.object.resource_version > after
                })
                .filter_map(|(_, event)| scope.view(event).map(|t| (t, event.object.clone())))
                .collect();
            (backlog, state.resource_version.max(after), state.generation)
        };
        let follower = Follower {
            cache: self.clone(),
            receiver,
            kind,
            scope,
            cursor,
            generation,
            pending: backlog,
            ended: false,
        };
        Ok(Some(futures::stream::unfold(follower, Follower::next)))
    }
}

/// One watcher's position in the cache's changes.
struct Follower {
    cache: Arc<WatchCache>,
    receiver: broadcast::Receiver<Live>,
    kind: Kind,
    scope: Scope,
    /// Every change at or below this revision was delivered or skipped.
    cursor: u64,
    generation: u64,
    pending: VecDeque<Sent>,
    ended: bool,
}

impl Follower {
    async fn next(mut self) -> Option<(Result<Sent, Gone>, Self)> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(sent) = self.pending.pop_front() {
                return Some((Ok(sent), self));
            }
            match self.receiver.recv().await {
                Ok(Live::Change(kind, event)) => {
                    let revision = event.object.resource_version;
                    if revision <= self.cursor {
                        continue;
                    }
                    self.cursor = revision;
                    if kind != self.kind {
                        continue;
                    }
                    if let Some(event_type) = self.scope.view(&event) {
                        return Some((Ok((event_type, event.object.clone())), self));
                    }
                }
                Ok(Live::Reloaded) | Err(RecvError::Closed) => {
                    return self.gone("the server's watch cache loaded everything again");
                }
                Err(RecvError::Lagged(_)) => {
                    if let Err(gone) = self.catch_up() {
                        self.ended = true;
                        return Some((Err(gone), self));
                    }
                }
            }
        }
    }

    fn gone(mut self, why: &str) -> Option<(Result<Sent, Gone>, Self)> {
        self.ended = true;
        Some((Err(Gone(format!("{why}; list again"))), self))
    }

    /// After lagging behind the live changes, re-reads the window from
    /// the cursor.
    fn catch_up(&mut self) -> Result<(), Gone> {
        let state = self.cache.read();
        if state.generation != self.generation || self.cursor < state.window_start {
            return Err(Gone(
                "this watch fell behind the server's window of changes; list again".into(),
            ));
        }
        for (kind, event) in &state.window {
            if event.object.resource_version <= self.cursor {
                continue;
            }
            if *kind == self.kind
                && let Some(event_type) = self.scope.view(event)
            {
                self.pending.push_back((event_type, event.object.clone()));
            }
        }
        self.cursor = self.cursor.max(state.resource_version);
        Ok(())
    }
}
