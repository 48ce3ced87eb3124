//! A new instance stamped from its definition's [`Fresh`], and the line
//! cancelling one that never began, against the engine doing it all.

use corral_api::workflow::WorkflowOutcome;

use super::*;
use crate::{
    BUILTIN_WORKFLOWS, Fresh, cancel, cancel_never_began, definition_name, dehydrate, hydrate,
    instantiate,
};

/// Every built-in definition, pod start with a registered step, and two
/// made by hand: one whose goal is a step, one reached as it starts.
fn definitions() -> Vec<WorkflowDefinition> {
    let mut all: Vec<WorkflowDefinition> = BUILTIN_WORKFLOWS
        .iter()
        .map(|(kind, workflow)| {
            definition_for(*kind, workflow, &[])
                .expect("valid definition")
                .expect("built in")
        })
        .collect();
    let spec = spec_with(vec![registration(
        "acme/check",
        &["ipam/assign-address"],
        &[],
        "30s",
    )]);
    all.push(pod_start(&[RegisteredController {
        name: "acme",
        spec: &spec,
    }]));
    all.push(definition(
        "x/last",
        vec![step("x/first"), {
            let mut last = step("x/last");
            last.after = names(&["x/first"]);
            last
        }],
    ));
    all.push(definition("done", vec![target("done")]));
    all
}

#[test]
fn a_fresh_instance_stamped_is_what_the_engine_makes_and_stores() {
    for definition in definitions() {
        let name = definition_name(&definition);
        let fresh = Fresh::new(&definition, &name);
        let reached_at_once = definition.goal == "done";
        assert_eq!(
            matches!(fresh, Fresh::Stamped(..)),
            !reached_at_once,
            "{name}"
        );
        for (id, uid, revision, now) in [
            ("start-1", "uid-1", 1, at(0)),
            ("update-7", "uid-2", 7, at(86_400_123)),
        ] {
            let (instance, logs) = instantiate(&definition, id, uid, revision, now);
            let expected = (dehydrate(&instance, &name), logs);
            let stamped = fresh.instance(id, uid, revision, now);
            assert_eq!(stamped, expected, "{name} {id}");
        }
    }
}

#[test]
fn cancelling_an_instance_that_never_began_logs_what_the_engine_would() {
    let reason = "superseded by update-3";
    for definition in definitions() {
        let name = definition_name(&definition);
        let (instance, _) = instantiate(&definition, "update-2", "uid-1", 2, at(0));
        let stored = dehydrate(&instance, &name);
        if stored.outcome != WorkflowOutcome::Running {
            assert_eq!(
                cancel_never_began(&definition, &stored, "uid-1", at(5), reason),
                None,
                "{name}: a finished instance is not cancelled"
            );
            continue;
        }
        assert!(stored.never_began(), "{name}");
        let mut full = hydrate(&definition, &stored, "uid-1", &[]);
        let expected = cancel(&mut full, at(5), reason);
        assert!(expected.is_some(), "{name}");
        let quick = cancel_never_began(&definition, &stored, "uid-1", at(5), reason);
        assert_eq!(quick, expected, "{name}");
    }
    // The hand-made goal that is a step logs the phase it is stored in.
    let last_is_goal = definitions().remove(BUILTIN_WORKFLOWS.len() + 1);
    let name = definition_name(&last_is_goal);
    let (instance, _) = instantiate(&last_is_goal, "start-1", "uid-1", 1, at(0));
    let entry = cancel_never_began(
        &last_is_goal,
        &dehydrate(&instance, &name),
        "uid-1",
        at(5),
        reason,
    )
    .expect("cancelled");
    assert_eq!(entry.step, "x/last");
    assert_eq!(entry.fields["phase"], "waiting");
    assert_eq!(
        entry.message,
        "start workflow cancelled: superseded by update-3"
    );
}

#[test]
fn an_instance_that_began_is_not_cancelled_the_quick_way() {
    let definition = pod_start(&[]);
    let name = definition_name(&definition);
    let (mut instance, _) = instantiate(&definition, "start-1", "uid-1", 1, at(0));
    claim(
        &mut instance,
        "scheduler/place",
        &controller("scheduler"),
        None,
        at(1),
    )
    .expect("claim");
    let stored = dehydrate(&instance, &name);
    assert!(!stored.never_began());
    assert_eq!(
        cancel_never_began(
            &definition,
            &stored,
            "uid-1",
            at(5),
            "superseded by update-2"
        ),
        None
    );
}
