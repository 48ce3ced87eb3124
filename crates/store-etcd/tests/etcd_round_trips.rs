//! How many etcd requests a write costs, and that what the store remembers
//! of its own writes to save them is never trusted over etcd: two stores
//! (two servers) writing the same objects stay correct.

use chrono::{DateTime, Utc};
use corral_api::{AuthorClass, Kind, Object, ObjectKey};
use corral_store::{ChangeMeta, Store, StoreError};
use corral_store_etcd::{EtcdConfig, EtcdStore, KvCalls};
use corral_testkit::etcd::EtcdCluster;
use serde_json::{Value, json};

const EDITS: u64 = 100;

fn change() -> ChangeMeta {
    ChangeMeta {
        author: "alice".into(),
        class: AuthorClass::External,
        message: String::new(),
        // One fixed time: the event window is checked once, at the first
        // write, and compacts nothing, so only the writes' own requests count.
        time: DateTime::<Utc>::UNIX_EPOCH,
        always_record: false,
    }
}

fn spec(edit: u64) -> Value {
    json!({"containers": [{"name": "app", "image": "app:1", "env": {"EDIT": edit.to_string()}}]})
}

fn pod(name: &str) -> Object {
    let mut object = Object::new(Kind::Pod, Some("default"), name, spec(0));
    object.metadata.uid = format!("uid-{name}");
    object
}

fn per_write(before: KvCalls, after: KvCalls, writes: u64) -> (f64, f64, f64) {
    let per = |a: u64, b: u64| (b - a) as f64 / writes as f64;
    (
        per(before.gets, after.gets),
        per(before.puts, after.puts),
        per(before.txns, after.txns),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_costs_one_transaction_when_the_store_wrote_the_object_last() {
    let cluster = EtcdCluster::start(1);
    let store = EtcdStore::connect(&EtcdConfig::new(cluster.endpoints()))
        .await
        .expect("connect");
    let key = ObjectKey::new(Kind::Pod, Some("default"), "web");

    let start = store.kv_calls();
    let mut object = store.create(pod("web"), &change()).await.expect("create");
    let created = store.kv_calls();
    for edit in 1..=EDITS {
        let expected = object.metadata.resource_version;
        object.spec = spec(edit);
        object = store
            .update(object, expected, &change())
            .await
            .expect("update");
    }
    let updated = store.kv_calls();
    let expected = object.metadata.resource_version;
    object.status = json!({"phase": "Running"});
    object = store
        .update(object, expected, &change())
        .await
        .expect("status update");
    let status_written = store.kv_calls();
    store
        .delete(&key, Some(object.metadata.resource_version), &change())
        .await
        .expect("delete");
    let deleted = store.kv_calls();

    let create = per_write(start, created, 1);
    let update = per_write(created, updated, EDITS);
    let status = per_write(updated, status_written, 1);
    let delete = per_write(status_written, deleted, 1);
    println!("etcd requests per write (gets, puts, txns):");
    println!(
        "  create {create:?}, spec update {update:?}, status update {status:?}, delete {delete:?}"
    );
    assert_eq!(create, (0.0, 0.0, 1.0), "create is one transaction");
    assert_eq!(update, (0.0, 0.0, 1.0), "a spec update is one transaction");
    assert_eq!(
        status,
        (0.0, 0.0, 1.0),
        "a status update is one transaction"
    );
    assert_eq!(delete, (0.0, 0.0, 1.0), "a delete is one transaction");

    // Every revision still decodes (the deltas were built on what the
    // store remembered, not on history it read back).
    let history = store.history(&key).await.expect("history");
    assert_eq!(
        history.len() as u64,
        EDITS + 2,
        "revisions and the deletion"
    );
    for revision in [1, 2, 50, 64, 65, 66, EDITS + 1] {
        let record = store.revision(&key, revision).await.expect("revision");
        assert_eq!(record.spec, Some(spec(revision - 1)), "revision {revision}");
    }
    let last = store
        .revision(&key, EDITS + 2)
        .await
        .expect("deletion record");
    assert!(last.deleted);
    assert_eq!(last.spec, Some(spec(EDITS)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_writing_one_object_stay_correct() {
    let cluster = EtcdCluster::start(1);
    let config = EtcdConfig::new(cluster.endpoints());
    let a = EtcdStore::connect(&config).await.expect("connect a");
    let b = EtcdStore::connect(&config).await.expect("connect b");
    let key = ObjectKey::new(Kind::Pod, Some("default"), "shared");

    let mut on_a = a.create(pod("shared"), &change()).await.expect("create");
    // B edits what A wrote last: B knows nothing of it and reads etcd.
    let mut on_b = b.get(&key).await.expect("get").expect("exists");
    let expected = on_b.metadata.resource_version;
    on_b.spec = spec(1);
    let on_b = b.update(on_b, expected, &change()).await.expect("b edits");
    assert_eq!(on_b.metadata.revision, 2);

    // A, still remembering revision 1, is told of B's write.
    let stale = on_a.metadata.resource_version;
    on_a.spec = spec(99);
    match a.update(on_a.clone(), stale, &change()).await {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => {
            assert_eq!((expected, actual), (stale, on_b.metadata.resource_version));
        }
        other => panic!("a stale write through A must conflict, got {other:?}"),
    }
    // A writes on from B's version: a new revision on top of B's spec.
    on_a = on_b.clone();
    on_a.spec = spec(2);
    let on_a = a
        .update(on_a, on_b.metadata.resource_version, &change())
        .await
        .expect("a edits after b");
    assert_eq!(on_a.metadata.revision, 3);
    // B's memory of its own write is stale now; its next write from A's
    // version must still encode against revision 3.
    let mut again = on_a.clone();
    again.spec = spec(3);
    let again = b
        .update(again, on_a.metadata.resource_version, &change())
        .await
        .expect("b edits again");
    assert_eq!(again.metadata.revision, 4);
    for revision in 1..=4 {
        for store in [&a, &b] {
            let record = store.revision(&key, revision).await.expect("revision");
            assert_eq!(record.spec, Some(spec(revision - 1)), "revision {revision}");
        }
    }
    // A deletes without a version: its memory is stale, etcd says so, and
    // the delete goes through on what etcd holds.
    let gone = a.delete(&key, None, &change()).await.expect("delete");
    assert_eq!(gone.metadata.revision, 4);
    assert_eq!(gone.spec, spec(3));
    assert_eq!(a.get(&key).await.expect("get"), None);
}
