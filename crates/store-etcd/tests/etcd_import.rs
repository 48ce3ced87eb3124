//! `corral migrate`'s core: a SQLite store exported and imported into a real
//! etcd answers exactly as the SQLite store did — objects, every revision
//! with its author, class, message, time and spec (past the delta codec's
//! keyframe interval, across a compaction gap, for deleted and recreated
//! objects), tokens and step logs — and an import into a non-empty prefix
//! is refused without writing.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use corral_api::workflow::{LogLevel, StepLogEntry};
use corral_api::{AuthorClass, HistoryQuery, Identity, Kind, Object, ObjectKey, Role};
use corral_store::sqlite::SqliteStore;
use corral_store::{ChangeMeta, StepLogFilter, Store, TokenRecord};
use corral_store_etcd::{EtcdConfig, EtcdStore, ImportError};
use corral_testkit::etcd::EtcdCluster;
use serde_json::json;

fn at(minute: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2031, 5, 1, 0, 0, 0)
        .single()
        .expect("a valid date")
        + TimeDelta::minutes(minute)
}

fn change(author: &str, class: AuthorClass, minute: i64) -> ChangeMeta {
    ChangeMeta {
        author: author.to_string(),
        class,
        message: format!("{author} at minute {minute}"),
        time: at(minute),
        always_record: false,
    }
}

fn pod(name: &str, uid: &str, image: &str) -> Object {
    let mut object = Object::new(
        Kind::Pod,
        Some("default"),
        name,
        json!({"containers": [{"name": "main", "image": image}]}),
    );
    object.metadata.uid = uid.to_string();
    object.metadata.created_at = Some(at(0));
    object
}

async fn edit(store: &dyn Store, key: &ObjectKey, change: &ChangeMeta, image: &str) {
    let mut object = store.get(key).await.expect("get").expect("exists");
    let expected = object.metadata.resource_version;
    object.spec = json!({"containers": [{"name": "main", "image": image}]});
    store
        .update(object, expected, change)
        .await
        .expect("update");
}

/// A store with some life in it: a long history, a compaction, a deleted
/// and recreated name, a Node (cluster-wide), tokens and step logs.
async fn populated(store: &SqliteStore) {
    let web = store
        .create(
            pod("web", "uid-web", "img:0"),
            &change("alice", AuthorClass::External, 0),
        )
        .await
        .expect("create web")
        .key();
    for i in 1..=70 {
        let author = if i % 3 == 0 {
            "pinned-deployment"
        } else {
            "bob"
        };
        let class = if i % 3 == 0 {
            AuthorClass::System
        } else {
            AuthorClass::External
        };
        edit(store, &web, &change(author, class, i), &format!("img:{i}")).await;
    }
    store
        .compact_history(
            corral_api::history::CompactionPolicy::Last { count: 60 },
            at(100),
        )
        .await
        .expect("compact");
    let db = store
        .create(
            pod("db", "uid-db-1", "pg:1"),
            &change("alice", AuthorClass::External, 101),
        )
        .await
        .expect("create db")
        .key();
    store
        .delete(&db, None, &change("alice", AuthorClass::External, 102))
        .await
        .expect("delete db");
    store
        .create(
            pod("db", "uid-db-2", "pg:2"),
            &change("carol", AuthorClass::External, 103),
        )
        .await
        .expect("recreate db");
    let mut node = Object::new(Kind::Node, None, "node-1", json!({}));
    node.metadata.uid = "uid-node-1".into();
    node.metadata.created_at = Some(at(104));
    node.status = json!({"phase": "Ready"});
    store
        .create(node, &change("node:node-1", AuthorClass::System, 104))
        .await
        .expect("create node");
    store
        .put_token(TokenRecord {
            hash: "aa11".into(),
            identity: Identity::new("admin", Role::Operator),
            created_at: at(1),
            last_used_at: None,
        })
        .await
        .expect("token");
    let entries: Vec<StepLogEntry> = (0..7)
        .map(|i| StepLogEntry {
            time: at(105 + i / 3),
            object_uid: if i % 2 == 0 { "uid-web" } else { "uid-db-2" }.into(),
            workflow_id: "start-1".into(),
            workflow: "start".into(),
            step: "node/start-containers".into(),
            owner: "node:node-1".into(),
            level: LogLevel::Info,
            message: format!("line {i}"),
            fields: BTreeMap::new(),
        })
        .collect();
    store.append_step_logs(&entries).await.expect("step logs");
}

