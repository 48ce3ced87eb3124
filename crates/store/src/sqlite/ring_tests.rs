//! The watch-event ring of schema version 8 (design 0057): a revision's
//! event in its slot, replays across the end of the ring, a table that
//! stays one ring long, and the migration from the version 7 log.

use std::time::Duration;

use corral_api::{Kind, Object};
use futures::StreamExt;
use rusqlite::Connection;
use serde_json::json;

use super::events::{EVENT_SLOTS, slot_ranges};
use super::tests::change;
use super::{SqliteStore, schema};
use crate::{Store, StoreError, WatchFilter, WatchStream};

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

/// Brings `conn` to the current schema and opens a store on it.
fn migrated(mut conn: Connection) -> SqliteStore {
    schema::prepare(&mut conn, false).expect("migrate");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("version");
    assert_eq!(version, super::SCHEMA_VERSION);
    SqliteStore::from_connection(conn, None, 16).expect("store")
}
