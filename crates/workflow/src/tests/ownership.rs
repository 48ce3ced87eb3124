//! Only a step's owner moves it; only the engine derives states.

use std::collections::BTreeMap;

use corral_api::workflow::{LogLevel, StepState};

use super::*;
use crate::{TransitionError, WriteError, append_log, check_write, claim_if_ready, instantiate};

#[test]
fn only_the_owner_may_claim() {
    let (mut instance, _) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    let error = claim(
        &mut instance,
        "scheduler/place",
        &controller("ipam"),
        None,
        at(1),
    )
    .expect_err("not the owner");
    assert_eq!(
        error.to_string(),
        "ipam may not claim step scheduler/place: it belongs to controller scheduler"
    );
    run(
        &mut instance,
        "scheduler/place",
        &controller("scheduler"),
        1,
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
    let error = claim(
        &mut instance,
        "node/create-sandbox",
        &agent("node-2"),
        Some("node-1"),
        at(5),
    )
    .expect_err("another node's agent");
    assert_eq!(
        error.to_string(),
        "node-2 may not claim step node/create-sandbox: it belongs to the agent of node node-1"
    );
    claim(
        &mut instance,
        "node/create-sandbox",
        &agent("node-1"),
        Some("node-1"),
        at(5),
    )
    .expect("the bound node's agent may");
}

#[test]
fn a_claim_if_ready_leaves_a_waiting_step_and_takes_a_ready_one() {
    let (mut instance, _) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    let node = agent("node-1");
    run(
        &mut instance,
        "scheduler/place",
        &controller("scheduler"),
        1,
        2,
        Some("node-1"),
    );
    // Waiting on IPAM: left alone, nothing logged, no attempt counted.
    let (logs, claimed) = claim_if_ready(
        &mut instance,
        "node/create-sandbox",
        &node,
        Some("node-1"),
        at(3),
    )
    .expect("a waiting step is no refusal");
    assert!(!claimed);
    assert!(logs.is_empty(), "{logs:?}");
    assert_eq!(phase(&instance, "node/create-sandbox"), "waiting");
    assert_eq!(
        instance.step("node/create-sandbox").map(|s| s.attempts),
        Some(0)
    );
    // The owner rule holds for a waiting step too.
    let error = claim_if_ready(
        &mut instance,
        "node/create-sandbox",
        &agent("node-2"),
        Some("node-1"),
        at(3),
    )
    .expect_err("another node's agent");
    assert!(matches!(error, TransitionError::NotOwner { .. }), "{error}");
    run(
        &mut instance,
        "ipam/assign-address",
        &controller("ipam"),
        4,
        4,
        None,
    );
    let (logs, claimed) = claim_if_ready(
        &mut instance,
        "node/create-sandbox",
        &node,
        Some("node-1"),
        at(5),
    )
    .expect("a ready step is claimed");
    assert!(claimed);
    assert_eq!(phase(&instance, "node/create-sandbox"), "running");
    assert_eq!(logs.len(), 1, "{logs:?}");
    // Running now: a second claim is refused as a plain one would be.
    let error = claim_if_ready(
        &mut instance,
        "node/create-sandbox",
        &node,
        Some("node-1"),
        at(6),
    )
    .expect_err("already running");
    assert!(
        matches!(
            error,
            TransitionError::WrongState {
                phase: "running",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn states_must_allow_the_transition() {
    let (mut instance, _) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    let scheduler = controller("scheduler");
    let error = complete(
        &mut instance,
        "scheduler/place",
        &scheduler,
        None,
        at(1),
        None,
    )
    .expect_err("not claimed");
    assert!(
        matches!(error, TransitionError::WrongState { phase: "ready", .. }),
        "{error}"
    );
    let error = claim(&mut instance, "running", &scheduler, None, at(1)).expect_err("target");
    assert!(matches!(error, TransitionError::Target { .. }), "{error}");
    let error = claim(
        &mut instance,
        "ipam/assign-address",
        &controller("ipam"),
        None,
        at(1),
    )
    .expect_err("waiting");
    assert_eq!(
        error.to_string(),
        "cannot claim step ipam/assign-address: it is waiting: only a ready step, or a failed one awaiting its retry, can be claimed"
    );
    let error = claim(&mut instance, "nope/nothing", &scheduler, None, at(1)).expect_err("unknown");
    assert!(
        matches!(error, TransitionError::UnknownStep { .. }),
        "{error}"
    );
    claim(&mut instance, "scheduler/place", &scheduler, None, at(1)).expect("claim");
    let error =
        claim(&mut instance, "scheduler/place", &scheduler, None, at(2)).expect_err("twice");
    assert!(
        matches!(
            error,
            TransitionError::WrongState {
                phase: "running",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn only_the_claimant_completes() {
    let mut a = step("x/a");
    a.wanted_by = Some("end".into());
    // Two replicas of one controller share the identity; a different
    // identity with the owner's name but another role is refused.
    let (mut instance, _) = instantiate(
        &definition("end", vec![a, target("end")]),
        "w",
        "u",
        1,
        at(0),
    );
    claim(&mut instance, "x/a", &controller("x"), None, at(0)).expect("claim");
    let impostor = corral_api::Identity::new("x", corral_api::Role::Operator);
    let error = complete(&mut instance, "x/a", &impostor, None, at(1), None).expect_err("role");
    assert!(matches!(error, TransitionError::NotOwner { .. }), "{error}");
}

#[test]
fn owners_log_only_for_their_steps() {
    let (instance, _) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    let mut fields = BTreeMap::new();
    fields.insert("candidates".to_string(), serde_json::json!(3));
    let entry = append_log(
        &instance,
        "scheduler/place",
        &controller("scheduler"),
        None,
        at(2),
        LogLevel::Info,
        "scored 3 nodes",
        fields,
    )
    .expect("owner may log");
    assert_eq!(entry.object_uid, "uid-1");
    assert_eq!(entry.workflow_id, "start-1");
    assert_eq!(entry.owner, "scheduler");
    assert_eq!(entry.fields.get("candidates"), Some(&serde_json::json!(3)));
    let error = append_log(
        &instance,
        "scheduler/place",
        &controller("ipam"),
        None,
        at(2),
        LogLevel::Info,
        "hi",
        BTreeMap::new(),
    )
    .expect_err("not the owner");
    assert!(matches!(error, TransitionError::NotOwner { .. }));
}

#[test]
fn raw_writes_are_checked_per_step() {
    let (old, _) = instantiate(&pod_start(&[]), "start-1", "uid-1", 1, at(0));
    let scheduler = controller("scheduler");
    let mut claimed = old.clone();
    claim(&mut claimed, "scheduler/place", &scheduler, None, at(1)).expect("claim");
    check_write(&old, &claimed, &scheduler, None).expect("the owner writes running");
    assert!(matches!(
        check_write(&old, &claimed, &controller("ipam"), None),
        Err(WriteError::NotOwner { .. })
    ));

    let mut forged = claimed.clone();
    let index = forged
        .steps
        .iter()
        .position(|s| s.definition.name == "ipam/assign-address")
        .expect("step");
    forged.steps[index].state = StepState::Ready { since: at(1) };
    assert!(matches!(
        check_write(&claimed, &forged, &controller("ipam"), None),
        Err(WriteError::EngineOnly { phase: "ready", .. })
    ));
    check_write(&claimed, &forged, &controller(crate::ENGINE_OWNER), None)
        .expect("the engine derives states");

    let mut redefined = claimed.clone();
    redefined.steps[0].definition.timeout_ms = Some(1);
    assert!(matches!(
        check_write(&claimed, &redefined, &scheduler, None),
        Err(WriteError::DefinitionChanged { .. })
    ));
}
