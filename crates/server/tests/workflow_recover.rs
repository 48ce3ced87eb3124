//! A node's report of a pod it recovered after a reboot, `POST
//! …/pods/{name}/recoveries`: recorded as a finished `recover` instance with
//! the node's own timings, only from the pod's node, never cancelling a
//! running instance, and idempotent.

mod workflow_harness;

use axum::http::StatusCode;
use chrono::{TimeDelta, TimeZone, Utc};
use corral_api::Role;
use corral_api::workflow::{WorkflowInstance, WorkflowOutcome};
use serde_json::{Value, json};
use workflow_harness::{Harness, PODS, phase};

const STEPS: [&str; 5] = [
    "node/check-sandbox",
    "node/clear-stale-sandbox",
    "node/create-sandbox",
    "node/prepare-volumes",
    "node/start-containers",
];

/// Pod `web`, bound to node-1 by the scheduler.
async fn bound_pod(h: &Harness) {
    h.create_pod("web", "img:1").await;
    let scheduler = h.token("scheduler", Role::Controller).await;
    let mut pod = h.ok("GET", &format!("{PODS}/web"), None).await;
    pod["status"]["node"] = json!("node-1");
    let (status, value) = h
        .call("PUT", &format!("{PODS}/web/status"), &scheduler, Some(pod))
        .await;
    assert_eq!(status, StatusCode::OK, "{value}");
}

/// A report of `steps`, each taking 100 ms from `began`; the last fails
/// with `error` if given.
fn report(began: chrono::DateTime<Utc>, steps: &[&str], error: Option<&str>) -> Value {
    let steps: Vec<Value> = steps
        .iter()
        .enumerate()
        .map(|(index, step)| {
            let at = |n: usize| began + TimeDelta::milliseconds(100 * n as i64);
            let mut step = json!({
                "step": step,
                "startedAt": at(index),
                "finishedAt": at(index + 1),
                "note": format!("{step} done"),
            });
            if index + 1 == steps.len()
                && let Some(error) = error
            {
                step["error"] = json!(error);
                step.as_object_mut().map(|s| s.remove("note"));
            }
            step
        })
        .collect();
    json!({"revision": 1, "startedAt": began, "steps": steps})
}

#[tokio::test]
async fn a_recovery_is_recorded_as_a_finished_instance_with_the_nodes_timings() {
    let h = Harness::new().await;
    bound_pod(&h).await;
    let path = format!("{PODS}/web/recoveries");
    // Two hours before the server's clock (2030-01-01): the control plane
    // was away while the node recovered.
    let began = Utc
        .with_ymd_and_hms(2029, 12, 31, 22, 0, 0)
        .single()
        .expect("valid time");
    let body = report(began, &STEPS, None);

    // Only the pod's own node reports it.
    for (name, role) in [
        ("node-2", Role::Node),
        ("alice", Role::User),
        ("scheduler", Role::Controller),
    ] {
        let token = h.token(name, role).await;
        let (status, value) = h.call("POST", &path, &token, Some(body.clone())).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{name}: {value}");
    }
    assert_eq!(
        h.workflows("web").await.instances.len(),
        1,
        "nothing recorded"
    );

    let node = h.token("node-1", Role::Node).await;
    let (status, value) = h.call("POST", &path, &node, Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{value}");
    let recorded: WorkflowInstance = serde_json::from_value(value).expect("an instance");
    assert_eq!(recorded.workflow, "recover");
    assert_eq!(recorded.outcome, WorkflowOutcome::Succeeded);
    assert_eq!(recorded.started_at, began);
    assert_eq!(
        recorded.finished_at,
        Some(began + TimeDelta::milliseconds(500))
    );
    for step in STEPS {
        assert_eq!(phase(&recorded, step), "done", "{step}");
    }

    // Beside the start instance (still running: not cancelled), newest.
    let kept = h.workflows("web").await;
    let ids: Vec<(&str, WorkflowOutcome)> = kept
        .instances
        .iter()
        .map(|i| (i.id.as_str(), i.outcome))
        .collect();
    assert_eq!(
        ids,
        [
            ("start-1", WorkflowOutcome::Running),
            (recorded.id.as_str(), WorkflowOutcome::Succeeded)
        ]
    );
    // The step log has the node's notes at the node's times.
    let logs = h.logs("web", "?step=node/check-sandbox").await;
    let done = logs
        .iter()
        .find(|entry| entry.message.starts_with("done"))
        .expect("a done entry");
    assert_eq!(done.message, "done: node/check-sandbox done");
    assert_eq!(done.time, began + TimeDelta::milliseconds(100));

    // The same report again is the same instance, not a second one.
    let (status, value) = h.call("POST", &path, &node, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{value}");
    assert_eq!(value["id"], json!(recorded.id));
    assert_eq!(h.workflows("web").await.instances.len(), 2);
}

#[tokio::test]
async fn a_failed_recovery_is_recorded_failed_and_bad_reports_are_refused() {
    let h = Harness::new().await;
    bound_pod(&h).await;
    let path = format!("{PODS}/web/recoveries");
    let node = h.token("node-1", Role::Node).await;
    let began = Utc::now();

    let failed = report(began, &STEPS[..3], Some("cannot pin the namespace"));
    let (status, value) = h.call("POST", &path, &node, Some(failed)).await;
    assert_eq!(status, StatusCode::OK, "{value}");
    let recorded: WorkflowInstance = serde_json::from_value(value).expect("an instance");
    assert_eq!(recorded.outcome, WorkflowOutcome::Failed);
    assert_eq!(phase(&recorded, "node/create-sandbox"), "failed");

    // A step out of order (not ready yet) is refused, naming it.
    let skipped = report(began + TimeDelta::seconds(5), &[STEPS[0], STEPS[4]], None);
    let (status, value) = h.call("POST", &path, &node, Some(skipped)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{value}");
    assert!(
        value["message"]
            .as_str()
            .is_some_and(|m| m.contains("node/start-containers")),
        "{value}"
    );

    let (status, value) = h
        .call(
            "POST",
            &path,
            &node,
            Some(json!({"revision": 1, "startedAt": began, "steps": []})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{value}");
    let (status, value) = h
        .call("POST", &path, &node, Some(json!({"revision": 1})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{value}");
}
