//! The watch-event ring of schema version 8 (design 0057): a revision's
//! event in its slot, replays across the end of the ring, a table that
//! stays one ring long, and the migration from the version 7 log; and the
//! age window of version 9, kept without an index by time (design 0061).

use std::time::Duration;

use corral_api::{Kind, Object};
use futures::StreamExt;
use rusqlite::Connection;
use serde_json::json;

use super::events::{EVENT_SLOTS, slot_ranges};
use super::tests::change;
use super::{SqliteStore, schema};
use crate::{ChangeMeta, EventWindow, Store, StoreError, WatchFilter, WatchStream};

fn pod(name: &str, n: u64) -> Object {
    let mut object = Object::new(Kind::Pod, Some("default"), name, json!({"n": n}));
    object.metadata.uid = format!("uid-{name}");
    object
}

async fn next_version(stream: &mut WatchStream) -> u64 {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
        .expect("an event, not an error")
        .resource_version()
}

async fn assert_quiet(stream: &mut WatchStream) {
    let next = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
    assert!(next.is_err(), "no event past the newest, got {next:?}");
}

/// Updates `object` until the store revision is `newest`; returns it as
/// last written.
async fn update_until(store: &SqliteStore, mut object: Object, newest: u64) -> Object {
    while object.metadata.resource_version < newest {
        object.spec = json!({"n": object.metadata.resource_version});
        let expected = object.metadata.resource_version;
        object = store
            .update(object, expected, &change())
            .await
            .expect("update");
    }
    object
}

fn event_rows(store: &SqliteStore) -> i64 {
    store
        .shared
        .db
        .writer()
        .query_row("SELECT count(*) FROM events", [], |row| row.get(0))
        .expect("count the events")
}

fn expired_through(outcome: Result<WatchStream, StoreError>) -> u64 {
    match outcome {
        Err(StoreError::Expired { compacted, .. }) => compacted,
        Err(error) => panic!("expected Expired, got {error}"),
        Ok(_) => panic!("expected Expired, got a stream"),
    }
}

/// The migration to the ring puts each event in the slot the code reads
/// it from.
#[test]
fn the_migration_slots_events_as_the_store_does() {
    let slotted = format!("resource_version % {EVENT_SLOTS}, resource_version");
    assert!(
        schema::SCHEMA_V8.contains(&slotted),
        "{}",
        schema::SCHEMA_V8
    );
    let compacted = format!("(SELECT value FROM meta WHERE key = 'revision') - {EVENT_SLOTS}");
    assert!(
        schema::SCHEMA_V8.contains(&compacted),
        "{}",
        schema::SCHEMA_V8
    );
}

#[test]
fn revisions_map_to_one_slot_range_or_two_where_they_wrap() {
    assert_eq!(slot_ranges(1, 10), [(1, 10)]);
    assert_eq!(slot_ranges(9_995, 10_004), [(9_995, 9_999), (0, 4)]);
    assert_eq!(slot_ranges(10_000, 10_000), [(0, 0)]);
    assert_eq!(slot_ranges(20_001, 20_000), []);
    // At most one ring: revisions past it would share its slots.
    assert_eq!(slot_ranges(3, 30_000), [(3, 9_999), (0, 2)]);
}

/// Past a full ring, the newest 10,000 events replay in order across the
/// ring's end, the one before them is expired, a filtered watch passes
/// thousands of revisions that are not its own, and the table holds
/// exactly one ring.
#[tokio::test]
async fn a_watch_replays_across_the_end_of_the_ring_and_the_table_stays_one_ring() {
    let store = SqliteStore::open_in_memory().expect("open");
    let created = store.create(pod("p", 0), &change()).await.expect("create");
    let newest = EVENT_SLOTS + 300;
    let object = update_until(&store, created, newest).await;
    assert_eq!(object.metadata.resource_version, newest);
    assert_eq!(
        event_rows(&store),
        i64::try_from(EVENT_SLOTS).expect("small")
    );

    // Revisions 9,701 to 10,300: slots 9,701 to 9,999, then 0 to 300.
    let from = newest - 600;
    let mut watch = store
        .watch(WatchFilter::default(), from)
        .await
        .expect("watch");
    for expected in from + 1..=newest {
        assert_eq!(next_version(&mut watch).await, expected);
    }
    assert_quiet(&mut watch).await;

    let oldest_kept = newest - EVENT_SLOTS;
    let mut whole = store
        .watch(WatchFilter::default(), oldest_kept)
        .await
        .expect("a watch from the start of the window");
    assert_eq!(next_version(&mut whole).await, oldest_kept + 1);
    let before = store.watch(WatchFilter::default(), oldest_kept - 1).await;
    assert_eq!(expired_through(before), oldest_kept);

    // A watch for pod q from early in the window reads 9,999 events of
    // pod p (twenty batches of none of its own), then q's creation (which
    // moves the window's start one revision on).
    let filter = WatchFilter {
        name: Some("q".into()),
        ..WatchFilter::default()
    };
    let mut only_q = store.watch(filter, oldest_kept + 1).await.expect("watch q");
    let q = store
        .create(pod("q", 0), &change())
        .await
        .expect("create q");
    assert_eq!(next_version(&mut only_q).await, q.metadata.resource_version);
    assert_quiet(&mut only_q).await;
}

