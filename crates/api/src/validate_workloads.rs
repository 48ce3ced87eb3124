//! The rules of workloads beyond pods and PinnedDeployments: a Job (pods
//! that run to completion, counts that make sense, a schedule that
//! parses) and a PerNodeDeployment (a template pinned to no node).

use super::{Checker, check_pod};
use crate::cron::Schedule;
use crate::kinds::{JobSpec, PerNodeDeploymentSpec, RestartPolicy};

pub(super) fn check_job(checker: &mut Checker, spec: &JobSpec) {
    if spec.completions == 0 {
        checker.fail("spec.completions", "must be at least 1");
    }
    if spec.parallelism == 0 {
        checker.fail("spec.parallelism", "must be at least 1");
    }
    if spec.template.spec.restart_policy == RestartPolicy::Always {
        checker.fail(
            "spec.template.spec.restartPolicy",
            "a Job's pods run to completion: Never or OnFailure",
        );
    }
    if spec.active_deadline_seconds == Some(0) {
        checker.fail("spec.activeDeadlineSeconds", "must be at least 1");
    }
    if let Some(schedule) = &spec.schedule
        && let Err(error) = schedule.parse::<Schedule>()
    {
        checker.fail("spec.schedule", error.to_string());
    }
    checker.labels(
        "spec.template.metadata.labels",
        &spec.template.metadata.labels,
    );
    check_pod(checker, "spec.template.spec", &spec.template.spec);
}

pub(super) fn check_per_node(checker: &mut Checker, spec: &PerNodeDeploymentSpec) {
    checker.labels("spec.nodeSelector", &spec.node_selector);
    checker.labels(
        "spec.template.metadata.labels",
        &spec.template.metadata.labels,
    );
    if spec
        .template
        .spec
        .placement
        .as_ref()
        .is_some_and(|p| p.node.is_some())
    {
        checker.fail(
            "spec.template.spec.placement.node",
            "must not be set: each pod is pinned to its own node",
        );
    }
    if let Some(max) = &spec.max_unavailable
        && max.resolve(100).is_none()
    {
        checker.fail(
            "spec.maxUnavailable",
            "must be a count or a percent from 0% to 100%",
        );
    }
    if spec.progress_deadline_seconds == Some(0) {
        checker.fail("spec.progressDeadlineSeconds", "must be at least 1");
    }
    check_pod(checker, "spec.template.spec", &spec.template.spec);
}

#[cfg(test)]
mod tests {
    use crate::kinds::JobSpec;
    use crate::{Kind, Object, validate_object};
    use serde_json::json;

    fn errors(spec: serde_json::Value) -> Vec<String> {
        let job = Object::new(Kind::Job, None, "batch", spec);
        match validate_object(&job) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    fn template(restart: &str) -> serde_json::Value {
        json!({"spec": {"restartPolicy": restart,
                        "containers": [{"name": "c", "image": "busybox"}]}})
    }

    #[test]
    fn a_job_defaults_to_one_completion_one_at_a_time_six_failures() {
        assert!(errors(json!({"template": template("Never")})).is_empty());
        let spec: JobSpec = serde_json::from_value(json!({"template": template("Never")})).unwrap();
        assert_eq!(
            (spec.completions, spec.parallelism, spec.backoff_limit),
            (1, 1, 6)
        );
    }

    #[test]
    fn rules_name_their_field() {
        assert_eq!(
            errors(json!({"template": template("Always")})),
            [
                "spec.template.spec.restartPolicy: a Job's pods run to completion: Never or OnFailure"
            ]
        );
        assert_eq!(
            errors(json!({"template": template("OnFailure"), "completions": 0,
                          "parallelism": 0, "schedule": "61 * * * *"})),
            [
                "spec.completions: must be at least 1",
                "spec.parallelism: must be at least 1",
                "spec.schedule: minute: 61 is outside 0–59",
            ]
        );
        assert_eq!(
            errors(json!({"template": template("Never"), "concurrencyPolicy": "Sometimes"})).len(),
            1
        );
    }
}

#[cfg(test)]
mod per_node_tests {
    use crate::{Kind, Object, validate_object};
    use serde_json::json;

    #[test]
    fn a_per_node_template_names_no_node_of_its_own() {
        let spec = |placement: serde_json::Value| {
            json!({"nodeSelector": {"role": "edge"}, "maxUnavailable": "10%",
                   "template": {"spec": {"placement": placement,
                       "containers": [{"name": "c", "image": "busybox"}]}}})
        };
        let ok = Object::new(Kind::PerNodeDeployment, None, "agent", spec(json!({})));
        assert_eq!(validate_object(&ok), Ok(()));
        let pinned = Object::new(
            Kind::PerNodeDeployment,
            None,
            "agent",
            spec(json!({"node": "node-1"})),
        );
        let errors: Vec<String> = validate_object(&pinned)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "spec.template.spec.placement.node: must not be set: each pod is pinned to its own node"
            ]
        );
    }
}
