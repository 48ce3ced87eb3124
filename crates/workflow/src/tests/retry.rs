//! A person's retry: a failed instance runs its failed steps again with a
//! fresh budget, keeping what is done; a backoff is cut short; nothing else
//! is retried.

use corral_api::workflow::{RetryPolicy, StepState, WorkflowOutcome};

use super::*;
use crate::{TransitionError, dehydrate, fail, hydrate, instantiate, retry};

/// `x/a` then `x/b` (which requires it), wanted by target `end`; `x/a` gets
/// `attempts` tries one second apart.
fn chain(attempts: u32) -> WorkflowDefinition {
    let mut a = step("x/a");
    a.retry = RetryPolicy {
        max_attempts: attempts,
        backoff_ms: 1_000,
        max_backoff_ms: 1_000,
    };
    let mut b = step("x/b");
    b.after = names(&["x/a"]);
    b.requires = names(&["x/a"]);
    let mut end = target("end");
    end.after = names(&["x/b"]);
    end.requires = names(&["x/b"]);
    definition("end", vec![a, b, end])
}

fn fail_a(instance: &mut WorkflowInstance, from: i64) {
    let x = controller("x");
    claim(instance, "x/a", &x, None, at(from)).expect("claim x/a");
    fail(
        instance,
        "x/a",
        &x,
        None,
        at(from + 10),
        "image not on node",
    )
    .expect("fail x/a");
}

#[test]
fn a_failed_instance_runs_its_failed_steps_again_and_can_succeed() {
    let (mut instance, _) = instantiate(&chain(2), "start-1", "uid", 1, at(0));
    fail_a(&mut instance, 0);
    fail_a(&mut instance, 2_000);
    assert_eq!(instance.outcome, WorkflowOutcome::Failed);
    assert_eq!(phase(&instance, "x/b"), "blocked");

    let logs = retry(&mut instance, "alice", at(5_000)).expect("retry");
    assert_eq!(instance.outcome, WorkflowOutcome::Running);
    assert_eq!(instance.finished_at, None);
    assert_eq!(instance.id, "start-1", "the same instance, one story");
    assert_eq!(ready_steps(&instance), ["x/a"]);
    assert_eq!(phase(&instance, "x/b"), "waiting");
    assert_eq!(phase(&instance, "end"), "waiting");
    assert!(
        logs.iter().any(|log| log.message
            == "start workflow retried by alice: x/a start again with a fresh retry budget"),
        "{logs:?}"
    );

    // A fresh budget, attempts still counted on (an owner tells attempts
    // apart by their numbers): attempt 3 of 4 may fail and be retried, after
    // the first backoff again.
    fail_a(&mut instance, 6_000);
    let StepState::Failed {
        attempt,
        next_retry_at,
        ..
    } = state(&instance, "x/a")
    else {
        panic!("x/a should have failed");
    };
    assert_eq!((*attempt, *next_retry_at), (3, Some(at(7_010))));
    let stored = dehydrate(&instance, "chain");
    assert_eq!(stored.steps["x/a"].retry_base, 2, "the budget is stored");
    run(&mut instance, "x/a", &controller("x"), 7_010, 7_020, None);
    run(&mut instance, "x/b", &controller("x"), 7_020, 7_030, None);
    assert_eq!(instance.outcome, WorkflowOutcome::Succeeded);
}

#[test]
fn done_steps_stay_done_across_a_retry() {
    let mut a = step("x/a");
    a.wanted_by = Some("end".into());
    let mut b = step("x/b");
    b.after = names(&["x/a"]);
    b.requires = names(&["x/a"]);
    b.wanted_by = Some("end".into());
    let (mut instance, _) = instantiate(
        &definition("end", vec![a, b, target("end")]),
        "start-1",
        "uid",
        1,
        at(0),
    );
    let x = controller("x");
    run(&mut instance, "x/a", &x, 0, 10, Some("node-1"));
    claim(&mut instance, "x/b", &x, None, at(10)).expect("claim");
    fail(&mut instance, "x/b", &x, None, at(20), "boom").expect("fail");
    assert_eq!(instance.outcome, WorkflowOutcome::Failed);

    retry(&mut instance, "alice", at(100)).expect("retry");
    assert!(
        matches!(state(&instance, "x/a"), StepState::Done { note: Some(note), .. } if note == "node-1"),
        "{:?}",
        state(&instance, "x/a")
    );
    assert_eq!(ready_steps(&instance), ["x/b"]);

    // What the store keeps reads back the same.
    let stored = dehydrate(&instance, "pod-start-abc");
    let back = hydrate(
        &definition(
            "end",
            instance
                .steps
                .iter()
                .map(|s| s.definition.clone())
                .collect(),
        ),
        &stored,
        "uid",
        &[],
    );
    assert_eq!(back.outcome, WorkflowOutcome::Running);
    assert_eq!(ready_steps(&back), ["x/b"]);
}

#[test]
fn a_backoff_is_cut_short() {
    let (mut instance, _) = instantiate(&chain(5), "start-1", "uid", 1, at(0));
    fail_a(&mut instance, 0);
    assert_eq!(
        phase(&instance, "x/a"),
        "failed",
        "awaits its retry at 1.01s"
    );
    let logs = retry(&mut instance, "alice", at(500)).expect("retry");
    assert_eq!(ready_steps(&instance), ["x/a"]);
    assert!(
        logs.iter().any(|log| log.message
            == "retry of x/a brought forward by alice: ready now instead of after the backoff"),
        "{logs:?}"
    );
}

#[test]
fn nothing_to_retry_says_why() {
    let (mut instance, _) = instantiate(&chain(1), "start-1", "uid", 1, at(0));
    let error = retry(&mut instance, "alice", at(0)).expect_err("nothing failed");
    assert_eq!(
        error.to_string(),
        "workflow start-1 has nothing to retry: it is running and no step has failed: its steps wait on their owners"
    );
    let x = controller("x");
    run(&mut instance, "x/a", &x, 0, 10, None);
    run(&mut instance, "x/b", &x, 10, 20, None);
    let error = retry(&mut instance, "alice", at(30)).expect_err("succeeded");
    assert!(
        matches!(&error, TransitionError::NothingToRetry { why, .. } if why == "it succeeded"),
        "{error}"
    );
}
