//! Checks of workflow step logs: append, order, filters, per-object scope.

use std::collections::BTreeMap;

use corral_api::workflow::{LogLevel, StepLogEntry};
use serde_json::Value;

use super::at_minute;
use crate::{StepLogFilter, Store};

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
