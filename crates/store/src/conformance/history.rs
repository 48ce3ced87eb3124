//! Checks of cluster-wide history queries, compaction and tokens.

use chrono::TimeDelta;
use corral_api::history::CompactionPolicy;
use corral_api::{AuthorClass, HistoryQuery, Identity, Kind, ObjectKey, Role};
use serde_json::{Value, json};

use super::{alice, at_minute, base_time, change, edit, new_object, pod, pod_spec};
use futures::StreamExt;

use crate::{LeaseRecord, Store, StoreError, TokenRecord};

/// Every combination of the query filters returns exactly the records that
/// pass them, oldest first, `limit` keeping the newest.
pub async fn check_history_queries(store: &dyn Store) {
    let system = |author: &str, minute| change(author, AuthorClass::System, minute);
    let bob = |minute| change("bob", AuthorClass::External, minute);
    let web = store
        .create(pod("default", "web", "uid-web", "img:1"), &alice(0))
        .await
        .expect("create")
        .key();
    edit(store, &web, &system("scheduler", 1), |o| {
        o.spec = pod_spec("img:1-placed")
    })
    .await;
    let db = store
        .create(pod("team-a", "db", "uid-db", "pg:1"), &bob(2))
        .await
        .expect("create")
        .key();
    let node = new_object(
        Kind::Node,
        None,
        "node-1",
        "uid-node-1",
        json!({"zone": "home"}),
    );
    let node = store
        .create(node, &system("node-1", 3))
        .await
        .expect("create node")
        .key();
    edit(store, &web, &alice(4), |o| o.spec = pod_spec("img:2")).await;
    store.delete(&db, None, &bob(5)).await.expect("delete");
    edit(store, &web, &system("agent", 6), |o| {
        o.status = json!({"phase": "Running"})
    })
    .await;
    edit(store, &node, &system("scheduler", 7), |o| {
        o.spec = json!({"zone": "attic"})
    })
    .await;

    let all = store
        .query_history(&HistoryQuery::default())
        .await
        .expect("query all");
    let summary: Vec<(&str, &str, u64, bool)> = all
        .iter()
        .map(|r| (r.name.as_str(), r.author.as_str(), r.revision, r.deleted))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("web", "alice", 1, false),
            ("web", "scheduler", 2, false),
            ("db", "bob", 1, false),
            ("node-1", "node-1", 1, false),
            ("web", "alice", 3, false),
            ("db", "bob", 2, true),
            ("node-1", "scheduler", 2, false),
        ],
        "the whole history, oldest first; a status write adds nothing"
    );
    assert!(
        all.iter().all(|record| record.spec.is_none()),
        "queries carry no specs"
    );
    assert_eq!(all[2].namespace, "team-a");
    assert_eq!(all[3].namespace, "", "cluster-wide kinds have no namespace");

    let mut combinations = 0;
    for since in [
        None,
        Some(at_minute(3)),
        Some(at_minute(4) + TimeDelta::seconds(1)),
    ] {
        for authors in [
            vec![],
            vec!["alice"],
            vec!["alice", "scheduler"],
            vec!["nobody"],
        ] {
            for exclude in [vec![], vec!["bob"], vec!["scheduler", "alice"]] {
                for class in [None, Some(AuthorClass::External), Some(AuthorClass::System)] {
                    for kind in [None, Some(Kind::Pod), Some(Kind::Node)] {
                        for limit in [None, Some(0), Some(1), Some(3), Some(100)] {
                            let query = HistoryQuery {
                                since,
                                authors: authors.iter().map(|a| a.to_string()).collect(),
                                exclude_authors: exclude.iter().map(|a| a.to_string()).collect(),
                                class,
                                kind,
                                limit,
                            };
                            let mut expected: Vec<_> = all
                                .iter()
                                .filter(|record| query.admits(record))
                                .cloned()
                                .collect();
                            if let Some(limit) = limit {
                                expected.drain(..expected.len().saturating_sub(limit));
                            }
                            let got = store.query_history(&query).await.expect("query");
                            assert_eq!(got, expected, "query {query:?}");
                            combinations += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(combinations, 3 * 4 * 3 * 3 * 3 * 5);

    // A few spelled out, so the check does not rest on `admits` alone.
    let names = |records: Vec<corral_api::RevisionRecord>| -> Vec<(String, u64)> {
        records.into_iter().map(|r| (r.name, r.revision)).collect()
    };
    let query = |q: HistoryQuery| async move { store.query_history(&q).await.expect("query") };
    assert_eq!(
        names(
            query(HistoryQuery {
                class: Some(AuthorClass::System),
                ..Default::default()
            })
            .await
        ),
        vec![
            ("web".into(), 2),
            ("node-1".into(), 1),
            ("node-1".into(), 2)
        ]
    );
    assert_eq!(
        names(
            query(HistoryQuery {
                since: Some(at_minute(4)),
                limit: Some(2),
                ..Default::default()
            })
            .await
        ),
        vec![("db".into(), 2), ("node-1".into(), 2)]
    );
    assert_eq!(
        names(
            query(HistoryQuery {
                exclude_authors: vec!["alice".into(), "scheduler".into()],
                kind: Some(Kind::Pod),
                ..Default::default()
            })
            .await
        ),
        vec![("db".into(), 1), ("db".into(), 2)]
    );
}

fn spec_at(revision: u64) -> Value {
    json!({"containers": [{"name": "main", "image": format!("app:{revision}"), "env": {"N": revision}}]})
}

/// Creates `pod/default/<name>` and edits its spec until it has `revisions`
/// revisions; revision r is written at minute `r - 1`.
async fn grow(store: &dyn Store, name: &str, revisions: u64) -> ObjectKey {
    let object = new_object(
        Kind::Pod,
        Some("default"),
        name,
        &format!("uid-{name}"),
        spec_at(1),
    );
    let key = store.create(object, &alice(0)).await.expect("create").key();
    for revision in 2..=revisions {
        let minute = i64::try_from(revision).expect("small") - 1;
        edit(store, &key, &alice(minute), |o| o.spec = spec_at(revision)).await;
    }
    key
}

/// Asserts exactly `kept` revisions remain for `key` and each decodes.
async fn assert_kept(store: &dyn Store, key: &ObjectKey, kept: &[u64], context: &str) {
    let history = store
        .history(key)
        .await
        .unwrap_or_else(|error| panic!("{context}: history of {key}: {error}"));
    let revisions: Vec<u64> = history.iter().map(|record| record.revision).collect();
    assert_eq!(revisions, kept, "{context}: revisions of {key} kept");
    for &revision in kept {
        let record = store
            .revision(key, revision)
            .await
            .unwrap_or_else(|error| panic!("{context}: revision {revision} of {key}: {error}"));
        assert_eq!(
            record.spec,
            Some(spec_at(revision)),
            "{context}: spec of revision {revision}"
        );
    }
    if let Some(&first) = kept.first().filter(|&&first| first > 1) {
        match store.revision(key, first - 1).await {
            Err(StoreError::RevisionNotFound { revision, .. }) => assert_eq!(revision, first - 1),
            other => {
                panic!("{context}: a dropped revision must be RevisionNotFound, got {other:?}")
            }
        }
    }
}

async fn compact(store: &dyn Store, policy: CompactionPolicy, minute: i64) -> u64 {
    store
        .compact_history(policy, at_minute(minute))
        .await
        .unwrap_or_else(|error| panic!("compact {policy:?}: {error}"))
        .revisions_removed
}

/// Three objects for the compaction checks: `long` with 70 revisions (past a
/// keyframe boundary), `gone` with 3 revisions then deleted, `single` with one.
async fn compaction_fixture(store: &dyn Store) -> (ObjectKey, ObjectKey, ObjectKey) {
    let long = grow(store, "long", 70).await;
    // A status write after the last spec change moves nothing in history.
    edit(store, &long, &alice(69), |o| {
        o.status = json!({"ready": true})
    })
    .await;
    let gone = grow(store, "gone", 3).await;
    store.delete(&gone, None, &alice(3)).await.expect("delete");
    let single = grow(store, "single", 1).await;
    let size = store.history_size().await.expect("size");
    assert_eq!(size.revisions, 70 + 4 + 1);
    assert!(size.raw_bytes > 0 && size.stored_bytes > 0);
    (long, gone, single)
}

/// `Last { count }` keeps the newest revisions of each object, never the
/// current one, and every kept revision still decodes.
pub async fn check_compaction_last(store: &dyn Store) {
    let (long, gone, single) = compaction_fixture(store).await;
    assert_eq!(
        compact(store, CompactionPolicy::All, 1000).await,
        0,
        "All keeps everything"
    );
    assert_kept(store, &long, &(1..=70).collect::<Vec<_>>(), "All").await;

    assert_eq!(
        compact(store, CompactionPolicy::Last { count: 3 }, 1000).await,
        67 + 1
    );
    assert_kept(store, &long, &[68, 69, 70], "Last 3").await;
    let gone_history = store
        .history(&gone)
        .await
        .expect("history of a deleted object");
    let revisions: Vec<(u64, bool)> = gone_history
        .iter()
        .map(|r| (r.revision, r.deleted))
        .collect();
    assert_eq!(
        revisions,
        vec![(2, false), (3, false), (4, true)],
        "Last 3 of a deleted object"
    );
    assert_kept(store, &single, &[1], "Last 3").await;
    assert_eq!(
        store.history_size().await.expect("size").revisions,
        3 + 3 + 1
    );

    // Writing on after a compaction still works and decodes.
    edit(store, &long, &alice(80), |o| o.spec = spec_at(71)).await;
    assert_kept(store, &long, &[68, 69, 70, 71], "a write after compaction").await;
    assert_eq!(
        compact(store, CompactionPolicy::Last { count: 3 }, 1000).await,
        1
    );

    compact(store, CompactionPolicy::Last { count: 0 }, 1000).await;
    assert_kept(store, &long, &[71], "Last 0 keeps the current revision").await;
    assert_kept(store, &single, &[1], "Last 0 keeps the current revision").await;
}

/// `For { seconds }` drops revisions older than `now - seconds`, never the
/// current one, and every kept revision still decodes.
pub async fn check_compaction_for(store: &dyn Store) {
    let (long, gone, single) = compaction_fixture(store).await;
    assert_eq!(
        compact(store, CompactionPolicy::For { seconds: u64::MAX }, 100).await,
        0
    );
    assert_kept(store, &long, &(1..=70).collect::<Vec<_>>(), "For forever").await;

    // Cutoff minute 40: revisions 1..=40 of `long` (minutes 0..=39) and all
    // of `gone` (minutes 0..=3) go; `single` stays as a current revision.
    assert_eq!(
        compact(store, CompactionPolicy::For { seconds: 60 * 60 }, 100).await,
        40 + 4
    );
    assert_kept(store, &long, &(41..=70).collect::<Vec<_>>(), "For 1h").await;
    assert_kept(store, &single, &[1], "For 1h").await;
    match store.history(&gone).await {
        Ok(records) => assert!(
            records.is_empty(),
            "all of a deleted object's old records go"
        ),
        Err(StoreError::NotFound { .. }) => {}
        Err(error) => panic!("history of a compacted deleted object: {error}"),
    }

    assert_eq!(
        compact(store, CompactionPolicy::For { seconds: 0 }, 100).await,
        29
    );
    assert_kept(store, &long, &[70], "For 0 keeps the current revision").await;
    assert_kept(store, &single, &[1], "For 0 keeps the current revision").await;
}

/// `LastOrFor { last, seconds }` keeps a live object's newest `last`
/// revisions and everything younger than `seconds`, a deleted object's
/// young revisions only, never a current revision; every kept revision
/// still decodes.
pub async fn check_compaction_keep(store: &dyn Store) {
    let keep = |last, minutes: u64| CompactionPolicy::LastOrFor {
        last,
        seconds: minutes * 60,
    };
    let (long, gone, single) = compaction_fixture(store).await;
    // Cutoff minute 40: `long` keeps revisions 41..=70 (minutes 40..=69),
    // more than its last 5; `gone` is deleted and old, so all of it goes.
    assert_eq!(compact(store, keep(5, 60), 100).await, 40 + 4);
    assert_kept(store, &long, &(41..=70).collect::<Vec<_>>(), "last 5 or 1h").await;
    assert_kept(store, &single, &[1], "last 5 or 1h").await;
    match store.history(&gone).await {
        Ok(records) => assert!(
            records.is_empty(),
            "a deleted object's old records go, its last ones too"
        ),
        Err(StoreError::NotFound { .. }) => {}
        Err(error) => panic!("history of a compacted deleted object: {error}"),
    }

    // A deleted object whose records are young keeps them all.
    let recent = new_object(
        Kind::Pod,
        Some("default"),
        "recent",
        "uid-recent",
        spec_at(1),
    );
    let recent = store
        .create(recent, &alice(200))
        .await
        .expect("create")
        .key();
    edit(store, &recent, &alice(201), |o| o.spec = spec_at(2)).await;
    edit(store, &recent, &alice(202), |o| o.spec = spec_at(3)).await;
    store
        .delete(&recent, None, &alice(203))
        .await
        .expect("delete");
    // At minute 210 everything of `long` is old: its last 5 stay.
    assert_eq!(compact(store, keep(5, 60), 210).await, 25);
    assert_kept(store, &long, &[66, 67, 68, 69, 70], "all old: the last 5").await;
    assert_kept(store, &single, &[1], "all old: the current revision").await;
    let recent_history: Vec<(u64, bool)> = store
        .history(&recent)
        .await
        .expect("history of a young deleted object")
        .iter()
        .map(|record| (record.revision, record.deleted))
        .collect();
    assert_eq!(
        recent_history,
        vec![(1, false), (2, false), (3, false), (4, true)],
        "a deleted object keeps what is young"
    );
    let third = store.revision(&recent, 3).await.expect("revision 3");
    assert_eq!(third.spec, Some(spec_at(3)));

    // Much later: `long` keeps its last 2, `recent` ages out entirely.
    assert_eq!(compact(store, keep(2, 1), 1000).await, 3 + 4);
    assert_kept(store, &long, &[69, 70], "last 2 or 1m").await;
    assert_kept(store, &single, &[1], "last 2 or 1m").await;
    match store.history(&recent).await {
        Ok(records) => assert!(records.is_empty(), "an old deleted object goes"),
        Err(StoreError::NotFound { .. }) => {}
        Err(error) => panic!("history of an aged-out deleted object: {error}"),
    }
    // Writing on after the compaction still decodes.
    edit(store, &long, &alice(1001), |o| o.spec = spec_at(71)).await;
    assert_kept(store, &long, &[69, 70, 71], "a write after compaction").await;
}

/// Tokens: missing is None, put then find, put again replaces.
pub async fn check_tokens(store: &dyn Store) {
    let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    assert_eq!(store.find_token(hash).await.expect("find"), None);
    let token = TokenRecord {
        hash: hash.to_string(),
        identity: Identity::new("alice", Role::Operator),
        created_at: base_time(),
        last_used_at: None,
    };
    store.put_token(token.clone()).await.expect("put");
    assert_eq!(store.find_token(hash).await.expect("find"), Some(token));
    let replaced = TokenRecord {
        hash: hash.to_string(),
        identity: Identity::new("node-1", Role::Node),
        created_at: at_minute(5),
        last_used_at: None,
    };
    store.put_token(replaced.clone()).await.expect("put again");
    assert_eq!(
        store.find_token(hash).await.expect("find"),
        Some(replaced.clone())
    );
    assert_eq!(store.find_token("0000").await.expect("find"), None);

    // Last use is kept; tokens list oldest first; revocation deletes.
    let used = TokenRecord {
        last_used_at: Some(at_minute(9)),
        ..replaced
    };
    store.put_token(used.clone()).await.expect("record a use");
    let older = TokenRecord {
        hash: "00aa".into(),
        identity: Identity::new("bob", Role::User),
        created_at: at_minute(1),
        last_used_at: None,
    };
    store.put_token(older.clone()).await.expect("put another");
    assert_eq!(
        store.list_tokens().await.expect("list"),
        vec![older.clone(), used.clone()]
    );
    store
        .touch_token("00aa", at_minute(12))
        .await
        .expect("touch");
    let older = TokenRecord {
        last_used_at: Some(at_minute(12)),
        ..older
    };
    assert_eq!(
        store.find_token("00aa").await.expect("find"),
        Some(older.clone())
    );
    store
        .delete_tokens(&[hash.to_string(), "ffff".to_string()])
        .await
        .expect("revoke");
    store
        .touch_token(hash, at_minute(13))
        .await
        .expect("touch a revoked token");
    assert_eq!(store.find_token(hash).await.expect("find"), None);
    assert_eq!(store.list_tokens().await.expect("list"), vec![older]);
}

/// Leases: the newest renewal is kept per node, apart from objects (no
/// store revision, no watch event).
pub async fn check_leases(store: &dyn Store) {
    assert_eq!(store.find_lease("node-1").await.expect("find"), None);
    let before = store.current_revision().await.expect("revision");
    let first = LeaseRecord {
        name: "node-1".into(),
        holder: "node-1".into(),
        renewed_at: base_time(),
        fence_after_seconds: Some(20),
    };
    store.renew_lease(first.clone()).await.expect("renew");
    assert_eq!(
        store.find_lease("node-1").await.expect("find").as_ref(),
        Some(&first)
    );
    let later = LeaseRecord {
        renewed_at: at_minute(1),
        ..first
    };
    store.renew_lease(later.clone()).await.expect("renew again");
    assert_eq!(store.find_lease("node-1").await.expect("find"), Some(later));
    assert_eq!(store.find_lease("node-2").await.expect("find"), None);
    let objects = store.list(Kind::Node, None).await.expect("list");
    assert!(objects.objects.is_empty(), "a lease is no object");
    // No watch event: a watch from before the renewals sees nothing.
    let mut events = store
        .watch(crate::WatchFilter::default(), before)
        .await
        .expect("watch");
    let next = tokio::time::timeout(super::QUIET_PERIOD, events.next()).await;
    assert!(
        next.is_err(),
        "a lease renewal made a watch event: {next:?}"
    );
}