/// The version 7 log (one row per event, keyed by revision) becomes the
/// ring: the events past `events_compacted` are kept and replay; the
/// next write takes the slot of its revision.
#[tokio::test]
async fn a_version_7_event_log_becomes_the_ring_and_keeps_its_window() {
    let conn = Connection::open_in_memory().expect("open");
    schema::create_at(&conn, 7).expect("version 7");
    for revision in 1..=12_u64 {
        let mut object = pod("p", revision);
        object.metadata.resource_version = revision;
        conn.execute(
            "INSERT INTO events (resource_version, kind, namespace, name, type, body, time)
             VALUES (?1, 'Pod', 'default', 'p', 'MODIFIED', ?2, 0)",
            rusqlite::params![
                i64::try_from(revision).expect("small"),
                serde_json::to_string(&object).expect("json")
            ],
        )
        .expect("a version 7 event");
    }
    conn.execute_batch(
        "UPDATE meta SET value = 12 WHERE key = 'revision';
         UPDATE meta SET value = 2 WHERE key = 'events_compacted';",
    )
    .expect("meta");
    let store = migrated(conn);

    let mut watch = store.watch(WatchFilter::default(), 2).await.expect("watch");
    for expected in 3..=12 {
        assert_eq!(next_version(&mut watch).await, expected);
    }
    assert_eq!(
        expired_through(store.watch(WatchFilter::default(), 1).await),
        2
    );
    let created = store.create(pod("q", 0), &change()).await.expect("create");
    assert_eq!(created.metadata.resource_version, 13);
    assert_eq!(next_version(&mut watch).await, 13);
    let slot: i64 = store
        .shared
        .db
        .writer()
        .query_row(
            "SELECT slot FROM events WHERE resource_version = 13",
            [],
            |row| row.get(0),
        )
        .expect("the new event's row");
    assert_eq!(slot, 13);
}

/// A version 7 log longer than a ring (its window lagging) keeps the
/// newest ring of events; the log then starts after the ones displaced.
#[tokio::test]
async fn a_version_7_log_longer_than_a_ring_keeps_the_newest_ring() {
    let conn = Connection::open_in_memory().expect("open");
    schema::create_at(&conn, 7).expect("version 7");
    let newest = EVENT_SLOTS + 5;
    conn.execute(
        "WITH RECURSIVE n(rv) AS (SELECT 1 UNION ALL SELECT rv + 1 FROM n WHERE rv < ?1)
         INSERT INTO events (resource_version, kind, namespace, name, type, body, time)
         SELECT rv, 'Pod', 'default', 'p', 'MODIFIED',
                json_object('kind', 'Pod', 'metadata', json_object(
                    'name', 'p', 'namespace', 'default', 'uid', 'uid-p',
                    'resourceVersion', rv, 'revision', 1), 'spec', json_object()),
                0
         FROM n",
        [i64::try_from(newest).expect("small")],
    )
    .expect("a long version 7 log");
    conn.execute(
        "UPDATE meta SET value = ?1 WHERE key = 'revision'",
        [i64::try_from(newest).expect("small")],
    )
    .expect("meta");
    let store = migrated(conn);

    assert_eq!(
        event_rows(&store),
        i64::try_from(EVENT_SLOTS).expect("small")
    );
    assert_eq!(
        expired_through(store.watch(WatchFilter::default(), 4).await),
        5
    );
    let mut watch = store.watch(WatchFilter::default(), 5).await.expect("watch");
    for expected in 6..=newest {
        assert_eq!(next_version(&mut watch).await, expected);
    }
    assert_quiet(&mut watch).await;
}

/// A change made `minute` minutes after the epoch.
fn at_minute(minute: i64) -> ChangeMeta {
    ChangeMeta {
        time: chrono::DateTime::UNIX_EPOCH + chrono::TimeDelta::minutes(minute),
        ..change()
    }
}

/// Creates pod `name` at `minute`; returns its store revision.
async fn create_at(store: &SqliteStore, name: &str, minute: i64) -> u64 {
    store
        .create(pod(name, 0), &at_minute(minute))
        .await
        .expect("create")
        .metadata
        .resource_version
}

