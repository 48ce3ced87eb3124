//! The informer: list once, then watch; resume a broken watch from the last
//! change seen; list again only when the watch window has moved on.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use corral_api::Object;
use corral_api::watch::EventType;
use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Cache, Index, Scope};
use crate::{Client, ClientError};

/// The first wait after the API failed; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Objects per page of a list.
pub(crate) const PAGE: usize = 500;

/// One change the informer applied to its cache.
#[derive(Debug)]
pub enum Change<'a> {
    /// Created or changed; `old` is what the cache held before, if anything
    /// (with another uid when the object was deleted and created again).
    Applied {
        old: Option<&'a Object>,
        new: &'a Object,
    },
    /// Deleted, or out of the informer's scope now.
    Deleted(&'a Object),
}

impl Change<'_> {
    /// The object as it is now, or as it was last for a deletion.
    pub fn object(&self) -> &Object {
        match self {
            Change::Applied { new, .. } => new,
            Change::Deleted(object) => object,
        }
    }
}

type Handler = Box<dyn Fn(&Change<'_>) + Send + Sync>;

/// A watch-fed cache of the objects in one [`Scope`], and the handlers told
/// about each change. Cheap to clone.
#[derive(Clone)]
pub struct Informer {
    cache: Cache,
    handlers: Arc<Mutex<Vec<Handler>>>,
    synced: watch::Receiver<bool>,
}

impl std::fmt::Debug for Informer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informer")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl Informer {
    /// Starts following `scope` through `client` until `shutdown`, filing
    /// objects under `indexes`.
    pub fn start(
        client: Client,
        scope: Scope,
        indexes: Vec<Index>,
        shutdown: CancellationToken,
    ) -> Informer {
        let (synced_tx, synced) = watch::channel(false);
        let informer = Informer {
            cache: Cache::new(indexes),
            handlers: Arc::new(Mutex::new(Vec::new())),
            synced,
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

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Calls `handler` for every object already cached (as applied) and
    /// for every later change, in order. Handlers run on the informer's
    /// task and must not block: queue work, do not do it.
    pub fn on_change(&self, handler: impl Fn(&Change<'_>) + Send + Sync + 'static) {
        let mut handlers = self.lock_handlers();
        for object in self.cache.list() {
            handler(&Change::Applied {
                old: None,
                new: &object,
            });
        }
        handlers.push(Box::new(handler));
    }

    /// Waits until the first list is in the cache.
    pub async fn synced(&self) {
        let mut synced = self.synced.clone();
        // An error means the follower is gone (shut down): nothing to wait for.
        let _ = synced.wait_for(|synced| *synced).await;
    }

    fn lock_handlers(&self) -> std::sync::MutexGuard<'_, Vec<Handler>> {
        self.handlers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn notify(&self, change: &Change<'_>) {
        for handler in self.lock_handlers().iter() {
            handler(change);
        }
    }

    fn apply(&self, object: Object) {
        if let Some((old, new)) = self.cache.apply(object) {
            self.notify(&Change::Applied {
                old: old.as_deref(),
                new: &new,
            });
        }
    }

    fn remove(&self, object: &Object) {
        if let Some(old) = self
            .cache
            .remove(&object.key(), object.metadata.resource_version)
        {
            self.notify(&Change::Deleted(&old));
        }
    }

    fn replace(&self, objects: Vec<Object>, resource_version: u64) {
        let (gone, applied) = self.cache.replace(objects, resource_version);
        for object in &gone {
            self.notify(&Change::Deleted(object));
        }
        for (old, new) in &applied {
            self.notify(&Change::Applied {
                old: old.as_deref(),
                new,
            });
        }
    }
}

/// The task behind an informer.
struct Follower {
    client: Client,
    scope: Scope,
    informer: Informer,
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

impl Follower {
    async fn run(self, shutdown: CancellationToken) {
        let mut backoff = FIRST_BACKOFF;
        let mut listed = false;
        while !shutdown.is_cancelled() {
            if !listed {
                let list = tokio::select! {
                    list = self.client.list_scope_all(&self.scope) => list,
                    () = shutdown.cancelled() => return,
                };
                match list {
                    Ok(list) => {
                        self.informer.replace(list.items, list.resource_version);
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
            opened = self.client.watch_scope(&self.scope, after) => opened,
            () = shutdown.cancelled() => return None,
        };
        let events = match opened {
            Ok(events) => events,
            Err(error) if error.status() == Some(410) => return Some(Ended::Expired),
            Err(error) => return Some(Ended::Broken(Some(error))),
        };
        futures::pin_mut!(events);
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                () = shutdown.cancelled() => return None,
            };
            match event {
                Some(Ok(event)) => match event.event_type {
                    EventType::Deleted => self.informer.remove(&event.object),
                    EventType::Added | EventType::Modified => self.informer.apply(event.object),
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
