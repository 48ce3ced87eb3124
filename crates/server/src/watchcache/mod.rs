//! The server's watch cache: every object of every kind in memory, as the
//! JSON it is served as, fed by one store watch, with a window of recent
//! changes — what Kubernetes' apiserver calls the cacher.
//!
//! Lists and watches are served from here, so they cost no store reads and
//! the JSON of an object is made once per change, not once per reader:
//! - a **list** waits until the cache has applied every write this server
//!   had made when the request came (so a client reads its own writes;
//!   [`Tracked`] remembers them), then copies out the objects in scope, in
//!   (namespace, name) order, a page at a time;
//! - a **watch** replays the window's changes after the given
//!   `resourceVersion`, then follows live ones. A watch scoped to a node,
//!   a label selector or a managing controller hears an object leave its
//!   scope as a deletion and enter it as an addition, because each change
//!   carries the facts (node, labels, manager) of the version it replaced.
//!   A watch from before the window falls back to the store's own replay
//!   (unscoped by node or manager), or is `410 Gone` so the watcher lists
//!   again.
//!
//! In-process readers (the built-in controllers, `crate::local_reads`)
//! need the object itself, not its JSON: the newest changes keep the
//! object the store sent along ([`WatchCache::shared`]), so the several
//! controllers that hear a change share it, each copying only the fields
//! its read mask keeps, instead of each parsing it.
//!
//! When the store's watch breaks (its window moved on, the backend went
//! away) the cache loads everything again and ends every open watch with
//! `Gone`: their clients list again, from the cache.

mod filter;
mod owners;
mod serve;
mod tracked;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use corral_api::watch::EventType;
use corral_api::{Kind, Object, ObjectKey};
use corral_store::{Store, StoreError, WatchFilter};
use futures::StreamExt;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

pub use filter::Scope;
pub use serve::{ListPage, ListRequest};
pub use tracked::Tracked;

/// Changes kept for watchers that resume.
pub const WINDOW: usize = 10_000;
/// Live changes buffered per watcher before it lags and re-reads the window.
const LIVE_CAPACITY: usize = 4_096;

/// How many of the newest changes keep their decoded object for
/// in-process readers: enough for every built-in controller to take a
/// burst's changes from here, few enough that the memory stays small
/// (the cache itself keeps only JSON).
const RECENT_DECODED: usize = 256;
/// How long a list waits for the cache to catch up with the store.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(10);
/// Objects read from the store per request while loading.
const LOAD_PAGE: usize = 1_000;
/// The wait before loading again after the store failed.
const RELOAD_BACKOFF: Duration = Duration::from_millis(500);

/// One object as the cache keeps it: the facts scopes filter on and the
/// JSON it is served as.
#[derive(Debug)]
pub struct CachedObject {
    pub namespace: String,
    pub name: String,
    pub resource_version: u64,
    /// `status.node` of pods and VirtualMachines.
    pub node: Option<String>,
    /// A VM's `status.migration.from`: the node it left stays in scope for
    /// its agent, which cleans up after the move.
    pub migrated_from: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// The uid `metadata.owner` names, for the dependents index.
    pub owner_uid: Option<String>,
    /// The controller its `corral.dev/managed-by` annotation names.
    pub manager: Option<String>,
    pub json: Bytes,
}

impl CachedObject {
    fn from_object(object: &Object) -> Result<Self, serde_json::Error> {
        Ok(Self::with_json(
            object,
            Bytes::from(serde_json::to_vec(object)?),
        ))
    }

    /// The cached form of a store change: its JSON is the body the store
    /// wrote when the store passed it along, else encoded here.
    fn from_event(event: &corral_api::watch::WatchEvent) -> Result<Self, serde_json::Error> {
        match &event.encoded {
            Some(json) => Ok(Self::with_json(
                &event.object,
                Bytes::copy_from_slice(json.as_bytes()),
            )),
            None => Self::from_object(&event.object),
        }
    }

    fn with_json(object: &Object, json: Bytes) -> Self {
        let key = object.key();
        CachedObject {
            namespace: key.namespace,
            name: key.name,
            resource_version: object.metadata.resource_version,
            node: object
                .status
                .get("node")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string),
            migrated_from: object
                .status
                .get("migration")
                .and_then(|migration| migration.get("from"))
                .and_then(serde_json::Value::as_str)
                .map(str::to_string),
            labels: object.metadata.labels.clone(),
            owner_uid: object
                .metadata
                .owner
                .as_ref()
                .map(|owner| owner.uid.clone()),
            manager: corral_api::manager_of(&object.metadata).map(str::to_string),
            json,
        }
    }

    /// The object, decoded again (for callers served a masked view).
    pub fn decode(&self) -> Result<Object, serde_json::Error> {
        serde_json::from_slice(&self.json)
    }
}

