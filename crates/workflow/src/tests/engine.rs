//! Ordering, parallelism, failure propagation, validation, timeouts,
//! retries and inserted steps.

use chrono::TimeDelta;
use corral_api::workflow::{StepState, WorkflowOutcome, WorkflowStatus};

use super::*;
use crate::{
    DefinitionError, Unfinished, VerdictState, backoff, fail, instantiate, next_deadline, record,
    tick, unfinished_before, unfinished_text, validate, verdict,
};

#[test]
fn steps_wait_for_what_is_ordered_before_them() {
    let (instance, _) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    assert_eq!(ready_steps(&instance), ["scheduler/place"]);
    assert_eq!(
        state(&instance, "ipam/assign-address"),
        &StepState::Waiting {
            on: names(&["scheduled"])
        }
    );
    assert_eq!(
        state(&instance, "scheduled"),
        &StepState::Waiting {
            on: names(&["scheduler/place"])
        }
    );
    // Steps are stored in a topological order.
    let position = |name: &str| {
        instance
            .steps
            .iter()
            .position(|step| step.definition.name == name)
            .expect(name)
    };
    assert!(position("scheduler/place") < position("scheduled"));
    assert!(position("containers") < position("node/start-containers"));
    assert!(position("node/await-readiness") < position("running"));
}

#[test]
fn unordered_steps_are_ready_together() {
    let (mut instance, _) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    run(
        &mut instance,
        "scheduler/place",
        &controller("scheduler"),
        0,
        3,
        Some("node-1"),
    );
    assert_eq!(phase(&instance, "scheduled"), "done");
    assert_eq!(
        ready_steps(&instance),
        [
            "ipam/assign-address",
            "node/pull-image",
            "node/prepare-volumes"
        ]
    );
}

#[test]
fn a_whole_start_succeeds_and_records_its_finish() {
    let (mut instance, _) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    let node = agent("node-1");
    run(
        &mut instance,
        "scheduler/place",
        &controller("scheduler"),
        0,
        3,
        Some("node-1"),
    );
    run(
        &mut instance,
        "ipam/assign-address",
        &controller("ipam"),
        3,
        4,
        None,
    );
    run(&mut instance, "node/create-sandbox", &node, 4, 22, None);
    run(&mut instance, "node/pull-image", &node, 3, 500, None);
    run(&mut instance, "node/prepare-volumes", &node, 3, 10, None);
    assert_eq!(ready_steps(&instance), ["node/run-init-containers"]);
    run(
        &mut instance,
        "node/run-init-containers",
        &node,
        500,
        500,
        None,
    );
    assert_eq!(ready_steps(&instance), ["node/start-containers"]);
    run(
        &mut instance,
        "node/start-containers",
        &node,
        500,
        700,
        None,
    );
    run(
        &mut instance,
        "node/await-readiness",
        &node,
        700,
        1_200,
        None,
    );
    assert_eq!(instance.outcome, WorkflowOutcome::Succeeded);
    assert_eq!(instance.finished_at, Some(at(1_200)));
    let judged = verdict(&instance, at(5_000), TimeDelta::minutes(2));
    assert_eq!(judged.state, VerdictState::Succeeded);
    assert_eq!(judged.message, "start workflow finished in 1.2s");
}

/// `x/a`; `x/b` requires it; `x/c` is only after it; `x/d` requires `x/b`.
fn requires_versus_after() -> crate::WorkflowDefinition {
    let mut b = step("x/b");
    b.requires = names(&["x/a"]);
    let mut c = step("x/c");
    c.after = names(&["x/a"]);
    c.wanted_by = Some("end".into());
    let mut d = step("x/d");
    d.requires = names(&["x/b"]);
    definition("end", vec![step("x/a"), b, c, d, target("end")])
}

#[test]
fn requires_propagates_failure_and_after_only_orders() {
    let (mut instance, _) = instantiate(&requires_versus_after(), "w", "uid", 1, at(0));
    let x = controller("x");
    claim(&mut instance, "x/a", &x, None, at(0)).expect("claim");
    assert_eq!(phase(&instance, "x/c"), "waiting");
    fail(&mut instance, "x/a", &x, None, at(10), "disk on fire").expect("fail");
    assert_eq!(
        state(&instance, "x/b"),
        &StepState::Blocked {
            dependency: "x/a".into(),
            cause: "x/a".into(),
            at: at(10)
        }
    );
    assert_eq!(
        state(&instance, "x/d"),
        &StepState::Blocked {
            dependency: "x/b".into(),
            cause: "x/a".into(),
            at: at(10)
        }
    );
    assert_eq!(
        phase(&instance, "x/c"),
        "ready",
        "after-only dependents still run"
    );
    run(&mut instance, "x/c", &x, 20, 30, None);
    assert_eq!(instance.outcome, WorkflowOutcome::Succeeded);
}

