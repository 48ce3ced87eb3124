//! Behaviour specific to the SQLite store that the conformance suite cannot
//! reach: lagging watchers, event retention.

use corral_api::{AuthorClass, Kind, Object};
use futures::StreamExt;
use serde_json::json;

use super::SqliteStore;
use crate::{ChangeMeta, EventWindow, Store, StoreError, WatchFilter, WatchStream};

fn store_with_capacity(capacity: usize) -> SqliteStore {
    let mut conn = rusqlite::Connection::open_in_memory().expect("open");
    super::schema::prepare(&mut conn, false).expect("schema");
    SqliteStore::from_connection(conn, None, capacity).expect("store")
}

pub(super) fn change() -> ChangeMeta {
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
    store.set_event_window(EventWindow {
        count: 10,
        max_age: std::time::Duration::from_secs(3600),
    });
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
    let store = SqliteStore::from_connection(conn, None, 16).expect("store");
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

fn object_named(name: &str, image: &str) -> Object {
    let mut object = Object::new(Kind::Pod, Some("default"), name, json!({"image": image}));
    object.metadata.uid = format!("uid-{name}");
    object
}

/// Writes queued while the writer waits share one commit; each failing
/// write fails alone, later writes of the group see earlier ones, and the
/// events come out in revision order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_commits_together_and_its_writes_fail_alone() {
    use futures::FutureExt;
    use futures::future::BoxFuture;

    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("group.db")).expect("open");
    let a = crate::ObjectKey::new(Kind::Pod, Some("default"), "a");
    let c = crate::ObjectKey::new(Kind::Pod, Some("default"), "c");
    let mut a_edited = object_named("a", "img:2");
    a_edited.metadata.namespace = Some("default".into());
    let entry = log_entry();
    let change = change();
    let writes: Vec<BoxFuture<'_, Result<Option<u64>, StoreError>>> = vec![
        store
            .create(object_named("a", "img:1"), &change)
            .map(version)
            .boxed(),
        store
            .create(object_named("a", "img:9"), &change)
            .map(version)
            .boxed(),
        store
            .update(object_named("b", "img:1"), 1, &change)
            .map(version)
            .boxed(),
        store
            .create(object_named("c", "img:1"), &change)
            .map(version)
            .boxed(),
        store
            .update(a_edited.clone(), 1, &change)
            .map(version)
            .boxed(),
        store.update(a_edited, 1, &change).map(version).boxed(),
        store.delete(&c, Some(2), &change).map(version).boxed(),
        store
            .append_step_logs(std::slice::from_ref(&entry))
            .map(|done| done.map(|()| None))
            .boxed(),
    ];
    let results = queued_together(&store, futures::future::join_all(writes)).await;
    let summary: Vec<String> = results
        .iter()
        .map(|result| match result {
            Ok(version) => format!("ok {version:?}"),
            Err(StoreError::AlreadyExists { .. }) => "AlreadyExists".into(),
            Err(StoreError::NotFound { .. }) => "NotFound".into(),
            Err(StoreError::Conflict {
                expected, actual, ..
            }) => format!("Conflict {expected}/{actual}"),
            Err(other) => format!("{other}"),
        })
        .collect();
    assert_eq!(
        summary,
        [
            "ok Some(1)",
            "AlreadyExists",
            "NotFound",
            "ok Some(2)",
            "ok Some(3)",
            "Conflict 1/3",
            "ok Some(4)",
            "ok None",
        ]
    );
    let stats = store.commit_stats();
    assert_eq!(
        stats.writes, 9,
        "failed writes are answered by the commit too (eight and the group's blocker)"
    );
    assert!(
        stats.commits <= 2,
        "the blocker and eight queued writes take at most two commits, got {stats:?}"
    );

    let seen = first_events(&store, 4).await;
    assert_eq!(
        seen,
        [
            ("a".into(), 1),
            ("c".into(), 2),
            ("a".into(), 3),
            ("c".into(), 4)
        ],
        "only the successful writes, in revision order"
    );
    let history = store.history(&a).await.expect("history of a");
    assert_eq!(history.len(), 2);
    assert_eq!(
        store.revision(&a, 2).await.expect("revision 2").spec,
        Some(json!({"image": "img:2"})),
        "a delta against a revision of the same group decodes"
    );
    assert_eq!(
        store
            .step_logs("uid-a", &crate::StepLogFilter::default())
            .await
            .expect("step logs"),
        vec![entry]
    );
}

