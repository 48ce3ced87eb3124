//! The rules of a Job: pods that run to completion, counts that make
//! sense, and a schedule that parses.

use super::{Checker, check_pod};
use crate::cron::Schedule;
use crate::kinds::{JobSpec, RestartPolicy};

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
