//! The embedded store: one SQLite database in WAL mode, fsynced on every
//! commit.
//!
//! One connection sits behind a mutex and all work runs on tokio's blocking
//! pool; no lock is held across an `.await`. Every write is one transaction
//! that bumps the store revision, writes the object, appends a watch event
//! and, when the spec changed, a history revision — committed before the
//! method returns. Watch events are broadcast after the commit while the
//! connection lock is still held, so the channel sees them in store-revision
//! order.

mod export;
mod history;
mod objects;
mod schema;
mod steplogs;
mod watch;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use corral_api::history::CompactionPolicy;
use corral_api::workflow::StepLogEntry;
use corral_api::{HistoryQuery, Kind, Object, ObjectKey, RevisionRecord};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::broadcast;

use crate::conformance::EventRetention;
use crate::{
    ChangeMeta, CompactionReport, HistorySize, LeaseRecord, ListResult, StepLogFilter, Store,
    StoreError, TokenRecord, WatchEvent, WatchFilter, WatchStream,
};

pub use schema::SCHEMA_VERSION;

/// How many watch events are kept by default; a watch from further back
/// gets [`StoreError::Expired`] and must list again.
pub const DEFAULT_EVENT_RETENTION: u64 = 100_000;

/// Live events buffered per watcher before it lags and re-reads the table.
const BROADCAST_CAPACITY: usize = 4096;

/// The SQLite implementation of [`Store`]. Cheap to clone; clones share one
/// connection.
#[derive(Clone)]
pub struct SqliteStore {
    shared: Arc<Shared>,
}

/// What the store's tasks share.
struct Shared {
    conn: Mutex<Connection>,
    /// Node leases: soft state in memory, never on disk (a renewal every
    /// few seconds per node needs no fsync; after a restart nodes renew
    /// within one heartbeat).
    leases: Mutex<std::collections::HashMap<String, LeaseRecord>>,
    events: broadcast::Sender<Arc<WatchEvent>>,
    event_retention: AtomicU64,
    path: Option<PathBuf>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.shared.path)
            .field(
                "event_retention",
                &self.shared.event_retention.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and migrates its
    /// schema.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let mut conn = Connection::open(path)?;
        schema::prepare(&mut conn, true)?;
        Ok(Self::from_connection(
            conn,
            Some(path.to_path_buf()),
            BROADCAST_CAPACITY,
        ))
    }

    /// A private database that lives as long as the store; for tests.
    pub fn open_in_memory() -> Result<SqliteStore, StoreError> {
        let mut conn = Connection::open_in_memory()?;
        schema::prepare(&mut conn, false)?;
        Ok(Self::from_connection(conn, None, BROADCAST_CAPACITY))
    }

    fn from_connection(conn: Connection, path: Option<PathBuf>, capacity: usize) -> SqliteStore {
        let (events, _) = broadcast::channel(capacity);
        SqliteStore {
            shared: Arc::new(Shared {
                conn: Mutex::new(conn),
                leases: Mutex::new(std::collections::HashMap::new()),
                events,
                event_retention: AtomicU64::new(DEFAULT_EVENT_RETENTION),
                path,
            }),
        }
    }

    /// Keeps only the newest `count` watch events from the next write on.
    pub fn set_event_retention(&self, count: u64) {
        self.shared
            .event_retention
            .store(count.max(1), Ordering::Relaxed);
    }

    /// Forgets the watch events up to and including store revision
    /// `through`; a watch from before it gets [`StoreError::Expired`].
    pub async fn compact_events(&self, through: u64) -> Result<(), StoreError> {
        self.blocking(move |conn, _| objects::compact_events(conn, through))
            .await
    }

    /// The whole store, for moving it to another backend (see
    /// [`crate::dump`]).
    pub async fn export(&self) -> Result<crate::dump::Dump, StoreError> {
        self.blocking(|conn, _| export::export(conn)).await
    }

    async fn blocking<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Shared) -> Result<T, StoreError> + Send + 'static,
    {
        run_blocking(Arc::clone(&self.shared), work).await
    }
}

/// Runs `work` with the connection on the blocking pool.
async fn run_blocking<T, F>(shared: Arc<Shared>, work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce(&mut Connection, &Shared) -> Result<T, StoreError> + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        // A panic while holding the lock left no transaction open (it rolls
        // back on drop), so the connection is still usable.
        let mut conn = shared.conn.lock().unwrap_or_else(PoisonError::into_inner);
        work(&mut conn, &shared)
    })
    .await?
}

#[async_trait]
impl Store for SqliteStore {
    async fn current_revision(&self) -> Result<u64, StoreError> {
        self.blocking(|conn, _| schema::get_meta(conn, schema::META_REVISION))
            .await
    }