/// A step log entry of pod "a".
fn log_entry() -> corral_api::workflow::StepLogEntry {
    corral_api::workflow::StepLogEntry {
        time: chrono::DateTime::UNIX_EPOCH,
        object_uid: "uid-a".into(),
        workflow_id: "start-1".into(),
        workflow: "start".into(),
        step: "node/start".into(),
        owner: "node".into(),
        level: corral_api::workflow::LogLevel::Info,
        message: "started".into(),
        fields: Default::default(),
    }
}

/// Runs `writes` (whose first poll queues them) so that the writer takes
/// them as one group: the write connection is held (from a thread of its
/// own) while a blocker write — a step log entry, which makes no revision
/// — is queued first, so the writer takes the blocker and waits for the
/// connection while every one of `writes` queues up behind it.
async fn queued_together<F: std::future::Future>(store: &SqliteStore, writes: F) -> F::Output {
    let mut writes = std::pin::pin!(writes);
    let db = std::sync::Arc::clone(&store.shared.db);
    let (locked, is_locked) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let held = db.writer();
        locked.send(()).expect("report the lock");
        let _ = released.recv();
        drop(held);
    });
    is_locked.recv().expect("the connection is held");
    let entry = corral_api::workflow::StepLogEntry {
        object_uid: "uid-blocker".into(),
        ..log_entry()
    };
    let mut blocker = std::pin::pin!(store.append_step_logs(std::slice::from_ref(&entry)));
    assert!(futures::poll!(&mut blocker).is_pending());
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(futures::poll!(&mut writes).is_pending());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    release.send(()).expect("release the connection");
    holder.join().expect("holder thread");
    // Had the writer not taken it alone, it shares the group's fate.
    let _ = blocker.await;
    writes.await
}

/// A write whose statement fails once it has begun writing its rows cannot
/// be taken back alone: its whole group fails, nothing of the group is
/// committed, every caller hears why, and the store goes on from where it
/// was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_failing_while_it_writes_fails_its_group_and_leaves_nothing() {
    use futures::FutureExt;
    use futures::future::BoxFuture;

    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("group.db")).expect("open");
    let change = change();
    store
        .create(object_named("before", "img:1"), &change)
        .await
        .expect("create before");
    // The watch event of pod "poison" cannot be inserted: its write fails
    // after its store revision, history revision and object row.
    store
        .shared
        .db
        .writer()
        .execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON events WHEN NEW.name = 'poison'
             BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
        )
        .expect("trigger");
    let mut before_edited = object_named("before", "img:2");
    before_edited.metadata.namespace = Some("default".into());
    let writes: Vec<BoxFuture<'_, Result<Object, StoreError>>> = vec![
        store.create(object_named("a", "img:1"), &change).boxed(),
        store
            .create(object_named("poison", "img:1"), &change)
            .boxed(),
        store.update(before_edited, 1, &change).boxed(),
    ];
    let results = queued_together(&store, futures::future::join_all(writes)).await;
    for result in &results {
        match result {
            Err(StoreError::Unavailable(message)) => {
                assert!(message.contains("injected failure"), "{message}")
            }
            other => panic!("every write of the group fails, got {other:?}"),
        }
    }
    let key = |name: &str| crate::ObjectKey::new(Kind::Pod, Some("default"), name);
    assert_eq!(store.current_revision().await.expect("revision"), 1);
    for name in ["a", "poison"] {
        assert!(
            store.get(&key(name)).await.expect("get").is_none(),
            "{name} was not created"
        );
        assert!(
            matches!(
                store.history(&key(name)).await,
                Err(StoreError::NotFound { .. })
            ),
            "{name} has no history"
        );
    }
    let before = store
        .get(&key("before"))
        .await
        .expect("get")
        .expect("before exists");
    assert_eq!(before.spec, json!({"image": "img:1"}));
    assert_eq!(
        store.history(&key("before")).await.expect("history").len(),
        1
    );

    store
        .shared
        .db
        .writer()
        .execute_batch("DROP TRIGGER poison;")
        .expect("drop trigger");
    let after = store
        .create(object_named("poison", "img:1"), &change)
        .await
        .expect("the store goes on");
    assert_eq!(after.metadata.resource_version, 2);
    let seen = first_events(&store, 2).await;
    assert_eq!(seen, [("before".to_string(), 1), ("poison".to_string(), 2)]);
}

