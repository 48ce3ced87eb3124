//! The table layout of schema versions 6 (design 0046), 7 (design 0054)
//! and 8 (design 0057): what the migrations keep, and how few pages an
//! update writes.

use corral_api::workflow::{LogLevel, StepLogEntry};
use corral_api::{AuthorClass, Kind, Object, ObjectKey};
use rusqlite::Connection;
use serde_json::json;

use super::history::{self, NewRevision};
use super::{SqliteStore, schema, steplogs};
use crate::{ChangeMeta, StepLogFilter, Store};

fn change(message: &str) -> ChangeMeta {
    ChangeMeta {
        author: "alice".into(),
        class: AuthorClass::External,
        message: message.into(),
        time: chrono::DateTime::UNIX_EPOCH,
        always_record: false,
    }
}

/// A pod about as large as a running one (~2 KB of JSON), which is what
/// spilled out of a `WITHOUT ROWID` leaf.
fn pod(name: &str, uid: &str, generation: u64) -> Object {
    let mut object = Object::new(
        Kind::Pod,
        Some("default"),
        name,
        json!({
            "image": format!("registry.example.com/app:{generation}"),
            "notes": "x".repeat(1700),
        }),
    );
    object.metadata.uid = uid.into();
    object.metadata.created_at = Some(created());
    object
}

/// The creation time every test pod carries (the server sets it on
/// create; the store keeps it).
fn created() -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(1_700_000_000, 123_456_789).expect("a time")
}

fn log(uid: &str, second: i64, message: &str) -> StepLogEntry {
    StepLogEntry {
        time: chrono::DateTime::from_timestamp(second, 0).expect("a time"),
        object_uid: uid.into(),
        workflow_id: "start-1".into(),
        workflow: "start".into(),
        step: "node/pull-image".into(),
        owner: "node".into(),
        level: LogLevel::Info,
        message: message.into(),
        fields: std::collections::BTreeMap::new(),
    }
}

/// Writes a history revision of `object` as every version writes it
/// (a keyframe), at store revision `seq`.
fn revision_row(conn: &Connection, object: &Object, revision: u64, seq: u64, deleted: bool) {
    let key = object.key();
    let change = change("v5");
    let new = NewRevision {
        uid: &object.metadata.uid,
        revision,
        key: &key,
        change: &change,
        deleted,
        seq,
    };
    let bytes = serde_json::to_vec(&object.spec).expect("spec");
    let encoded = history::encode(&new, &bytes, None).expect("encode");
    history::insert(conn, &encoded).expect("a revision row");
}

/// The object row as version 5 wrote it (today's code writes version 6's
/// columns).
fn version_5_object_row(conn: &Connection, object: &Object) {
    let key = object.key();
    conn.execute(
        "INSERT INTO objects (kind, namespace, name, uid, revision, resource_version, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        rusqlite::params![
            key.kind.as_str(),
            key.namespace,
            key.name,
            object.metadata.uid,
            object.metadata.revision as i64,
            object.metadata.resource_version as i64,
            serde_json::to_string(object).expect("body"),
        ],
    )
    .expect("an object row");
}

