//! Checks of object reads and writes: create, get, list, CAS update, spec
//! revisions, delete and recreate.

use corral_api::{AuthorClass, Kind, RevisionRecord};
use serde_json::json;

use super::{alice, at_minute, change, edit, key, new_object, pod, pod_spec};
use crate::{ChangeMeta, Store, StoreError};

/// create/get/list: sorting, namespace filter, cluster-wide kinds,
/// server-set metadata, AlreadyExists.
pub async fn check_create_get_list(store: &dyn Store) {
    assert_eq!(
        store.current_revision().await.expect("revision"),
        0,
        "a fresh store is at revision 0"
    );
    let listed = store.list(Kind::Pod, None).await.expect("list");
    assert!(listed.objects.is_empty(), "a fresh store lists nothing");

    let mut last_version = 0;
    for (namespace, name) in [("b", "web"), ("a", "zeta"), ("a", "alpha"), ("c", "db")] {
        let created = store
            .create(
                pod(namespace, name, &format!("uid-{namespace}-{name}"), "img:1"),
                &alice(0),
            )
            .await
            .expect("create");
        assert_eq!(created.metadata.revision, 1, "create sets revision 1");
        assert!(
            created.metadata.resource_version > last_version,
            "resourceVersion grows"
        );
        assert_eq!(
            created.metadata.resource_version,
            store.current_revision().await.expect("revision"),
            "the created object carries the new store revision"
        );
        assert_eq!(
            created.metadata.uid,
            format!("uid-{namespace}-{name}"),
            "uid is the caller's"
        );
        assert_eq!(
            created.metadata.created_at,
            Some(at_minute(0)),
            "createdAt is the caller's"
        );
        last_version = created.metadata.resource_version;
        let fetched = store
            .get(&created.key())
            .await
            .expect("get")
            .expect("created object exists");
        assert_eq!(fetched, created, "get returns what create returned");
    }
    let node = new_object(
        Kind::Node,
        None,
        "node-1",
        "uid-node-1",
        json!({"labels": {}}),
    );
    let node = store.create(node, &alice(0)).await.expect("create node");
    assert_eq!(node.key(), key(Kind::Node, None, "node-1"));

    let all = store.list(Kind::Pod, None).await.expect("list");
    let names: Vec<(String, String)> = all
        .objects
        .iter()
        .map(|object| (object.key().namespace, object.metadata.name.clone()))
        .collect();
    let expected: Vec<(String, String)> =
        [("a", "alpha"), ("a", "zeta"), ("b", "web"), ("c", "db")]
            .iter()
            .map(|(ns, name)| (ns.to_string(), name.to_string()))
            .collect();
    assert_eq!(names, expected, "list sorts by namespace then name");
    assert_eq!(
        all.resource_version,
        store.current_revision().await.expect("revision")
    );

    let in_a = store.list(Kind::Pod, Some("a")).await.expect("list a");
    assert_eq!(in_a.objects.len(), 2, "list filters by namespace");
    assert!(
        in_a.objects
            .iter()
            .all(|object| object.key().namespace == "a")
    );
    let nodes = store.list(Kind::Node, None).await.expect("list nodes");
    assert_eq!(nodes.objects, vec![node], "list filters by kind");
    assert!(
        store
            .list(Kind::VirtualMachine, None)
            .await
            .expect("list")
            .objects
            .is_empty()
    );

    assert_eq!(
        store
            .get(&key(Kind::Pod, Some("a"), "missing"))
            .await
            .expect("get"),
        None
    );
    assert_eq!(
        store.get(&key(Kind::Node, None, "web")).await.expect("get"),
        None,
        "kinds do not mix"
    );

    let before = store.current_revision().await.expect("revision");
    match store
        .create(pod("a", "alpha", "uid-other", "img:2"), &alice(1))
        .await
    {
        Err(StoreError::AlreadyExists { key: existing }) => {
            assert_eq!(existing, key(Kind::Pod, Some("a"), "alpha"));
        }
        other => panic!("creating an existing object must be AlreadyExists, got {other:?}"),
    }
    assert_eq!(
        store.current_revision().await.expect("revision"),
        before,
        "a refused write changes nothing"
    );
    let kept = store
        .get(&key(Kind::Pod, Some("a"), "alpha"))
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(
        kept.metadata.uid, "uid-a-alpha",
        "a refused create leaves the object alone"
    );
}

