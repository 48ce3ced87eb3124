//! Connection settings, the schema and its migrations, and the small
//! conversions between Rust values and columns.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use corral_api::{AuthorClass, Kind};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::StoreError;

/// The schema this code writes; kept in `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 10;

/// How long a connection waits for another process's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// `meta` key of the newest store revision.
pub(super) const META_REVISION: &str = "revision";
/// `meta` key of the newest store revision whose watch event was pruned.
pub(super) const META_EVENTS_COMPACTED: &str = "events_compacted";
/// `meta` key of the newest step-log `seq` in `step_logs_by_object`: every
/// entry up to it is found there, every later one only in `step_logs`.
pub(super) const META_STEP_LOGS_INDEXED: &str = "step_logs_indexed";
/// `meta` key of the newest step-log `seq` given out: the writer numbers
/// entries on from it, so a number is never given twice, even after the
/// newest entries were deleted (design 0061).
pub(super) const META_STEP_LOGS_SEQ: &str = "step_logs_seq";

pub(super) const SCHEMA_V1: &str = "
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE objects (
    kind             TEXT NOT NULL,
    namespace        TEXT NOT NULL,
    name             TEXT NOT NULL,
    uid              TEXT NOT NULL,
    revision         INTEGER NOT NULL,
    resource_version INTEGER NOT NULL,
    body             TEXT NOT NULL,
    PRIMARY KEY (kind, namespace, name)
) WITHOUT ROWID;
CREATE INDEX objects_uid ON objects (uid);

-- One row per spec revision. `payload` is the codec's encoding of the
-- spec (a keyframe or a delta against the previous revision of the same
-- uid); `raw_len` is the size of the spec as JSON. `seq` is the store
-- revision of the write that made it.
CREATE TABLE revisions (
    uid       TEXT NOT NULL,
    revision  INTEGER NOT NULL,
    kind      TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name      TEXT NOT NULL,
    time      TEXT NOT NULL,
    author    TEXT NOT NULL,
    class     TEXT NOT NULL,
    message   TEXT NOT NULL,
    deleted   INTEGER NOT NULL,
    keyframe  INTEGER NOT NULL,
    payload   BLOB NOT NULL,
    raw_len   INTEGER NOT NULL,
    seq       INTEGER NOT NULL,
    PRIMARY KEY (uid, revision)
) WITHOUT ROWID;
CREATE INDEX revisions_time ON revisions (time, seq);
CREATE INDEX revisions_key ON revisions (kind, namespace, name, seq);

CREATE TABLE events (
    resource_version INTEGER PRIMARY KEY,
    kind             TEXT NOT NULL,
    namespace        TEXT NOT NULL,
    name             TEXT NOT NULL,
    type             TEXT NOT NULL,
    body             TEXT NOT NULL
);

CREATE TABLE tokens (
    hash       TEXT PRIMARY KEY,
    identity   TEXT NOT NULL,
    created_at TEXT NOT NULL
) WITHOUT ROWID;

INSERT INTO meta (key, value) VALUES ('revision', 0), ('events_compacted', 0);
";

/// Version 2: workflow step logs. `seq` keeps the order entries were
/// appended in, which breaks ties between entries of the same time.
const SCHEMA_V2: &str = "
CREATE TABLE step_logs (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    object_uid  TEXT NOT NULL,
    time        TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    workflow    TEXT NOT NULL,
    step        TEXT NOT NULL,
    owner       TEXT NOT NULL,
    level       TEXT NOT NULL,
    message     TEXT NOT NULL,
    fields      TEXT NOT NULL
);
CREATE INDEX step_logs_object ON step_logs (object_uid, time, seq);
";

/// Version 3: the time of each watch event (Unix milliseconds of the
/// write's change time), so the event window can drop events by age with
/// an index range instead of a scan. Events from before the migration count
/// as written at the migration.
const SCHEMA_V3: &str = "
ALTER TABLE events ADD COLUMN time INTEGER NOT NULL DEFAULT 0;
UPDATE events SET time = CAST(strftime('%s', 'now') AS INTEGER) * 1000;
CREATE INDEX events_time ON events (time);
";