#[tokio::test]
async fn a_version_5_database_keeps_its_objects_step_logs_and_the_history_of_deleted_ones() {
    let mut conn = Connection::open_in_memory().expect("open");
    schema::create_at(&conn, 5).expect("the v5 schema");
    // Under one key: a pod deleted, then another created and deleted; a live
    // pod beside them, updated once.
    let mut seq = 0;
    for (uid, generation) in [("uid-old", 1), ("uid-new", 2)] {
        let gone = pod("gone", uid, generation);
        for (revision, deleted) in [(1, false), (2, true)] {
            seq += 1;
            revision_row(&conn, &gone, revision, seq, deleted);
        }
    }
    for revision in [1, 2] {
        seq += 1;
        revision_row(
            &conn,
            &pod("live", "uid-live", revision),
            revision,
            seq,
            false,
        );
    }
    let mut stored = pod("live", "uid-live", 2);
    stored.metadata.revision = 2;
    stored.metadata.resource_version = seq;
    version_5_object_row(&conn, &stored);
    schema::set_meta(&conn, schema::META_REVISION, seq).expect("the store revision");
    let live = stored.key();

    // Appended out of time order: read back in time order all the same.
    let logs = [log("uid-live", 3, "later"), log("uid-live", 1, "earlier")];
    let encoded = steplogs::encode(&logs).expect("encode");
    steplogs::insert(&conn, &encoded, &mut 0).expect("append at version 5");

    schema::prepare(&mut conn, false).expect("migrate");
    let layout: Vec<String> = conn
        .prepare("SELECT sql FROM sqlite_schema WHERE sql IS NOT NULL ORDER BY name")
        .expect("schema")
        .query_map([], |row| row.get(0))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("sql");
    let objects_table = layout
        .iter()
        .find(|sql| {
            sql.starts_with("CREATE TABLE \"objects\"") || sql.starts_with("CREATE TABLE objects")
        })
        .expect("an objects table");
    assert!(!objects_table.contains("WITHOUT ROWID"), "{objects_table}");
    assert!(
        layout
            .iter()
            .any(|sql| sql.contains("revisions_deleted_key") && sql.contains("WHERE deleted = 1")),
        "{layout:#?}"
    );
    assert!(
        !layout
            .iter()
            .any(|sql| sql.contains("INDEX revisions_key ")),
        "{layout:#?}"
    );
    // Version 7: the entries are found by object in a table filled in
    // batches, which the migration filled with every entry so far.
    assert!(
        layout
            .iter()
            .any(|sql| sql.contains("CREATE TABLE step_logs_by_object")),
        "{layout:#?}"
    );
    assert!(
        !layout.iter().any(|sql| sql.contains("step_logs_object")),
        "{layout:#?}"
    );
    let appended: u64 = conn
        .query_row("SELECT MAX(seq) FROM step_logs", [], |row| row.get(0))
        .expect("newest entry");
    assert_eq!(
        schema::get_meta(&conn, schema::META_STEP_LOGS_INDEXED).expect("mark"),
        appended
    );

    let store = SqliteStore::from_connection(conn, None, 16).expect("store");
    let stored = store.get(&live).await.expect("get").expect("the live pod");
    assert_eq!(stored.metadata.uid, "uid-live");
    assert_eq!(stored.metadata.revision, 2);
    assert_eq!(stored.metadata.created_at, Some(created()), "from the body");
    assert_eq!(stored.spec, pod("live", "uid-live", 2).spec);
    let listed = store.list(Kind::Pod, Some("default")).await.expect("list");
    assert_eq!(listed.objects.len(), 1, "the deleted pods stay deleted");

    let gone = ObjectKey::new(Kind::Pod, Some("default"), "gone");
    let history = store
        .history(&gone)
        .await
        .expect("history of a deleted key");
    assert!(
        history.iter().all(|record| record.uid == "uid-new"),
        "the newest uid deleted under the key: {history:?}"
    );
    assert_eq!(
        history
            .iter()
            .map(|record| record.deleted)
            .collect::<Vec<_>>(),
        [false, true]
    );
    assert_eq!(store.history(&live).await.expect("history").len(), 2);
    let read = store
        .step_logs("uid-live", &StepLogFilter::default())
        .await
        .expect("step logs");
    assert_eq!(
        read.iter()
            .map(|entry| entry.message.as_str())
            .collect::<Vec<_>>(),
        ["earlier", "later"]
    );

    // The new layout takes writes: a third pod under the old key.
    store
        .create(pod("gone", "uid-third", 3), &change("again"))
        .await
        .expect("create after the migration");
    let history = store.history(&gone).await.expect("history");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].uid, "uid-third");

    // An update takes the creation time from the column the migration
    // filled, not from its caller.
    let mut update = pod("live", "uid-live", 2);
    update.metadata.created_at = None;
    update.status = json!({"phase": "Running"});
    let updated = store
        .update(update, seq, &change("status"))
        .await
        .expect("update after the migration");
    assert_eq!(updated.metadata.created_at, Some(created()));
    assert_eq!(updated.metadata.revision, 2, "the same spec");
}

