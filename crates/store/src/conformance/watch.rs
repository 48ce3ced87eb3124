//! Checks of watch: replay, the hand-over from replay to live events,
//! filters and expiry.

use corral_api::{Kind, Object};
use futures::StreamExt;
use serde_json::json;

use super::{
    EVENT_TIMEOUT, EventRetention, alice, assert_quiet, edit, key, new_object, next_event, pod,
    pod_spec,
};
use crate::{EventType, Store, StoreError, WatchEvent, WatchFilter, WatchStream};

fn summary(event: &WatchEvent) -> (EventType, String, u64) {
    (
        event.event_type,
        event.object.key().to_string(),
        event.resource_version(),
    )
}

async fn collect(stream: &mut WatchStream, count: usize) -> Vec<(EventType, String, u64)> {
    let mut events = Vec::with_capacity(count);
    for _ in 0..count {
        events.push(summary(&next_event(stream).await));
    }
    events
}

/// Replay from 0 and from a mid revision, in order, with the right types and
/// objects; nothing more until a new write.
pub async fn check_watch_replay(store: &dyn Store) {
    let a = store
        .create(pod("default", "a", "uid-a", "img:1"), &alice(0))
        .await
        .expect("create a");
    let b = store
        .create(pod("default", "b", "uid-b", "img:1"), &alice(0))
        .await
        .expect("create b");
    let a2 = edit(store, &a.key(), &alice(1), |object| {
        object.spec = pod_spec("img:2")
    })
    .await;
    let a3 = edit(store, &a.key(), &alice(2), |object| {
        object.status = json!({"phase": "Running"})
    })
    .await;
    let b_gone = store
        .delete(&b.key(), None, &alice(3))
        .await
        .expect("delete b");
    let expected = vec![
        (
            EventType::Added,
            "pod/a".to_string(),
            a.metadata.resource_version,
        ),
        (
            EventType::Added,
            "pod/b".to_string(),
            b.metadata.resource_version,
        ),
        (
            EventType::Modified,
            "pod/a".to_string(),
            a2.metadata.resource_version,
        ),
        (
            EventType::Modified,
            "pod/a".to_string(),
            a3.metadata.resource_version,
        ),
        (
            EventType::Deleted,
            "pod/b".to_string(),
            b_gone.metadata.resource_version,
        ),
    ];

    let mut from_start = store
        .watch(WatchFilter::default(), 0)
        .await
        .expect("watch from 0");
    let mut events = Vec::new();
    for _ in 0..expected.len() {
        events.push(next_event(&mut from_start).await);
    }
    assert_eq!(
        events.iter().map(summary).collect::<Vec<_>>(),
        expected,
        "replay from 0"
    );
    assert_eq!(
        events[2].object, a2,
        "a Modified event carries the object as written"
    );
    assert_eq!(
        events[4].object, b_gone,
        "a Deleted event carries the last state"
    );
    assert_quiet(&mut from_start, "replay from 0").await;

    let mid = b.metadata.resource_version;
    let mut from_mid = store
        .watch(WatchFilter::default(), mid)
        .await
        .expect("watch from mid");
    assert_eq!(
        collect(&mut from_mid, 3).await,
        expected[2..].to_vec(),
        "replay after {mid}"
    );
    assert_quiet(&mut from_mid, "replay from mid").await;

    let now = store.current_revision().await.expect("revision");
    let mut from_now = store
        .watch(WatchFilter::default(), now)
        .await
        .expect("watch from now");
    assert_quiet(&mut from_now, "watch from the current revision").await;

    // A write after the replay reaches every watcher exactly once.
    let c = store
        .create(pod("default", "c", "uid-c", "img:1"), &alice(4))
        .await
        .expect("create c");
    let added = (
        EventType::Added,
        "pod/c".to_string(),
        c.metadata.resource_version,
    );
    for stream in [&mut from_start, &mut from_mid, &mut from_now] {
        assert_eq!(summary(&next_event(stream).await), added);
        assert_quiet(stream, "after one live write").await;
    }
}

/// Watchers see concurrent writes with no gap and no duplicate, including
/// one that starts replaying while writes go on; dropping a stream is fine.
pub async fn check_watch_live(store: &dyn Store) {
    let first = store
        .create(pod("default", "seed", "uid-seed", "img:0"), &alice(0))
        .await
        .expect("create");
    let start = first.metadata.resource_version;
    let mut live = store
        .watch(WatchFilter::default(), start)
        .await
        .expect("watch");
    let dropped = store
        .watch(WatchFilter::default(), 0)
        .await
        .expect("watch to drop");
    drop(dropped);

    const WRITES: usize = 300;
    let writer = async {
        let mut versions = Vec::with_capacity(WRITES);
        for index in 0..WRITES {
            let name = format!("pod-{index:03}");
            let object = store
                .create(
                    pod("default", &name, &format!("uid-{name}"), "img:1"),
                    &alice(1),
                )
                .await
                .expect("create");
            versions.push(object.metadata.resource_version);
            if index % 50 == 0 {
                tokio::task::yield_now().await;
            }
        }
        versions
    };
    let reader = async {
        let mut seen = Vec::with_capacity(WRITES);
        for _ in 0..WRITES {
            seen.push(next_event(&mut live).await.resource_version());
        }
        seen
    };
    // A second watcher starts from 0 halfway through the writes: its replay
    // must hand over to live events seamlessly.
    let late_reader = async {
        while store.current_revision().await.expect("revision") < start + (WRITES / 2) as u64 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let mut late = store
            .watch(WatchFilter::default(), 0)
            .await
            .expect("late watch");
        let mut seen = Vec::with_capacity(WRITES + 1);
        for _ in 0..=WRITES {
            seen.push(next_event(&mut late).await.resource_version());
        }
        (seen, late)
    };
    let (written, seen, (late_seen, mut late)) = tokio::join!(writer, reader, late_reader);
    assert_eq!(
        seen, written,
        "a live watcher sees every write once, in order"
    );
    let mut everything = vec![start];
    everything.extend(&written);
    assert_eq!(
        late_seen, everything,
        "a watcher replaying during writes misses and repeats nothing"
    );
    assert_quiet(&mut live, "after the concurrent writes").await;
    assert_quiet(&mut late, "after the concurrent writes").await;
}