/// The name and revision of the store's first `count` watch events.
async fn first_events(store: &SqliteStore, count: usize) -> Vec<(String, u64)> {
    let mut watch = store.watch(WatchFilter::default(), 0).await.expect("watch");
    let mut seen = Vec::new();
    for _ in 0..count {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next())
            .await
            .expect("an event in time")
            .expect("stream goes on")
            .expect("event");
        seen.push((event.object.metadata.name.clone(), event.resource_version()));
    }
    seen
}

fn version(result: Result<Object, StoreError>) -> Result<Option<u64>, StoreError> {
    result.map(|object| Some(object.metadata.resource_version))
}

/// Many concurrent writers: every write lands once, revisions are dense,
/// and groups really form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_get_dense_revisions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("many.db")).expect("open");
    let tasks: Vec<_> = (0..16)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut versions = Vec::new();
                let mut object = store
                    .create(object_named(&format!("t{task}"), "img:0"), &change())
                    .await
                    .expect("create");
                versions.push(object.metadata.resource_version);
                for edit in 1..=30 {
                    let expected = object.metadata.resource_version;
                    object.spec = json!({"image": format!("img:{edit}")});
                    object = store
                        .update(object, expected, &change())
                        .await
                        .expect("update");
                    versions.push(object.metadata.resource_version);
                }
                versions
            })
        })
        .collect();
    let mut versions = Vec::new();
    for task in tasks {
        versions.extend(task.await.expect("task"));
    }
    versions.sort_unstable();
    assert_eq!(versions, (1..=16 * 31).collect::<Vec<u64>>());
    let stats = store.commit_stats();
    assert_eq!(stats.writes, 16 * 31);
    println!("{} writes in {} commits", stats.writes, stats.commits);
    let key = crate::ObjectKey::new(Kind::Pod, Some("default"), "t7");
    assert_eq!(
        store.revision(&key, 31).await.expect("revision").spec,
        Some(json!({"image": "img:30"}))
    );
}

/// Compaction walks the objects in batches; every batch is applied.
#[tokio::test]
async fn compaction_covers_objects_across_batches() {
    let store = SqliteStore::open_in_memory().expect("store");
    let objects = 1200;
    for index in 0..objects {
        let mut object = store
            .create(object_named(&format!("p{index:04}"), "img:0"), &change())
            .await
            .expect("create");
        for edit in 1..=2 {
            let expected = object.metadata.resource_version;
            object.spec = json!({"image": format!("img:{edit}")});
            object = store
                .update(object, expected, &change())
                .await
                .expect("update");
        }
    }
    let report = store
        .compact_history(
            corral_api::history::CompactionPolicy::Last { count: 1 },
            chrono::DateTime::UNIX_EPOCH,
        )
        .await
        .expect("compact");
    assert_eq!(report.revisions_removed, 2 * objects);
    assert_eq!(store.history_size().await.expect("size").revisions, objects);
    for index in [0, 499, 500, 1199] {
        let key = crate::ObjectKey::new(Kind::Pod, Some("default"), &format!("p{index:04}"));
        assert_eq!(
            store
                .revision(&key, 3)
                .await
                .expect("current revision")
                .spec,
            Some(json!({"image": "img:2"}))
        );
    }
}

fn entry(uid: &str, message: &str) -> corral_api::workflow::StepLogEntry {
    corral_api::workflow::StepLogEntry {
        time: chrono::DateTime::UNIX_EPOCH,
        object_uid: uid.to_string(),
        workflow_id: "start-1".into(),
        workflow: "start".into(),
        step: "x/a".into(),
        owner: "x".into(),
        level: corral_api::workflow::LogLevel::Info,
        message: message.to_string(),
        fields: Default::default(),
    }
}

