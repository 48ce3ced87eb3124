//! The store as the server uses it: every call goes to the real store, and
//! the newest revision this server wrote is remembered, so a list served
//! from the cache waits until the cache has it (a client reads its own
//! writes).
//!
//! Why not the store's current revision: on etcd every write of any key
//! (a step log, a token, a lease) takes a revision, and the cache only sees
//! object writes, so it could wait for a revision no object has.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use corral_api::history::CompactionPolicy;
use corral_api::workflow::StepLogEntry;
use corral_api::{HistoryQuery, Kind, Object, ObjectKey, RevisionRecord};
use corral_store::{
    ChangeMeta, CompactionReport, HistorySize, LeaseRecord, ListContinue, ListPage, ListResult,
    SealedRecord, SharedWatchStream, StepLogFilter, Store, StoreError, TokenRecord, WatchEvent,
    WatchFilter, WatchStream,
};

/// A store that remembers the newest object write made through it.
pub struct Tracked {
    inner: Arc<dyn Store>,
    written: Arc<AtomicU64>,
}

impl std::fmt::Debug for Tracked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracked")
            .field("written", &self.written.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Tracked {
    pub fn new(inner: Arc<dyn Store>, written: Arc<AtomicU64>) -> Self {
        Tracked { inner, written }
    }

    fn note(&self, result: Result<Object, StoreError>) -> Result<Object, StoreError> {
        if let Ok(object) = &result {
            self.written
                .fetch_max(object.metadata.resource_version, Ordering::SeqCst);
        }
        result
    }
}

#[async_trait]
impl Store for Tracked {
    async fn current_revision(&self) -> Result<u64, StoreError> {
        self.inner.current_revision().await
    }

    async fn get(&self, key: &ObjectKey) -> Result<Option<Object>, StoreError> {
        self.inner.get(key).await
    }

    async fn list(&self, kind: Kind, namespace: Option<&str>) -> Result<ListResult, StoreError> {
        self.inner.list(kind, namespace).await
    }

    async fn list_page(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        limit: usize,
        after: Option<&ListContinue>,
    ) -> Result<ListPage, StoreError> {
        self.inner.list_page(kind, namespace, limit, after).await
    }

    async fn create(&self, object: Object, change: &ChangeMeta) -> Result<Object, StoreError> {
        self.note(self.inner.create(object, change).await)
    }

    async fn update(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
    ) -> Result<Object, StoreError> {
        self.note(self.inner.update(object, expected, change).await)
    }

    async fn create_logged(
        &self,
        object: Object,
        change: &ChangeMeta,
        logs: &[StepLogEntry],
    ) -> Result<Object, StoreError> {
        self.note(self.inner.create_logged(object, change, logs).await)
    }

    async fn update_logged(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
        logs: &[StepLogEntry],
    ) -> Result<Object, StoreError> {
        self.note(
            self.inner
                .update_logged(object, expected, change, logs)
                .await,
        )
    }

    async fn update_logged_event(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
        logs: &[StepLogEntry],
    ) -> Result<Arc<WatchEvent>, StoreError> {
        let event = self
            .inner
            .update_logged_event(object, expected, change, logs)
            .await?;
        self.written
            .fetch_max(event.object.metadata.resource_version, Ordering::SeqCst);
        Ok(event)
    }

    async fn delete(
        &self,
        key: &ObjectKey,
        expected: Option<u64>,
        change: &ChangeMeta,
    ) -> Result<Object, StoreError> {
        self.note(self.inner.delete(key, expected, change).await)
    }

    async fn watch(&self, filter: WatchFilter, after: u64) -> Result<WatchStream, StoreError> {
        self.inner.watch(filter, after).await
    }

    async fn watch_shared(
        &self,
        filter: WatchFilter,
        after: u64,
    ) -> Result<SharedWatchStream, StoreError> {
        self.inner.watch_shared(filter, after).await
    }

    async fn history(&self, key: &ObjectKey) -> Result<Vec<RevisionRecord>, StoreError> {
        self.inner.history(key).await
    }

    async fn recent_history(
        &self,
        key: &ObjectKey,
        limit: usize,
    ) -> Result<Vec<RevisionRecord>, StoreError> {
        self.inner.recent_history(key, limit).await
    }

    async fn revision(&self, key: &ObjectKey, revision: u64) -> Result<RevisionRecord, StoreError> {
        self.inner.revision(key, revision).await
    }

    async fn query_history(&self, query: &HistoryQuery) -> Result<Vec<RevisionRecord>, StoreError> {
        self.inner.query_history(query).await
    }

    async fn compact_history(
        &self,
        policy: CompactionPolicy,
        now: DateTime<Utc>,
    ) -> Result<CompactionReport, StoreError> {
        self.inner.compact_history(policy, now).await
    }

    async fn history_size(&self) -> Result<HistorySize, StoreError> {
        self.inner.history_size().await
    }

    async fn put_token(&self, token: TokenRecord) -> Result<(), StoreError> {
        self.inner.put_token(token).await
    }

    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>, StoreError> {
        self.inner.find_token(hash).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        self.inner.list_tokens().await
    }

    async fn delete_tokens(&self, hashes: &[String]) -> Result<(), StoreError> {
        self.inner.delete_tokens(hashes).await
    }

    async fn touch_token(
        &self,
        hash: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        self.inner.touch_token(hash, at).await
    }

    async fn get_sealed(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get_sealed(name).await
    }

    async fn list_sealed(&self, prefix: &str) -> Result<Vec<SealedRecord>, StoreError> {
        self.inner.list_sealed(prefix).await
    }

    async fn write_sealed(
        &self,
        put: &[SealedRecord],
        remove: &[String],
    ) -> Result<(), StoreError> {
        self.inner.write_sealed(put, remove).await
    }

    async fn renew_lease(&self, lease: LeaseRecord) -> Result<(), StoreError> {
        self.inner.renew_lease(lease).await
    }

    async fn find_lease(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.find_lease(name).await
    }

    async fn append_step_logs(&self, entries: &[StepLogEntry]) -> Result<(), StoreError> {
        self.inner.append_step_logs(entries).await
    }

    async fn step_logs(
        &self,
        uid: &str,
        filter: &StepLogFilter,
    ) -> Result<Vec<StepLogEntry>, StoreError> {
        self.inner.step_logs(uid, filter).await
    }
}
