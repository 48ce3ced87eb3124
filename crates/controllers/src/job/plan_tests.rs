use super::*;
use serde_json::json;

fn spec(extra: serde_json::Value) -> JobSpec {
    let mut value = json!({"template": {"spec": {"restartPolicy": "Never",
        "containers": [{"name": "c", "image": "busybox"}]}}});
    for (key, v) in extra.as_object().unwrap() {
        value[key] = v.clone();
    }
    serde_json::from_value(value).unwrap()
}

fn pod(index: u32, phase: PodPhase) -> JobPod {
    let exit = (phase == PodPhase::Failed).then(|| ("c".to_string(), Some(1)));
    JobPod {
        index,
        phase,
        restarts: 0,
        exit,
    }
}

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-03-01T10:00:00Z")
        .unwrap()
        .to_utc()
}

fn creates(plan: &Plan) -> Vec<u32> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Create { index } => Some(*index),
            _ => None,
        })
        .collect()
}

use PodPhase::{Failed as F, Pending as P, Running as R, Succeeded as S};

/// Runs a Job to its end, every pod finishing as `outcome(index)` says,
/// one pod per step: the most pods active at once, and the final plan.
fn simulate(spec: &JobSpec, outcome: impl Fn(u32) -> PodPhase) -> (u32, Plan) {
    let mut pods: Vec<JobPod> = Vec::new();
    let mut status = JobStatus::default();
    let mut most = 0;
    for _ in 0..50 {
        let next = pods.len() as u32;
        let planned = plan("batch", spec, &status, &pods, next, now());
        for action in &planned.actions {
            match *action {
                Action::Create { index } => pods.push(pod(index, R)),
                Action::Delete { index } => pods.retain(|p| p.index != index),
                Action::DeleteJob => {}
            }
        }
        status = planned.status.clone();
        let active = pods.iter().filter(|p| is_active(p)).count() as u32;
        most = most.max(active);
        if status.phase.is_finished() {
            return (most, planned);
        }
        // The oldest running pod finishes.
        if let Some(p) = pods.iter_mut().find(|p| p.phase == R) {
            *p = pod(p.index, outcome(p.index));
        }
    }
    panic!("the job never finished: {status:?}");
}

#[test]
fn completions_three_parallelism_two_runs_at_most_two_and_completes() {
    let (most, last) = simulate(&spec(json!({"completions": 3, "parallelism": 2})), |_| S);
    assert_eq!(most, 2);
    assert_eq!(last.status.phase, JobPhase::Complete);
    assert_eq!(last.status.succeeded, 3);
    assert_eq!(last.status.reason.as_deref(), Some("3 of 3 pods succeeded"));
}

#[test]
fn a_first_plan_creates_up_to_parallelism_and_no_more_than_needed() {
    let planned = plan(
        "batch",
        &spec(json!({"completions": 3, "parallelism": 5})),
        &JobStatus::default(),
        &[],
        0,
        now(),
    );
    assert_eq!(creates(&planned), [0, 1, 2]);
    assert_eq!(planned.status.active, 3);
    assert_eq!(planned.status.started_at, Some(now()));
    // Two done, one running: nothing more.
    let pods = [pod(0, S), pod(1, S), pod(2, P)];
    let planned = plan(
        "batch",
        &spec(json!({"completions": 3, "parallelism": 5})),
        &planned.status,
        &pods,
        3,
        now(),
    );
    assert!(planned.actions.is_empty(), "{:?}", planned.actions);
}

#[test]
fn failures_retry_up_to_the_backoff_limit_then_fail_naming_the_exit() {
    let (_, last) = simulate(&spec(json!({"backoffLimit": 2})), |_| F);
    assert_eq!(last.status.phase, JobPhase::Failed);
    assert_eq!(last.status.failed, 3, "the limit plus one");
    assert_eq!(
        last.status.reason.as_deref(),
        Some("pod batch-2: container c exited 1; backoff limit 2 reached")
    );
}

#[test]
fn a_retry_that_succeeds_completes_the_job() {
    let (_, last) = simulate(&spec(json!({"backoffLimit": 2})), |i| {
        if i == 0 { F } else { S }
    });
    assert_eq!(last.status.phase, JobPhase::Complete);
    assert_eq!((last.status.succeeded, last.status.failed), (1, 1));
}

#[test]
fn on_failure_restarts_count_against_the_limit() {
    let mut restarting = pod(0, R);
    restarting.restarts = 3;
    restarting.exit = Some(("c".into(), Some(2)));
    let running = JobStatus {
        phase: JobPhase::Running,
        ..JobStatus::default()
    };
    let planned = plan(
        "batch",
        &spec(json!({"backoffLimit": 2})),
        &running,
        &[restarting],
        1,
        now(),
    );
    assert_eq!(planned.status.phase, JobPhase::Failed);
    assert_eq!(
        planned.status.reason.as_deref(),
        Some("pod batch-0 restarted 3 times (container c exited 2); backoff limit 2 reached")
    );
    assert_eq!(
        planned.actions,
        [Action::Delete { index: 0 }],
        "its running pod stops"
    );
}

#[test]
fn the_active_deadline_fails_the_job_and_stops_its_pods() {
    let job = spec(json!({"activeDeadlineSeconds": 30}));
    let first = plan("batch", &job, &JobStatus::default(), &[], 0, now());
    assert_eq!(first.requeue_after, Some(Duration::from_secs(30)));
    let later = now() + chrono::Duration::seconds(31);
    let planned = plan("batch", &job, &first.status, &[pod(0, R)], 1, later);
    assert_eq!(planned.status.phase, JobPhase::Failed);
    assert_eq!(
        planned.status.reason.as_deref(),
        Some("active deadline of 30s passed")
    );
    assert_eq!(planned.actions, [Action::Delete { index: 0 }]);
}

#[test]
fn a_finished_job_stays_finished_and_goes_after_its_ttl() {
    let job = spec(json!({"ttlSecondsAfterFinished": 60}));
    let done = plan(
        "batch",
        &job,
        &JobStatus {
            phase: JobPhase::Running,
            ..Default::default()
        },
        &[pod(0, S)],
        1,
        now(),
    );
    assert_eq!(done.status.phase, JobPhase::Complete);
    assert_eq!(done.status.finished_at, Some(now()));
    assert_eq!(done.requeue_after, Some(Duration::from_secs(60)));
    // Raising completions after the end runs nothing.
    let more = spec(json!({"ttlSecondsAfterFinished": 60, "completions": 2}));
    let again = plan(
        "batch",
        &more,
        &done.status,
        &[pod(0, S)],
        1,
        now() + chrono::Duration::seconds(10),
    );
    assert!(again.actions.is_empty());
    assert_eq!(again.status.phase, JobPhase::Complete);
    let expired = plan(
        "batch",
        &job,
        &done.status,
        &[pod(0, S)],
        1,
        now() + chrono::Duration::seconds(60),
    );
    assert_eq!(expired.actions, [Action::DeleteJob]);
}