/// Filters on kind, namespace and name apply to replay and live events.
pub async fn check_watch_filtered(store: &dyn Store) {
    let node = new_object(Kind::Node, None, "web", "uid-node-web", json!({}));
    let writes: Vec<Object> = vec![
        store
            .create(pod("a", "web", "uid-a-web", "img:1"), &alice(0))
            .await
            .expect("create"),
        store
            .create(pod("b", "web", "uid-b-web", "img:1"), &alice(0))
            .await
            .expect("create"),
        store
            .create(pod("a", "db", "uid-a-db", "img:1"), &alice(0))
            .await
            .expect("create"),
        store.create(node, &alice(0)).await.expect("create node"),
    ];
    let filters = [
        WatchFilter {
            kind: Some(Kind::Node),
            ..WatchFilter::default()
        },
        WatchFilter {
            namespace: Some("a".into()),
            ..WatchFilter::default()
        },
        WatchFilter {
            name: Some("web".into()),
            ..WatchFilter::default()
        },
        WatchFilter {
            kind: Some(Kind::Pod),
            namespace: Some("a".into()),
            name: Some("web".into()),
        },
        WatchFilter {
            kind: Some(Kind::VirtualMachine),
            ..WatchFilter::default()
        },
    ];
    let mut streams = Vec::new();
    for filter in &filters {
        streams.push(store.watch(filter.clone(), 0).await.expect("watch"));
    }
    // Live writes after the watches started.
    let mut later = vec![
        edit(store, &key(Kind::Pod, Some("a"), "web"), &alice(1), |o| {
            o.spec = pod_spec("img:2")
        })
        .await,
        edit(store, &key(Kind::Pod, Some("b"), "web"), &alice(1), |o| {
            o.spec = pod_spec("img:2")
        })
        .await,
    ];
    later.push(
        store
            .delete(&key(Kind::Node, None, "web"), None, &alice(2))
            .await
            .expect("delete node"),
    );
    let all: Vec<&Object> = writes.iter().chain(&later).collect();

    for (filter, stream) in filters.iter().zip(&mut streams) {
        let expected: Vec<u64> = all
            .iter()
            .filter(|object| filter.admits(object))
            .map(|object| object.metadata.resource_version)
            .collect();
        let mut seen = Vec::new();
        for _ in 0..expected.len() {
            let event = next_event(stream).await;
            assert!(
                filter.admits(&event.object),
                "{filter:?} admitted {}",
                event.object.key()
            );
            seen.push(event.resource_version());
        }
        assert_eq!(seen, expected, "events through {filter:?}");
        assert_quiet(stream, &format!("watch through {filter:?}")).await;
    }
}

/// A watch from before the oldest kept event is Expired; from the newest
/// forgotten one it works.
pub async fn check_watch_expired<S: Store + EventRetention>(store: &S) {
    let mut versions = Vec::new();
    for index in 0..5 {
        let name = format!("p{index}");
        let object = store
            .create(
                pod("default", &name, &format!("uid-{name}"), "img:1"),
                &alice(0),
            )
            .await
            .expect("create");
        versions.push(object.metadata.resource_version);
    }
    let through = versions[2];
    store.compact_events(through).await.expect("compact events");

    for after in [0, versions[1]] {
        let outcome = match store.watch(WatchFilter::default(), after).await {
            Err(error) => Err(error),
            Ok(mut stream) => match tokio::time::timeout(EVENT_TIMEOUT, stream.next()).await {
                Ok(Some(Err(error))) => Err(error),
                other => Ok(format!("{other:?}")),
            },
        };
        match outcome {
            Err(StoreError::Expired {
                requested,
                compacted,
            }) => {
                assert_eq!(requested, after, "Expired names the requested version");
                assert!(
                    compacted >= through,
                    "Expired names how far events were forgotten"
                );
            }
            other => panic!(
                "a watch from {after} after forgetting through {through} must be Expired, got {other:?}"
            ),
        }
    }
    let mut stream = store
        .watch(WatchFilter::default(), through)
        .await
        .expect("watch from the compaction point");
    let seen = vec![
        next_event(&mut stream).await.resource_version(),
        next_event(&mut stream).await.resource_version(),
    ];
    assert_eq!(seen, versions[3..].to_vec());
    assert_quiet(&mut stream, "after expiry").await;
}