/// A cached object decoded: the one a recent change carries, shared with
/// everyone who reads it, or one parsed for this reader.
#[derive(Debug)]
pub enum Shared {
    Kept(Arc<corral_api::watch::WatchEvent>),
    Decoded(Box<Object>),
}

impl Shared {
    /// The object, copied only when others share it.
    pub fn into_object(self) -> Object {
        match self {
            // Not the whole event: its JSON stays with the other readers.
            Shared::Kept(event) => Arc::try_unwrap(event)
                .map_or_else(|event| event.object.clone(), |event| event.object),
            Shared::Decoded(object) => *object,
        }
    }
}

impl std::ops::Deref for Shared {
    type Target = Object;

    fn deref(&self) -> &Object {
        match self {
            Shared::Kept(event) => &event.object,
            Shared::Decoded(object) => object,
        }
    }
}

/// The facts of the version a change replaced, to tell when an object left
/// or entered a scope.
#[derive(Debug, Clone)]
pub struct PreviousFacts {
    pub node: Option<String>,
    pub migrated_from: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub manager: Option<String>,
}

/// One change, as the cache keeps it.
#[derive(Debug)]
pub struct CachedEvent {
    pub event_type: EventType,
    /// The object after the change (for a deletion, its last state).
    pub object: Arc<CachedObject>,
    pub previous: Option<PreviousFacts>,
}

/// What a kind's objects are filed under: (namespace, name).
type Objects = BTreeMap<(String, String), Arc<CachedObject>>;

#[derive(Debug, Default)]
struct State {
    kinds: HashMap<Kind, Objects>,
    /// Recent changes, oldest first, each with its kind.
    window: VecDeque<(Kind, Arc<CachedEvent>)>,
    /// Every change after this store revision is in `window`.
    window_start: u64,
    /// The store revision the cache reflects.
    resource_version: u64,
    /// Bumped at every load; a watch of an older one has missed changes.
    generation: u64,
    /// Changes applied per kind since the server started (for caches of
    /// things derived from a kind, like workflow definitions from
    /// `Controller`s).
    changes: HashMap<Kind, u64>,
    /// Every cached object that names an owner, by the owner's uid.
    dependents: owners::Dependents,
}

/// A live change or the news that the cache loaded everything again.
#[derive(Debug, Clone)]
enum Live {
    Change(Kind, Arc<CachedEvent>),
    Reloaded,
}

/// The cache. Built once per server; [`WatchCache::start`] loads it and
/// follows the store until the server stops.
#[derive(Debug)]
pub struct WatchCache {
    state: RwLock<State>,
    live: broadcast::Sender<Live>,
    /// The store revision the cache reflects, for waiters; `None` while
    /// loading.
    progress: watch::Sender<Option<u64>>,
    /// The newest revision this server wrote (see [`Tracked`]).
    written: Arc<AtomicU64>,
    /// The newest changes as the store sent them (their objects decoded),
    /// by store revision, oldest first.
    recent: Mutex<VecDeque<Arc<corral_api::watch::WatchEvent>>>,
}

impl Default for WatchCache {
    fn default() -> Self {
        WatchCache {
            state: RwLock::new(State::default()),
            live: broadcast::channel(LIVE_CAPACITY).0,
            progress: watch::channel(None).0,
            written: Arc::new(AtomicU64::new(0)),
            recent: Mutex::new(VecDeque::with_capacity(RECENT_DECODED)),
        }
    }
}

