//! The informer: list once, then watch; resume a broken watch from the last
//! change seen; list again only when the watch window has moved on.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use corral_api::watch::EventType;
use corral_api::{Object, ObjectKey};
use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Cache, Index, Scope};
use crate::{Client, ClientError};

/// The first wait after the API failed; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// One change the informer applied to its cache.
#[derive(Debug)]
pub enum Change<'a, T> {
    /// Created or changed; `old` is what the cache held before, if anything
    /// (for another uid when the object was deleted and created again).
    Applied {
        key: &'a ObjectKey,
        object: &'a Object,
        old: Option<&'a T>,
        new: &'a T,
    },
    /// Deleted, or out of the informer's scope now; `old` is what the
    /// cache held.
    Deleted { key: &'a ObjectKey, old: &'a T },
}

impl<T> Change<'_, T> {
    pub fn key(&self) -> &ObjectKey {
        match self {
            Change::Applied { key, .. } | Change::Deleted { key, .. } => key,
        }
    }
}

type Handler<T> = Box<dyn Fn(&Change<'_, T>) + Send + Sync>;

/// What the cache keeps of each object.
pub type Projection<T> = fn(&Object) -> T;

/// A watch-fed cache of the objects in one [`Scope`] — whole, or as a
/// projection keeps them — and the handlers told about each change. Cheap
/// to clone.
pub struct Informer<T = Object> {
    cache: Cache<T>,
    handlers: Arc<Mutex<Vec<Handler<T>>>>,
    synced: watch::Receiver<bool>,
    project: Projection<T>,
}

impl<T> Clone for Informer<T> {
    fn clone(&self) -> Self {
        Informer {
            cache: self.cache.clone(),
            handlers: self.handlers.clone(),
            synced: self.synced.clone(),
            project: self.project,
        }
    }
}

impl<T> std::fmt::Debug for Informer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informer").finish_non_exhaustive()
    }
}

impl Informer<Object> {
    /// Starts following `scope` through `client` until `shutdown`, keeping
    /// whole objects filed under `indexes`.
    pub fn start(
        client: Client,
        scope: Scope,
        indexes: Vec<Index<Object>>,
        shutdown: CancellationToken,
    ) -> Informer<Object> {
        Informer::start_projected(client, scope, Object::clone, indexes, shutdown)
    }
}

impl<T: Send + Sync + 'static> Informer<T> {
    /// Starts following `scope` through `client` until `shutdown`, keeping
    /// what `project` makes of each object, filed under `indexes`.
    pub fn start_projected(
        client: Client,
        scope: Scope,
        project: Projection<T>,
        indexes: Vec<Index<T>>,
        shutdown: CancellationToken,
    ) -> Informer<T> {
        let (synced_tx, synced) = watch::channel(false);
        let informer = Informer {
            cache: Cache::new(indexes),
            handlers: Arc::new(Mutex::new(Vec::new())),
            synced,
            project,
        };
        let follower = Follower {
            client,
            scope,
            informer: informer.clone(),
            synced: synced_tx,
        };
        tokio::spawn(follower.run(shutdown));
        informer
    }

    pub fn cache(&self) -> &Cache<T> {
        &self.cache
    }

    /// Calls `existing` for every item already cached, then `handler` for
    /// every later change, in order, with nothing missed in between.
    /// Handlers run on the informer's task and must not block or register
    /// handlers: queue work, do not do it.
    pub fn on_change(
        &self,
        existing: impl Fn(&ObjectKey, &T),
        handler: impl Fn(&Change<'_, T>) + Send + Sync + 'static,
    ) {
        let mut handlers = self.lock_handlers();
        for (key, item) in self.cache.list() {
            existing(&key, &item);
        }
        handlers.push(Box::new(handler));
    }

    /// Waits until the first list is in the cache.
    pub async fn synced(&self) {
        let mut synced = self.synced.clone();
        // An error means the follower is gone (shut down): nothing to wait for.
        let _ = synced.wait_for(|synced| *synced).await;
    }

    fn lock_handlers(&self) -> std::sync::MutexGuard<'_, Vec<Handler<T>>> {
        self.handlers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn notify(&self, change: &Change<'_, T>) {
        for handler in self.lock_handlers().iter() {
            handler(change);
        }
    }

    fn apply(&self, object: &Object) {
        let key = object.key();
        let item = (self.project)(object);
        if let Some((old, new)) = self
            .cache
            .apply(&key, object.metadata.resource_version, item)
        {
            self.notify(&Change::Applied {
                key: &key,
                object,
                old: old.as_deref(),
                new: &new,
            });
        }
    }

    fn remove(&self, object: &Object) {
        let key = object.key();
        if let Some(old) = self.cache.remove(&key, object.metadata.resource_version) {
            self.notify(&Change::Deleted {
                key: &key,
                old: &old,
            });
        }
    }

    fn replace(&self, objects: &[Object], resource_version: u64) {
        let items = objects
            .iter()
            .map(|object| {
                (
                    object.key(),
                    object.metadata.resource_version,
                    (self.project)(object),
                )
            })
            .collect();
        let (gone, applied) = self.cache.replace(items, resource_version);
        for (key, old) in &gone {
            self.notify(&Change::Deleted { key, old });
        }
        let objects: std::collections::HashMap<ObjectKey, &Object> = objects
            .iter()
            .map(|object| (object.key(), object))
            .collect();
        for (key, old, new) in &applied {
            if let Some(object) = objects.get(key) {
                self.notify(&Change::Applied {
                    key,
                    object,
                    old: old.as_deref(),
                    new,
                });
            }
        }
    }
}

