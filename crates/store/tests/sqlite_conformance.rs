//! The backend conformance suite against SQLite databases in temp files.

use corral_store::conformance;
use corral_store::sqlite::SqliteStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut count = 0;
    conformance::run_all(|| {
        count += 1;
        let path = dir.path().join(format!("conformance-{count}.db"));
        async move { SqliteStore::open(&path).expect("open store") }
    })
    .await;
    assert!(count >= 12, "every check ran against its own store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_store_passes_the_conformance_suite() {
    conformance::run_all(|| async { SqliteStore::open_in_memory().expect("open store") }).await;
}