/// Version 4: sealed values (Secrets' encrypted data), outside history and
/// watch events.
const SCHEMA_V4: &str = "
CREATE TABLE sealed (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
) WITHOUT ROWID;
";

/// Version 5: when each token last authenticated a request.
const SCHEMA_V5: &str = "
ALTER TABLE tokens ADD COLUMN last_used TEXT;
";

/// Version 6: fewer pages per write (design 0046).
/// - `objects` becomes a rowid table with a unique index on its key. In a
///   `WITHOUT ROWID` table a row over about 1 KB spills to an overflow
///   page, and a pod's body is about 2 KB: every update rewrote its leaf,
///   a new overflow page and the freelist. A rowid leaf holds it whole.
///   It gains a `created_at` column, so an update reads what it keeps of
///   the stored object from columns instead of parsing its body.
/// - `revisions_key` keeps only deletion records. Its one reader looks up
///   the newest uid deleted under a key, and every revision of every
///   object rewrote a page of it.
/// - `step_logs_object` drops the time from its key: 40 bytes an entry
///   instead of 75, so an object's leaf fills, and splits, half as often.
///   Reading an object's log sorts its entries by time.
const SCHEMA_V6: &str = "
CREATE TABLE objects_v6 (
    kind             TEXT NOT NULL,
    namespace        TEXT NOT NULL,
    name             TEXT NOT NULL,
    uid              TEXT NOT NULL,
    revision         INTEGER NOT NULL,
    resource_version INTEGER NOT NULL,
    created_at       TEXT,
    body             TEXT NOT NULL
);
INSERT INTO objects_v6
    (kind, namespace, name, uid, revision, resource_version, created_at, body)
    SELECT kind, namespace, name, uid, revision, resource_version,
           json_extract(body, '$.metadata.createdAt'), body
    FROM objects;
DROP TABLE objects;
ALTER TABLE objects_v6 RENAME TO objects;
CREATE UNIQUE INDEX objects_key ON objects (kind, namespace, name);
CREATE INDEX objects_uid ON objects (uid);
DROP INDEX revisions_key;
CREATE INDEX revisions_deleted_key ON revisions (kind, namespace, name, seq) WHERE deleted = 1;
DROP INDEX step_logs_object;
CREATE INDEX step_logs_object ON step_logs (object_uid, seq);
";

/// Version 7: the step log's per-object index leaves the write path
/// (design 0054). A write appends its entries to `step_logs` only (the
/// newest page of a table in `seq` order, shared by every write of a
/// group); the writer copies each batch of new entries into
/// `step_logs_by_object` at once, and a reader looks an object's entries up
/// there and scans the short tail past `step_logs_indexed`. Inserting into
/// an index clustered by object put each write in the middle of a b-tree,
/// where SQLite rebalances three full leaves whenever one fills: 2.2 of the
/// 7 pages a pod update wrote.
const SCHEMA_V7: &str = "
CREATE TABLE step_logs_by_object (
    object_uid TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    PRIMARY KEY (object_uid, seq)
) WITHOUT ROWID;
INSERT INTO step_logs_by_object (object_uid, seq) SELECT object_uid, seq FROM step_logs;
DROP INDEX step_logs_object;
INSERT INTO meta (key, value) SELECT 'step_logs_indexed', COALESCE(MAX(seq), 0) FROM step_logs;
";

/// Version 8: the watch-event log becomes a ring of
/// [`EVENT_SLOTS`](super::events::EVENT_SLOTS) rows (design 0057). The
/// event of store revision `rv` is written over slot `rv % 10000`, which
/// holds the event of `rv - 10000` (outside every window), so a write no
/// longer deletes the oldest events at the head of the table while it
/// appends its own at the tail (an update alone in its group wrote 11.7
/// pages past a full window, 6.7 in the ring).
/// The count window is kept by `events_compacted` alone; there is no index
/// by revision (a revision's slot is known). The events kept are those of
/// the newest 10,000 revisions past `events_compacted`; if a lagging
/// window left more, the newest win their slots and the log starts after
/// the ones they displace.
pub(super) const SCHEMA_V8: &str = "
CREATE TABLE event_slots (
    slot             INTEGER PRIMARY KEY,
    resource_version INTEGER NOT NULL,
    kind             TEXT NOT NULL,
    namespace        TEXT NOT NULL,
    name             TEXT NOT NULL,
    type             TEXT NOT NULL,
    body             TEXT NOT NULL,
    time             INTEGER NOT NULL
);
INSERT OR REPLACE INTO event_slots
    (slot, resource_version, kind, namespace, name, type, body, time)
    SELECT resource_version % 10000, resource_version, kind, namespace, name, type, body, time
    FROM events
    WHERE resource_version > (SELECT value FROM meta WHERE key = 'events_compacted')
    ORDER BY resource_version;