/// Asserts a watch from `after` replays exactly `expected`, then is quiet.
async fn assert_replays(store: &SqliteStore, after: u64, expected: &[u64]) {
    let mut watch = store
        .watch(WatchFilter::default(), after)
        .await
        .unwrap_or_else(|error| panic!("a watch from {after}: {error}"));
    for &version in expected {
        assert_eq!(next_version(&mut watch).await, version);
    }
    assert_quiet(&mut watch).await;
}

const TEN_MINUTES: EventWindow = EventWindow {
    count: EVENT_SLOTS,
    max_age: Duration::from_secs(10 * 60),
};

/// With a window of ten minutes, a write at minute 13 deletes the rows of
/// the events of minutes 0–2 (found by the writer's marks, not an index)
/// and keeps minute 3 on; a watch from before them is expired.
#[tokio::test]
async fn the_age_window_deletes_the_rows_of_the_aged_events() {
    let store = SqliteStore::open_in_memory().expect("open");
    store.set_event_window(TEN_MINUTES);
    let mut versions = Vec::new();
    for minute in 0..5 {
        versions.push(create_at(&store, &format!("p{minute}"), minute).await);
    }
    assert_eq!(event_rows(&store), 5);
    versions.push(create_at(&store, "p13", 13).await);
    assert_eq!(
        event_rows(&store),
        3,
        "the events of minutes 0, 1 and 2 are deleted"
    );
    assert_eq!(
        expired_through(store.watch(WatchFilter::default(), versions[1]).await),
        versions[2]
    );
    assert_replays(&store, versions[2], &versions[3..]).await;
    // A later write in the same minute deletes nothing more.
    versions.push(create_at(&store, "q13", 13).await);
    assert_eq!(event_rows(&store), 4);
}

/// A store opened again knows its events' times only from the newest:
/// the older ones go when that one is old, never sooner than their own
/// age.
#[tokio::test]
async fn after_a_restart_the_age_window_drops_older_events_by_the_newest_time() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let mut versions = Vec::new();
    {
        let store = SqliteStore::open(&path).expect("open");
        store.set_event_window(TEN_MINUTES);
        for minute in 0..5 {
            versions.push(create_at(&store, &format!("p{minute}"), minute).await);
        }
    }
    let store = SqliteStore::open(&path).expect("open again");
    store.set_event_window(TEN_MINUTES);
    // At minute 13 the events of minutes 0–2 are old, but the store
    // reopened knows only that all five were written by minute 4.
    versions.push(create_at(&store, "p13", 13).await);
    assert_eq!(event_rows(&store), 6);
    assert_replays(&store, 0, &versions).await;
    // At minute 15 minute 4 is old: all five go, minute 13's stays.
    versions.push(create_at(&store, "p15", 15).await);
    assert_eq!(event_rows(&store), 2);
    assert_eq!(
        expired_through(store.watch(WatchFilter::default(), versions[3]).await),
        versions[4]
    );
    assert_replays(&store, versions[4], &versions[5..]).await;
}

/// Change times out of revision order (a clock stepped back) keep the
/// window one prefix of revisions: an event is forgotten with every event
/// before it, once the latest change time up to it is old.
#[tokio::test]
async fn the_age_window_forgets_a_prefix_when_change_times_step_back() {
    let store = SqliteStore::open_in_memory().expect("open");
    store.set_event_window(TEN_MINUTES);
    let five = create_at(&store, "p5", 5).await;
    let one = create_at(&store, "p1", 1).await;
    let twelve = create_at(&store, "p12", 12).await;
    // At minute 12 minute 1 is old but minute 5, before it, is not: both
    // stay.
    assert_eq!(event_rows(&store), 3);
    let sixteen = create_at(&store, "p16", 16).await;
    assert_eq!(event_rows(&store), 2);
    assert_eq!(
        expired_through(store.watch(WatchFilter::default(), five).await),
        one
    );
    assert_replays(&store, one, &[twelve, sixteen]).await;
}

/// Version 9 drops the index of the events by time.
#[test]
fn the_version_9_migration_drops_the_event_time_index() {
    let conn = Connection::open_in_memory().expect("open");
    schema::create_at(&conn, 8).expect("version 8");
    let indexes = |conn: &Connection| -> i64 {
        conn.query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = 'events_time'",
            [],
            |row| row.get(0),
        )
        .expect("count indexes")
    };
    assert_eq!(indexes(&conn), 1);
    let store = migrated(conn);
    assert_eq!(indexes(&store.shared.db.writer()), 0);
}

/// Brings `conn` to the current schema and opens a store on it.
fn migrated(mut conn: Connection) -> SqliteStore {
    schema::prepare(&mut conn, false).expect("migrate");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("version");
    assert_eq!(version, super::SCHEMA_VERSION);
    SqliteStore::from_connection(conn, None, 16).expect("store")
}