/// The messages of `uid`'s step log, in order.
async fn log_messages(store: &SqliteStore, uid: &str) -> Vec<String> {
    store
        .step_logs(uid, &crate::StepLogFilter::default())
        .await
        .unwrap_or_else(|error| panic!("{uid}'s log: {error}"))
        .into_iter()
        .map(|entry| entry.message)
        .collect()
}

#[tokio::test]
async fn a_logged_write_and_its_log_land_together_or_not_at_all() {
    let store = store_with_capacity(16);
    let mut object = Object::new(Kind::Pod, None, "p", json!({"n": 1}));
    object.metadata.uid = "uid-p".into();
    let created = store
        .create_logged(object, &change(), &[entry("uid-p", "created")])
        .await
        .expect("create");
    let mut next = created.clone();
    next.status = json!({"phase": "Running"});
    store
        .update_logged(
            next.clone(),
            created.metadata.resource_version,
            &change(),
            &[entry("uid-p", "ran")],
        )
        .await
        .expect("update");
    let stale = store
        .update_logged(
            next,
            created.metadata.resource_version,
            &change(),
            &[entry("uid-p", "never")],
        )
        .await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    let logs = store
        .step_logs("uid-p", &crate::StepLogFilter::default())
        .await
        .expect("logs");
    let messages: Vec<&str> = logs.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        ["created", "ran"],
        "the refused write logged nothing"
    );
}

#[tokio::test]
async fn a_live_event_carries_the_body_the_store_wrote() {
    let store = store_with_capacity(16);
    let mut stream = store.watch(WatchFilter::default(), 0).await.expect("watch");
    // The first event may be read back from the table; the next are live.
    create(&store, 0).await;
    assert_eq!(next_version(&mut stream).await.expect("event"), 1);
    let mut object = Object::new(Kind::Pod, None, "p0", json!({"text": "a \"quoted\" é"}));
    object.metadata.resource_version = 1;
    store.update(object, 1, &change()).await.expect("update");
    create(&store, 1).await;
    for expected in 2..=3 {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
            .await
            .expect("an event in time")
            .expect("stream goes on")
            .expect("event");
        assert_eq!(event.resource_version(), expected);
        // The watch cache serves these bytes as the object's JSON: they must
        // be exactly what encoding the event's object gives.
        let encoded = event.encoded.as_deref().expect("a live event has its body");
        assert_eq!(
            encoded,
            serde_json::to_string(&event.object).expect("encode")
        );
    }
}

/// The bundled SQLite syncs its WAL with `fdatasync` (design 0053): the
/// flag that tells its build `fdatasync` exists reaches every build of the
/// workspace (`.cargo/config.toml`).
#[test]
fn the_bundled_sqlite_is_built_to_sync_with_fdatasync() {
    let flags = option_env!("LIBSQLITE3_FLAGS").unwrap_or_default();
    assert!(
        flags.contains("-DHAVE_FDATASYNC=1"),
        "LIBSQLITE3_FLAGS={flags:?}"
    );
}

/// The writer numbers step-log entries on from the newest number it gave
/// out, kept in `meta`, not from the newest row: after the newest entries
/// were indexed and deleted (an object's log going with it), new entries
/// still get numbers past the index mark, and read back, before and after
/// the store is opened again.
#[tokio::test]
async fn step_log_numbers_are_never_given_twice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    {
        let store = SqliteStore::open(&path).expect("open");
        store
            .append_step_logs(&[entry("uid-a", "a1"), entry("uid-a", "a2")])
            .await
            .expect("append a");
        store
            .append_step_logs(&[entry("uid-b", "b1"), entry("uid-b", "b2")])
            .await
            .expect("append b");
        // Everything indexed, then the newest entries (b's) deleted, as
        // when b's log goes with b.
        store
            .shared
            .db
            .writer()
            .execute_batch(
                "INSERT INTO step_logs_by_object (object_uid, seq)
                     SELECT object_uid, seq FROM step_logs;
                 UPDATE meta SET value = 4 WHERE key = 'step_logs_indexed';
                 DELETE FROM step_logs WHERE object_uid = 'uid-b';
                 DELETE FROM step_logs_by_object WHERE object_uid = 'uid-b';",
            )
            .expect("index, then delete b's entries");
        store
            .append_step_logs(&[entry("uid-c", "c1")])
            .await
            .expect("append c");
        assert_eq!(log_messages(&store, "uid-c").await, ["c1"]);
    }
    let store = SqliteStore::open(&path).expect("open again");
    store
        .append_step_logs(&[entry("uid-c", "c2")])
        .await
        .expect("append c again");
    assert_eq!(log_messages(&store, "uid-c").await, ["c1", "c2"]);
    let numbers: Vec<i64> = {
        let conn = store.shared.db.writer();
        let mut statement = conn
            .prepare("SELECT seq FROM step_logs ORDER BY seq")
            .expect("prepare");
        statement
            .query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("numbers")
    };
    assert_eq!(numbers, [1, 2, 5, 6]);
}

