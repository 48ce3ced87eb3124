//! corral's store on a real etcd cluster: the [`corral_store::Store`] trait
//! (objects, revisions, delta-compressed history, watch, compare-and-swap)
//! implemented with etcd transactions, plus the controller leader election
//! on an etcd lease ([`leader`]).
//!
//! etcd is the consensus layer; this crate adds none of its own. A write is
//! acknowledged after etcd's raft commit (a quorum has it in its WAL) —
//! that is the durability contract. The store revision (`resourceVersion`)
//! is etcd's revision minus one, global and monotonic across every corral
//! server on the same cluster, so a watch resumes on any server. See
//! [`keys`] for the layout.
//!
//! This crate must not decide who may write (the server does), and must not
//! trust anything it remembers between calls: several servers share the
//! cluster. It remembers only its own last write of each object, and a
//! write built on that memory carries a compare of the key's value, so
//! etcd checks it ([`last_written`]).

mod config;
mod history;
mod import;
mod keys;
mod last_written;
pub mod leader;
mod objects;
mod records;
mod retry;
mod watch;
mod window;
mod writes;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use corral_api::history::CompactionPolicy;
use corral_api::workflow::StepLogEntry;
use corral_api::{HistoryQuery, Kind, Object, ObjectKey, RevisionRecord};
use corral_store::conformance::EventRetention;
use corral_store::{
    ChangeMeta, CompactionReport, EventWindow, HistorySize, LeaseRecord, ListContinue, ListPage,
    ListResult, SealedRecord, StepLogFilter, Store, StoreError, TokenRecord, WatchFilter,
    WatchStream,
};
use etcd_client::{Client, GetOptions, KeyValue};

pub use config::{
    CONNECT_TIMEOUT, ConfigError, DEFAULT_PREFIX, Datastore, EtcdConfig, EtcdTls, REQUEST_TIMEOUT,
};
pub use import::ImportError;
use keys::{Keys, etcd_revision, store_revision};
pub use retry::KvCalls;

/// Why connecting to etcd failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("etcd settings")]
    Config(#[from] ConfigError),
    #[error("connecting to etcd at {endpoints}")]
    Connect {
        endpoints: String,
        #[source]
        source: etcd_client::Error,
    },
}

