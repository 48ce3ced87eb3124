//! Instances as objects store them: what is kept, what is derived again,
//! and a finished instance replayed from its step log.

use corral_api::workflow::{StepLogEntry, StepState, WorkflowInstance, WorkflowOutcome};

use super::*;
use crate::{definition_name, dehydrate, fail, hydrate, instantiate, stored_deadline, tick};

/// Claims and completes `step`, keeping the log entries.
fn run_logged(
    instance: &mut WorkflowInstance,
    logs: &mut Vec<StepLogEntry>,
    step: &str,
    actor: &Identity,
    from: i64,
    to: i64,
    note: Option<&str>,
) {
    logs.extend(claim(instance, step, actor, Some("node-1"), at(from)).expect("claim"));
    logs.extend(
        complete(
            instance,
            step,
            actor,
            Some("node-1"),
            at(to),
            note.map(str::to_string),
        )
        .expect("complete"),
    );
}

#[test]
fn a_running_instance_keeps_its_owners_steps_and_derives_the_rest() {
    let definition = pod_start(&[]);
    let (mut instance, _) = instantiate(&definition, "start-1", "uid-1", 1, at(0));
    let mut logs = Vec::new();
    run_logged(
        &mut instance,
        &mut logs,
        "scheduler/place",
        &controller("scheduler"),
        0,
        3,
        Some("node-1"),
    );
    claim(
        &mut instance,
        "ipam/assign-address",
        &controller("ipam"),
        None,
        at(4),
    )
    .expect("claim");
    let name = definition_name(&definition);
    let stored = dehydrate(&instance, &name);
    assert_eq!(stored.definition, name);
    let kept: Vec<&str> = stored.steps.keys().map(String::as_str).collect();
    assert_eq!(
        kept,
        [
            "ipam/assign-address",
            "node/prepare-volumes",
            "node/pull-image",
            "scheduler/place"
        ],
        "steps past waiting, no targets"
    );
    assert!(stored.is_ready("node/pull-image"));
    assert_eq!(
        stored.steps_in("running").collect::<Vec<_>>(),
        ["ipam/assign-address"]
    );
    assert_eq!(
        stored_deadline(&stored),
        Some(at(4 + 30_000)),
        "ipam's timeout"
    );
    let back = hydrate(&definition, &stored, "uid-1", &[]);
    assert_eq!(back, instance, "the graph gives back every other state");
}

#[test]
fn a_failed_instance_keeps_its_steps_and_shows_what_they_blocked() {
    let definition = pod_start(&[]);
    let (mut instance, _) = instantiate(&definition, "start-1", "uid-1", 1, at(0));
    let mut logs = Vec::new();
    run_logged(
        &mut instance,
        &mut logs,
        "scheduler/place",
        &controller("scheduler"),
        0,
        3,
        Some("node-1"),
    );
    // ipam/assign-address has three attempts; each fails.
    let ipam = controller("ipam");
    let mut now = 10;
    while instance.outcome == WorkflowOutcome::Running {
        tick(&mut instance, at(now));
        claim(&mut instance, "ipam/assign-address", &ipam, None, at(now)).expect("claim");
        fail(
            &mut instance,
            "ipam/assign-address",
            &ipam,
            None,
            at(now),
            "no /64",
        )
        .expect("fail");
        now += 120_000;
    }
    assert_eq!(instance.outcome, WorkflowOutcome::Failed);
    let stored = dehydrate(&instance, "pod-start-x");
    assert!(
        !stored.steps.is_empty(),
        "a failed instance keeps its steps"
    );
    let back = hydrate(&definition, &stored, "uid-1", &[]);
    assert_eq!(back, instance);
    assert_eq!(phase(&back, "running"), "blocked");
}

#[test]
fn a_succeeded_instance_stores_no_steps_and_is_replayed_from_its_log() {
    let definition = pod_start(&[]);
    let (mut instance, created) = instantiate(&definition, "start-1", "uid-1", 1, at(0));
    let mut logs = created;
    let node = agent("node-1");
    let steps: [(&str, Identity, i64, i64, Option<&str>); 8] = [
        (
            "scheduler/place",
            controller("scheduler"),
            0,
            3,
            Some("node-1"),
        ),
        (
            "ipam/assign-address",
            controller("ipam"),
            3,
            4,
            Some("fd00::1"),
        ),
        ("node/create-sandbox", node.clone(), 4, 22, None),
        ("node/pull-image", node.clone(), 3, 500, None),
        ("node/prepare-volumes", node.clone(), 3, 10, None),
        ("node/run-init-containers", node.clone(), 500, 500, None),
        ("node/start-containers", node.clone(), 500, 700, None),
        ("node/await-readiness", node, 700, 1_200, None),
    ];
    for (step, actor, from, to, note) in &steps {
        run_logged(&mut instance, &mut logs, step, actor, *from, *to, *note);
    }
    assert_eq!(instance.outcome, WorkflowOutcome::Succeeded);
    let stored = dehydrate(&instance, "pod-start-x");
    assert!(stored.steps.is_empty(), "{stored:?}");
    let size = serde_json::to_string(&stored).expect("serializes").len();
    assert!(size < 250, "a finished instance takes {size} bytes");

    let without_log = hydrate(&definition, &stored, "uid-1", &[]);
    assert_eq!(phase(&without_log, "node/pull-image"), "waiting");

    // Another instance's entries are not replayed.
    let mut other = logs[0].clone();
    other.workflow_id = "update-2".into();
    logs.push(other);
    let replayed = hydrate(&definition, &stored, "uid-1", &logs);
    for step in &instance.steps {
        let name = &step.definition.name;
        let again = replayed.step(name).expect("the step");
        assert_eq!(again.state, step.state, "{name}");
        assert_eq!(again.attempts, step.attempts, "{name}");
        assert_eq!(again.first_started_at, step.first_started_at, "{name}");
    }
    assert!(matches!(
        state(&replayed, "ipam/assign-address"),
        StepState::Done { note: Some(note), .. } if note == "fd00::1"
    ));
}

#[test]
fn equal_definitions_share_a_name_and_a_changed_one_gets_another() {
    let plain = pod_start(&[]);
    assert_eq!(definition_name(&plain), definition_name(&pod_start(&[])));
    assert!(definition_name(&plain).starts_with("pod-start-"));
    let mut changed = plain.clone();
    changed.steps[0].timeout_ms = Some(1);
    assert_ne!(definition_name(&plain), definition_name(&changed));
}
