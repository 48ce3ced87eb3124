//! The WAL-holding VFS: how few writes it hands on, and that what it holds
//! back is never missed by a reader, a rollback, a checkpoint or a reopen.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use rusqlite::{Connection, OpenFlags, params};

use super::{NAME, register};

/// A WAL's writes: as SQLite made them, and as they were handed on.
#[derive(Debug, Clone)]
pub(super) struct Counts {
    path: PathBuf,
    pub received: usize,
    pub handed: usize,
}

impl Counts {
    pub fn new(name: &CStr) -> Counts {
        Counts {
            path: PathBuf::from(name.to_string_lossy().into_owned()),
            received: 0,
            handed: 0,
        }
    }
}

/// The counts of the WAL files closed so far in this process.
static CLOSED: Mutex<Vec<Counts>> = Mutex::new(Vec::new());

pub(super) fn closed(counts: &Counts) {
    CLOSED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(counts.clone());
}

/// What the WAL of the database at `path` counted until it was closed.
fn counts_of(path: &Path) -> Counts {
    let wal = path.with_extension("db-wal");
    CLOSED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .rev()
        .find(|counts| counts.path == wal)
        .cloned()
        .expect("the WAL was closed")
}

/// A write connection through the VFS, as the store opens its own: WAL,
/// synced commits.
fn open_writer(path: &Path) -> Connection {
    register().expect("the VFS registers");
    let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), NAME)
        .expect("open through the VFS");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .expect("journal mode");
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("synchronous");
    conn.execute_batch("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        .expect("table");
    conn
}

/// A read-only connection through SQLite's own VFS, as the store's
/// readers are.
fn reader(path: &Path) -> Connection {
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("a reader")
}

/// The value row `key` holds after write number `round`: 3 KB, so each
/// row fills most of a page.
fn value(key: i64, round: i64) -> Vec<u8> {
    let seed = u8::try_from((key * 31 + round * 7) % 251).expect("small");
    (0..3000_u32)
        .map(|i| seed.wrapping_add(u8::try_from(i % 256).expect("small")))
        .collect()
}

/// Inserts rows `keys` with their values of write number `round`.
fn insert(conn: &Connection, keys: std::ops::Range<i64>, round: i64) {
    for key in keys {
        conn.execute(
            "INSERT INTO t (k, v) VALUES (?1, ?2)",
            params![key, value(key, round)],
        )
        .expect("write");
    }
}

fn rows(conn: &Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM t", [], |row| row.get(0))
        .expect("count")
}

fn row(conn: &Connection, key: i64) -> Option<Vec<u8>> {
    conn.query_row("SELECT v FROM t WHERE k = ?1", [key], |row| row.get(0))
        .ok()
}

fn integrity(path: &Path) -> String {
    Connection::open(path)
        .expect("open")
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity check")
}

#[test]
fn a_commit_reaches_the_wal_in_a_few_writes_and_every_reader_sees_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let writer = open_writer(&path);
    let reader = reader(&path);
    // 300 commits of eight 3 KB rows: past SQLite's automatic checkpoint
    // (1,000 pages), so the WAL is also started over from its beginning.
    for round in 0..300_i64 {
        let tx = writer.unchecked_transaction().expect("begin");
        for key in 0..8 {
            let key = (round * 3 + key) % 40;
            tx.execute(
                "INSERT OR REPLACE INTO t (k, v) VALUES (?1, ?2)",
                params![key, value(key, round)],
            )
            .expect("write");
        }
        tx.commit().expect("commit");
        let newest = (round * 3 + 7) % 40;
        assert_eq!(
            row(&reader, newest),
            Some(value(newest, round)),
            "round {round}"
        );
    }
    assert_eq!(rows(&reader), 40);
    drop(reader);
    drop(writer);

    let counts = counts_of(&path);
    // Two writes a frame from SQLite, one or two a commit handed on.
    assert!(counts.received >= 300 * 2 * 8, "{counts:?}");
    assert!(counts.handed <= 2 * 300 + 10, "{counts:?}");
    assert_eq!(integrity(&path), "ok");
}

#[test]
fn a_rolled_back_spill_and_unsynced_commits_leave_readers_a_whole_database() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let writer = open_writer(&path);
    // A small cache that spills a large transaction's pages into the WAL
    // before it commits.
    writer
        .pragma_update(None, "cache_size", -64)
        .expect("cache size");
    writer
        .pragma_update(None, "cache_spill", 16)
        .expect("cache spill");
    let reader = reader(&path);

    let tx = writer.unchecked_transaction().expect("begin");
    insert(&tx, 0..400, 0);
    // The transaction read back its own spilled pages to get here.
    assert_eq!(rows(&tx), 400);
    tx.rollback().expect("rollback");
    assert_eq!(rows(&reader), 0);

    let tx = writer.unchecked_transaction().expect("begin");
    insert(&tx, 0..5, 1);
    tx.commit().expect("commit");
    assert_eq!(rows(&reader), 5);
    assert_eq!(row(&reader, 4), Some(value(4, 1)));

    // Commits that are not synced are handed on as they are published.
    writer
        .pragma_update(None, "synchronous", "OFF")
        .expect("synchronous off");
    for key in 5..60 {
        insert(&writer, key..key + 1, 2);
        assert_eq!(row(&reader, key), Some(value(key, 2)), "row {key}");
    }
    drop(reader);
    drop(writer);
    assert_eq!(integrity(&path), "ok");

    let again = open_writer(&path);
    assert_eq!(rows(&again), 60);
    assert_eq!(row(&again, 59), Some(value(59, 2)));
}
