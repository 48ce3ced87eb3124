//! The pod `stop` workflow: its order (nothing is released before the
//! containers stopped; the address and reservation go after the sandbox),
//! a registered finalizer that holds the goal, and a person's skip.

use corral_api::workflow::{StepState, WorkflowOutcome};

use super::*;
use crate::{RegisteredController, TransitionError, instantiate, skip, unfinished_steps};

fn pod_stop(controllers: &[RegisteredController<'_>]) -> WorkflowDefinition {
    definition_for(Kind::Pod, "stop", controllers)
        .expect("valid definition")
        .expect("pod stop exists")
}

/// `acme/backup`, after `stopped`, wanted by `deleted`: a finalizer.
fn finalizer() -> ControllerSpec {
    let mut backup = registration("acme/backup", &[], &[], "30s");
    backup.workflow = "stop".into();
    backup.requires = names(&["stopped"]);
    backup.wanted_by = Some("deleted".into());
    spec_with(vec![backup])
}

#[test]
fn a_pod_stops_before_anything_is_released_and_a_finalizer_holds_the_goal() {
    let spec = finalizer();
    let registered = [RegisteredController {
        name: "acme",
        spec: &spec,
    }];
    let (mut instance, _) = instantiate(&pod_stop(&registered), "stop-2", "uid", 2, at(0));
    let node = agent("node-1");
    assert_eq!(ready_steps(&instance), ["node/mark-unready"]);
    run(&mut instance, "node/mark-unready", &node, 0, 10, None);
    assert_eq!(ready_steps(&instance), ["node/stop-containers"]);
    run(&mut instance, "node/stop-containers", &node, 10, 20, None);
    let mut ready = ready_steps(&instance);
    ready.sort_unstable();
    assert_eq!(ready, ["acme/backup", "node/release-volumes"]);
    run(&mut instance, "node/release-volumes", &node, 20, 30, None);
    assert_eq!(phase(&instance, "volumes-released"), "done");
    run(&mut instance, "node/remove-sandbox", &node, 30, 40, None);
    run(
        &mut instance,
        "ipam/release-address",
        &controller("ipam"),
        40,
        50,
        None,
    );
    assert_eq!(phase(&instance, "scheduler/release"), "ready");
    run(
        &mut instance,
        "scheduler/release",
        &controller("scheduler"),
        50,
        60,
        None,
    );
    assert_eq!(phase(&instance, "released"), "done");
    assert_eq!(
        instance.outcome,
        WorkflowOutcome::Running,
        "the finalizer is not done"
    );
    assert_eq!(unfinished_steps(&instance), ["acme/backup"]);
    run(
        &mut instance,
        "acme/backup",
        &controller("acme"),
        60,
        70,
        None,
    );
    assert_eq!(instance.outcome, WorkflowOutcome::Succeeded);
}

#[test]
fn a_skipped_step_is_done_with_who_skipped_it_and_the_rest_follows() {
    let spec = finalizer();
    let registered = [RegisteredController {
        name: "acme",
        spec: &spec,
    }];
    let (mut instance, _) = instantiate(&pod_stop(&registered), "stop-2", "uid", 2, at(0));
    // Skipping a step that waits is allowed: what requires it follows.
    let logs = skip(&mut instance, "node/stop-containers", "alice", at(5)).expect("skip");
    let StepState::Done { note, .. } = state(&instance, "node/stop-containers") else {
        panic!("skipped steps are done");
    };
    assert_eq!(note.as_deref(), Some("skipped by alice"));
    assert!(
        logs.iter().any(|log| log.message == "skipped by alice"),
        "{logs:?}"
    );
    assert_eq!(phase(&instance, "node/release-volumes"), "ready");
    assert_eq!(phase(&instance, "acme/backup"), "ready");

    // Skipping everything left finishes the instance.
    for step in unfinished_steps(&instance) {
        skip(&mut instance, &step, "alice", at(10)).expect("skip the rest");
    }
    assert_eq!(instance.outcome, WorkflowOutcome::Succeeded);
    assert!(
        matches!(
            skip(&mut instance, "acme/backup", "alice", at(20)),
            Err(TransitionError::Finished { .. })
        ),
        "a finished instance skips nothing"
    );
}

#[test]
fn skipping_names_a_step_the_instance_has() {
    let (mut instance, _) = instantiate(&pod_stop(&[]), "stop-1", "uid", 1, at(0));
    let unknown = skip(&mut instance, "acme/backup", "alice", at(1)).expect_err("unknown step");
    assert_eq!(
        unknown.to_string(),
        "workflow stop-1 has no step acme/backup"
    );
    let target = skip(&mut instance, "stopped", "alice", at(1)).expect_err("a target");
    assert!(matches!(target, TransitionError::Target { .. }), "{target}");
}
