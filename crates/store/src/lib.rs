//! corral's store: objects, revisions, authored history and watch.
//!
//! The [`Store`] trait is what the API server programs against. It is shaped
//! so that both the embedded SQLite implementation ([`sqlite::SqliteStore`])
//! and a later etcd implementation fit: every write gets a cluster-wide,
//! monotonically increasing store revision (the object's `resourceVersion`,
//! like etcd's `mod_revision`), updates are compare-and-swap on it, and watch
//! replays every change after a given store revision.
//!
//! The store decides nothing about *who* may write: authentication, admission
//! and field ownership happen in the server before a call reaches it. It
//! does decide what a spec revision is: a write whose spec differs from the
//! stored one bumps `metadata.revision` and appends a history record; a
//! status-only write does not.

pub mod codec;
pub mod conformance;
pub mod dump;
pub mod sqlite;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use corral_api::history::CompactionPolicy;
use corral_api::workflow::StepLogEntry;
use corral_api::{AuthorClass, HistoryQuery, Identity, Kind, Object, ObjectKey, RevisionRecord};
use futures::Stream;
use serde::{Deserialize, Serialize};

/// Who makes a change, why, and when. Time is passed in so that stores stay
/// deterministic under test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeMeta {
    pub author: String,
    pub class: AuthorClass,
    pub message: String,
    pub time: DateTime<Utc>,
    /// Record a revision even if the spec did not change: a system event in
    /// the object's life that history must show (a pod moving to another
    /// node). The revision carries the unchanged spec.
    pub always_record: bool,
}

pub use corral_api::watch::{EventType, WatchEvent};

/// The object of a write's event ([`Store::update_logged_event`]): moved
/// out when nothing else holds the event, copied otherwise.
pub fn written_object(event: Arc<WatchEvent>) -> Object {
    Arc::try_unwrap(event).map_or_else(|shared| shared.object.clone(), |event| event.object)
}

/// Which objects a watch follows; `None` means any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchFilter {
    pub kind: Option<Kind>,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl WatchFilter {
    pub fn admits(&self, object: &Object) -> bool {
        let key = object.key();
        self.kind.is_none_or(|kind| kind == key.kind)
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == key.namespace)
            && self.name.as_ref().is_none_or(|name| *name == key.name)
    }
}

/// A stream of changes in store-revision order.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, StoreError>> + Send>>;

/// A [`WatchStream`] whose events are shared with the store's other
/// watchers ([`Store::watch_shared`]).
pub type SharedWatchStream =
    Pin<Box<dyn Stream<Item = Result<Arc<WatchEvent>, StoreError>> + Send>>;

/// The objects of a list and the store revision they were read at; a watch
/// started from that revision misses nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct ListResult {
    pub objects: Vec<Object>,
    pub resource_version: u64,
}

/// Where the next page of a list starts: after the object with this
/// namespace and name (`""` for cluster-wide kinds). Opaque to API clients,
/// which get it encoded as a `continue` token.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ListContinue {
    pub namespace: String,
    pub name: String,
}

impl ListContinue {
    /// The position right after `object`.
    pub fn after(object: &Object) -> ListContinue {
        let key = object.key();
        ListContinue {
            namespace: key.namespace,
            name: key.name,
        }
    }
}

/// One page of a list: consistent in itself (read at `resource_version`),
/// not with the other pages.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage {
    pub objects: Vec<Object>,
    /// The store revision this page was read at.
    pub resource_version: u64,
    /// Where the next page starts; `None` when this page is the last.
    pub next: Option<ListContinue>,
}

/// How many watch events a store keeps to replay from, like etcd's
/// compaction window: an event goes once it is more than `count` store
/// revisions behind the newest, or older than `max_age` (measured against
/// the newest write's time, so an idle store keeps its last events). A
/// watch from before the window gets [`StoreError::Expired`] and lists
/// again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventWindow {
    pub count: u64,
    pub max_age: Duration,
}

impl EventWindow {
    /// The default window: 10,000 events, 10 minutes.
    pub const DEFAULT: EventWindow = EventWindow {
        count: 10_000,
        max_age: Duration::from_secs(10 * 60),
    };
}

