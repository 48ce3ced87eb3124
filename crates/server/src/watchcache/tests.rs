//! The watch cache against a real SQLite store.

use std::sync::Arc;
use std::time::Duration;

use corral_api::{AuthorClass, Kind, Object};
use corral_store::sqlite::SqliteStore;
use corral_store::{ChangeMeta, Store};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{RECENT_DECODED, WatchCache};

fn change() -> ChangeMeta {
    ChangeMeta {
        author: "alice".into(),
        class: AuthorClass::External,
        message: String::new(),
        time: chrono::Utc::now(),
        always_record: false,
    }
}

/// The cached form of pod `name` once the cache has `revision`.
async fn cached(cache: &WatchCache, name: &str, revision: u64) -> Arc<super::CachedObject> {
    cache
        .caught_up(revision, Duration::from_secs(10))
        .await
        .expect("the cache catches up");
    let state = cache.read();
    state.kinds[&Kind::Pod][&("default".to_string(), name.to_string())].clone()
}

/// An apply's read of the current object: the store's object, and no
/// answer while a write of this server is not in the cache yet.
#[tokio::test]
async fn current_answers_only_with_this_servers_writes_applied() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().expect("store"));
    let cache = Arc::new(WatchCache::default());
    let stopping = CancellationToken::new();
    cache.start(store.clone(), stopping.clone());
    let mut object = Object::new(Kind::Pod, Some("default"), "web", json!({"containers": []}));
    object.metadata.uid = "uid-web".into();
    let written = store.create(object, &change()).await.expect("create");
    let revision = written.metadata.resource_version;
    cached(&cache, "web", revision).await;
    let key = written.key();
    assert_eq!(cache.current(&key).as_deref(), Some(&written));
    let mut missing = key.clone();
    missing.name = "missing".into();
    assert!(cache.current(&missing).is_none());
    // This server wrote something newer the cache has not applied.
    cache
        .written
        .store(revision + 1, std::sync::atomic::Ordering::SeqCst);
    assert!(cache.current(&key).is_none());
    stopping.cancel();
}

#[tokio::test]
async fn in_process_readers_get_the_same_object_kept_or_parsed() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().expect("store"));
    let cache = Arc::new(WatchCache::default());
    let stopping = CancellationToken::new();
    cache.start(store.clone(), stopping.clone());
    // Loaded first, so every write below reaches the cache as a change
    // (a write made before its first list would come in that list, and
    // keep no decoded object: seen once in a loaded run).
    cache
        .caught_up(0, Duration::from_secs(10))
        .await
        .expect("loaded");
    let mut versions = Vec::new();
    for index in 0..RECENT_DECODED + 20 {
        let spec = json!({"containers": [{"name": "a", "image": "i", "env": {"N": index.to_string()}}],
                          "text": "quoted \"é\" 1.5e3"});
        let mut object = Object::new(Kind::Pod, Some("default"), &format!("p{index}"), spec);
        object.metadata.uid = format!("uid-{index}");
        object.metadata.labels.insert("app".into(), "web".into());
        let written = store.create(object, &change()).await.expect("create");
        versions.push(written);
    }
    let newest = versions.last().expect("written").metadata.resource_version;
    cache
        .caught_up(newest, Duration::from_secs(10))
        .await
        .expect("caught up");
    assert_eq!(
        cache.recent.lock().expect("lock").len(),
        RECENT_DECODED,
        "only the newest changes keep their object"
    );
    // The oldest is parsed from JSON, the newest copied from what the
    // store sent: both are the object the store wrote.
    for written in [&versions[0], &versions[versions.len() - 1]] {
        let name = &written.metadata.name;
        let cached = cached(&cache, name, written.metadata.resource_version).await;
        assert_eq!(&*cache.shared(&cached).expect("shared"), written);
        assert_eq!(&cached.decode().expect("parsed"), written);
    }
    // The newest is the very event the store broadcast, not a copy.
    let newest_cached = cached(&cache, &versions[versions.len() - 1].metadata.name, newest).await;
    assert!(matches!(
        cache.shared(&newest_cached).expect("shared"),
        super::Shared::Kept(_)
    ));
    // A kept object is only handed out for its own name and revision.
    let newest_name = &versions[versions.len() - 1].metadata.name;
    let mut other = super::CachedObject::from_object(&versions[1]).expect("cached");
    other.resource_version = newest;
    assert_ne!(&other.name, newest_name);
    assert_eq!(&*cache.shared(&other).expect("parsed"), &versions[1]);
    stopping.cancel();
}
