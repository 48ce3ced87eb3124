//! The embedded store: one SQLite database in WAL mode, fsynced on every
//! commit.
//!
//! **Writes** (create, update, delete, step-log appends) go to one writer
//! thread through a queue ([`writer`]). The thread takes whatever has
//! queued up and applies it in one transaction; a write checks before it
//! writes, so one write's failure (`Conflict`, `AlreadyExists`,
//! `NotFound`) leaves the others alone; then it commits — one fsync for
//! the whole group, like etcd's batch_tx — broadcasts the group's watch
//! events in store-revision order, and only then answers each caller. A
//! write is acknowledged only once the commit that holds it is durable.
//!
//! **Reads** run on tokio's blocking pool on read-only connections of their
//! own (file databases; WAL lets them read the last commit while the writer
//! is in the middle of the next). An in-memory database has one
//! connection, which reads share with the writer behind a mutex.
//!
//! Rare maintenance writes (tokens, compaction) take the write connection's
//! mutex directly, between the writer's groups; no lock is held across an
//! `.await`.

mod encoded;
mod events;
mod export;
mod history;
mod objects;
mod readers;
mod schema;
mod specs;
mod steplogs;
mod tokens;
mod wal_vfs;
mod watch;
mod writer;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread::JoinHandle;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use corral_api::history::CompactionPolicy;
use corral_api::workflow::StepLogEntry;
use corral_api::{HistoryQuery, Kind, Object, ObjectKey, RevisionRecord};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{broadcast, oneshot};

use crate::conformance::EventRetention;
use crate::{
    ChangeMeta, CompactionReport, EventWindow, HistorySize, LeaseRecord, ListContinue, ListPage,
    ListResult, SealedRecord, SharedWatchStream, StepLogFilter, Store, StoreError, TokenRecord,
    WatchEvent, WatchFilter, WatchStream,
};

pub use schema::SCHEMA_VERSION;

/// Live events buffered per watcher before it lags and re-reads the table.
const BROADCAST_CAPACITY: usize = 4096;

/// The SQLite implementation of [`Store`]. Cheap to clone; clones share one
/// database and one writer thread, which stops when the last clone goes.
#[derive(Clone)]
pub struct SqliteStore {
    shared: Arc<Shared>,
}

/// What the clones of one store share: the database and the writer queue.
struct Shared {
    db: Arc<Database>,
    /// Node leases: soft state in memory, never on disk (a renewal every
    /// few seconds per node needs no fsync; after a restart nodes renew
    /// within one heartbeat).
    leases: Mutex<std::collections::HashMap<String, LeaseRecord>>,
    /// `None` only while dropping.
    writes: Option<mpsc::Sender<writer::Request>>,
    writer: Option<JoinHandle<()>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing the queue ends the writer after its current group; wait
        // for it so the database is closed when the last store is gone.
        self.writes = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// The database, its connections and the watch channel; watch streams
/// and the writer thread hold it too.
pub(super) struct Database {
    /// The write connection.
    conn: Mutex<Connection>,
    readers: readers::Readers,
    events: broadcast::Sender<Arc<WatchEvent>>,
    window: Mutex<EventWindow>,
    path: Option<PathBuf>,
    /// Group commits made, and the writes they held.
    commits: AtomicU64,
    committed_writes: AtomicU64,
}

/// How the writer has grouped writes so far (successful commits only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Transactions committed by the writer thread (one fsync each).
    pub commits: u64,
    /// Writes those transactions held, failed ones included.
    pub writes: u64,
}

impl Database {
    /// The write connection, for the writer and maintenance writes.
    fn writer(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock left no transaction open (it rolls
        // back on drop), so the connection is still usable.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn window(&self) -> EventWindow {
        *self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.shared.db.path)
            .field("event_window", &self.shared.db.window())
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and migrates its
    /// schema.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        // The writer's WAL frames reach the kernel a commit at a time
        // (design 0059); readers open the file with SQLite's own VFS.
        wal_vfs::register()?;
        let mut conn = Connection::open_with_flags_and_vfs(
            path,
            rusqlite::OpenFlags::default(),
            wal_vfs::NAME,
        )?;
        schema::prepare(&mut conn, true)?;
        Self::from_connection(conn, Some(path.to_path_buf()), BROADCAST_CAPACITY)
    }