#[test]
fn a_failed_member_blocks_its_target_and_fails_the_workflow() {
    let (mut instance, _) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    run(
        &mut instance,
        "scheduler/place",
        &controller("scheduler"),
        0,
        3,
        Some("node-1"),
    );
    let node = agent("node-1");
    // Three attempts, each failing; the backoff doubles from 1s.
    let mut now = 10;
    for attempt in 1..=3 {
        claim(
            &mut instance,
            "node/pull-image",
            &node,
            Some("node-1"),
            at(now),
        )
        .expect("claim");
        fail(
            &mut instance,
            "node/pull-image",
            &node,
            Some("node-1"),
            at(now + 5),
            "manifest unknown",
        )
        .expect("fail");
        if attempt < 3 {
            now += 5 + 1_000 * (1 << (attempt - 1));
            tick(&mut instance, at(now));
        }
    }
    assert_eq!(phase(&instance, "image"), "blocked");
    assert_eq!(phase(&instance, "containers"), "blocked");
    assert_eq!(instance.outcome, WorkflowOutcome::Failed);
    let judged = verdict(&instance, at(now + 10), TimeDelta::minutes(2));
    assert_eq!(judged.state, VerdictState::Failed);
    assert_eq!(
        judged.message,
        "step node/pull-image failed: manifest unknown (attempt 3 of 3)"
    );
}

#[test]
fn a_cycle_is_named_in_full() {
    let mut a = step("x/a");
    a.after = names(&["x/c"]);
    let mut b = step("x/b");
    b.after = names(&["x/a"]);
    let mut c = step("x/c");
    c.after = names(&["x/b"]);
    let error = validate(&definition("end", vec![a, b, c, target("end")])).expect_err("cycle");
    assert_eq!(
        error.to_string(),
        "ordering cycle: x/a -> x/b -> x/c -> x/a"
    );
}

#[test]
fn an_unknown_reference_names_step_and_reference() {
    let mut a = step("x/a");
    a.before = names(&["netwrok"]);
    let error = validate(&definition("end", vec![a, target("end")])).expect_err("unknown");
    assert!(matches!(error, DefinitionError::UnknownReference { .. }));
    assert_eq!(
        error.to_string(),
        "step x/a: before names \"netwrok\", which is no step or target of this workflow"
    );
}

#[test]
fn duplicate_and_badly_named_steps_are_refused() {
    let error = validate(&definition(
        "end",
        vec![step("x/a"), step("x/a"), target("end")],
    ))
    .expect_err("duplicate");
    assert_eq!(error.to_string(), "step x/a is declared twice");
    let error =
        validate(&definition("end", vec![step("noslash"), target("end")])).expect_err("name");
    assert!(
        matches!(error, DefinitionError::InvalidName { .. }),
        "{error}"
    );
    let error = validate(&definition("x/a", vec![step("x/a")])).expect_err("goal");
    assert!(matches!(error, DefinitionError::BadGoal { .. }), "{error}");
}

#[test]
fn a_running_step_past_its_deadline_times_out_and_fails_for_good() {
    let mut a = step("x/a");
    a.timeout_ms = Some(30_000);
    a.wanted_by = Some("end".into());
    let (mut instance, _) = instantiate(
        &definition("end", vec![a, target("end")]),
        "w",
        "uid",
        1,
        at(0),
    );
    claim(&mut instance, "x/a", &controller("x"), None, at(1_000)).expect("claim");
    let logs = tick(&mut instance, at(30_999));
    assert!(logs.is_empty());
    assert_eq!(phase(&instance, "x/a"), "running");
    let logs = tick(&mut instance, at(40_000));
    assert_eq!(
        state(&instance, "x/a"),
        &StepState::TimedOut {
            started: at(1_000),
            at: at(31_000),
            attempt: 1,
            next_retry_at: None
        }
    );
    assert_eq!(instance.outcome, WorkflowOutcome::Failed);
    assert!(
        logs.iter()
            .any(|log| log.message.starts_with("timed out after 30s"))
    );
    // A late completion is refused: the step is no longer running.
    let error = complete(
        &mut instance,
        "x/a",
        &controller("x"),
        None,
        at(41_000),
        None,
    )
    .expect_err("finished");
    assert!(
        matches!(error, crate::TransitionError::Finished { .. }),
        "{error}"
    );
    let judged = verdict(&instance, at(41_000), TimeDelta::minutes(2));
    assert_eq!(
        judged.message,
        "step x/a timed out after 30s (attempt 1 of 1)"
    );
}