/// The etcd implementation of [`Store`]. Cheap to clone; clones share the
/// client's connections.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    keys: Keys,
    config: EtcdConfig,
    /// Which writes need controller leadership, and its fence.
    fencing: Option<Arc<leader::FencePolicy>>,
    /// The watch-event window this store compacts etcd to (see [`window`]).
    window: Arc<Mutex<window::WindowState>>,
    counters: Arc<retry::KvCounters>,
    /// This store's last write of each object, re-validated by etcd in
    /// every transaction that relies on it (see [`last_written`]).
    last_written: Arc<Mutex<last_written::LastWritten>>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.config.endpoints)
            .field("prefix", &self.config.prefix)
            .field("fencing", &self.fencing)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the cluster and checks that it answers.
    pub async fn connect(config: &EtcdConfig) -> Result<EtcdStore, ConnectError> {
        let options = config.connect_options()?;
        let connect_error = |source| ConnectError::Connect {
            endpoints: config.endpoints.join(","),
            source,
        };
        let mut client = Client::connect(&config.endpoints, Some(options))
            .await
            .map_err(connect_error)?;
        let keys = Keys::new(&config.prefix);
        // One read, so a wrong address fails here and not on first use.
        client
            .get(keys.probe(), Some(GetOptions::new().with_count_only()))
            .await
            .map_err(connect_error)?;
        Ok(EtcdStore {
            client,
            keys,
            config: config.clone(),
            fencing: None,
            window: Arc::default(),
            counters: Arc::default(),
            last_written: Arc::default(),
        })
    }

    /// Sets the watch-event window from the next write on (default
    /// [`EventWindow::DEFAULT`]): this store compacts etcd's history so
    /// that it keeps about `count` revisions and `max_age` of them. A watch
    /// from before the window gets [`StoreError::Expired`].
    pub fn set_event_window(&self, window: EventWindow) {
        self.window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_window(window);
    }

    /// Applies the event window after this store's write of store revision
    /// `revision` at `time`. The write is acknowledged whatever happens
    /// here: a failed compaction is logged and tried again later.
    pub(crate) async fn after_write(&self, time: DateTime<Utc>, revision: u64) {
        let through = self
            .window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .after_write(time, revision);
        let Some(through) = through else { return };
        // Logical compaction: etcd frees the space in the background.
        let target = etcd_revision(through) + 1;
        if let Err(error) = self.kv().compact(target, None).await {
            // Another server compacting further first is the usual cause.
            tracing::debug!(%error, through, "compacting etcd to the event window");
        }
    }

    /// The same store, whose writes by the policy's leader-only authors
    /// succeed only while this server's leadership fence holds (see
    /// [`leader`]); reads and other writers are unaffected.
    pub fn with_fencing(&self, policy: Arc<leader::FencePolicy>) -> EtcdStore {
        EtcdStore {
            fencing: Some(policy),
            ..self.clone()
        }
    }

    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// KV calls that retry transport failures (see [`retry`]).
    pub(crate) fn kv(&self) -> retry::Kv {
        retry::Kv {
            client: self.client.clone(),
            counters: Arc::clone(&self.counters),
        }
    }

    /// What this store last wrote under etcd key `key`, if its
    /// `mod_revision` is `mod_revision` (any when `None`).
    pub(crate) fn last_written(
        &self,
        key: &str,
        mod_revision: Option<i64>,
    ) -> Option<last_written::Written> {
        self.last_written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key, mod_revision)
            .cloned()
    }

    pub(crate) fn remember_written(&self, key: String, written: last_written::Written) {
        self.last_written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, written);
    }

    pub(crate) fn forget_written(&self, key: &str) {
        self.last_written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }

    /// How many KV requests this store (and its clones) made so far.
    pub fn kv_calls(&self) -> KvCalls {
        self.counters.snapshot()
    }

    /// Loads another backend's whole store (see [`corral_store::dump`])
    /// into this store's prefix, which must be empty: `corral migrate`.
    pub async fn import(&self, dump: &corral_store::dump::Dump) -> Result<(), ImportError> {
        import::import(self, dump).await
    }

    /// The underlying client, for leader election.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Forgets the watch events up to and including store revision
    /// `through` by compacting etcd's history; a watch from before it gets
    /// [`StoreError::Expired`]. Stored objects and corral's own revision
    /// history are unaffected (they are live keys).
    pub async fn compact_events(&self, through: u64) -> Result<(), StoreError> {
        let current = self.header_revision().await?;
        // etcd keeps the compaction revision itself watchable: compacting
        // at `through`'s etcd revision + 1 forgets exactly through `through`.
        let target = (etcd_revision(through) + 1).min(current);
        self.kv()
            .compact(
                target,
                Some(etcd_client::CompactionOptions::new().with_physical()),
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// etcd's current revision.
    async fn header_revision(&self) -> Result<i64, StoreError> {
        let response = self
            .kv()
            .get(self.keys.probe(), Some(GetOptions::new().with_count_only()))
            .await
            .map_err(unavailable)?;
        response
            .header()
            .map(|header| header.revision())
            .ok_or_else(|| StoreError::Corrupt("etcd answered without a header".into()))
    }

    /// The fence a write by this change's author must carry, if any.
    fn fence_for(&self, change: &ChangeMeta) -> Result<Option<leader::Fence>, StoreError> {
        match &self.fencing {
            Some(policy) => policy.fence_for(&change.author),
            None => Ok(None),
        }
    }

    /// Every key-value under `prefix`, in key order.
    async fn range(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        let mut response = self
            .kv()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        Ok(response.take_kvs())
    }
}

/// An etcd failure as the store reports it: the backend is unavailable.
pub(crate) fn unavailable(error: etcd_client::Error) -> StoreError {
    StoreError::Unavailable(format!("etcd: {error}"))
}

pub(crate) fn corrupt_json(what: &str) -> impl FnOnce(serde_json::Error) -> StoreError + '_ {
    move |error| StoreError::Corrupt(format!("{what}: {error}"))
}

#[async_trait]
impl Store for EtcdStore {
    async fn current_revision(&self) -> Result<u64, StoreError> {
        Ok(store_revision(self.header_revision().await?))
    }

