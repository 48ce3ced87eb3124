//! Behaviour specific to the SQLite store that the conformance suite cannot
//! reach: lagging watchers, event retention.

use corral_api::{AuthorClass, Kind, Object};
use futures::StreamExt;
use serde_json::json;

use super::SqliteStore;
use crate::{ChangeMeta, Store, StoreError, WatchFilter, WatchStream};

fn store_with_capacity(capacity: usize) -> SqliteStore {
    let mut conn = rusqlite::Connection::open_in_memory().expect("open");
    super::schema::prepare(&mut conn, false).expect("schema");
    SqliteStore::from_connection(conn, None, capacity)
}

fn change() -> ChangeMeta {
    ChangeMeta {
        author: "alice".into(),
        class: AuthorClass::External,
        message: String::new(),
        time: chrono::DateTime::UNIX_EPOCH,
        always_record: false,
    }
}

async fn create(store: &SqliteStore, index: u64) -> u64 {
    let mut object = Object::new(Kind::Pod, None, &format!("p{index}"), json!({"n": index}));
    object.metadata.uid = format!("uid-{index}");
    store
        .create(object, &change())
        .await
        .expect("create")
        .metadata
        .resource_version
}

async fn next_version(stream: &mut WatchStream) -> Result<u64, StoreError> {
    let item = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
        .await
        .expect("an event in time")
        .expect("stream goes on");
    item.map(|event| event.resource_version())
}

#[tokio::test]
async fn a_lagging_watcher_catches_up_from_the_table() {
    let store = store_with_capacity(4);
    let mut stream = store.watch(WatchFilter::default(), 0).await.expect("watch");
    // Read one event so the stream is live, then overflow its channel.
    create(&store, 0).await;
    assert_eq!(next_version(&mut stream).await.expect("event"), 1);
    for index in 1..50 {
        create(&store, index).await;
    }
    for expected in 2..=50 {
        assert_eq!(next_version(&mut stream).await.expect("event"), expected);
    }
    create(&store, 50).await;
    assert_eq!(next_version(&mut stream).await.expect("event"), 51);
}

#[tokio::test]
async fn retention_prunes_old_events_and_expires_old_watches() {
    let store = store_with_capacity(4);
    store.set_event_retention(10);
    let mut lagging = store.watch(WatchFilter::default(), 0).await.expect("watch");
    create(&store, 0).await;
    assert_eq!(next_version(&mut lagging).await.expect("event"), 1);
    for index in 1..30 {
        create(&store, index).await;
    }
    match store.watch(WatchFilter::default(), 5).await {
        Err(StoreError::Expired {
            requested: 5,
            compacted: 20,
        }) => {}
        other => panic!(
            "expected Expired through 20, got {:?}",
            other.map(|_| "a stream")
        ),
    }
    let mut recent = store
        .watch(WatchFilter::default(), 20)
        .await
        .expect("watch");
    for expected in 21..=30 {
        assert_eq!(next_version(&mut recent).await.expect("event"), expected);
    }
    // The lagging watcher lost its place in both channel and table.
    let mut outcome = Ok(0);
    for _ in 0..30 {
        outcome = next_version(&mut lagging).await;
        if outcome.is_err() {
            break;
        }
    }
    assert!(
        matches!(outcome, Err(StoreError::Expired { requested: 1, .. })),
        "a watcher that fell behind retention gets Expired, got {outcome:?}"
    );
}

#[tokio::test]
async fn a_version_1_database_is_migrated_and_keeps_its_objects() {
    let mut conn = rusqlite::Connection::open_in_memory().expect("open");
    conn.execute_batch(super::schema::SCHEMA_V1)
        .expect("v1 schema");
    conn.pragma_update(None, "user_version", 1)
        .expect("version 1");
    conn.execute(
        "INSERT INTO tokens (hash, identity, created_at) VALUES ('h', ?1, '2030-01-01T00:00:00.000000000Z')",
        [r#"{"name":"alice","role":"operator"}"#],
    )
    .expect("a v1 row");
    super::schema::prepare(&mut conn, false).expect("migrate");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("version");
    assert_eq!(version, super::SCHEMA_VERSION);
    let store = SqliteStore::from_connection(conn, None, 16);
    assert!(
        store.find_token("h").await.expect("read").is_some(),
        "v1 data survives the migration"
    );
    let logs = store
        .step_logs("uid-1", &crate::StepLogFilter::default())
        .await
        .expect("the v2 table exists");
    assert!(logs.is_empty());
}
