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
        last_used_at: None,
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

/// Set (to a database path) only in the child process of
/// `acknowledged_writes_survive_sigkill_of_concurrent_writers`.
const CHILD_DATABASE: &str = "CORRAL_STORE_SIGKILL_CHILD_DB";
/// How the child reports an acknowledged write on its stdout:
/// `ACK <resourceVersion> <name> <revision> <deleted>`.
const ACK: &str = "ACK";

/// Not a check by itself: the writer process the SIGKILL test below starts
/// by running this test binary with `CHILD_DATABASE` set. Four tasks write
/// concurrently (creates, spec updates, deletes) and print each write once
/// the store has acknowledged it, until the parent kills the process.
#[test]
fn sigkill_child_writer() {
    let Ok(path) = std::env::var(CHILD_DATABASE) else {
        return; // run as an ordinary test: nothing to do
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let store = SqliteStore::open(std::path::Path::new(&path)).expect("open");
        let writers: Vec<_> = (0..4)
            .map(|writer| tokio::spawn(child_writes(store.clone(), writer)))
            .collect();
        for writer in writers {
            writer.await.expect("writer task");
        }
    });
}

/// Writes until killed: pod `wW-N` is created, edited twice, and every
/// third one deleted.
async fn child_writes(store: SqliteStore, writer: usize) {
    use std::io::Write;
    let report = |object: &Object, deleted: bool| {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{ACK} {} {} {} {deleted}",
            object.metadata.resource_version, object.metadata.name, object.metadata.revision
        )
        .and_then(|()| out.flush())
        .expect("report an acknowledged write");
    };
    for index in 0.. {
        let name = format!("w{writer}-{index}");
        let mut object = store
            .create(new_pod(&name, pod_spec(0)), &change(0))
            .await
            .expect("create");
        report(&object, false);
        for edit in 1..=2 {
            let expected = object.metadata.resource_version;
            object.spec = pod_spec(edit);
            object = store
                .update(object, expected, &change(0))
                .await
                .expect("update");
            report(&object, false);
        }
        if index % 3 == 0 {
            let gone = store
                .delete(&object.key(), None, &change(0))
                .await
                .expect("delete");
            report(&gone, true);
        }
    }
}

/// One acknowledged write as the child reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ack {
    resource_version: u64,
    name: String,
    revision: u64,
    deleted: bool,
}

fn parse_ack(line: &str) -> Option<Ack> {
    let mut fields = line.strip_prefix(ACK)?.split_whitespace();
    Some(Ack {
        resource_version: fields.next()?.parse().ok()?,
        name: fields.next()?.to_string(),
        revision: fields.next()?.parse().ok()?,
        deleted: fields.next()?.parse().ok()?,
    })
}

/// Four concurrent writers in a child process share group commits; the
/// child is SIGKILLed mid-stream, and every write it had acknowledged —
/// exact resourceVersion, key and spec revision — is in the reopened
/// database.
#[tokio::test]
async fn acknowledged_writes_survive_sigkill_of_concurrent_writers() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    const KILL_AFTER: usize = 600;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("killed.db");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "sigkill_child_writer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DATABASE, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the writer process");
    let stdout = child.stdout.take().expect("child stdout");
    // Every line in the pipe was written after its write was acknowledged,
    // so lines still buffered when the child dies count too: read to EOF.
    let mut acks = Vec::new();
    let mut killed = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read the child's report");
        if let Some(ack) = parse_ack(&line) {
            acks.push(ack);
        }
        if !killed && acks.len() >= KILL_AFTER {
            child.kill().expect("SIGKILL the writer");
            killed = true;
        }
    }
    let status = child.wait().expect("reap the writer");
    assert_eq!(
        status.signal(),
        Some(9),
        "the writer must die by SIGKILL mid-stream (status {status:?}, {} acks)",
        acks.len()
    );
    assert!(
        acks.len() >= KILL_AFTER,
        "only {} writes acknowledged",
        acks.len()
    );

    let store = SqliteStore::open(&path).expect("reopen after SIGKILL");
    let newest = store.current_revision().await.expect("revision");
    let acked_newest = acks.iter().map(|ack| ack.resource_version).max();
    assert!(
        acked_newest.is_some_and(|acked| acked <= newest),
        "the store is at {newest}, behind acknowledged {acked_newest:?}"
    );
    // Every event (well inside the default window) says which object each
    // store revision wrote.
    let mut watch = store.watch(WatchFilter::default(), 0).await.expect("watch");
    let mut written = std::collections::HashMap::new();
    for _ in 0..newest {
        let event = watch.next().await.expect("event").expect("ok");
        written.insert(
            event.resource_version(),
            (
                event.object.metadata.name.clone(),
                event.object.metadata.revision,
                event.event_type == corral_store::EventType::Deleted,
            ),
        );
    }
    for ack in &acks {
        assert_eq!(
            written.get(&ack.resource_version),
            Some(&(ack.name.clone(), ack.revision, ack.deleted)),
            "acknowledged write {ack:?} is in the reopened store"
        );
        if !ack.deleted {
            let key = ObjectKey::new(Kind::Pod, Some("default"), &ack.name);
            let record = store
                .revision(&key, ack.revision)
                .await
                .unwrap_or_else(|error| panic!("revision of {ack:?}: {error}"));
            assert_eq!(record.spec, Some(pod_spec(ack.revision - 1)), "{ack:?}");
        }
    }
    let resource_versions: std::collections::HashSet<u64> =
        acks.iter().map(|ack| ack.resource_version).collect();
    assert_eq!(
        resource_versions.len(),
        acks.len(),
        "no two acks share a revision"
    );
}