/// Everything a client can read, as one comparable value.
async fn answers(store: &dyn Store) -> serde_json::Value {
    let mut objects = Vec::new();
    let mut histories = BTreeMap::new();
    for kind in [Kind::Pod, Kind::Node] {
        for mut object in store.list(kind, None).await.expect("list").objects {
            let key = object.key();
            object.metadata.resource_version = 0;
            let mut records = Vec::new();
            for record in store.history(&key).await.expect("history") {
                records.push(
                    store
                        .revision(&key, record.revision)
                        .await
                        .expect("revision"),
                );
            }
            histories.insert(key.to_string(), records);
            objects.push(object);
        }
    }
    // The deleted db's records are reachable through the cluster history.
    let cluster = store
        .query_history(&HistoryQuery::default())
        .await
        .expect("query");
    let mut logs = BTreeMap::new();
    for uid in ["uid-web", "uid-db-2"] {
        logs.insert(
            uid,
            store
                .step_logs(uid, &StepLogFilter::default())
                .await
                .expect("step logs"),
        );
    }
    let token = store.find_token("aa11").await.expect("token");
    json!({
        "objects": objects,
        "histories": histories,
        "cluster": cluster,
        "logs": logs,
        "token": token,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_store_moves_to_etcd_with_its_whole_history() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = SqliteStore::open(&dir.path().join("corral.db")).expect("open sqlite");
    populated(&sqlite).await;
    let dump = sqlite.export().await.expect("export");
    assert_eq!(dump.objects.len(), 3, "{}", dump.summary());
    // 71 web revisions compacted to 60, db-1 created and deleted, db-2, node.
    assert_eq!(dump.revisions.len(), 60 + 2 + 1 + 1, "{}", dump.summary());

    let etcd = EtcdCluster::start(1);
    let store = EtcdStore::connect(&EtcdConfig::new(etcd.endpoints()))
        .await
        .expect("connect to etcd");
    store.import(&dump).await.expect("import");
    let expected = answers(&sqlite).await;
    assert_eq!(answers(&store).await, expected);
    let history = store
        .history(&ObjectKey::new(Kind::Pod, Some("default"), "web"))
        .await
        .expect("history");
    assert_eq!(
        history.first().map(|r| r.revision),
        Some(12),
        "compacted revisions stay gone"
    );
    assert_eq!(history.last().map(|r| r.author.as_str()), Some("bob"));

    // Writes go on from the imported state.
    let web = ObjectKey::new(Kind::Pod, Some("default"), "web");
    edit(
        &store,
        &web,
        &change("dave", AuthorClass::External, 200),
        "img:next",
    )
    .await;
    let record = store.revision(&web, 72).await.expect("the next revision");
    assert_eq!(record.author, "dave");

    // A client resuming a watch from a SQLite version (far ahead of etcd's
    // count) is told to list again instead of waiting silently.
    let ahead = sqlite.current_revision().await.expect("revision") + 10_000;
    match store
        .watch(corral_store::WatchFilter::default(), ahead)
        .await
    {
        Err(corral_store::StoreError::Expired { requested, .. }) => assert_eq!(requested, ahead),
        Err(other) => panic!("a watch from the future must be Expired, got {other}"),
        Ok(_) => panic!("a watch from the future must be Expired, got a stream"),
    }

    // A second import finds the prefix in use and writes nothing.
    let before = answers(&store).await;
    match store.import(&dump).await {
        Err(ImportError::NotEmpty { keys, .. }) => assert!(keys > 0),
        other => panic!("an import into a used prefix must be refused, got {other:?}"),
    }
    assert_eq!(answers(&store).await, before);
}