impl WatchCache {
    /// The counter a [`Tracked`] store keeps this cache's writes in.
    pub fn written(&self) -> Arc<AtomicU64> {
        self.written.clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // Writers finish each change before releasing the lock.
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Loads the cache from `store` and keeps it following the store until
    /// `stopping` is cancelled.
    pub fn start(self: &Arc<Self>, store: Arc<dyn Store>, stopping: CancellationToken) {
        let cache = self.clone();
        tokio::spawn(async move {
            while !stopping.is_cancelled() {
                let ended = tokio::select! {
                    ended = cache.load_and_follow(store.as_ref()) => ended,
                    () = stopping.cancelled() => break,
                };
                tracing::warn!(error = %ended, "watch cache lost the store's watch; loading again");
                cache.progress.send_replace(None);
                let _ = cache.live.send(Live::Reloaded);
                tokio::select! {
                    () = tokio::time::sleep(RELOAD_BACKOFF) => {}
                    () = stopping.cancelled() => break,
                }
            }
        });
    }

    /// Loads every kind, then applies the store's changes as they come.
    /// Returns why it stopped.
    async fn load_and_follow(&self, store: &dyn Store) -> StoreError {
        let start = match store.current_revision().await {
            Ok(revision) => revision,
            Err(error) => return error,
        };
        let mut kinds = HashMap::new();
        let mut dependents = owners::Dependents::default();
        // Each kind is listed at its own revision, all at or after `start`:
        // replaying the changes after `start` brings them to one revision
        // (a change older than a cached object is skipped).
        let mut listed_through = start;
        for kind in Kind::ALL {
            let mut objects = Objects::new();
            let mut after = None;
            // In pages: etcd refuses a single answer of more than 4 MiB.
            loop {
                let page = match store.list_page(kind, None, LOAD_PAGE, after.as_ref()).await {
                    Ok(page) => page,
                    Err(error) => return error,
                };
                listed_through = listed_through.max(page.resource_version);
                for object in &page.objects {
                    match CachedObject::from_object(object) {
                        Ok(cached) => {
                            dependents.add(kind, &cached);
                            let slot = (cached.namespace.clone(), cached.name.clone());
                            objects.insert(slot, Arc::new(cached));
                        }
                        Err(error) => {
                            return StoreError::Corrupt(format!("{}: {error}", object.key()));
                        }
                    }
                }
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            kinds.insert(kind, objects);
        }
        let mut events = match store.watch_shared(WatchFilter::default(), start).await {
            Ok(events) => events,
            Err(error) => return error,
        };
        {
            let mut state = self.write();
            state.kinds = kinds;
            state.dependents = dependents;
            state.window.clear();
            state.window_start = listed_through;
            state.resource_version = start;
            state.generation += 1;
            for count in state.changes.values_mut() {
                *count += 1;
            }
        }
        let mut ready = false;
        if start >= listed_through {
            ready = true;
            self.progress.send_replace(Some(start));
        }
        loop {
            let event = match events.next().await {
                Some(Ok(event)) => event,
                Some(Err(error)) => return error,
                None => return StoreError::Unavailable("the store ended its watch".into()),
            };
            let revision = event.resource_version();
            if let Err(error) = self.apply(event, ready) {
                return error;
            }
            if !ready && revision >= listed_through {
                ready = true;
            }
            if ready {
                self.progress.send_replace(Some(revision));
            }
        }
    }

    /// Applies one store change; once `ready`, it joins the window and
    /// goes out to live watchers.
    fn apply(
        &self,
        event: Arc<corral_api::watch::WatchEvent>,
        ready: bool,
    ) -> Result<(), StoreError> {
        let kind = event.object.kind;
        let cached = CachedObject::from_event(&event)
            .map_err(|error| StoreError::Corrupt(format!("{}: {error}", event.object.key())))?;
        let revision = cached.resource_version;
        let slot = (cached.namespace.clone(), cached.name.clone());
        let cached = Arc::new(cached);
        let mut state = self.write();
        state.resource_version = state.resource_version.max(revision);
        *state.changes.entry(kind).or_default() += 1;
        let objects = state.kinds.entry(kind).or_default();
        let current = objects.get(&slot).cloned();
        // A replayed change older than the listed object changes nothing.
        if current
            .as_ref()
            .is_some_and(|current| current.resource_version >= revision)
        {
            return Ok(());
        }
        if event.event_type == EventType::Deleted {
            objects.remove(&slot);
        } else {
            objects.insert(slot, cached.clone());
        }
        if let Some(current) = &current {
            state.dependents.remove(kind, current);
        }
        if event.event_type != EventType::Deleted {
            state.dependents.add(kind, &cached);
        }
        if !ready {
            return Ok(());
        }
        let change = Arc::new(CachedEvent {
            event_type: event.event_type,
            object: cached,
            previous: current.map(|previous| PreviousFacts {
                node: previous.node.clone(),
                migrated_from: previous.migrated_from.clone(),
                labels: previous.labels.clone(),
                manager: previous.manager.clone(),
            }),
        });
        state.window.push_back((kind, change.clone()));
        while state.window.len() > WINDOW {
            if let Some((_, oldest)) = state.window.pop_front() {
                state.window_start = oldest.object.resource_version;
            }
        }
        drop(state);
        // Kept before the watchers hear of it, so they find it.
        self.remember_decoded(event);
        // No receiver is fine: nobody is watching.
        let _ = self.live.send(Live::Change(kind, change));
        Ok(())
    }

    /// Keeps the object of `event`, just applied, for
    /// [`WatchCache::shared`] (shared with the store's other watchers).
    fn remember_decoded(&self, event: Arc<corral_api::watch::WatchEvent>) {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        // A replayed change older than the newest kept would break the
        // order `shared` searches by; it is not needed anyway.
        if recent
            .back()
            .is_some_and(|newest| newest.resource_version() >= event.resource_version())
        {
            return;
        }
        if recent.len() == RECENT_DECODED {
            recent.pop_front();
        }
        recent.push_back(event);
    }

    /// `cached` as an object: the one the store sent, shared, when it is
    /// among the newest changes, else parsed from its JSON.
    pub fn shared(&self, cached: &CachedObject) -> Result<Shared, serde_json::Error> {
        match self.kept(cached) {
            Some(event) => Ok(Shared::Kept(event)),
            None => cached
                .decode()
                .map(|object| Shared::Decoded(Box::new(object))),
        }
    }

    /// The change the store sent for `cached`, when it is among the
    /// newest.
    fn kept(&self, cached: &CachedObject) -> Option<Arc<corral_api::watch::WatchEvent>> {
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        // Store revisions are unique and the deque is in their order.
        let index = recent
            .binary_search_by_key(&cached.resource_version, |event| event.resource_version())
            .ok()?;
        recent.get(index).cloned().filter(|event| {
            event.object.metadata.name == cached.name
                && event
                    .object
                    .metadata
                    .namespace
                    .as_deref()
                    .unwrap_or_default()
                    == cached.namespace
        })
    }

    /// Object `key` as the cache has it, when the cache has applied every
    /// write this server made (it does not wait): `None` when it has not,
    /// or has no such object. Another server's newer write may still be on
    /// its way, so only a write made conditional on exactly this version
    /// may rest on the answer (the store refuses it if the object moved
    /// on); any other decision reads the store.
    pub fn current(&self, key: &ObjectKey) -> Option<Shared> {
        let written = self.written.load(Ordering::SeqCst);
        if !self.progress.borrow().is_some_and(|seen| seen >= written) {
            return None;
        }
        let cached = self
            .read()
            .kinds
            .get(&key.kind)?
            .get(&(key.namespace.clone(), key.name.clone()))?
            .clone();
        self.shared(&cached).ok()
    }

    /// Waits until the cache reflects store revision `revision`, for at
    /// most `timeout`.
    async fn caught_up(&self, revision: u64, timeout: Duration) -> Result<(), ApiWait> {
        let mut progress = self.progress.subscribe();
        let waited = tokio::time::timeout(
            timeout,
            progress.wait_for(|seen| seen.is_some_and(|seen| seen >= revision)),
        )
        .await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) | Err(_) => Err(ApiWait { revision }),
        }
    }

    /// Waits until the cache has every write this server made so far.
    async fn has_own_writes(&self) -> Result<(), ApiWait> {
        let written = self.written.load(Ordering::SeqCst);
        self.caught_up(written, CATCH_UP_TIMEOUT).await
    }

    /// How many changes of `kind` the cache has applied: a different
    /// answer means something of that kind changed.
    pub fn changes_of(&self, kind: Kind) -> u64 {
        self.read().changes.get(&kind).copied().unwrap_or_default()
    }

    /// The number of cached objects of `kind` (for metrics).
    pub fn count(&self, kind: Kind) -> usize {
        self.read().kinds.get(&kind).map_or(0, BTreeMap::len)
    }
}

/// The cache did not reach a revision in time.
#[derive(Debug)]
struct ApiWait {
    revision: u64,
}

impl From<ApiWait> for crate::error::ApiError {
    fn from(wait: ApiWait) -> Self {
        crate::error::ApiError::Unavailable(format!(
            "the watch cache has not caught up with store revision {} yet; try again",
            wait.revision
        ))
    }
}

#[cfg(test)]
mod tests;