/// Version 10 rebuilds the step log without `AUTOINCREMENT` and starts
/// the writer's numbers past every number given out: here
/// `sqlite_sequence`'s, above the newest row left.
#[test]
fn the_version_10_migration_numbers_on_past_sqlite_sequence() {
    let mut conn = rusqlite::Connection::open_in_memory().expect("open");
    super::schema::create_at(&conn, 9).expect("version 9");
    conn.execute_batch(
        "INSERT INTO step_logs (object_uid, time, workflow_id, workflow, step, owner, level, message, fields)
             VALUES ('uid-a', '1970-01-01T00:00:00Z', 'start-1', 'start', 'x/a', 'x', 'info', 'a1', '{}'),
                    ('uid-a', '1970-01-01T00:00:00Z', 'start-1', 'start', 'x/a', 'x', 'info', 'a2', '{}'),
                    ('uid-b', '1970-01-01T00:00:00Z', 'start-1', 'start', 'x/a', 'x', 'info', 'b1', '{}');
         DELETE FROM step_logs WHERE object_uid = 'uid-b';",
    )
    .expect("a version 9 step log");
    super::schema::prepare(&mut conn, false).expect("migrate");
    let seq = super::schema::get_meta(&conn, super::schema::META_STEP_LOGS_SEQ).expect("mark");
    assert_eq!(seq, 3);
    let autoincrement: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'step_logs' AND sql LIKE '%AUTOINCREMENT%'",
            [],
            |row| row.get(0),
        )
        .expect("schema");
    assert_eq!(autoincrement, 0);
    let kept: Vec<String> = {
        let mut statement = conn
            .prepare("SELECT message FROM step_logs ORDER BY seq")
            .expect("prepare");
        statement
            .query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("messages")
    };
    assert_eq!(kept, ["a1", "a2"]);
}

/// Two stores opened on one file (two servers, or a tool beside one)
/// take turns writing: each writer notices the other's commits and reads
/// the store revision and the step-log numbers again, so revisions keep
/// rising and no number is given twice.
#[tokio::test]
async fn two_stores_on_one_file_take_turns_without_reusing_numbers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let stores = [
        SqliteStore::open(&path).expect("open"),
        SqliteStore::open(&path).expect("open a second time"),
    ];
    let mut object = Object::new(Kind::Pod, None, "p", json!({"n": 0}));
    object.metadata.uid = "uid-p".into();
    let mut current = stores[0]
        .create_logged(object, &change(), &[entry("uid-p", "0")])
        .await
        .expect("create");
    let mut versions = vec![current.metadata.resource_version];
    for turn in 1..=6_u64 {
        let store = &stores[usize::try_from(turn % 2).expect("small")];
        let mut next = current.clone();
        next.spec = json!({"n": turn});
        current = store
            .update_logged(
                next,
                current.metadata.resource_version,
                &change(),
                &[entry("uid-p", &turn.to_string())],
            )
            .await
            .unwrap_or_else(|error| panic!("turn {turn}: {error}"));
        versions.push(current.metadata.resource_version);
    }
    assert_eq!(versions, (1..=7).collect::<Vec<u64>>());
    assert_eq!(
        log_messages(&stores[1], "uid-p").await,
        ["0", "1", "2", "3", "4", "5", "6"]
    );
}