/// update is compare-and-swap on resourceVersion; a stale one is a Conflict
/// carrying both versions; server-set metadata is kept from the store.
pub async fn check_update_cas(store: &dyn Store) {
    let created = store
        .create(pod("default", "web", "uid-web", "img:1"), &alice(0))
        .await
        .expect("create");
    let web = created.key();
    let stale = created.metadata.resource_version;

    let updated = edit(store, &web, &alice(1), |object| {
        object.metadata.labels.insert("tier".into(), "front".into());
    })
    .await;
    let current = updated.metadata.resource_version;
    assert!(current > stale, "an update takes a newer resourceVersion");
    assert_eq!(current, store.current_revision().await.expect("revision"));

    let mut late = created.clone();
    late.spec = pod_spec("img:late");
    let before = store.current_revision().await.expect("revision");
    match store.update(late, stale, &alice(2)).await {
        Err(StoreError::Conflict {
            key: conflict,
            expected,
            actual,
        }) => {
            assert_eq!(conflict, web);
            assert_eq!(expected, stale, "the conflict names the stale version");
            assert_eq!(actual, current, "the conflict names the current version");
        }
        other => panic!("a stale resourceVersion must be a Conflict, got {other:?}"),
    }
    assert_eq!(
        store.current_revision().await.expect("revision"),
        before,
        "a conflict writes nothing"
    );
    let unchanged = store.get(&web).await.expect("get").expect("exists");
    assert_eq!(unchanged, updated, "a conflict leaves the object alone");

    // The caller cannot rewrite uid, createdAt or revision.
    let mut forged = unchanged.clone();
    forged.metadata.uid = "uid-forged".into();
    forged.metadata.created_at = Some(at_minute(999));
    forged.metadata.revision = 42;
    forged.status = json!({"phase": "Running"});
    let written = store
        .update(forged, current, &alice(3))
        .await
        .expect("update");
    assert_eq!(
        written.metadata.uid, "uid-web",
        "uid is kept from the store"
    );
    assert_eq!(
        written.metadata.created_at,
        Some(at_minute(0)),
        "createdAt is kept from the store"
    );
    assert_eq!(
        written.metadata.revision, 1,
        "revision is kept from the store"
    );
    assert_eq!(written.status, json!({"phase": "Running"}));
    assert_eq!(store.get(&web).await.expect("get"), Some(written));

    let ghost = pod("default", "ghost", "uid-ghost", "img:1");
    match store.update(ghost, 1, &alice(4)).await {
        Err(StoreError::NotFound { key: missing }) => {
            assert_eq!(missing, key(Kind::Pod, Some("default"), "ghost"));
        }
        other => panic!("updating a missing object must be NotFound, got {other:?}"),
    }
}

