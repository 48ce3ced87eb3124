//! Checks of workflow step logs: append, order, filters, per-object scope.

use std::collections::BTreeMap;

use corral_api::history::CompactionPolicy;
use corral_api::workflow::{LogLevel, StepLogEntry};
use serde_json::Value;

use super::{alice, at_minute, pod};
use crate::{STEP_LOG_ENTRIES_KEPT, StepLogFilter, Store};

fn entry(uid: &str, minute: i64, step: &str, owner: &str, message: &str) -> StepLogEntry {
    let mut fields = BTreeMap::new();
    fields.insert("phase".to_string(), Value::from("running"));
    StepLogEntry {
        time: at_minute(minute),
        object_uid: uid.to_string(),
        workflow_id: "start-1".to_string(),
        workflow: "start".to_string(),
        step: step.to_string(),
        owner: owner.to_string(),
        level: LogLevel::Info,
        message: message.to_string(),
        fields,
    }
}

fn messages(entries: &[StepLogEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.message.as_str()).collect()
}

/// Entries come back whole, ordered by time then append order, filtered by
/// step and owner, and only for the object asked about.
pub async fn check_step_logs(store: &dyn Store) {
    let empty = store
        .step_logs("uid-none", &StepLogFilter::default())
        .await
        .expect("read empty");
    assert!(empty.is_empty(), "an object with no entries has none");

    let mut late = entry("uid-a", 5, "acme/slow-mount", "acme-storage", "late");
    late.level = LogLevel::Error;
    store
        .append_step_logs(&[
            late.clone(),
            entry("uid-a", 1, "scheduler/place", "scheduler", "first"),
            entry("uid-a", 1, "acme/slow-mount", "acme-storage", "second"),
            entry("uid-b", 0, "scheduler/place", "scheduler", "other object"),
        ])
        .await
        .expect("append");
    store
        .append_step_logs(&[entry("uid-a", 1, "scheduler/place", "scheduler", "third")])
        .await
        .expect("append again");
    store.append_step_logs(&[]).await.expect("append nothing");

    let all = store
        .step_logs("uid-a", &StepLogFilter::default())
        .await
        .expect("read all");
    assert_eq!(
        messages(&all),
        ["first", "second", "third", "late"],
        "ordered by time, ties in append order, other objects left out"
    );
    assert_eq!(all[3], late, "an entry reads back as it was appended");

    let by_step = store
        .step_logs(
            "uid-a",
            &StepLogFilter {
                step: Some("acme/slow-mount".into()),
                ..StepLogFilter::default()
            },
        )
        .await
        .expect("by step");
    assert_eq!(messages(&by_step), ["second", "late"], "step filter");

    let by_owner = store
        .step_logs(
            "uid-a",
            &StepLogFilter {
                owner: Some("scheduler".into()),
                ..StepLogFilter::default()
            },
        )
        .await
        .expect("by owner");
    assert_eq!(messages(&by_owner), ["first", "third"], "owner filter");

    let nothing = store
        .step_logs(
            "uid-a",
            &StepLogFilter {
                step: Some("acme/slow-mount".into()),
                owner: Some("scheduler".into()),
                workflow_id: None,
            },
        )
        .await
        .expect("both filters");
    assert!(nothing.is_empty(), "filters combine with AND");

    let other_workflow = store
        .step_logs(
            "uid-a",
            &StepLogFilter {
                workflow_id: Some("update-2".into()),
                ..StepLogFilter::default()
            },
        )
        .await
        .expect("by workflow");
    assert!(other_workflow.is_empty(), "workflow filter");
}

/// A compaction trims step logs with the history: an object keeps its
/// newest [`STEP_LOG_ENTRIES_KEPT`] entries, one whose revisions are all
/// gone keeps none, a short log is left alone, and `All` keeps everything.
pub async fn check_step_log_trim(store: &dyn Store) {
    for name in ["long", "short"] {
        let uid = format!("uid-{name}");
        let created = store
            .create(pod("default", name, &uid, "img:1"), &alice(0))
            .await
            .unwrap_or_else(|error| panic!("create {name}: {error}"));
        assert_eq!(created.metadata.uid, uid);
    }
    let gone = store
        .create(pod("default", "gone", "uid-gone", "img:1"), &alice(0))
        .await
        .expect("create gone");
    store
        .delete(&gone.key(), None, &alice(1))
        .await
        .expect("delete gone");
    // One entry per append: the oldest appends are the ones that go.
    let total = STEP_LOG_ENTRIES_KEPT + 100;
    for index in 0..total {
        let message = format!("m{index}");
        let log = entry("uid-long", 2, "node/start", "node", &message);
        store.append_step_logs(&[log]).await.expect("append long");
    }
    let few = [
        entry("uid-short", 2, "node/start", "node", "s0"),
        entry("uid-short", 2, "node/start", "node", "s1"),
        entry("uid-gone", 2, "node/start", "node", "g0"),
    ];
    store.append_step_logs(&few).await.expect("append short");
    let read = |uid: &'static str| async move {
        store
            .step_logs(uid, &StepLogFilter::default())
            .await
            .unwrap_or_else(|error| panic!("step logs of {uid}: {error}"))
    };

    let kept_all = store
        .compact_history(CompactionPolicy::All, at_minute(1000))
        .await
        .expect("compact All");
    assert_eq!(
        kept_all.step_log_entries_removed, 0,
        "All keeps every entry"
    );
    assert_eq!(read("uid-long").await.len(), total);

    // Last 0 keeps each live object's current revision and nothing of the
    // deleted one.
    let report = store
        .compact_history(CompactionPolicy::Last { count: 0 }, at_minute(1000))
        .await
        .expect("compact Last 0");
    assert_eq!(report.revisions_removed, 2, "the deleted object's history");
    assert_eq!(report.step_log_entries_removed, 100 + 1);
    let long_log = read("uid-long").await;
    assert_eq!(long_log.len(), STEP_LOG_ENTRIES_KEPT, "the newest are kept");
    assert_eq!(long_log.first().map(|e| e.message.as_str()), Some("m100"));
    let newest = format!("m{}", total - 1);
    assert_eq!(long_log.last().map(|e| &e.message), Some(&newest));
    assert_eq!(messages(&read("uid-short").await), ["s0", "s1"]);
    assert!(read("uid-gone").await.is_empty(), "no history, no step log");

    let again = store
        .compact_history(CompactionPolicy::Last { count: 0 }, at_minute(1001))
        .await
        .expect("compact again");
    assert_eq!(again.step_log_entries_removed, 0, "nothing more to trim");
    // The trimmed log takes new entries after the kept ones.
    let late = entry("uid-long", 3, "node/start", "node", "after");
    store.append_step_logs(&[late]).await.expect("append after");
    let long_log = read("uid-long").await;
    assert_eq!(long_log.len(), STEP_LOG_ENTRIES_KEPT + 1);
    assert_eq!(long_log.last().map(|e| e.message.as_str()), Some("after"));
}