/// The task behind an informer.
struct Follower<T> {
    client: Client,
    scope: Scope,
    informer: Informer<T>,
    synced: watch::Sender<bool>,
}

/// Why a watch stopped.
enum Ended {
    /// The server ended the stream or the connection broke: resume from
    /// the last change seen.
    Broken(Option<ClientError>),
    /// The watch window moved past the last change seen: list again.
    Expired,
}

impl<T: Send + Sync + 'static> Follower<T> {
    async fn run(self, shutdown: CancellationToken) {
        let mut backoff = FIRST_BACKOFF;
        let mut listed = false;
        while !shutdown.is_cancelled() {
            if !listed {
                let list = tokio::select! {
                    list = self.client.informer_list(&self.scope) => list,
                    () = shutdown.cancelled() => return,
                };
                match list {
                    Ok(list) => {
                        self.informer.replace(&list.items, list.resource_version);
                        self.synced.send_replace(true);
                        listed = true;
                    }
                    Err(error) => {
                        tracing::debug!(kind = %self.scope.kind, %error, ?backoff, "cannot list; retrying");
                        if !sleep(&mut backoff, &shutdown).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let after = self.informer.cache.resource_version();
            match self.follow(after, &shutdown).await {
                None => return,
                Some(Ended::Expired) => {
                    tracing::debug!(kind = %self.scope.kind, after, "watch window moved on; listing again");
                    listed = false;
                }
                Some(Ended::Broken(error)) => {
                    // A stream that delivered events resets the backoff.
                    if self.informer.cache.resource_version() > after {
                        backoff = FIRST_BACKOFF;
                    }
                    if let Some(error) = error {
                        tracing::debug!(kind = %self.scope.kind, %error, ?backoff, "watch broke; resuming");
                    }
                    if !sleep(&mut backoff, &shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    /// Follows the watch from `after` until it ends; `None` on shutdown.
    async fn follow(&self, after: u64, shutdown: &CancellationToken) -> Option<Ended> {
        let opened = tokio::select! {
            opened = self.client.informer_watch(&self.scope, after) => opened,
            () = shutdown.cancelled() => return None,
        };
        let mut events = match opened {
            Ok(events) => events,
            Err(error) if error.status() == Some(410) => return Some(Ended::Expired),
            Err(error) => return Some(Ended::Broken(Some(error))),
        };
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                () = shutdown.cancelled() => return None,
            };
            match event {
                Some(Ok(event)) => match event.event_type {
                    EventType::Deleted => self.informer.remove(&event.object),
                    EventType::Added | EventType::Modified => self.informer.apply(&event.object),
                },
                Some(Err(error)) if error.status() == Some(410) => return Some(Ended::Expired),
                Some(Err(error)) => return Some(Ended::Broken(Some(error))),
                None => return Some(Ended::Broken(None)),
            }
        }
    }
}

/// Sleeps `backoff` (doubling it for next time); false on shutdown.
async fn sleep(backoff: &mut Duration, shutdown: &CancellationToken) -> bool {
    let wait = *backoff;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    tokio::select! {
        () = tokio::time::sleep(wait) => true,
        () = shutdown.cancelled() => false,
    }
}
