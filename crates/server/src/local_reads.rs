//! The built-in controllers' in-process reads: their informers list and
//! watch this server's watch cache directly ([`LocalReads`]) instead of
//! over HTTPS to the server they run in.
//!
//! Answers are what the HTTP list and watch give the same token
//! (`handlers/watch.rs`): the token is authenticated and its
//! request checked as a `GET` of the collection, objects are served through
//! the caller's read mask ([`crate::ownership::ReadView`]: a controller
//! sees the fields it declared it reads), scopes by namespace, node and
//! labels are the cache's, a node or label scope hears an object leave as
//! a deletion, and a watch the window cannot resume is `410 Gone`. What
//! goes away is the JSON encoding of each event, both ends of TLS and HTTP,
//! and the client's decoding into a `serde_json::Value` first: each event
//! is copied from the change the cache keeps decoded (or decoded from its
//! cached JSON when the change is no longer among the newest).
//!
//! One difference: over HTTP a watch from before the cache's window that
//! is not scoped by node is replayed from the store's kept changes; here it
//! is `410 Gone` and the informer lists again (from the cache, so cheaply).
//!
//! Writes never come here: the controllers write through the API.

use std::sync::Arc;

use axum::http::Method;
use corral_api::Object;
use corral_api::watch::{ObjectList, WatchEvent};
use corral_client::runtime::{LocalEvents, LocalReads, Scope as ClientScope};
use corral_client::{ClientError, collection_path};
use futures::StreamExt;
use futures::future::BoxFuture;

use crate::SharedServer;
use crate::error::ApiError;
use crate::handlers::watch::WatchGuard;
use crate::ownership::ReadView;
use crate::watchcache::{CachedObject, ListRequest, Scope};

/// Lists and watches of this server's cache for clients in its process.
#[derive(Clone)]
pub struct InProcessReads {
    server: SharedServer,
}

impl std::fmt::Debug for InProcessReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessReads").finish_non_exhaustive()
    }
}

impl InProcessReads {
    pub fn new(server: SharedServer) -> Arc<Self> {
        Arc::new(InProcessReads { server })
    }

    /// The cache scope of `scope` and the mask its caller reads through,
    /// checked as a `GET` of the collection would be.
    async fn admit(&self, token: &str, scope: &ClientScope) -> Result<(Scope, ReadView), ApiError> {
        let identity = crate::auth::identify(&self.server, token).await?;
        let path = collection_path(scope.kind, scope.namespace.as_deref());
        crate::scope::check(&identity, &Method::GET, &path, None)?;
        let namespace = scope
            .namespace
            .clone()
            .filter(|namespace| scope.kind.is_namespaced() && !namespace.is_empty());
        let cache_scope = crate::handlers::watch::scope(
            scope.kind,
            namespace,
            scope.node.as_deref().filter(|node| !node.is_empty()),
            scope.selector.as_deref().unwrap_or_default(),
            scope
                .managed_by
                .as_deref()
                .filter(|manager| !manager.is_empty()),
        )?;
        let view = crate::ownership::reader(&self.server, &identity).await?;
        Ok((cache_scope, view))
    }

    /// Every object in `scope`, from the cache, after it has applied every
    /// write this server had made.
    pub async fn list_all(&self, token: &str, scope: &ClientScope) -> Result<ObjectList, ApiError> {
        let (cache_scope, view) = self.admit(token, scope).await?;
        let mut request = ListRequest {
            kind: scope.kind,
            scope: cache_scope,
            limit: None,
            continue_token: None,
        };
        let mut items = Vec::new();
        let mut resource_version = None;
        loop {
            let page = self.server.cache.list(&request).await?;
            // Later pages carry the first page's revision.
            let first = *resource_version.get_or_insert(page.resource_version);
            items.reserve(page.items.len());
            for object in &page.items {
                items.push(served(&self.server.cache, &view, object)?);
            }
            match page.continue_token {
                Some(token) => request.continue_token = Some(token),
                None => {
                    return Ok(ObjectList {
                        items,
                        resource_version: first,
                        continue_token: None,
                    });
                }
            }
        }
    }

    /// The changes in `scope` after `after`, then live ones, until the
    /// stream is dropped or the server stops.
    pub async fn watch_from(
        &self,
        token: &str,
        scope: &ClientScope,
        after: u64,
    ) -> Result<LocalEvents, ApiError> {
        let (cache_scope, view) = self.admit(token, scope).await?;
        let current = self.server.store.current_revision().await?;
        if after > current {
            return Err(ApiError::Gone(format!(
                "watch from resourceVersion {after} is not possible: the store is at {current}; list again"
            )));
        }
        let Some(changes) = self
            .server
            .cache
            .watch(scope.kind, cache_scope, after)
            .await?
        else {
            return Err(ApiError::Gone(format!(
                "watch from resourceVersion {after} is older than the server's window of changes; list again"
            )));
        };
        self.server.metrics.watch_started();
        let guard = WatchGuard(self.server.clone());
        let cache = self.server.cache.clone();
        Ok(changes
            .map(move |change| {
                let _alive = &guard;
                match change {
                    Ok((event_type, object)) => served(&cache, &view, &object)
                        .map(|object| WatchEvent::new(event_type, object))
                        .map_err(client_error),
                    Err(gone) => Err(client_error(ApiError::Gone(gone.0))),
                }
            })
            .take_until(self.server.stopping.clone().cancelled_owned())
            .boxed())
    }
}

impl LocalReads for InProcessReads {
    fn list<'a>(
        &'a self,
        token: &'a str,
        scope: &'a ClientScope,
    ) -> BoxFuture<'a, Result<ObjectList, ClientError>> {
        Box::pin(async move { self.list_all(token, scope).await.map_err(client_error) })
    }

    fn watch<'a>(
        &'a self,
        token: &'a str,
        scope: &'a ClientScope,
        after: u64,
    ) -> BoxFuture<'a, Result<LocalEvents, ClientError>> {
        Box::pin(async move {
            self.watch_from(token, scope, after)
                .await
                .map_err(client_error)
        })
    }
}

/// `object` as `view` may see it: what the view sees of the change the
/// cache keeps decoded (copied, not the rest), else decoded from its cached
/// JSON.
fn served(
    cache: &crate::watchcache::WatchCache,
    view: &ReadView,
    object: &CachedObject,
) -> Result<Object, ApiError> {
    let decoded = cache.shared(object).map_err(|error| {
        ApiError::Internal(format!(
            "the cached object {}/{} is unreadable: {error}",
            object.namespace, object.name
        ))
    })?;
    Ok(view.serve_shared(&decoded))
}

/// The error as a client of the HTTP API would have received it.
fn client_error(error: ApiError) -> ClientError {
    let fields = match &error {
        ApiError::Invalid { fields, .. } => fields.clone(),
        _ => Vec::new(),
    };
    ClientError::Api {
        status: error.status().as_u16(),
        code: error.code().to_string(),
        message: error.to_string(),
        fields,
    }
}