    /// A private database that lives as long as the store; for tests.
    pub fn open_in_memory() -> Result<SqliteStore, StoreError> {
        let mut conn = Connection::open_in_memory()?;
        schema::prepare(&mut conn, false)?;
        Self::from_connection(conn, None, BROADCAST_CAPACITY)
    }

    fn from_connection(
        conn: Connection,
        path: Option<PathBuf>,
        capacity: usize,
    ) -> Result<SqliteStore, StoreError> {
        let (events, _) = broadcast::channel(capacity);
        let db = Arc::new(Database {
            conn: Mutex::new(conn),
            readers: readers::Readers::new(path.clone()),
            events,
            window: Mutex::new(EventWindow::default()),
            path,
            commits: AtomicU64::new(0),
            committed_writes: AtomicU64::new(0),
        });
        let (writes, queue) = mpsc::channel();
        let writer = writer::spawn(Arc::clone(&db), queue).map_err(|error| {
            StoreError::Unavailable(format!("starting the sqlite writer thread: {error}"))
        })?;
        Ok(SqliteStore {
            shared: Arc::new(Shared {
                db,
                leases: Mutex::new(std::collections::HashMap::new()),
                writes: Some(writes),
                writer: Some(writer),
            }),
        })
    }

    /// Sets the watch-event window from the next write on (default
    /// [`EventWindow::DEFAULT`]). A count of 0 is taken as 1, and one over
    /// the event ring's 10,000 slots as 10,000 (design 0057).
    pub fn set_event_window(&self, window: EventWindow) {
        let window = EventWindow {
            count: window.count.clamp(1, events::EVENT_SLOTS),
            ..window
        };
        *self
            .shared
            .db
            .window
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = window;
    }

    /// How many group commits the writer made and how many writes they
    /// held: `writes / commits` is the mean group size.
    pub fn commit_stats(&self) -> CommitStats {
        CommitStats {
            commits: self.shared.db.commits.load(Ordering::Relaxed),
            writes: self.shared.db.committed_writes.load(Ordering::Relaxed),
        }
    }

    /// Forgets the watch events up to and including store revision
    /// `through`; a watch from before it gets [`StoreError::Expired`].
    pub async fn compact_events(&self, through: u64) -> Result<(), StoreError> {
        self.maintain(move |conn| events::compact(conn, through))
            .await
    }

    /// The whole store, for moving it to another backend (see
    /// [`crate::dump`]).
    pub async fn export(&self) -> Result<crate::dump::Dump, StoreError> {
        self.read(export::export).await
    }

    /// Runs `work` on a read connection on the blocking pool.
    async fn read<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        read(Arc::clone(&self.shared.db), work).await
    }

    /// Runs `work` on the write connection on the blocking pool, between
    /// the writer's groups: for writes too rare to queue.
    async fn maintain<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let db = Arc::clone(&self.shared.db);
        tokio::task::spawn_blocking(move || work(&mut db.writer())).await?
    }

    /// Queues a write for the writer thread and waits until the commit
    /// that holds it is durable.
    async fn write(&self, write: writer::Write) -> Result<writer::Written, StoreError> {
        let (reply, answer) = oneshot::channel();
        let queue = self.shared.writes.as_ref().ok_or_else(writer::stopped)?;
        queue
            .send(writer::Request { write, reply })
            .map_err(|_| writer::stopped())?;
        answer.await.map_err(|_| writer::dropped())?
    }

    async fn write_object(&self, write: writer::Write) -> Result<Object, StoreError> {
        // Copied here, on the caller's thread, unless nothing else holds
        // the event any more.
        self.write_event(write).await.map(crate::written_object)
    }

    async fn write_event(&self, write: writer::Write) -> Result<Arc<WatchEvent>, StoreError> {
        match self.write(write).await? {
            writer::Written::Object(event) => Ok(event),
            writer::Written::StepLogs => Err(StoreError::Corrupt(
                "the sqlite writer answered an object write with a step-log append".into(),
            )),
        }
    }
}