/// A spec change bumps `revision` and appends history; status-only and
/// metadata-only writes bump only resourceVersion.
pub async fn check_spec_revisions(store: &dyn Store) {
    let web = store
        .create(pod("default", "web", "uid-web", "img:1"), &alice(0))
        .await
        .expect("create")
        .key();

    let spec_change = edit(
        store,
        &web,
        &change("bob", AuthorClass::External, 1),
        |object| {
            object.spec = pod_spec("img:2");
        },
    )
    .await;
    assert_eq!(
        spec_change.metadata.revision, 2,
        "a spec change bumps revision"
    );

    let status_only = edit(
        store,
        &web,
        &change("agent", AuthorClass::System, 2),
        |object| {
            object.status = json!({"phase": "Running"});
        },
    )
    .await;
    assert_eq!(
        status_only.metadata.revision, 2,
        "a status-only write keeps revision"
    );
    assert!(status_only.metadata.resource_version > spec_change.metadata.resource_version);

    let labels_only = edit(store, &web, &alice(3), |object| {
        object.metadata.labels.insert("app".into(), "web".into());
        object
            .metadata
            .annotations
            .insert("note".into(), "hi".into());
    })
    .await;
    assert_eq!(
        labels_only.metadata.revision, 2,
        "a metadata-only write keeps revision"
    );
    assert!(labels_only.metadata.resource_version > status_only.metadata.resource_version);

    let third = edit(
        store,
        &web,
        &change("scheduler", AuthorClass::System, 4),
        |object| {
            object.spec = json!({"containers": [], "placement": {"node": "node-1"}});
            object.status = json!({"phase": "Pending"});
        },
    )
    .await;
    assert_eq!(third.metadata.revision, 3);

    let moved = edit(
        store,
        &web,
        &ChangeMeta {
            always_record: true,
            message: "moved off node-1".into(),
            ..change("scheduler", AuthorClass::System, 5)
        },
        |object| {
            object.status = json!({"phase": "Pending", "node": null});
        },
    )
    .await;
    assert_eq!(
        moved.metadata.revision, 4,
        "a change marked always_record bumps revision with the spec unchanged"
    );

    let history = store.history(&web).await.expect("history");
    let summary: Vec<(u64, &str, AuthorClass, bool)> = history
        .iter()
        .map(|record| {
            (
                record.revision,
                record.author.as_str(),
                record.class,
                record.deleted,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, "alice", AuthorClass::External, false),
            (2, "bob", AuthorClass::External, false),
            (3, "scheduler", AuthorClass::System, false),
            (4, "scheduler", AuthorClass::System, false),
        ],
        "history has one record per spec change (and per recorded system event), oldest first"
    );
    for record in &history {
        assert_eq!(
            (record.kind, record.namespace.as_str(), record.name.as_str()),
            (Kind::Pod, "default", "web")
        );
        assert_eq!(record.uid, "uid-web");
        assert!(record.spec.is_none(), "history carries no specs");
    }
    for (limit, newest) in [(2, &history[2..]), (0, &history[3..]), (10, &history[..])] {
        assert_eq!(
            store
                .recent_history(&web, limit)
                .await
                .expect("recent history"),
            newest,
            "the newest {limit} (at least one), oldest first"
        );
    }
    assert_eq!(history[1].time, at_minute(1));
    assert_eq!(history[1].message, "bob at minute 1");
    assert_eq!(history[3].message, "moved off node-1");

    for (revision, spec) in [
        (1, pod_spec("img:1")),
        (2, pod_spec("img:2")),
        (
            3,
            json!({"containers": [], "placement": {"node": "node-1"}}),
        ),
        (
            4,
            json!({"containers": [], "placement": {"node": "node-1"}}),
        ),
    ] {
        let record = store.revision(&web, revision).await.expect("revision");
        assert_eq!(record.revision, revision);
        assert_eq!(
            record.spec,
            Some(spec),
            "revision {revision} returns its spec"
        );
        let summary = &history[usize::try_from(revision - 1).expect("a small revision")];
        assert_eq!(
            RevisionRecord {
                spec: None,
                ..record
            },
            *summary,
            "revision {revision} carries its history record"
        );
    }
    match store.revision(&web, 9).await {
        Err(StoreError::RevisionNotFound {
            key: missing,
            revision: 9,
            kept,
        }) => {
            assert_eq!(missing, web);
            assert_eq!(kept, "1-4", "the miss names the revisions kept");
        }
        other => panic!("a revision never written must be RevisionNotFound, got {other:?}"),
    }
    let never = key(Kind::Pod, Some("default"), "never");
    assert!(
        matches!(
            store.history(&never).await,
            Err(StoreError::NotFound { .. })
        ),
        "history of an unknown key"
    );
    assert!(
        matches!(
            store.recent_history(&never, 1).await,
            Err(StoreError::NotFound { .. })
        ),
        "recent history of an unknown key"
    );
    assert!(
        matches!(
            store.revision(&never, 1).await,
            Err(StoreError::NotFound { .. })
        ),
        "revision of an unknown key"
    );
}