#[test]
fn retries_back_off_then_succeed() {
    let mut a = step("x/a");
    a.timeout_ms = Some(10_000);
    a.wanted_by = Some("end".into());
    a.retry = RetryPolicy {
        max_attempts: 3,
        backoff_ms: 1_000,
        max_backoff_ms: 60_000,
    };
    let (mut instance, _) = instantiate(
        &definition("end", vec![a, target("end")]),
        "w",
        "uid",
        1,
        at(0),
    );
    let x = controller("x");
    assert_eq!(next_deadline(&instance), None, "waiting on its owner only");
    // Attempt 1 fails; retry after 1s.
    claim(&mut instance, "x/a", &x, None, at(0)).expect("claim 1");
    assert_eq!(next_deadline(&instance), Some(at(10_000)), "the timeout");
    fail(&mut instance, "x/a", &x, None, at(100), "flaky").expect("fail 1");
    assert_eq!(next_deadline(&instance), Some(at(1_100)), "the retry");
    let StepState::Failed { next_retry_at, .. } = state(&instance, "x/a") else {
        panic!("expected failed");
    };
    assert_eq!(*next_retry_at, Some(at(1_100)));
    tick(&mut instance, at(1_099));
    assert_eq!(phase(&instance, "x/a"), "failed");
    let judged = verdict(&instance, at(600), TimeDelta::minutes(2));
    assert_eq!(
        judged.message,
        "step x/a failed (attempt 1 of 3), retry in 500ms: flaky"
    );
    tick(&mut instance, at(1_100));
    assert_eq!(
        state(&instance, "x/a"),
        &StepState::Ready { since: at(1_100) }
    );
    // Attempt 2 times out; the backoff doubles to 2s after the deadline.
    claim(&mut instance, "x/a", &x, None, at(1_200)).expect("claim 2");
    tick(&mut instance, at(11_200));
    assert_eq!(
        state(&instance, "x/a"),
        &StepState::TimedOut {
            started: at(1_200),
            at: at(11_200),
            attempt: 2,
            next_retry_at: Some(at(13_200))
        }
    );
    assert_eq!(instance.outcome, WorkflowOutcome::Running);
    // Attempt 3 succeeds; the step's duration counts from the first attempt.
    claim(&mut instance, "x/a", &x, None, at(13_500)).expect("claim 3");
    complete(&mut instance, "x/a", &x, None, at(14_000), None).expect("complete");
    assert_eq!(
        state(&instance, "x/a"),
        &StepState::Done {
            started: at(13_500),
            finished: at(14_000),
            attempt: 3,
            note: None
        }
    );
    assert_eq!(
        instance.step("x/a").and_then(|s| s.first_started_at),
        Some(at(0))
    );
    assert_eq!(instance.outcome, WorkflowOutcome::Succeeded);
    assert_eq!(next_deadline(&instance), None, "finished");
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    let policy = RetryPolicy {
        max_attempts: 10,
        backoff_ms: 1_000,
        max_backoff_ms: 5_000,
    };
    let waits: Vec<i64> = (1..=5)
        .map(|n| backoff(&policy, n).num_milliseconds())
        .collect();
    assert_eq!(waits, [1_000, 2_000, 4_000, 5_000, 5_000]);
    assert_eq!(backoff(&policy, 200).num_milliseconds(), 5_000);
}