/// WAL frames of one page each, from the file's size.
fn wal_frames(path: &std::path::Path) -> u64 {
    const HEADER: u64 = 32;
    const FRAME: u64 = 24 + 4096;
    let wal = path.with_extension("db-wal");
    std::fs::metadata(wal).map_or(0, |meta| meta.len().saturating_sub(HEADER) / FRAME)
}

/// Pods `p0`… (uids `uid-0`…), created; their resource versions.
async fn create_pods(store: &SqliteStore, pods: usize) -> Vec<u64> {
    let mut versions = Vec::new();
    for index in 0..pods {
        let created = store
            .create(
                pod(&format!("p{index}"), &format!("uid-{index}"), 0),
                &change("create"),
            )
            .await
            .expect("create");
        versions.push(created.metadata.resource_version);
    }
    versions
}

/// Checkpoints the WAL into the database and empties it, so that its size
/// counts only what is written next.
fn restart_wal(path: &std::path::Path) {
    Connection::open(path)
        .expect("a second connection")
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
            row.get::<_, i64>(0)
        })
        .expect("checkpoint");
    assert_eq!(wal_frames(path), 0);
}

#[tokio::test]
async fn an_update_of_a_two_kilobyte_pod_writes_a_handful_of_pages() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path).expect("open");
    let pods = 40;
    let mut versions = create_pods(&store, pods).await;
    // Start the WAL over, so that its size counts only the updates.
    restart_wal(&path);

    let updates = 60;
    update_pods(&store, &mut versions, updates, 7).await;
    // Each update is a group of its own: the store revision, the object's
    // row, its history revision and the time index of history, its watch
    // event, and the database header: 6.2 pages per update when this was
    // written. Version 8 took 7.2 with its index of the events by time
    // (design 0061); the version 5 layout 9.9 even without rewriting the
    // uid index: a 2 KB row spilled to an overflow page (rewritten with the
    // freelist at every update), and every revision wrote a page of the key
    // index of history.
    let per_update = wal_frames(&path) as f64 / updates as f64;
    assert!(
        per_update <= 7.0,
        "{per_update:.1} WAL pages per update of a 2 KB pod"
    );
}

#[tokio::test]
async fn an_update_after_a_restart_tells_a_new_spec_from_the_stored_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let key = pod("p", "uid-p", 1).key();
    let version = {
        let store = SqliteStore::open(&path).expect("open");
        let created = store
            .create(pod("p", "uid-p", 1), &change("create"))
            .await
            .expect("create");
        created.metadata.resource_version
    };
    // A new store has not cached the spec of revision 1: the update
    // compares against the stored body instead.
    let store = SqliteStore::open(&path).expect("open again");
    let mut same = pod("p", "other-uid", 1);
    same.metadata.created_at = None;
    same.status = json!({"phase": "Running"});
    let written = store
        .update(same, version, &change("status only"))
        .await
        .expect("update");
    assert_eq!(written.metadata.revision, 1, "the same spec is no revision");
    assert_eq!(written.metadata.uid, "uid-p", "the stored uid is kept");
    assert_eq!(written.metadata.created_at, Some(created()));
    assert_eq!(written.status, json!({"phase": "Running"}));

    // Now cached: a new spec is told apart from the cached bytes.
    let newer = pod("p", "uid-p", 2);
    let written = store
        .update(
            newer,
            written.metadata.resource_version,
            &change("new image"),
        )
        .await
        .expect("update");
    assert_eq!(written.metadata.revision, 2);
    let again = pod("p", "uid-p", 2);
    let written = store
        .update(again, written.metadata.resource_version, &change("again"))
        .await
        .expect("update");
    assert_eq!(written.metadata.revision, 2, "unchanged against the cache");
    assert_eq!(store.history(&key).await.expect("history").len(), 2);
    let reread = store.get(&key).await.expect("get").expect("the pod");
    assert_eq!(reread.metadata.created_at, Some(created()));
}

/// The index mark and how many entries are past it.
async fn index_mark(store: &SqliteStore) -> (u64, u64) {
    store
        .read(|conn| {
            let mark = schema::get_meta(conn, schema::META_STEP_LOGS_INDEXED)?;
            let past: u64 = conn.query_row(
                "SELECT COUNT(*) FROM step_logs WHERE seq > ?1",
                [schema::to_i64(mark)],
                |row| row.get(0),
            )?;
            Ok((mark, past))
        })
        .await
        .expect("the index mark")
}