impl Default for EventWindow {
    fn default() -> EventWindow {
        EventWindow::DEFAULT
    }
}

/// Sizes of the stored history, to check that compression pays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistorySize {
    pub revisions: u64,
    /// Bytes of the specs as stored (encoded).
    pub stored_bytes: u64,
    /// Bytes the same specs take as full JSON copies.
    pub raw_bytes: u64,
}

/// What a compaction removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionReport {
    pub revisions_removed: u64,
    /// Step-log entries trimmed with the history (see
    /// [`STEP_LOG_ENTRIES_KEPT`]).
    #[serde(default)]
    pub step_log_entries_removed: u64,
}

/// The step-log entries a compaction keeps of each object: at least its
/// newest this many (see [`Store::compact_history`]). An object keeps
/// [`corral_api::workflow::KEPT_INSTANCES`] workflow instances, a few dozen
/// entries each, so `why` and `logs --steps` lose nothing they show;
/// without a bound, every revision's instance added its entries for good.
pub const STEP_LOG_ENTRIES_KEPT: usize = 1000;

/// A stored bearer token: only its hash is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Hex SHA-256 of the token.
    pub hash: String,
    pub identity: Identity,
    pub created_at: DateTime<Utc>,
    /// When it last authenticated a request, to within a few minutes
    /// (servers write it at most every few minutes per token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<DateTime<Utc>>,
}

/// One sealed value: an opaque name and the bytes kept under it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedRecord {
    pub name: String,
    #[serde(with = "sealed_bytes")]
    pub value: Vec<u8>,
}

/// Sealed bytes as base64 in JSON (dumps, etcd values).
mod sealed_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(value))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// A node's lease: the last time it said it is alive. Soft state: kept
/// apart from objects (renewing it is no object write, no watch event, no
/// history), and a store may lose it on restart — a node that is alive
/// renews it within seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRecord {
    /// The node's name.
    pub name: String,
    /// Who renewed it (the node's identity).
    pub holder: String,
    pub renewed_at: DateTime<Utc>,
    /// The fencing period granted with this renewal, in seconds: the node
    /// stops its ha pods if it cannot renew for that long
    /// (`corral_api::fencing`). Absent in leases of older servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_after_seconds: Option<u64>,
}

/// Which step log entries of one object to read; `None` means any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepLogFilter {
    /// Only entries about this step (`acme/slow-mount`).
    pub step: Option<String>,
    /// Only entries about steps of this owner (`acme-storage`).
    pub owner: Option<String>,
    /// Only entries of this workflow instance (`start-1`).
    pub workflow_id: Option<String>,
}

impl StepLogFilter {
    pub fn admits(&self, entry: &StepLogEntry) -> bool {
        self.step.as_ref().is_none_or(|step| *step == entry.step)
            && self
                .owner
                .as_ref()
                .is_none_or(|owner| *owner == entry.owner)
            && self
                .workflow_id
                .as_ref()
                .is_none_or(|id| *id == entry.workflow_id)
    }
}

/// Everything that can go wrong in a store. Variants are what callers branch
/// on; the server maps each to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{key} not found")]
    NotFound { key: ObjectKey },
    #[error("{key} already exists")]
    AlreadyExists { key: ObjectKey },
    #[error(
        "{key} was changed by someone else: resourceVersion {expected} is stale, the current one is {actual}; get the object again and reapply"
    )]
    Conflict {
        key: ObjectKey,
        expected: u64,
        actual: u64,
    },
    #[error("revision {revision} of {key} is not in history (kept: {kept})")]
    RevisionNotFound {
        key: ObjectKey,
        revision: u64,
        kept: String,
    },
    #[error(
        "watch from resourceVersion {requested} is no longer possible: changes up to {compacted} were compacted; list again"
    )]
    Expired { requested: u64, compacted: u64 },
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("store task failed")]
    Join(#[from] tokio::task::JoinError),
    #[error("store backend unavailable: {0}")]
    Unavailable(String),
}