#[test]
fn an_inserted_step_holds_containers_until_done() {
    let spec = spec_with(vec![registration(
        "acme/inject-sidecar",
        &["network"],
        &["containers"],
        "30s",
    )]);
    let controllers = [RegisteredController {
        name: "acme-sidecar",
        spec: &spec,
    }];
    let (mut instance, _) = instantiate(&pod_start(&controllers), "start-1", "uid-1", 1, at(0));
    let node = agent("node-1");
    run(
        &mut instance,
        "scheduler/place",
        &controller("scheduler"),
        0,
        3,
        Some("node-1"),
    );
    run(&mut instance, "node/pull-image", &node, 3, 50, None);
    run(&mut instance, "node/prepare-volumes", &node, 3, 60, None);
    assert_eq!(
        state(&instance, "acme/inject-sidecar"),
        &StepState::Waiting {
            on: names(&["network"])
        }
    );
    run(
        &mut instance,
        "ipam/assign-address",
        &controller("ipam"),
        3,
        4,
        None,
    );
    run(&mut instance, "node/create-sandbox", &node, 4, 22, None);
    assert_eq!(ready_steps(&instance), ["acme/inject-sidecar"]);
    assert_eq!(
        state(&instance, "containers"),
        &StepState::Waiting {
            on: names(&["acme/inject-sidecar"])
        }
    );
    assert_eq!(phase(&instance, "node/run-init-containers"), "waiting");
    run(
        &mut instance,
        "acme/inject-sidecar",
        &controller("acme-sidecar"),
        30,
        80,
        None,
    );
    assert_eq!(phase(&instance, "containers"), "done");
    assert_eq!(ready_steps(&instance), ["node/run-init-containers"]);

    // Without the registration, new instances lack the step; the running
    // instance keeps its snapshot.
    let (fresh, _) = instantiate(&pod_start(&[]), "start-2", "uid-1", 2, at(100));
    assert!(fresh.step("acme/inject-sidecar").is_none());
    assert!(instance.step("acme/inject-sidecar").is_some());
}

#[test]
fn a_ready_step_nobody_claims_makes_the_instance_stuck() {
    let (instance, _) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    let early = verdict(&instance, at(10_000), TimeDelta::minutes(2));
    assert_eq!(early.state, VerdictState::Running);
    assert_eq!(
        early.message,
        "step scheduler/place ready for 10s, not yet claimed (owner scheduler)"
    );
    let late = verdict(&instance, at(180_000), TimeDelta::minutes(2));
    assert_eq!(late.state, VerdictState::Stuck);
    assert_eq!(late.step.as_deref(), Some("scheduler/place"));
    assert_eq!(
        late.message,
        "step scheduler/place ready for 3m but nobody claimed it (owner scheduler)"
    );
}

#[test]
fn transitions_are_logged_with_object_workflow_step_and_owner() {
    let (mut instance, logs) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    let ready = logs
        .iter()
        .find(|log| log.step == "scheduler/place")
        .expect("ready logged");
    assert_eq!(ready.message, "ready");
    assert_eq!(ready.object_uid, "uid-1");
    assert_eq!(ready.workflow_id, "start-1");
    assert_eq!(ready.owner, "scheduler");
    let logs = claim(
        &mut instance,
        "scheduler/place",
        &controller("scheduler"),
        None,
        at(1),
    )
    .expect("claim");
    assert_eq!(
        logs.last().map(|log| log.message.as_str()),
        Some("claimed by scheduler (attempt 1)")
    );
    let logs = complete(
        &mut instance,
        "scheduler/place",
        &controller("scheduler"),
        None,
        at(3),
        Some("node-1".into()),
    )
    .expect("complete");
    let messages: Vec<(&str, &str)> = logs
        .iter()
        .map(|log| (log.step.as_str(), log.message.as_str()))
        .collect();
    assert!(
        messages.contains(&("scheduler/place", "done: node-1")),
        "{messages:?}"
    );
    assert!(
        messages.contains(&("scheduled", "target reached")),
        "{messages:?}"
    );
    assert!(
        messages.contains(&("ipam/assign-address", "ready")),
        "{messages:?}"
    );
}

#[test]
fn recording_keeps_the_newest_and_cancels_the_superseded() {
    let mut status = WorkflowStatus::default();
    for revision in 1..=4 {
        let (instance, _) = instantiate(
            &pod_start(&[]),
            &format!("start-{revision}"),
            "uid-1",
            revision,
            at(revision as i64 * 1_000),
        );
        record(&mut status, instance, 3, at(revision as i64 * 1_000));
    }
    let ids: Vec<&str> = status.instances.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["start-2", "start-3", "start-4"]);
    assert_eq!(status.instances[0].outcome, WorkflowOutcome::Cancelled);
    assert_eq!(
        status.latest().map(|i| i.outcome),
        Some(WorkflowOutcome::Running)
    );
}