    async fn get(&self, key: &ObjectKey) -> Result<Option<Object>, StoreError> {
        objects::get(self, key)
            .await
            .map(|found| found.map(|(object, _)| object))
    }

    async fn list(&self, kind: Kind, namespace: Option<&str>) -> Result<ListResult, StoreError> {
        objects::list(self, kind, namespace).await
    }

    async fn list_page(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        limit: usize,
        after: Option<&ListContinue>,
    ) -> Result<ListPage, StoreError> {
        objects::list_page(self, kind, namespace, limit, after).await
    }

    async fn create(&self, object: Object, change: &ChangeMeta) -> Result<Object, StoreError> {
        writes::create(self, object, change).await
    }

    async fn update(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
    ) -> Result<Object, StoreError> {
        writes::update(self, object, expected, change).await
    }

    async fn delete(
        &self,
        key: &ObjectKey,
        expected: Option<u64>,
        change: &ChangeMeta,
    ) -> Result<Object, StoreError> {
        writes::delete(self, key, expected, change).await
    }

    async fn watch(&self, filter: WatchFilter, after: u64) -> Result<WatchStream, StoreError> {
        // A version from the future comes from another store (a cluster
        // migrated here from SQLite renumbers its versions): etcd would
        // wait silently until it got there, so the caller lists again.
        let current = self.current_revision().await?;
        if after > current {
            return Err(StoreError::Expired {
                requested: after,
                compacted: current,
            });
        }
        watch::watch(self, filter, after).await
    }

    async fn history(&self, key: &ObjectKey) -> Result<Vec<RevisionRecord>, StoreError> {
        history::history(self, key).await
    }

    async fn recent_history(
        &self,
        key: &ObjectKey,
        limit: usize,
    ) -> Result<Vec<RevisionRecord>, StoreError> {
        history::recent_history(self, key, limit).await
    }

    async fn revision(&self, key: &ObjectKey, revision: u64) -> Result<RevisionRecord, StoreError> {
        history::revision(self, key, revision).await
    }

    async fn query_history(&self, query: &HistoryQuery) -> Result<Vec<RevisionRecord>, StoreError> {
        history::query(self, query).await
    }

    async fn compact_history(
        &self,
        policy: CompactionPolicy,
        now: DateTime<Utc>,
    ) -> Result<CompactionReport, StoreError> {
        history::compact(self, policy, now).await
    }

    async fn history_size(&self) -> Result<HistorySize, StoreError> {
        history::size(self).await
    }

    async fn put_token(&self, token: TokenRecord) -> Result<(), StoreError> {
        records::put_token(self, token).await
    }

    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>, StoreError> {
        records::find_token(self, hash).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        records::list_tokens(self).await
    }

    async fn delete_tokens(&self, hashes: &[String]) -> Result<(), StoreError> {
        records::delete_tokens(self, hashes).await
    }

    async fn touch_token(&self, hash: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        records::touch_token(self, hash, at).await
    }

    async fn get_sealed(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        records::get_sealed(self, name).await
    }

    async fn list_sealed(&self, prefix: &str) -> Result<Vec<SealedRecord>, StoreError> {
        records::list_sealed(self, prefix).await
    }

    async fn write_sealed(
        &self,
        put: &[SealedRecord],
        remove: &[String],
    ) -> Result<(), StoreError> {
        records::write_sealed(self, put, remove).await
    }

    async fn renew_lease(&self, lease: LeaseRecord) -> Result<(), StoreError> {
        records::renew_lease(self, lease).await
    }

    async fn find_lease(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        records::find_lease(self, name).await
    }

    async fn append_step_logs(&self, entries: &[StepLogEntry]) -> Result<(), StoreError> {
        records::append_step_logs(self, entries).await
    }

    async fn step_logs(
        &self,
        uid: &str,
        filter: &StepLogFilter,
    ) -> Result<Vec<StepLogEntry>, StoreError> {
        records::step_logs(self, uid, filter).await
    }
}

#[async_trait]
impl EventRetention for EtcdStore {
    async fn compact_events(&self, through: u64) -> Result<(), StoreError> {
        EtcdStore::compact_events(self, through).await
    }

    fn set_event_window(&self, window: EventWindow) {
        EtcdStore::set_event_window(self, window);
    }
}