    async fn get(&self, key: &ObjectKey) -> Result<Option<Object>, StoreError> {
        let key = key.clone();
        self.blocking(move |conn, _| objects::load(conn, &key))
            .await
    }

    async fn list(&self, kind: Kind, namespace: Option<&str>) -> Result<ListResult, StoreError> {
        let namespace = namespace.map(str::to_string);
        self.blocking(move |conn, _| objects::list(conn, kind, namespace.as_deref()))
            .await
    }

    async fn create(&self, object: Object, change: &ChangeMeta) -> Result<Object, StoreError> {
        let change = change.clone();
        self.blocking(move |conn, shared| objects::create(conn, shared, object, &change))
            .await
    }

    async fn update(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
    ) -> Result<Object, StoreError> {
        let change = change.clone();
        self.blocking(move |conn, shared| objects::update(conn, shared, object, expected, &change))
            .await
    }

    async fn delete(
        &self,
        key: &ObjectKey,
        expected: Option<u64>,
        change: &ChangeMeta,
    ) -> Result<Object, StoreError> {
        let (key, change) = (key.clone(), change.clone());
        self.blocking(move |conn, shared| objects::delete(conn, shared, &key, expected, &change))
            .await
    }

    async fn watch(&self, filter: WatchFilter, after: u64) -> Result<WatchStream, StoreError> {
        watch::watch(Arc::clone(&self.shared), filter, after).await
    }

    async fn history(&self, key: &ObjectKey) -> Result<Vec<RevisionRecord>, StoreError> {
        let key = key.clone();
        self.blocking(move |conn, _| history::history(conn, &key))
            .await
    }

    async fn revision(&self, key: &ObjectKey, revision: u64) -> Result<RevisionRecord, StoreError> {
        let key = key.clone();
        self.blocking(move |conn, _| history::revision(conn, &key, revision))
            .await
    }

    async fn query_history(&self, query: &HistoryQuery) -> Result<Vec<RevisionRecord>, StoreError> {
        let query = query.clone();
        self.blocking(move |conn, _| history::query(conn, &query))
            .await
    }

    async fn compact_history(
        &self,
        policy: CompactionPolicy,
        now: DateTime<Utc>,
    ) -> Result<CompactionReport, StoreError> {
        self.blocking(move |conn, _| history::compact(conn, policy, now))
            .await
    }

    async fn history_size(&self) -> Result<HistorySize, StoreError> {
        self.blocking(|conn, _| history::size(conn)).await
    }

    async fn put_token(&self, token: TokenRecord) -> Result<(), StoreError> {
        self.blocking(move |conn, _| {
            let identity = serde_json::to_string(&token.identity)
                .map_err(schema::corrupt_json("token identity"))?;
            conn.execute(
                "INSERT INTO tokens (hash, identity, created_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (hash) DO UPDATE
                 SET identity = excluded.identity, created_at = excluded.created_at",
                params![token.hash, identity, schema::time_to_text(token.created_at)],
            )?;
            Ok(())
        })
        .await
    }

    async fn renew_lease(&self, lease: LeaseRecord) -> Result<(), StoreError> {
        self.shared
            .leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(lease.name.clone(), lease);
        Ok(())
    }

    async fn find_lease(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        Ok(self
            .shared
            .leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned())
    }

    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>, StoreError> {
        let hash = hash.to_string();
        self.blocking(move |conn, _| {
            let row: Option<(String, String)> = conn
                .query_row(
                    "SELECT identity, created_at FROM tokens WHERE hash = ?1",
                    [&hash],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            let Some((identity, created_at)) = row else {
                return Ok(None);
            };
            Ok(Some(TokenRecord {
                identity: serde_json::from_str(&identity)
                    .map_err(schema::corrupt_json("token identity"))?,
                created_at: schema::time_from_text(&created_at)?,
                hash,
            }))
        })
        .await
    }

    async fn append_step_logs(&self, entries: &[StepLogEntry]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let entries = entries.to_vec();
        self.blocking(move |conn, _| steplogs::append(conn, &entries))
            .await
    }

    async fn step_logs(
        &self,
        uid: &str,
        filter: &StepLogFilter,
    ) -> Result<Vec<StepLogEntry>, StoreError> {
        let (uid, filter) = (uid.to_string(), filter.clone());
        self.blocking(move |conn, _| steplogs::read(conn, &uid, &filter))
            .await
    }
}

#[async_trait]
impl EventRetention for SqliteStore {
    async fn compact_events(&self, through: u64) -> Result<(), StoreError> {
        SqliteStore::compact_events(self, through).await
    }
}

#[cfg(test)]
mod tests;