#[tokio::test]
async fn step_logs_past_the_index_mark_are_read_with_the_indexed_ones() {
    let store = SqliteStore::open_in_memory().expect("store");
    // Two objects' entries interleaved, in appends of 100 (a group each),
    // with times that run backwards within each append: read back in time
    // order all the same.
    let appends = 25;
    for append in 0..appends {
        let entries: Vec<StepLogEntry> = (0..100)
            .map(|index| {
                let uid = if index % 2 == 0 { "uid-a" } else { "uid-b" };
                let second = append * 1000 + (100 - index);
                let mut entry = log(uid, second, &format!("{append}/{index}"));
                entry.workflow_id = format!("start-{}", append % 2);
                entry
            })
            .collect();
        store.append_step_logs(&entries).await.expect("append");
    }
    let total = (appends * 100) as u64;
    let (mark, past) = index_mark(&store).await;
    assert!(
        mark >= steplogs::INDEX_BATCH && past > 0 && past < steplogs::INDEX_BATCH,
        "indexed up to {mark}, {past} past the mark"
    );
    assert_eq!(mark + past, total);

    for uid in ["uid-a", "uid-b"] {
        let read = store
            .step_logs(uid, &StepLogFilter::default())
            .await
            .expect("read");
        assert_eq!(read.len() as u64, total / 2, "{uid}");
        assert!(read.iter().all(|entry| entry.object_uid == uid));
        assert!(
            read.windows(2).all(|pair| pair[0].time <= pair[1].time),
            "{uid}: in time order"
        );
        // A filter applies to the entries on both sides of the mark (the
        // last three appends are past it).
        let filter = StepLogFilter {
            workflow_id: Some("start-1".into()),
            ..StepLogFilter::default()
        };
        let filtered = store.step_logs(uid, &filter).await.expect("read");
        // The odd appends' half of the entries.
        assert_eq!(filtered.len() as u64, (appends / 2 * 50) as u64, "{uid}");
        assert!(filtered.iter().all(|entry| entry.workflow_id == "start-1"));
        assert!(
            filtered
                .iter()
                .any(|entry| entry.message.starts_with("23/"))
        );
        assert!(filtered.iter().any(|entry| entry.message.starts_with("1/")));
    }
}

#[tokio::test]
async fn an_update_and_its_step_log_write_no_page_of_an_index_by_object() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path).expect("open");
    let pods = 16;
    let mut versions = create_pods(&store, pods).await;
    // Enough history and log that every object's entries span leaves of
    // their own, as on a store that has run for a while; then the WAL
    // starts over and counts the next updates.
    let warm = 3000;
    let updates = 50;
    for round in 0..warm + updates {
        if round == warm {
            restart_wal(&path);
        }
        let index = (round * 7) % pods;
        let uid = format!("uid-{index}");
        let mut object = pod(&format!("p{index}"), &uid, round as u64 + 1);
        object.metadata.resource_version = versions[index];
        // What a workflow's update writes with it: the old instance
        // cancelled, two steps of the new one ready.
        let logs: Vec<StepLogEntry> = ["cancelled", "ready", "ready"]
            .iter()
            .map(|message| log(&uid, round as i64, message))
            .collect();
        let written = store
            .update_logged(object, versions[index], &change("update"), &logs)
            .await
            .expect("update");
        versions[index] = written.metadata.resource_version;
    }
    // Each update is a group of its own (fewer than the 1,000 pages after
    // which SQLite starts the WAL over): 10.0 pages each when this was
    // written, none of them of `step_logs_by_object` until a batch is
    // indexed. With every write's entries indexed as it is written (as
    // version 6 did) the same updates wrote 11.2.
    let per_update = wal_frames(&path) as f64 / updates as f64;
    assert!(
        per_update <= 10.5,
        "{per_update:.1} WAL pages per update of a pod with three log entries"
    );
}