#[test]
fn the_owner_may_retry_a_failed_step_before_its_backoff_ends() {
    let mut a = step("x/a");
    a.wanted_by = Some("end".into());
    a.retry = RetryPolicy {
        max_attempts: 3,
        backoff_ms: 60_000,
        max_backoff_ms: 60_000,
    };
    let (mut instance, _) = instantiate(
        &definition("end", vec![a, target("end")]),
        "w",
        "uid",
        1,
        at(0),
    );
    let (x, y) = (controller("x"), controller("y"));
    claim(&mut instance, "x/a", &x, None, at(0)).expect("claim 1");
    fail(&mut instance, "x/a", &x, None, at(100), "no node is ready").expect("fail 1");
    // Someone else may not hurry it along.
    let refused = claim(&mut instance, "x/a", &y, None, at(200)).expect_err("not the owner");
    assert!(
        matches!(refused, crate::TransitionError::NotOwner { .. }),
        "{refused}"
    );
    // Its owner may: attempt 2 starts at once, not a minute later.
    let logs = claim(&mut instance, "x/a", &x, None, at(300)).expect("early claim");
    assert!(
        logs.iter()
            .any(|log| log.message == "claimed by x (attempt 2, retried before its backoff)"),
        "{logs:?}"
    );
    complete(&mut instance, "x/a", &x, None, at(400), None).expect("complete");
    assert_eq!(instance.outcome, WorkflowOutcome::Succeeded);
    // A failure that is final cannot be claimed again.
    let mut b = step("x/b");
    b.wanted_by = Some("end".into());
    let (mut once, _) = instantiate(
        &definition("end", vec![b, target("end")]),
        "w",
        "uid",
        1,
        at(0),
    );
    claim(&mut once, "x/b", &x, None, at(0)).expect("claim");
    fail(&mut once, "x/b", &x, None, at(100), "broken").expect("fail");
    let error = claim(&mut once, "x/b", &x, None, at(200)).expect_err("final");
    assert!(
        matches!(error, crate::TransitionError::Finished { .. }),
        "{error}"
    );
}

#[test]
fn a_step_a_cancelled_instance_left_running_is_what_the_newest_waits_for() {
    let mut slow = step("x/a");
    slow.timeout_ms = Some(60_000);
    slow.wanted_by = Some("end".into());
    let mut other = step("y/b");
    other.wanted_by = Some("end".into());
    let defined = definition("end", vec![slow, other, target("end")]);
    let x = controller("x");
    let mut status = WorkflowStatus::default();
    let (mut first, _) = instantiate(&defined, "update-2", "uid", 2, at(0));
    claim(&mut first, "x/a", &x, None, at(1_000)).expect("claim");
    record(&mut status, first, 5, at(0));
    let (second, _) = instantiate(&defined, "update-3", "uid", 3, at(2_000));
    record(&mut status, second.clone(), 5, at(2_000));
    assert_eq!(status.instances[0].outcome, WorkflowOutcome::Cancelled);

    // x claimed x/a of update-2 and never ended it; update-3's x/a waits.
    let found = unfinished_before(&status, &second, at(6_000));
    assert_eq!(
        found,
        [Unfinished {
            workflow_id: "update-2".into(),
            step: "x/a".into(),
            owner: "x".into(),
            claimed_at: at(1_000),
            cancelled_at: Some(at(2_000)),
        }]
    );
    assert_eq!(
        unfinished_text(&found, &second, at(6_000)),
        "  x/a of update-2 (cancelled 4s ago): claimed by x 5s ago, not reported ended; x finishes it before it claims a step of update-3\n"
    );
    // Past the old claim's timeout, the owner is not taken to be at it.
    assert!(unfinished_before(&status, &second, at(61_000)).is_empty());
    // Once x works on update-3, nothing is held up.
    let mut working = second.clone();
    claim(&mut working, "x/a", &x, None, at(7_000)).expect("claim");
    assert!(unfinished_before(&status, &working, at(8_000)).is_empty());
    // An owner with no ready step in the newest is not what it waits for.
    let y = controller("y");
    let mut other = second;
    claim(&mut other, "x/a", &x, None, at(7_000)).expect("claim");
    claim(&mut other, "y/b", &y, None, at(7_000)).expect("claim");
    assert!(unfinished_before(&status, &other, at(8_000)).is_empty());
}