UPDATE meta SET value = max(value, (SELECT value FROM meta WHERE key = 'revision') - 10000)
    WHERE key = 'events_compacted';
DROP TABLE events;
ALTER TABLE event_slots RENAME TO events;
CREATE INDEX events_time ON events (time);
";

/// Version 9: no index of the events by change time (design 0061). The
/// age window finds the events it drops by the marks of change time the
/// writer keeps per second of writes, and deletes them by store revision;
/// the index cost every write a row in a b-tree of its own (about a tenth
/// of a group's WAL pages).
const SCHEMA_V9: &str = "
DROP INDEX events_time;
";

/// Version 10: the step log without `AUTOINCREMENT` (design 0061). The
/// writer numbers the entries itself, on from the `step_logs_seq` mark it
/// keeps in `meta` (whose page every group writes anyway), instead of
/// SQLite reading and writing the `sqlite_sequence` row at every insert
/// (a page of its own in every commit). The mark starts past every number
/// given out before: the table's, `sqlite_sequence`'s and the index mark.
const SCHEMA_V10: &str = "
CREATE TABLE step_logs_v10 (
    seq         INTEGER PRIMARY KEY,
    object_uid  TEXT NOT NULL,
    time        TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    workflow    TEXT NOT NULL,
    step        TEXT NOT NULL,
    owner       TEXT NOT NULL,
    level       TEXT NOT NULL,
    message     TEXT NOT NULL,
    fields      TEXT NOT NULL
);
INSERT INTO step_logs_v10
    (seq, object_uid, time, workflow_id, workflow, step, owner, level, message, fields)
    SELECT seq, object_uid, time, workflow_id, workflow, step, owner, level, message, fields
    FROM step_logs ORDER BY seq;
INSERT INTO meta (key, value) SELECT 'step_logs_seq', max(
    COALESCE((SELECT MAX(seq) FROM step_logs), 0),
    COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'step_logs'), 0),
    COALESCE((SELECT value FROM meta WHERE key = 'step_logs_indexed'), 0));
DROP TABLE step_logs;
ALTER TABLE step_logs_v10 RENAME TO step_logs;
";

/// The migrations, in order: entry `n` brings version `n` to `n + 1`.
const MIGRATIONS: [&str; 10] = [
    SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6, SCHEMA_V7, SCHEMA_V8,
    SCHEMA_V9, SCHEMA_V10,
];

/// Gives an empty database the schema of an older `version`, as that
/// version's code left it: for migration tests.
#[cfg(test)]
pub(super) fn create_at(conn: &Connection, version: usize) -> Result<(), StoreError> {
    for migration in &MIGRATIONS[..version] {
        conn.execute_batch(migration)?;
    }
    conn.pragma_update(None, "user_version", to_i64(version as u64))?;
    Ok(())
}

/// The writer connection's page cache, in KiB (a negative `cache_size`).
/// Kept small on purpose: see [`prepare`].
const WRITER_CACHE_KIB: i64 = -4 * 1024;

/// How many pages a transaction may dirty before SQLite spills some to the
/// WAL ahead of its commit: 32 MiB of 4 KiB pages, more than the largest
/// group writes.
const WRITER_SPILL_PAGES: i64 = 8 * 1024;

/// The WAL pages after whose commit the writer checkpoints the WAL into
/// the database (SQLite's default is 1,000): 16 MiB of 4 KiB pages, which
/// the WAL file keeps once it has grown to them.
pub(super) const WRITER_CHECKPOINT_PAGES: i64 = 4_000;

