//! Steps contributed by `Controller` objects, merged into built-in
//! definitions. New instances snapshot the merged definition; removing a
//! registration only changes instances created afterwards.

use corral_api::Kind;
use corral_api::kinds::{ControllerSpec, StepRegistration};
use corral_api::workflow::{RetryPolicy, StepDefinition, StepKind};

use crate::builtin::builtin;
use crate::definition::{DefinitionError, WorkflowDefinition, validate};

/// A registered controller: its name (the identity that owns its steps) and
/// its spec.
#[derive(Debug, Clone, Copy)]
pub struct RegisteredController<'a> {
    pub name: &'a str,
    pub spec: &'a ControllerSpec,
}

/// The definition new instances of `kind`'s `workflow` snapshot: the built-in
/// steps plus every registered step for that kind and workflow, validated.
/// `Ok(None)` when the kind has no such workflow.
pub fn definition_for(
    kind: Kind,
    workflow: &str,
    controllers: &[RegisteredController<'_>],
) -> Result<Option<WorkflowDefinition>, DefinitionError> {
    let Some(mut definition) = builtin(kind, workflow) else {
        return Ok(None);
    };
    for controller in controllers {
        for registration in &controller.spec.steps {
            if applies_to(registration, kind, workflow) {
                definition
                    .steps
                    .push(step_from_registration(controller.name, registration)?);
            }
        }
    }
    validate(&definition)?;
    Ok(Some(definition))
}

/// Admission check for a new or changed `Controller`: every step it
/// registers must land in an existing workflow and keep that workflow valid
/// together with the other registered controllers (no duplicate names, no
/// unknown references, no cycle).
pub fn check_controller(
    candidate: RegisteredController<'_>,
    others: &[RegisteredController<'_>],
) -> Result<(), DefinitionError> {
    let mut all: Vec<RegisteredController<'_>> = others
        .iter()
        .filter(|other| other.name != candidate.name)
        .copied()
        .collect();
    all.push(candidate);
    for registration in &candidate.spec.steps {
        let kind = registration.kind.parse::<Kind>().ok();
        let exists = kind.is_some_and(|kind| builtin(kind, &registration.workflow).is_some());
        let (Some(kind), true) = (kind, exists) else {
            return Err(DefinitionError::UnknownWorkflow {
                kind: registration.kind.clone(),
                workflow: registration.workflow.clone(),
                step: registration.name.clone(),
            });
        };
        definition_for(kind, &registration.workflow, &all)?;
    }
    Ok(())
}

/// The step a registration declares, owned by the registering controller.
/// `retries: n` means `n + 1` attempts, with the default backoff.
pub fn step_from_registration(
    controller: &str,
    registration: &StepRegistration,
) -> Result<StepDefinition, DefinitionError> {
    let timeout_ms = match &registration.timeout {
        None => None,
        Some(value) => {
            let duration =
                humantime::parse_duration(value).map_err(|_| DefinitionError::InvalidTimeout {
                    step: registration.name.clone(),
                    value: value.clone(),
                })?;
            Some(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
        }
    };
    Ok(StepDefinition {
        name: registration.name.clone(),
        owner: controller.to_string(),
        executor: registration.executor,
        kind: StepKind::Step,
        description: None,
        after: registration.after.clone(),
        before: registration.before.clone(),
        requires: registration.requires.clone(),
        wanted_by: registration.wanted_by.clone(),
        timeout_ms,
        retry: RetryPolicy {
            max_attempts: registration.retries.unwrap_or(0).saturating_add(1),
            ..RetryPolicy::default()
        },
    })
}

fn applies_to(registration: &StepRegistration, kind: Kind, workflow: &str) -> bool {
    registration.workflow == workflow
        && registration
            .kind
            .parse::<Kind>()
            .is_ok_and(|registered| registered == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sidecar_controller() -> ControllerSpec {
        ControllerSpec {
            owns: Vec::new(),
            reads: Vec::new(),
            steps: vec![StepRegistration {
                name: "acme/inject-sidecar".into(),
                kind: "Pod".into(),
                workflow: "start".into(),
                after: vec!["network".into()],
                before: vec!["containers".into()],
                requires: Vec::new(),
                wanted_by: None,
                timeout: Some("30s".into()),
                retries: Some(2),
                executor: None,
            }],
        }
    }

    #[test]
    fn registered_step_is_merged_with_its_controller_as_owner() {
        let spec = sidecar_controller();
        let controllers = [RegisteredController {
            name: "acme-sidecar",
            spec: &spec,
        }];
        let definition = definition_for(Kind::Pod, "start", &controllers)
            .expect("valid")
            .expect("pod start exists");
        let step = definition.step("acme/inject-sidecar").expect("merged");
        assert_eq!(step.owner, "acme-sidecar");
        assert_eq!(step.timeout_ms, Some(30_000));
        assert_eq!(step.retry.max_attempts, 3);
        // Other workflows and kinds are untouched.
        let stop = definition_for(Kind::Pod, "stop", &controllers)
            .expect("valid")
            .expect("pod stop exists");
        assert!(stop.step("acme/inject-sidecar").is_none());
    }

    #[test]
    fn registration_creating_a_cycle_is_refused_with_the_cycle() {
        let mut spec = sidecar_controller();
        spec.steps[0].after = vec!["containers".into()];
        spec.steps[0].before = vec!["network".into()];
        let error = check_controller(
            RegisteredController {
                name: "acme-sidecar",
                spec: &spec,
            },
            &[],
        )
        .expect_err("cycle");
        let DefinitionError::Cycle { cycle } = &error else {
            panic!("expected a cycle, got {error}");
        };
        assert!(cycle.contains("acme/inject-sidecar"), "{cycle}");
        assert!(
            cycle.contains("containers -> acme/inject-sidecar -> network"),
            "{cycle}"
        );
    }

    #[test]
    fn registration_for_a_missing_workflow_is_refused() {
        let mut spec = sidecar_controller();
        spec.steps[0].workflow = "explode".into();
        let error = check_controller(
            RegisteredController {
                name: "acme-sidecar",
                spec: &spec,
            },
            &[],
        )
        .expect_err("unknown workflow");
        assert!(
            matches!(error, DefinitionError::UnknownWorkflow { .. }),
            "{error}"
        );
    }

    #[test]
    fn bad_timeout_names_the_step() {
        let mut spec = sidecar_controller();
        spec.steps[0].timeout = Some("soon".into());
        let error = step_from_registration("acme-sidecar", &spec.steps[0]).expect_err("bad");
        assert_eq!(
            error.to_string(),
            "step acme/inject-sidecar: timeout \"soon\" is not a duration like 30s or 10m"
        );
    }
}
