//! A scheduled Job's plan, pure: its runs (Jobs it owns) in, the runs to
//! create or delete and its status out.
//!
//! A run is due at the latest time the schedule fired since the last run
//! (or since the Job was made): runs missed while the controller was away
//! are not made up, only the newest. The concurrency policy decides what a
//! due run does while another is active. Finished runs beyond the newest
//! [`KEEP_FINISHED`] are deleted with their pods.

use std::time::Duration;

use chrono::{DateTime, Utc};
use corral_api::cron::Schedule;
use corral_api::kinds::{ConcurrencyPolicy, JobPhase, JobStatus};

/// Finished runs kept for `logs` and `why`.
pub const KEEP_FINISHED: usize = 3;

/// One run of a scheduled Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub phase: JobPhase,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create the run `name`, due at `due`.
    Create { name: String, due: DateTime<Utc> },
    /// Delete a run: replaced by a newer one, or finished and too old.
    Delete { name: String, why: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub status: JobStatus,
    pub requeue_after: Option<Duration>,
}

/// The name of the run due at `due`: `NAME-<minutes since 1970>`.
pub fn run_name(job: &str, due: DateTime<Utc>) -> String {
    format!("{job}-{}", due.timestamp() / 60)
}

pub fn plan(
    job: &str,
    schedule: &Schedule,
    policy: ConcurrencyPolicy,
    created_at: DateTime<Utc>,
    current: &JobStatus,
    runs: &[Run],
    now: DateTime<Utc>,
) -> Plan {
    let mut runs: Vec<&Run> = runs.iter().collect();
    runs.sort_by_key(|run| (run.created_at, run.name.clone()));
    let since = current.last_schedule_at.unwrap_or(created_at);
    let mut actions = Vec::new();
    let mut status = JobStatus {
        phase: JobPhase::Scheduled,
        last_run: current.last_run.clone(),
        last_schedule_at: current.last_schedule_at,
        ..JobStatus::default()
    };
    let active: Vec<&&Run> = runs.iter().filter(|r| !r.phase.is_finished()).collect();
    let mut replaced = Vec::new();
    if let Some(due) = schedule.latest_between(since, now) {
        let name = run_name(job, due);
        status.last_schedule_at = Some(due);
        match policy {
            ConcurrencyPolicy::Forbid if !active.is_empty() => {
                status.reason = Some(format!(
                    "run due at {} skipped: {} still runs (concurrencyPolicy Forbid)",
                    due.format("%Y-%m-%dT%H:%M:%SZ"),
                    active[0].name
                ));
            }
            _ => {
                if policy == ConcurrencyPolicy::Replace {
                    for run in &active {
                        replaced.push(run.name.clone());
                        actions.push(Action::Delete {
                            name: run.name.clone(),
                            why: format!("replaced by {name} (concurrencyPolicy Replace)"),
                        });
                    }
                }
                actions.push(Action::Create {
                    name: name.clone(),
                    due,
                });
                status.last_run = Some(name);
            }
        }
    } else {
        status.reason = current.reason.clone();
    }
    let finished: Vec<&&Run> = runs.iter().filter(|r| r.phase.is_finished()).collect();
    for run in finished.iter().rev().skip(KEEP_FINISHED) {
        actions.push(Action::Delete {
            name: run.name.clone(),
            why: format!("more than {KEEP_FINISHED} finished runs are kept"),
        });
    }
    let created = actions
        .iter()
        .filter(|a| matches!(a, Action::Create { .. }))
        .count() as u32;
    status.active = active
        .iter()
        .filter(|r| !replaced.contains(&r.name))
        .count() as u32
        + created;
    status.succeeded = finished
        .iter()
        .filter(|r| r.phase == JobPhase::Complete)
        .count() as u32;
    status.failed = finished
        .iter()
        .filter(|r| r.phase == JobPhase::Failed)
        .count() as u32;
    status.next_schedule_at = schedule.next_after(now.max(status.last_schedule_at.unwrap_or(now)));
    let requeue_after = status
        .next_schedule_at
        .and_then(|next| (next - now).to_std().ok());
    Plan {
        actions,
        status,
        requeue_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: i64) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-03-01T10:00:00Z")
            .unwrap()
            .to_utc()
            + chrono::Duration::minutes(minute)
    }

    fn run(minute: i64, phase: JobPhase) -> Run {
        Run {
            name: run_name("nightly", at(minute)),
            created_at: at(minute),
            phase,
        }
    }

    fn every_minute() -> Schedule {
        "* * * * *".parse().unwrap()
    }

    fn planned(policy: ConcurrencyPolicy, runs: &[Run], now: i64) -> Plan {
        let current = JobStatus {
            last_schedule_at: Some(at(1)),
            ..JobStatus::default()
        };
        plan(
            "nightly",
            &every_minute(),
            policy,
            at(0),
            &current,
            runs,
            at(now),
        )
    }

    #[test]
    fn a_due_run_is_created_once_and_the_next_is_awaited() {
        let first = plan(
            "nightly",
            &every_minute(),
            ConcurrencyPolicy::Allow,
            at(0),
            &JobStatus::default(),
            &[],
            at(0) + chrono::Duration::seconds(61),
        );
        assert_eq!(
            first.actions,
            [Action::Create {
                name: run_name("nightly", at(1)),
                due: at(1)
            }]
        );
        assert_eq!(first.status.phase, JobPhase::Scheduled);
        assert_eq!(first.status.active, 1);
        assert_eq!(first.status.next_schedule_at, Some(at(2)));
        assert_eq!(first.requeue_after, Some(Duration::from_secs(59)));
        let again = plan(
            "nightly",
            &every_minute(),
            ConcurrencyPolicy::Allow,
            at(0),
            &first.status,
            &[run(1, JobPhase::Running)],
            at(1) + chrono::Duration::seconds(30),
        );
        assert!(again.actions.is_empty(), "{:?}", again.actions);
    }

    #[test]
    fn missed_runs_are_not_made_up() {
        let plan = planned(ConcurrencyPolicy::Allow, &[], 10);
        assert_eq!(
            plan.actions,
            [Action::Create {
                name: run_name("nightly", at(10)),
                due: at(10)
            }]
        );
    }

    #[test]
    fn the_concurrency_policy_decides_about_an_active_run() {
        let running = [run(1, JobPhase::Running)];
        let allow = planned(ConcurrencyPolicy::Allow, &running, 2);
        assert_eq!(allow.actions.len(), 1);
        assert_eq!(allow.status.active, 2);
        let forbid = planned(ConcurrencyPolicy::Forbid, &running, 2);
        assert!(forbid.actions.is_empty());
        assert_eq!(
            forbid.status.reason.as_deref(),
            Some(
                "run due at 2026-03-01T10:02:00Z skipped: nightly-29539321 still runs (concurrencyPolicy Forbid)"
            )
        );
        assert_eq!(
            forbid.status.last_schedule_at,
            Some(at(2)),
            "skipped, not retried"
        );
        let replace = planned(ConcurrencyPolicy::Replace, &running, 2);
        assert_eq!(
            replace.actions,
            [
                Action::Delete {
                    name: run_name("nightly", at(1)),
                    why: "replaced by nightly-29539322 (concurrencyPolicy Replace)".into()
                },
                Action::Create {
                    name: run_name("nightly", at(2)),
                    due: at(2)
                }
            ]
        );
        assert_eq!(replace.status.active, 1);
    }

    #[test]
    fn only_the_newest_finished_runs_are_kept() {
        let runs: Vec<Run> = (1..=5)
            .map(|m| {
                run(
                    m,
                    if m == 2 {
                        JobPhase::Failed
                    } else {
                        JobPhase::Complete
                    },
                )
            })
            .collect();
        let plan = planned(ConcurrencyPolicy::Allow, &runs, 5);
        let deleted: Vec<&str> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            deleted,
            [run_name("nightly", at(2)), run_name("nightly", at(1))]
        );
        assert_eq!((plan.status.succeeded, plan.status.failed), (4, 1));
    }
}