/// Applies the connection settings and brings the schema up to date.
/// `durable` is false only for in-memory databases, which have no WAL.
pub(super) fn prepare(conn: &mut Connection, durable: bool) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    if durable {
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unavailable(format!(
                "sqlite refused write-ahead logging (journal mode is {mode})"
            )));
        }
    }
    // Every commit is synced before it returns: an acknowledged write
    // survives kill -9 and power loss. (With `fdatasync`: the bundled
    // SQLite is built with HAVE_FDATASYNC, see .cargo/config.toml and
    // design 0053.)
    conn.pragma_update(None, "synchronous", "FULL")?;
    // Temporary structures (a large sort, a statement journal) stay in
    // memory, not in a temp file opened, written and deleted each time.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // The pages a group touches (the newest rows of the history, event and
    // step-log tables and their indexes, the object rows) stay in the
    // writer's cache instead of being read back from the file each time,
    // and a large group is not spilled to the WAL before it commits.
    // The cache is not larger than that: when a leaf splits, SQLite parks a
    // page under a page number past 1 GiB for a moment, and the commit then
    // walks every page and hash slot of the cache to drop pages past the
    // end of the database (4.5 % of the writer thread with a 32 MiB cache;
    // design 0046).
    conn.pragma_update(None, "cache_size", WRITER_CACHE_KIB)?;
    conn.pragma_update(None, "cache_spill", WRITER_SPILL_PAGES)?;
    // Checkpoints come four times less often than SQLite's default, and
    // each copies the pages hundreds of commits rewrote (the object rows,
    // the index ends, the header) once instead of four times; each is
    // longer, which the writes queued behind it feel (design 0060).
    conn.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)?;

    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if !(0..=SCHEMA_VERSION).contains(&version) {
        return Err(StoreError::Corrupt(format!(
            "database schema version {version} is newer than this corral understands ({SCHEMA_VERSION})"
        )));
    }
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    // All pending migrations in one transaction: a crash leaves the old
    // version intact.
    let tx = conn.transaction()?;
    let first = usize::try_from(version).unwrap_or(0);
    for migration in &MIGRATIONS[first..] {
        tx.execute_batch(migration)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

/// Opens a read-only connection to the database at `path`, which a
/// [`prepare`]d write connection keeps in WAL mode: it reads the last
/// committed state while a write transaction is in flight.
pub(super) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

pub(super) fn get_meta(conn: &Connection, key: &str) -> Result<u64, StoreError> {
    let value: Option<i64> = conn
        .prepare_cached("SELECT value FROM meta WHERE key = ?1")?
        .query_row([key], |row| row.get(0))
        .optional()?;
    Ok(value.map_or(0, to_u64))
}

pub(super) fn set_meta(conn: &Connection, key: &str, value: u64) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![key, to_i64(value)])?;
    Ok(())
}

/// Column value of a count or revision; SQLite integers are signed.
pub(super) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(super) fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// Times are stored as fixed-width RFC 3339 text (nanoseconds, `Z`), which
/// sorts in time order.
pub(super) fn time_to_text(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

/// Event times are Unix milliseconds: small, and ordered by an integer
/// index.
pub(super) fn time_to_millis(time: DateTime<Utc>) -> i64 {
    time.timestamp_millis()
}

pub(super) fn time_from_text(text: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(text)
        .map(|time| time.with_timezone(&Utc))
        .map_err(|error| StoreError::Corrupt(format!("stored time {text:?}: {error}")))
}

pub(super) fn kind_from_text(text: &str) -> Result<Kind, StoreError> {
    Kind::from_str(text).map_err(|error| StoreError::Corrupt(error.to_string()))
}

pub(super) fn class_from_text(text: &str) -> Result<AuthorClass, StoreError> {
    match text {
        "external" => Ok(AuthorClass::External),
        "system" => Ok(AuthorClass::System),
        other => Err(StoreError::Corrupt(format!(
            "stored author class {other:?} is neither external nor system"
        ))),
    }
}

/// Maps a JSON error on stored data to `Corrupt`, naming what was read.
pub(super) fn corrupt_json(what: &str) -> impl FnOnce(serde_json::Error) -> StoreError + '_ {
    move |error| StoreError::Corrupt(format!("{what}: {error}"))
}