/// Runs `work` on a read connection of `db` on the blocking pool.
async fn read<T, F>(db: Arc<Database>, work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
{
    tokio::task::spawn_blocking(move || db.readers.with(&db, work)).await?
}

#[async_trait]
impl Store for SqliteStore {
    async fn current_revision(&self) -> Result<u64, StoreError> {
        self.read(|conn| schema::get_meta(conn, schema::META_REVISION))
            .await
    }

    async fn get(&self, key: &ObjectKey) -> Result<Option<Object>, StoreError> {
        let key = key.clone();
        self.read(move |conn| objects::load(conn, &key)).await
    }

    async fn list(&self, kind: Kind, namespace: Option<&str>) -> Result<ListResult, StoreError> {
        let namespace = namespace.map(str::to_string);
        self.read(move |conn| objects::list(conn, kind, namespace.as_deref()))
            .await
    }

    async fn list_page(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        limit: usize,
        after: Option<&ListContinue>,
    ) -> Result<ListPage, StoreError> {
        let namespace = namespace.map(str::to_string);
        let after = after.cloned();
        self.read(move |conn| {
            objects::list_page(conn, kind, namespace.as_deref(), limit, after.as_ref())
        })
        .await
    }

    async fn create(&self, object: Object, change: &ChangeMeta) -> Result<Object, StoreError> {
        self.create_logged(object, change, &[]).await
    }

    async fn create_logged(
        &self,
        object: Object,
        change: &ChangeMeta,
        logs: &[StepLogEntry],
    ) -> Result<Object, StoreError> {
        self.write_object(writer::Write::Create {
            parts: encoded::EncodedParts::of(&object)?,
            object,
            change: change.clone(),
            logs: logs.to_vec(),
        })
        .await
    }

    async fn update(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
    ) -> Result<Object, StoreError> {
        self.update_logged(object, expected, change, &[]).await
    }

    async fn update_logged(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
        logs: &[StepLogEntry],
    ) -> Result<Object, StoreError> {
        self.update_logged_event(object, expected, change, logs)
            .await
            .map(crate::written_object)
    }

    async fn update_logged_event(
        &self,
        object: Object,
        expected: u64,
        change: &ChangeMeta,
        logs: &[StepLogEntry],
    ) -> Result<Arc<WatchEvent>, StoreError> {
        self.write_event(writer::Write::Update {
            parts: encoded::EncodedParts::of(&object)?,
            object,
            expected,
            change: change.clone(),
            logs: logs.to_vec(),
        })
        .await
    }

    async fn delete(
        &self,
        key: &ObjectKey,
        expected: Option<u64>,
        change: &ChangeMeta,
    ) -> Result<Object, StoreError> {
        self.write_object(writer::Write::Delete {
            key: key.clone(),
            expected,
            change: change.clone(),
        })
        .await
    }

    async fn watch(&self, filter: WatchFilter, after: u64) -> Result<WatchStream, StoreError> {
        watch::watch(Arc::clone(&self.shared.db), filter, after).await
    }

    async fn watch_shared(
        &self,
        filter: WatchFilter,
        after: u64,
    ) -> Result<SharedWatchStream, StoreError> {
        watch::watch_shared(Arc::clone(&self.shared.db), filter, after).await
    }

    async fn history(&self, key: &ObjectKey) -> Result<Vec<RevisionRecord>, StoreError> {
        let key = key.clone();
        self.read(move |conn| history::history(conn, &key)).await
    }

    async fn recent_history(
        &self,
        key: &ObjectKey,
        limit: usize,
    ) -> Result<Vec<RevisionRecord>, StoreError> {
        let key = key.clone();
        self.read(move |conn| history::recent_history(conn, &key, limit))
            .await
    }

    async fn revision(&self, key: &ObjectKey, revision: u64) -> Result<RevisionRecord, StoreError> {
        let key = key.clone();
        self.read(move |conn| history::revision(conn, &key, revision))
            .await
    }

    async fn query_history(&self, query: &HistoryQuery) -> Result<Vec<RevisionRecord>, StoreError> {
        let query = query.clone();
        self.read(move |conn| history::query(conn, &query)).await
    }

    async fn compact_history(
        &self,
        policy: CompactionPolicy,
        now: DateTime<Utc>,
    ) -> Result<CompactionReport, StoreError> {
        let mut report = CompactionReport::default();
        if policy == CompactionPolicy::All {
            return Ok(report);
        }
        // A batch of objects per transaction, so writes queue behind one
        // batch at most, never behind the whole compaction.
        let mut after: Option<String> = None;
        loop {
            let from = after.clone();
            let batch = self
                .maintain(move |conn| history::compact_batch(conn, policy, now, from.as_deref()))
                .await?;
            report.revisions_removed += batch.revisions_removed;
            report.step_log_entries_removed += batch.step_log_entries_removed;
            match batch.last_uid {
                Some(uid) => after = Some(uid),
                None => return Ok(report),
            }
        }
    }

    async fn history_size(&self) -> Result<HistorySize, StoreError> {
        self.read(|conn| history::size(conn)).await
    }

    async fn put_token(&self, token: TokenRecord) -> Result<(), StoreError> {
        self.maintain(move |conn| tokens::put(conn, &token)).await
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
        self.read(move |conn| tokens::find(conn, &hash)).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        self.read(tokens::list).await
    }

    async fn touch_token(&self, hash: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        let hash = hash.to_string();
        self.maintain(move |conn| tokens::touch(conn, &hash, at))
            .await
    }

    async fn delete_tokens(&self, hashes: &[String]) -> Result<(), StoreError> {
        let hashes = hashes.to_vec();
        self.maintain(move |conn| tokens::delete(conn, &hashes))
            .await
    }

    async fn get_sealed(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let name = name.to_string();
        self.read(move |conn| {
            Ok(conn
                .query_row("SELECT value FROM sealed WHERE name = ?1", [&name], |row| {
                    row.get(0)
                })
                .optional()?)
        })
        .await
    }

    async fn list_sealed(&self, prefix: &str) -> Result<Vec<SealedRecord>, StoreError> {
        let prefix = prefix.to_string();
        self.read(move |conn| {
            let mut statement = conn.prepare(
                "SELECT name, value FROM sealed WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name",
            )?;
            let rows = statement.query_map([&prefix], |row| {
                Ok(SealedRecord {
                    name: row.get(0)?,
                    value: row.get(1)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn write_sealed(
        &self,
        put: &[SealedRecord],
        remove: &[String],
    ) -> Result<(), StoreError> {
        let (put, remove) = (put.to_vec(), remove.to_vec());
        self.maintain(move |conn| {
            let tx = conn.transaction()?;
            for record in &put {
                tx.execute(
                    "INSERT INTO sealed (name, value) VALUES (?1, ?2)
                     ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    params![record.name, record.value],
                )?;
            }
            for name in &remove {
                tx.execute("DELETE FROM sealed WHERE name = ?1", [name])?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn append_step_logs(&self, entries: &[StepLogEntry]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        self.write(writer::Write::StepLogs(entries.to_vec()))
            .await
            .map(|_| ())
    }

    async fn step_logs(
        &self,
        uid: &str,
        filter: &StepLogFilter,
    ) -> Result<Vec<StepLogEntry>, StoreError> {
        let (uid, filter) = (uid.to_string(), filter.clone());
        self.read(move |conn| steplogs::read(conn, &uid, &filter))
            .await
    }
}

#[async_trait]
impl EventRetention for SqliteStore {
    async fn compact_events(&self, through: u64) -> Result<(), StoreError> {
        SqliteStore::compact_events(self, through).await
    }

    fn set_event_window(&self, window: EventWindow) {
        SqliteStore::set_event_window(self, window);
    }
}

#[cfg(test)]
mod layout_tests;
#[cfg(test)]
mod ring_tests;
#[cfg(test)]
mod tests;
