//! Scenario tests of the engine and the renderers, driven through the
//! public API with a fake clock.

mod engine;
mod fresh;
mod ownership;
mod render;
mod retry;
mod stop;
mod stored;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use corral_api::kinds::{ControllerSpec, StepRegistration};
use corral_api::workflow::{RetryPolicy, StepDefinition, StepKind, StepState, WorkflowInstance};
use corral_api::{Identity, Kind, Role};

use crate::{RegisteredController, WorkflowDefinition, claim, complete, definition_for};

/// `base + millis`.
pub(super) fn at(millis: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
        .single()
        .expect("valid time")
        + TimeDelta::milliseconds(millis)
}

pub(super) fn controller(name: &str) -> Identity {
    Identity::new(name, Role::Controller)
}

pub(super) fn agent(node: &str) -> Identity {
    Identity::new(node, Role::Node)
}

pub(super) fn phase(instance: &WorkflowInstance, step: &str) -> &'static str {
    instance
        .step(step)
        .unwrap_or_else(|| panic!("no step {step}"))
        .state
        .phase()
}

pub(super) fn state<'a>(instance: &'a WorkflowInstance, step: &str) -> &'a StepState {
    &instance
        .step(step)
        .unwrap_or_else(|| panic!("no step {step}"))
        .state
}

pub(super) fn ready_steps(instance: &WorkflowInstance) -> Vec<&str> {
    instance
        .steps
        .iter()
        .filter(|step| matches!(step.state, StepState::Ready { .. }))
        .map(|step| step.definition.name.as_str())
        .collect()
}

/// A step of a hand-made definition; owner `x` unless named otherwise.
pub(super) fn step(name: &str) -> StepDefinition {
    StepDefinition {
        name: name.to_string(),
        owner: name
            .split_once('/')
            .map_or("x", |(owner, _)| owner)
            .to_string(),
        executor: None,
        kind: StepKind::Step,
        description: None,
        after: Vec::new(),
        before: Vec::new(),
        requires: Vec::new(),
        wanted_by: None,
        timeout_ms: None,
        retry: RetryPolicy::default(),
    }
}

pub(super) fn target(name: &str) -> StepDefinition {
    StepDefinition {
        kind: StepKind::Target,
        owner: crate::ENGINE_OWNER.to_string(),
        ..step(name)
    }
}

pub(super) fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|name| name.to_string()).collect()
}

pub(super) fn definition(goal: &str, steps: Vec<StepDefinition>) -> WorkflowDefinition {
    WorkflowDefinition {
        kind: Kind::Pod,
        workflow: "start".into(),
        goal: goal.into(),
        steps,
    }
}

pub(super) fn registration(
    name: &str,
    after: &[&str],
    before: &[&str],
    timeout: &str,
) -> StepRegistration {
    StepRegistration {
        name: name.into(),
        kind: "Pod".into(),
        workflow: "start".into(),
        after: names(after),
        before: names(before),
        requires: Vec::new(),
        wanted_by: None,
        timeout: Some(timeout.into()),
        retries: None,
        executor: None,
    }
}

pub(super) fn spec_with(steps: Vec<StepRegistration>) -> ControllerSpec {
    ControllerSpec {
        owns: Vec::new(),
        reads: Vec::new(),
        steps,
    }
}

/// The pod start definition with the given controllers' steps merged.
pub(super) fn pod_start(controllers: &[RegisteredController<'_>]) -> WorkflowDefinition {
    definition_for(Kind::Pod, "start", controllers)
        .expect("valid definition")
        .expect("pod start exists")
}

/// Claims and completes `step` as `actor` between `from` and `to` (ms).
pub(super) fn run(
    instance: &mut WorkflowInstance,
    step: &str,
    actor: &Identity,
    from: i64,
    to: i64,
    note: Option<&str>,
) {
    claim(instance, step, actor, Some("node-1"), at(from))
        .unwrap_or_else(|error| panic!("claim {step}: {error}"));
    complete(
        instance,
        step,
        actor,
        Some("node-1"),
        at(to),
        note.map(str::to_string),
    )
    .unwrap_or_else(|error| panic!("complete {step}: {error}"));
}
