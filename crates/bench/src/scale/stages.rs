//! Where a pod's start spends its time: from each pod's `start` workflow
//! instance, the time from the pod's creation until each step was claimed
//! and until it was done, as p50 and p99 over the pods started at one
//! size. A step that waits long to be claimed points at its owner (the
//! scheduler, IPAM, the node); one that runs long points at the work.

use std::fmt::Write;
use std::time::Duration;

use chrono::{DateTime, Utc};
use corral_api::Object;
use corral_api::workflow::{StepKind, StepState, WorkflowInstance};
use corral_client::Client;

use crate::stats::percentile;

/// For one step: when, after the pod's creation, it was claimed and done.
#[derive(Debug, Default)]
struct StepTimes {
    name: String,
    claimed: Vec<Duration>,
    done: Vec<Duration>,
}

fn since(created: DateTime<Utc>, at: DateTime<Utc>) -> Duration {
    (at - created).to_std().unwrap_or_default()
}

/// At most this many pods are read back for the report (one request each).
pub const SAMPLE: usize = 300;

/// The start workflows of up to [`SAMPLE`] of `pods`, evenly spread, with
/// each pod's creation time: finished instances keep no steps in the
/// object, so each is read whole through `GET …/workflows`.
pub async fn sample(client: &Client, pods: &[Object]) -> Vec<(DateTime<Utc>, WorkflowInstance)> {
    let every = pods.len().div_ceil(SAMPLE).max(1);
    let mut sampled = Vec::new();
    for pod in pods.iter().step_by(every) {
        let Some(created) = pod.metadata.created_at else {
            continue;
        };
        let Ok(status) = client.workflows(&pod.key()).await else {
            continue;
        };
        if let Some(start) = status.instances.into_iter().find(|i| i.revision == 1) {
            sampled.push((created, start));
        }
    }
    sampled
}

/// One line per step of the pods' start workflows, in graph order.
pub fn report(pods: &[(DateTime<Utc>, WorkflowInstance)]) -> String {
    let mut steps: Vec<StepTimes> = Vec::new();
    let mut counted = 0;
    for (created, instance) in pods {
        let created = *created;
        counted += 1;
        for step in instance
            .steps
            .iter()
            .filter(|step| step.definition.kind == StepKind::Step)
        {
            let StepState::Done {
                started, finished, ..
            } = &step.state
            else {
                continue;
            };
            let name = &step.definition.name;
            let index = match steps.iter().position(|times| times.name == *name) {
                Some(index) => index,
                None => {
                    steps.push(StepTimes {
                        name: name.clone(),
                        ..StepTimes::default()
                    });
                    steps.len() - 1
                }
            };
            steps[index].claimed.push(since(created, *started));
            steps[index].done.push(since(created, *finished));
        }
    }
    if counted == 0 {
        return "no start workflows to read\n".to_string();
    }
    let mut out = format!(
        "time from a pod's creation until each start step was claimed → done, p50 / p99 over {counted} pods:\n"
    );
    let seconds = |sorted: &[Duration], p: f64| {
        percentile(sorted, p).map_or_else(|| "-".into(), |d| format!("{:.2}", d.as_secs_f64()))
    };
    for times in &mut steps {
        times.claimed.sort_unstable();
        times.done.sort_unstable();
        let _ = writeln!(
            out,
            "  {:<24} {} → {} s / {} → {} s ({} pods)",
            times.name,
            seconds(&times.claimed, 50.0),
            seconds(&times.done, 50.0),
            seconds(&times.claimed, 99.0),
            seconds(&times.done, 99.0),
            times.done.len()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;
    use corral_api::Kind;

    use super::*;

    #[test]
    fn steps_are_timed_from_creation() {
        let created = Utc::now();
        let definition = corral_workflow::builtin(Kind::Pod, "start").expect("pod start");
        let (mut instance, _) =
            corral_workflow::instantiate(&definition, "start-1", "u", 1, created);
        for step in &mut instance.steps {
            if step.definition.name == "scheduler/place" {
                step.state = StepState::Done {
                    started: created + TimeDelta::seconds(2),
                    finished: created + TimeDelta::seconds(3),
                    attempt: 1,
                    note: None,
                };
            }
        }
        let text = report(&[(created, instance)]);
        assert!(text.contains("over 1 pods"), "{text}");
        assert!(
            text.contains("scheduler/place          2.00 → 3.00 s / 2.00 → 3.00 s (1 pods)"),
            "{text}"
        );
        assert!(!text.contains("node/"), "{text}");
        assert_eq!(report(&[]), "no start workflows to read\n");
    }
}
