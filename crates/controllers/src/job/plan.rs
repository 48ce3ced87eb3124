//! A Job's plan, pure: its pods in, the pods to create or delete and the
//! Job's status out.
//!
//! Pods are named `NAME-0`, `NAME-1`, … in the order they are made; a
//! retry is a new pod with the next index, so the failed one stays for
//! `logs` and `why`. The indexes are deterministic, so a plan made from a
//! cache that has not seen the last pods yet asks to create names that
//! exist and is refused, never making a pod too many. A finished Job
//! (Complete or Failed) stays finished.

use std::time::Duration;

use chrono::{DateTime, Utc};
use corral_api::kinds::{JobPhase, JobSpec, JobStatus, PodPhase};

/// One pod of the Job, as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPod {
    /// `N` of `NAME-N`.
    pub index: u32,
    pub phase: PodPhase,
    /// Restarts of its containers (an `OnFailure` pod's failures).
    pub restarts: u32,
    /// Its failed container and exit code, if one failed.
    pub exit: Option<(String, Option<i32>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Create `NAME-index` from the template.
    Create { index: u32 },
    /// Delete `NAME-index`: the Job finished while it still ran.
    Delete { index: u32 },
    /// Delete the Job itself: its TTL after finishing passed.
    DeleteJob,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub status: JobStatus,
    /// When to look again though nothing changes (a deadline, the TTL).
    pub requeue_after: Option<Duration>,
}

fn is_active(pod: &JobPod) -> bool {
    matches!(pod.phase, PodPhase::Pending | PodPhase::Running)
}

/// Plans the Job `name` given its pods (`pods`, any order) and the status
/// it had; `next_index` is the first index no pod of that name has taken.
pub fn plan(
    name: &str,
    spec: &JobSpec,
    current: &JobStatus,
    pods: &[JobPod],
    next_index: u32,
    now: DateTime<Utc>,
) -> Plan {
    let active: Vec<&JobPod> = pods.iter().filter(|p| is_active(p)).collect();
    let succeeded = pods
        .iter()
        .filter(|p| p.phase == PodPhase::Succeeded)
        .count() as u32;
    let failed_pods = pods.iter().filter(|p| p.phase == PodPhase::Failed).count() as u32;
    let failed = failed_pods + pods.iter().map(|p| p.restarts).sum::<u32>();
    let mut status = JobStatus {
        phase: current.phase,
        reason: current.reason.clone(),
        active: active.len() as u32,
        succeeded,
        failed,
        started_at: current.started_at,
        finished_at: current.finished_at,
        ..JobStatus::default()
    };
    let mut actions = Vec::new();
    let stop_active = |actions: &mut Vec<Action>| {
        actions.extend(active.iter().map(|pod| Action::Delete { index: pod.index }));
    };

    if !current.phase.is_finished() {
        let verdict = if succeeded >= spec.completions {
            Some((
                JobPhase::Complete,
                format!("{succeeded} of {} pods succeeded", spec.completions),
            ))
        } else if failed > spec.backoff_limit {
            Some((
                JobPhase::Failed,
                format!(
                    "{}; backoff limit {} reached",
                    last_failure(name, pods),
                    spec.backoff_limit
                ),
            ))
        } else {
            deadline(spec, current.started_at).and_then(|(limit, at)| {
                (now >= at).then(|| {
                    (
                        JobPhase::Failed,
                        format!("active deadline of {limit}s passed"),
                    )
                })
            })
        };
        match verdict {
            Some((phase, reason)) => {
                status.phase = phase;
                status.reason = Some(reason);
                status.finished_at = Some(now);
            }
            None => {
                let wanted = spec
                    .parallelism
                    .min(spec.completions.saturating_sub(succeeded));
                let missing = wanted.saturating_sub(status.active);
                actions.extend(
                    (next_index..next_index + missing).map(|index| Action::Create { index }),
                );
                status.active += missing;
                status.started_at = status.started_at.or(Some(now));
                status.phase = JobPhase::Running;
                status.reason = None;
            }
        }
    }

    let mut requeue_after = None;
    if status.phase.is_finished() {
        // A finished Job runs nothing more.
        stop_active(&mut actions);
        if let (Some(ttl), Some(finished)) = (spec.ttl_seconds_after_finished, status.finished_at) {
            let expires = finished + chrono::Duration::seconds(ttl as i64);
            if now >= expires {
                actions.push(Action::DeleteJob);
            } else {
                requeue_after = (expires - now).to_std().ok();
            }
        }
    } else if let Some((_, at)) = deadline(spec, status.started_at) {
        requeue_after = (at - now).to_std().ok();
    }
    Plan {
        actions,
        status,
        requeue_after,
    }
}

/// The active deadline, in seconds, and when it passes.
fn deadline(spec: &JobSpec, started: Option<DateTime<Utc>>) -> Option<(u64, DateTime<Utc>)> {
    let limit = spec.active_deadline_seconds?;
    Some((limit, started? + chrono::Duration::seconds(limit as i64)))
}

/// "pod batch-3 exited 1" (the newest failed pod), or "pod batch-0
/// restarted 3 times" for `OnFailure` pods.
fn last_failure(name: &str, pods: &[JobPod]) -> String {
    let failed = pods
        .iter()
        .filter(|p| p.phase == PodPhase::Failed)
        .max_by_key(|p| p.index);
    if let Some(pod) = failed {
        return match &pod.exit {
            Some((container, Some(code))) => {
                format!(
                    "pod {name}-{}: container {container} exited {code}",
                    pod.index
                )
            }
            Some((container, None)) => {
                format!("pod {name}-{}: container {container} failed", pod.index)
            }
            None => format!("pod {name}-{} failed", pod.index),
        };
    }
    match pods
        .iter()
        .filter(|p| p.restarts > 0)
        .max_by_key(|p| p.index)
    {
        Some(pod) => {
            let exit = match &pod.exit {
                Some((container, Some(code))) => format!(" (container {container} exited {code})"),
                _ => String::new(),
            };
            format!(
                "pod {name}-{} restarted {} times{exit}",
                pod.index, pod.restarts
            )
        }
        None => "pods failed".to_string(),
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