/// The cluster's source of truth. See the crate docs for the contract.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The newest store revision (0 for an empty store).
    async fn current_revision(&self) -> Result<u64, StoreError>;

    async fn get(&self, key: &ObjectKey) -> Result<Option<Object>, StoreError>;

    /// Objects of a kind, in one namespace or all (`None`), sorted by
    /// namespace then name.
    async fn list(&self, kind: Kind, namespace: Option<&str>) -> Result<ListResult, StoreError>;

    /// At most `limit` (at least 1) objects of a kind, in one namespace or
    /// all, after `after` (from the start when `None`), in the backend's
    /// key order: by namespace then name, except that etcd puts a
    /// namespace before another that it extends with `-` (`a-b` before
    /// `a`). Every object present through the whole walk is on exactly one
    /// page; objects created or deleted meanwhile may or may not be.
    async fn list_page(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        limit: usize,
        after: Option<&ListContinue>,
    ) -> Result<ListPage, StoreError>;

    /// Stores a new object. The caller sets `metadata.uid` and
    /// `metadata.createdAt`; the store sets `revision` to 1 and
    /// `resourceVersion`, and records revision 1 in history.
    async fn create(&self, object: Object, change: &ChangeMeta) -> Result<Object, StoreError>;

    /// Replaces an object if its current `resourceVersion` is `expected`.
    /// `uid`, `createdAt` and `revision` are kept from the stored object; a
    /// changed spec (or a change with `always_record`) bumps `revision` and
    /// appends a history record.
    async fn update(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
    ) -> Result<Object, StoreError>;

    /// [`Store::create`] and then [`Store::append_step_logs`] of `logs`
    /// (the log of what the write did): in one transaction where the
    /// backend can, so the object and its log land together, with one
    /// commit. The default makes the two calls.
    async fn create_logged(
        &self,
        object: Object,
        change: &ChangeMeta,
        logs: &[StepLogEntry],
    ) -> Result<Object, StoreError> {
        let created = self.create(object, change).await?;
        self.append_step_logs(logs).await?;
        Ok(created)
    }

    /// [`Store::update`] and then [`Store::append_step_logs`] of `logs`,
    /// like [`Store::create_logged`].
    async fn update_logged(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
        logs: &[StepLogEntry],
    ) -> Result<Object, StoreError> {
        let updated = self.update(object, expected, change).await?;
        self.append_step_logs(logs).await?;
        Ok(updated)
    }

    /// [`Store::update_logged`], answering with the change's event: the
    /// object and, when the store made them, the JSON bytes it stored
    /// (`encoded`), so a caller that answers with the object sends those
    /// instead of copying and encoding it again ([`written_object`] takes
    /// the object out). The default wraps `update_logged`'s object.
    async fn update_logged_event(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
        logs: &[StepLogEntry],
    ) -> Result<Arc<WatchEvent>, StoreError> {
        let updated = self.update_logged(object, expected, change, logs).await?;
        Ok(Arc::new(WatchEvent::new(EventType::Modified, updated)))
    }

    /// Removes an object, if `expected` is given only at that
    /// `resourceVersion`. History keeps a record of the deletion.
    async fn delete(
        &self,
        key: &ObjectKey,
        expected: Option<u64>,
        change: &ChangeMeta,
    ) -> Result<Object, StoreError>;

    /// Every change after store revision `after` that passes the filter,
    /// then live changes, in order, until the stream is dropped.
    async fn watch(&self, filter: WatchFilter, after: u64) -> Result<WatchStream, StoreError>;

    /// [`Store::watch`], each event shared with the store's other watchers
    /// instead of copied for this one, where the backend can (one that
    /// broadcasts its changes hands out the broadcast's event).
    async fn watch_shared(
        &self,
        filter: WatchFilter,
        after: u64,
    ) -> Result<SharedWatchStream, StoreError> {
        use futures::TryStreamExt;
        Ok(Box::pin(self.watch(filter, after).await?.map_ok(Arc::new)))
    }

    /// The revisions of the object at `key` (the live one, or the last one
    /// deleted under that key), oldest first, without specs.
    async fn history(&self, key: &ObjectKey) -> Result<Vec<RevisionRecord>, StoreError>;

    /// The newest `limit` (at least one) of [`Store::history`]'s records,
    /// oldest first: what reads the latest revisions of an object whose
    /// history is long. The default reads them all and keeps the newest.
    async fn recent_history(
        &self,
        key: &ObjectKey,
        limit: usize,
    ) -> Result<Vec<RevisionRecord>, StoreError> {
        let mut records = self.history(key).await?;
        let older = records.len().saturating_sub(limit.max(1));
        records.drain(..older);
        Ok(records)
    }

    /// One revision with its spec.
    async fn revision(&self, key: &ObjectKey, revision: u64) -> Result<RevisionRecord, StoreError>;

    /// Cluster-wide history, oldest first, without specs.
    async fn query_history(&self, query: &HistoryQuery) -> Result<Vec<RevisionRecord>, StoreError>;

    /// Drops revisions the policy does not keep (see
    /// [`CompactionPolicy::doomed`]); never an object's current one.
    ///
    /// Unless the policy is [`CompactionPolicy::All`] (keep everything), it
    /// also trims the step log of each object that has history: an object
    /// keeps at least its newest [`STEP_LOG_ENTRIES_KEPT`] entries and at
    /// most those of its newest that many appends (SQLite keeps exactly
    /// that many entries; etcd, which stores an append as one key, that
    /// many appends), and one with no revision left — deleted, its history
    /// compacted away — keeps none.
    async fn compact_history(
        &self,
        policy: CompactionPolicy,
        now: DateTime<Utc>,
    ) -> Result<CompactionReport, StoreError>;

    async fn history_size(&self) -> Result<HistorySize, StoreError>;

    async fn put_token(&self, token: TokenRecord) -> Result<(), StoreError>;

    /// Records a node's lease renewal.
    async fn renew_lease(&self, lease: LeaseRecord) -> Result<(), StoreError>;

    /// A node's lease, if it renewed one since the store (or, for soft
    /// state, the process) started.
    async fn find_lease(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError>;

    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>, StoreError>;

    /// Every token record, oldest first.
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError>;

    /// Removes the tokens with these hashes (revocation), all or none;
    /// unknown hashes are ignored.
    async fn delete_tokens(&self, hashes: &[String]) -> Result<(), StoreError>;

    /// Records that the token with `hash` was used at `at`, if it still
    /// exists: a revoked token is never written back.
    async fn touch_token(&self, hash: &str, at: DateTime<Utc>) -> Result<(), StoreError>;

    /// Sealed values (a Secret's encrypted data) by name: bytes kept without
    /// history or watch events, never interpreted by the store.
    async fn get_sealed(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Every sealed value whose name starts with `prefix`, ordered by name.
    async fn list_sealed(&self, prefix: &str) -> Result<Vec<SealedRecord>, StoreError>;

    /// Writes every record of `put` and removes the names in `remove`, all
    /// or none, durably before it returns.
    async fn write_sealed(&self, put: &[SealedRecord], remove: &[String])
    -> Result<(), StoreError>;

    /// Appends workflow step log entries (engine transitions and lines step
    /// owners wrote), all or none. They outlive the object they are about.
    async fn append_step_logs(&self, entries: &[StepLogEntry]) -> Result<(), StoreError>;

    /// The step log of the object with `uid` that passes the filter, ordered
    /// by time, then by the order they were appended.
    async fn step_logs(
        &self,
        uid: &str,
        filter: &StepLogFilter,
    ) -> Result<Vec<StepLogEntry>, StoreError>;
}

/// The revisions history kept, as [`StoreError::RevisionNotFound`] names
/// them: `1-3, 7, 9-12`, or `none`.
pub fn describe_kept(revisions: impl IntoIterator<Item = u64>) -> String {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for revision in revisions {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == revision => *end = revision,
            _ => ranges.push((revision, revision)),
        }
    }
    if ranges.is_empty() {
        return "none".to_string();
    }
    ranges
        .iter()
        .map(|&(start, end)| {
            if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::describe_kept;

    #[test]
    fn kept_revisions_read_as_ranges() {
        assert_eq!(describe_kept([]), "none");
        assert_eq!(describe_kept([4]), "4");
        assert_eq!(describe_kept([1, 2, 3, 7, 9, 10, 11, 12]), "1-3, 7, 9-12");
    }
}