/// Updates pods `p0`…, `updates` times, each a new spec: the `n`th update
/// goes to pod `n * stride` (modulo the pods). `versions` holds each pod's
/// resource version and is kept current.
async fn update_pods(store: &SqliteStore, versions: &mut [u64], updates: usize, stride: usize) {
    for round in 0..updates {
        let index = (round * stride) % versions.len();
        let mut update = pod(
            &format!("p{index}"),
            &format!("uid-{index}"),
            versions[index],
        );
        update.metadata.resource_version = versions[index];
        let written = store
            .update(update, versions[index], &change("update"))
            .await
            .expect("update");
        versions[index] = written.metadata.resource_version;
    }
}

/// Sets the writer's `synchronous` mode: `OFF` to fill a table quickly
/// with commits that are not synced, `FULL` to go back.
fn set_writer_synchronous(store: &SqliteStore, mode: &str) {
    store
        .shared
        .db
        .writer()
        .pragma_update(None, "synchronous", mode)
        .expect("set synchronous");
}

/// WAL pages per update over 80 round-robin updates, from an empty WAL.
async fn frames_per_update(
    store: &SqliteStore,
    path: &std::path::Path,
    versions: &mut [u64],
) -> f64 {
    const UPDATES: usize = 80;
    restart_wal(path);
    update_pods(store, versions, UPDATES, 1).await;
    wal_frames(path) as f64 / UPDATES as f64
}

/// Once the event window is full, an update writes no more pages than
/// before: its event takes the slot of the one a ring behind (design
/// 0057) instead of deleting the oldest at the head of the table. When
/// this was written, the version 7 log went from 7.4 pages per update to
/// 11.7 once it deleted a 2 KB event per write; the ring from 7.4 to 6.7.
#[tokio::test]
async fn an_update_past_a_full_event_ring_writes_no_more_pages_than_before() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path).expect("open");
    let mut versions = create_pods(&store, 40).await;
    let before = frames_per_update(&store, &path, &mut versions).await;

    // Fill the ring and go 100 revisions past it, quickly: these commits
    // are not synced.
    set_writer_synchronous(&store, "OFF");
    let written = versions.iter().max().copied().unwrap_or(0);
    let past_the_ring = super::events::EVENT_SLOTS + 100 - written;
    let updates = usize::try_from(past_the_ring).expect("small");
    update_pods(&store, &mut versions, updates, 1).await;
    set_writer_synchronous(&store, "FULL");
    let after = frames_per_update(&store, &path, &mut versions).await;
    assert!(
        after <= before + 0.25,
        "{after:.2} WAL pages per update past a full ring, {before:.2} before it"
    );
}

/// The writer checkpoints the WAL once it holds
/// [`schema::WRITER_CHECKPOINT_PAGES`] pages, not SQLite's default 1,000
/// (design 0060): the WAL grows past 1,000 pages without being started
/// over, and once it has been, its file is no larger than the threshold
/// and the commit that crossed it.
#[tokio::test]
async fn the_writer_checkpoints_the_wal_at_its_own_threshold() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path).expect("open");
    let mut versions = create_pods(&store, 40).await;
    restart_wal(&path);
    set_writer_synchronous(&store, "OFF");
    const SQLITE_DEFAULT_PAGES: u64 = 1_000;
    let threshold = u64::try_from(schema::WRITER_CHECKPOINT_PAGES).expect("positive");
    // With SQLite's default the WAL would start over at about 1,000 pages
    // and its file would stop growing there.
    let mut largest = 0;
    let mut updates = 0;
    while largest < 2 * SQLITE_DEFAULT_PAGES {
        update_pods(&store, &mut versions, 50, 1).await;
        updates += 50;
        largest = wal_frames(&path);
        assert!(
            updates <= 2_000,
            "the WAL file stopped growing at {largest} pages ({updates} updates): checkpointed early"
        );
    }
    // Write about twice the threshold's pages: the WAL is checkpointed and
    // started over, so its file ends about as large as the threshold. (At
    // least one page an update: over 2,000 pages in at most 2,000.)
    let per_update = largest / updates as u64;
    let more = usize::try_from(2 * threshold / per_update).expect("small");
    update_pods(&store, &mut versions, more, 1).await;
    let frames = wal_frames(&path);
    assert!(
        (threshold..threshold + 100).contains(&frames),
        "the WAL file holds {frames} pages after {more} more updates; the threshold is {threshold}"
    );
}
