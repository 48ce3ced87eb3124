//! Sealed values: opaque bytes by name, written and removed all or none,
//! listed by prefix, and outside the object space (no watch event, no
//! history).

use futures::StreamExt;

use crate::{SealedRecord, Store};

fn record(name: &str, value: &[u8]) -> SealedRecord {
    SealedRecord {
        name: name.to_string(),
        value: value.to_vec(),
    }
}

pub async fn check_sealed(store: &dyn Store) {
    assert_eq!(store.get_sealed("default/db/a").await.expect("get"), None);
    let before = store.current_revision().await.expect("revision");
    let binary = [0u8, 255, 1, 254, b'/', 0];
    store
        .write_sealed(
            &[
                record("default/db/a", &binary),
                record("default/db/b", b"bee"),
                record("default/dbx/a", b"other secret"),
                record("team/db/a", b"other namespace"),
            ],
            &[],
        )
        .await
        .expect("write");
    // No watch event: a watch from before the write sees nothing.
    let mut events = store
        .watch(crate::WatchFilter::default(), before)
        .await
        .expect("watch");
    let next = tokio::time::timeout(super::QUIET_PERIOD, events.next()).await;
    assert!(next.is_err(), "a sealed write made a watch event: {next:?}");
    assert_eq!(
        store.get_sealed("default/db/a").await.expect("get"),
        Some(binary.to_vec()),
        "bytes come back as written"
    );
    let listed = store.list_sealed("default/db/").await.expect("list");
    assert_eq!(
        listed,
        [
            record("default/db/a", &binary),
            record("default/db/b", b"bee")
        ],
        "a prefix lists only its names, by name"
    );
    assert_eq!(store.list_sealed("").await.expect("list all").len(), 4);

    // Replace one, add one, remove one: one write.
    store
        .write_sealed(
            &[
                record("default/db/b", b"new"),
                record("default/db/c", b"sea"),
            ],
            &["default/db/a".to_string(), "default/db/missing".to_string()],
        )
        .await
        .expect("replace");
    assert_eq!(
        store.list_sealed("default/db/").await.expect("list"),
        [
            record("default/db/b", b"new"),
            record("default/db/c", b"sea")
        ]
    );
    assert_eq!(store.get_sealed("default/db/a").await.expect("get"), None);
}
