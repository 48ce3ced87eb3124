//! What survives closing and reopening the database file, and how much the
//! history takes on disk.

use chrono::{TimeZone, Utc};
use corral_api::history::CompactionPolicy;
use corral_api::{AuthorClass, HistoryQuery, Identity, Kind, Object, ObjectKey, Role};
use corral_store::sqlite::{SCHEMA_VERSION, SqliteStore};
use corral_store::{ChangeMeta, Store, TokenRecord, WatchFilter};
use futures::StreamExt;
use serde_json::{Value, json};

fn change(minute: i64) -> ChangeMeta {
    ChangeMeta {
        author: "alice".into(),
        class: AuthorClass::External,
        message: format!("edit {minute}"),
        time: Utc
            .with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .expect("time")
            + chrono::TimeDelta::minutes(minute),
        always_record: false,
    }
}

fn pod_spec(edit: u64) -> Value {
    json!({
        "availability": "best-effort",
        "containers": [{
            "name": "web",
            "image": format!("registry.local/team-a/web:1.{}", edit / 2),
            "command": ["httpd", "-f", "-p", "8080", "-h", "/srv/www"],
            "env": {
                "GREETING": "hello",
                "LOG_LEVEL": "info",
                "BUILD": format!("build-{}", edit - edit / 2),
                "DATABASE_URL": "postgres://db.team-a.svc:5432/web",
            },
            "ports": [8080, 8443],
            "resources": {"cpu": "250m", "memory": "128Mi"},
            "readiness": {"http": {"port": 8080, "path": "/healthz"}},
        }],
    })
}

fn new_pod(name: &str, spec: Value) -> Object {
    let mut object = Object::new(Kind::Pod, Some("default"), name, spec);
    object.metadata.uid = format!("uid-{name}");
    object.metadata.created_at = Some(change(0).time);
    object
}

#[tokio::test]
async fn reopening_the_file_keeps_objects_history_revision_and_tokens() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("corral.db");
    let web = ObjectKey::new(Kind::Pod, Some("default"), "web");
    let token = TokenRecord {
        hash: "abc123".into(),
        identity: Identity::new("node-1", Role::Node),
        created_at: change(3).time,
    };
    let (written, history, revision) = {
        let store = SqliteStore::open(&path).expect("open");
        let created = store
            .create(new_pod("web", pod_spec(0)), &change(0))
            .await
            .expect("create");
        let mut next = created.clone();
        next.spec = pod_spec(1);
        let updated = store
            .update(next, created.metadata.resource_version, &change(1))
            .await
            .expect("update");
        store
            .create(new_pod("gone", pod_spec(0)), &change(2))
            .await
            .expect("create");
        let gone = ObjectKey::new(Kind::Pod, Some("default"), "gone");
        store.delete(&gone, None, &change(2)).await.expect("delete");
        store.put_token(token.clone()).await.expect("put token");
        let history = store
            .query_history(&HistoryQuery::default())
            .await
            .expect("query");
        (
            updated,
            history,
            store.current_revision().await.expect("revision"),
        )
    };

    let store = SqliteStore::open(&path).expect("reopen");
    assert_eq!(store.get(&web).await.expect("get"), Some(written.clone()));
    assert_eq!(store.current_revision().await.expect("revision"), revision);
    assert_eq!(
        store
            .query_history(&HistoryQuery::default())
            .await
            .expect("query"),
        history
    );
    assert_eq!(history.len(), 4, "web 1, web 2, gone 1, gone deleted");
    assert_eq!(
        store.revision(&web, 1).await.expect("revision 1").spec,
        Some(pod_spec(0))
    );
    assert_eq!(
        store.revision(&web, 2).await.expect("revision 2").spec,
        Some(pod_spec(1))
    );
    assert_eq!(store.find_token("abc123").await.expect("find"), Some(token));
    // Watch replays what was written before the reopen.
    let mut watch = store.watch(WatchFilter::default(), 0).await.expect("watch");
    let mut versions = Vec::new();
    for _ in 0..revision {
        versions.push(
            watch
                .next()
                .await
                .expect("event")
                .expect("ok")
                .resource_version(),
        );
    }
    assert_eq!(versions, (1..=revision).collect::<Vec<_>>());
    // Writing goes on from the stored revision.
    let next = store
        .create(new_pod("after", pod_spec(0)), &change(4))
        .await
        .expect("create");
    assert_eq!(next.metadata.resource_version, revision + 1);
    drop(store);

    let raw = rusqlite::Connection::open(&path).expect("open raw");
    let version: i64 = raw
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("user_version");
    assert_eq!(version, SCHEMA_VERSION);
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .expect("journal_mode");
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn a_database_from_a_newer_corral_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("corral.db");
    drop(SqliteStore::open(&path).expect("open"));
    let raw = rusqlite::Connection::open(&path).expect("open raw");
    raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .expect("bump");
    drop(raw);
    let error = SqliteStore::open(&path).expect_err("newer schema must be refused");
    assert!(
        matches!(error, corral_store::StoreError::Corrupt(_)),
        "got {error:?}"
    );
}

#[tokio::test]
async fn a_thousand_edits_through_the_store_take_under_five_percent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("corral.db")).expect("open");
    let mut object = store
        .create(new_pod("web", pod_spec(0)), &change(0))
        .await
        .expect("create");
    for edit in 1..=1000 {
        let expected = object.metadata.resource_version;
        object.spec = pod_spec(edit);
        object = store
            .update(object, expected, &change(0))
            .await
            .expect("update");
    }
    assert_eq!(object.metadata.revision, 1001);
    let size = store.history_size().await.expect("size");
    let ratio = size.stored_bytes as f64 / size.raw_bytes as f64;
    println!(
        "sqlite: {} revisions, {} bytes stored for {} raw ({:.2}%)",
        size.revisions,
        size.stored_bytes,
        size.raw_bytes,
        ratio * 100.0
    );
    assert_eq!(size.revisions, 1001);
    assert!(ratio <= 0.05, "ratio {ratio} is above 5%");
    let web = object.key();
    for revision in [1, 2, 64, 65, 66, 500, 1000, 1001] {
        let record = store.revision(&web, revision).await.expect("revision");
        assert_eq!(
            record.spec,
            Some(pod_spec(revision - 1)),
            "revision {revision}"
        );
    }
    let removed = store
        .compact_history(CompactionPolicy::Last { count: 10 }, change(0).time)
        .await
        .expect("compact");
    assert_eq!(removed.revisions_removed, 991);
    for revision in 992..=1001 {
        let record = store.revision(&web, revision).await.expect("revision");
        assert_eq!(
            record.spec,
            Some(pod_spec(revision - 1)),
            "revision {revision} after compaction"
        );
    }
}
