//! Checks of the watch-event window: events go once they are more than
//! `count` revisions behind the newest write or older than `max_age`, and a
//! watch from before the window is `Expired`.

use std::time::Duration;

use futures::StreamExt;

use super::{EVENT_TIMEOUT, EventRetention, alice, assert_quiet, next_event, pod};
use crate::{EventWindow, Store, StoreError, WatchFilter};

/// Creates `pod/default/pN` at minute `minute`; returns its revision.
async fn create_at(store: &dyn Store, index: usize, minute: i64) -> u64 {
    let name = format!("p{index}");
    store
        .create(
            pod("default", &name, &format!("uid-{name}"), "img:1"),
            &alice(minute),
        )
        .await
        .expect("create")
        .metadata
        .resource_version
}

/// Asserts a watch from `after` is Expired, at once or as its first item.
async fn assert_expired(store: &dyn Store, after: u64, context: &str) {
    let outcome = match store.watch(WatchFilter::default(), after).await {
        Err(error) => Err(error),
        Ok(mut stream) => match tokio::time::timeout(EVENT_TIMEOUT, stream.next()).await {
            Ok(Some(Err(error))) => Err(error),
            other => Ok(format!("{other:?}")),
        },
    };
    match outcome {
        Err(StoreError::Expired { requested, .. }) => {
            assert_eq!(
                requested, after,
                "{context}: Expired names the requested version"
            );
        }
        other => panic!("{context}: a watch from {after} must be Expired, got {other:?}"),
    }
}

/// Asserts a watch from `after` replays exactly `expected`.
async fn assert_replays(store: &dyn Store, after: u64, expected: &[u64], context: &str) {
    let mut stream = store
        .watch(WatchFilter::default(), after)
        .await
        .unwrap_or_else(|error| panic!("{context}: watch from {after}: {error}"));
    let mut seen = Vec::new();
    for _ in expected {
        seen.push(next_event(&mut stream).await.resource_version());
    }
    assert_eq!(seen, expected, "{context}: replay from {after}");
    assert_quiet(&mut stream, context).await;
}

/// With a window of 5 events, the newest 5 are replayable and a watch
/// from further back is Expired.
pub async fn check_event_window_count<S: Store + EventRetention>(store: &S) {
    store.set_event_window(EventWindow {
        count: 5,
        max_age: Duration::from_secs(24 * 60 * 60),
    });
    let mut versions = Vec::new();
    for index in 0..12 {
        // A minute apart, so no backend skips a check for being too soon.
        versions.push(create_at(store, index, i64::try_from(index).expect("small")).await);
    }
    let newest = versions[11];
    assert_replays(store, newest - 5, &versions[7..], "count window").await;
    assert_expired(store, newest - 6, "count window").await;
    assert_expired(store, 0, "count window").await;
}

/// With a window of 10 minutes, a write at minute 13 drops the events of
/// minutes 0–2 and keeps minute 3 on.
pub async fn check_event_window_age<S: Store + EventRetention>(store: &S) {
    store.set_event_window(EventWindow {
        count: 10_000,
        max_age: Duration::from_secs(10 * 60),
    });
    let mut versions = Vec::new();
    for minute in 0..5 {
        versions.push(create_at(store, usize::try_from(minute).expect("small"), minute).await);
    }
    assert_replays(store, 0, &versions, "nothing is old yet").await;
    versions.push(create_at(store, 5, 13).await);
    assert_replays(store, versions[2], &versions[3..], "age window").await;
    assert_expired(store, versions[1], "age window").await;
    assert_expired(store, 0, "age window").await;
}
