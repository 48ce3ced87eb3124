//! A person's retry of a failed workflow: `POST …/retry` and an unchanged
//! re-apply run the failed steps again in the same instance; controllers
//! and nodes may not ask; nothing failed is a 409 that says so.

mod workflow_harness;

use axum::http::StatusCode;
use chrono::TimeDelta;
use corral_api::Role;
use corral_api::workflow::{WorkflowInstance, WorkflowOutcome};
use serde_json::json;
use workflow_harness::{Harness, PODS, phase, pod};

/// Registers `acme/slow-mount` (one attempt), creates pod `web`, and lets
/// the step fail for good; returns the owner's token.
async fn failed_pod(h: &Harness) -> String {
    h.register_slow_mount().await;
    h.create_pod("web", "img:1").await;
    let owner = h.token("acme-storage", Role::Controller).await;
    fail_mount(h, &owner).await;
    owner
}

async fn fail_mount(h: &Harness, owner: &str) -> WorkflowInstance {
    h.step_ok(
        "web",
        owner,
        json!({"action": "claim", "step": "acme/slow-mount"}),
    )
    .await;
    h.clock.advance(TimeDelta::seconds(1));
    let failed = h
        .step_ok(
            "web",
            owner,
            json!({"action": "fail", "step": "acme/slow-mount", "error": "nfs down"}),
        )
        .await;
    assert_eq!(failed.outcome, WorkflowOutcome::Failed);
    failed
}

#[tokio::test]
async fn retry_runs_the_failed_steps_again_in_the_same_instance() {
    let h = Harness::new().await;
    let owner = failed_pod(&h).await;

    // Only people ask for a retry.
    for role in [Role::Controller, Role::Node] {
        let token = h.token("someone", role).await;
        let (status, value) = h
            .call("POST", &format!("{PODS}/web/retry"), &token, None)
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{role:?}: {value}");
    }

    let user = h.token("alice", Role::User).await;
    let (status, value) = h
        .call("POST", &format!("{PODS}/web/retry"), &user, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{value}");
    let retried: WorkflowInstance = serde_json::from_value(value).expect("an instance");
    assert_eq!(retried.id, "start-1");
    assert_eq!(retried.outcome, WorkflowOutcome::Running);
    assert_eq!(phase(&retried, "acme/slow-mount"), "ready");
    assert_eq!(phase(&retried, "storage"), "waiting");
    assert_eq!(h.workflows("web").await.latest(), Some(&retried), "stored");

    // Running with nothing failed: 409, and it says why.
    let (status, value) = h
        .call("POST", &format!("{PODS}/web/retry"), &user, None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{value}");
    assert_eq!(
        value["message"],
        "pod/web: workflow start-1 has nothing to retry: it is running and no step has failed: its steps wait on their owners"
    );

    // The owner's new attempt is attempt 2, of a fresh budget; the log
    // tells the whole story: failure, who retried, the new attempt.
    let again = h
        .step_ok(
            "web",
            &owner,
            json!({"action": "claim", "step": "acme/slow-mount"}),
        )
        .await;
    assert_eq!(phase(&again, "acme/slow-mount"), "running");
    let logs = h.logs("web", "?step=acme/slow-mount").await;
    let messages: Vec<&str> = logs.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "ready",
            "claimed by acme-storage (attempt 1)",
            "failed (attempt 1, the last): nfs down",
            "start workflow retried by alice: acme/slow-mount start again with a fresh retry budget",
            "ready",
            "claimed by acme-storage (attempt 2)",
        ]
    );
}

#[tokio::test]
async fn an_unchanged_apply_retries_a_failed_workflow_and_a_controller_apply_does_not() {
    let h = Harness::new().await;
    let owner = failed_pod(&h).await;
    let path = format!("{PODS}/web");

    // A controller putting the same object back changes nothing.
    let controller = h.token("acme-storage", Role::Controller).await;
    let (status, _) = h
        .call("PUT", &path, &controller, Some(pod("web", "img:1")))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        h.workflows("web").await.latest().map(|i| i.outcome),
        Some(WorkflowOutcome::Failed)
    );

    let applied = h.ok("PUT", &path, Some(pod("web", "img:1"))).await;
    assert_eq!(applied["metadata"]["revision"], 1, "no new revision");
    let latest = h
        .workflows("web")
        .await
        .latest()
        .cloned()
        .expect("an instance");
    assert_eq!(
        (latest.id.as_str(), latest.outcome),
        ("start-1", WorkflowOutcome::Running)
    );
    assert_eq!(phase(&latest, "acme/slow-mount"), "ready");

    // Applying it again while it runs is just unchanged.
    let version = applied["metadata"]["resourceVersion"].clone();
    let again = h.ok("PUT", &path, Some(pod("web", "img:1"))).await;
    assert_eq!(again["metadata"]["resourceVersion"], version);

    // And it can fail again, and be retried again.
    fail_mount(&h, &owner).await;
    h.ok("PUT", &path, Some(pod("web", "img:1"))).await;
    assert_eq!(
        h.workflows("web").await.latest().map(|i| i.outcome),
        Some(WorkflowOutcome::Running)
    );
}