/// delete checks `expected`, leaves a `deleted` history record, and a new
/// object under the same name starts a fresh history.
pub async fn check_delete_and_recreate(store: &dyn Store) {
    let web = store
        .create(pod("default", "web", "uid-web-1", "img:1"), &alice(0))
        .await
        .expect("create")
        .key();
    let last = edit(store, &web, &alice(1), |object| {
        object.spec = pod_spec("img:2")
    })
    .await;

    let stale = last.metadata.resource_version - 1;
    match store.delete(&web, Some(stale), &alice(2)).await {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => {
            assert_eq!((expected, actual), (stale, last.metadata.resource_version));
        }
        other => panic!("delete at a stale resourceVersion must be a Conflict, got {other:?}"),
    }
    assert!(
        store.get(&web).await.expect("get").is_some(),
        "a refused delete keeps the object"
    );

    let deleted = store
        .delete(
            &web,
            Some(last.metadata.resource_version),
            &change("bob", AuthorClass::External, 3),
        )
        .await
        .expect("delete");
    assert_eq!(deleted.metadata.uid, "uid-web-1");
    assert_eq!(
        deleted.spec,
        pod_spec("img:2"),
        "delete returns the last state"
    );
    assert_eq!(
        deleted.metadata.revision, 2,
        "delete returns the last spec revision"
    );
    assert_eq!(
        deleted.metadata.resource_version,
        store.current_revision().await.expect("revision"),
        "delete returns the deletion's store revision"
    );
    assert_eq!(store.get(&web).await.expect("get"), None);
    assert!(
        store
            .list(Kind::Pod, None)
            .await
            .expect("list")
            .objects
            .is_empty()
    );
    assert!(
        matches!(
            store.delete(&web, None, &alice(4)).await,
            Err(StoreError::NotFound { .. })
        ),
        "deleting a missing object is NotFound"
    );

    let history = store
        .history(&web)
        .await
        .expect("history of a deleted object");
    let revisions: Vec<(u64, bool)> = history
        .iter()
        .map(|record| (record.revision, record.deleted))
        .collect();
    assert_eq!(
        revisions,
        vec![(1, false), (2, false), (3, true)],
        "deletion leaves revision last+1"
    );
    assert_eq!(history[2].author, "bob");
    let tombstone = store.revision(&web, 3).await.expect("deletion record");
    assert!(tombstone.deleted);
    assert_eq!(
        tombstone.spec,
        Some(pod_spec("img:2")),
        "the deletion record holds the last spec"
    );

    // Recreate under the same name: new uid, fresh revisions.
    let again = store
        .create(pod("default", "web", "uid-web-2", "img:9"), &alice(5))
        .await
        .expect("recreate");
    assert_eq!(
        again.metadata.revision, 1,
        "a recreated object starts at revision 1"
    );
    assert_eq!(again.metadata.uid, "uid-web-2");
    let history = store.history(&web).await.expect("history");
    assert_eq!(history.len(), 1, "history shows the live object only");
    assert_eq!(
        (history[0].uid.as_str(), history[0].revision),
        ("uid-web-2", 1)
    );
    assert_eq!(
        store.revision(&web, 1).await.expect("revision").spec,
        Some(pod_spec("img:9"))
    );
    // The old object's records stay in the cluster-wide history.
    let all = store
        .query_history(&Default::default())
        .await
        .expect("query");
    assert_eq!(
        all.iter()
            .filter(|record| record.uid == "uid-web-1")
            .count(),
        3
    );
}
