//! `kind: Job` — pods that run to completion: `completions` successes,
//! at most `parallelism` at once, giving up after `backoffLimit` failures
//! or `activeDeadlineSeconds`. With a `schedule` the Job runs again and
//! again: each run is a Job of its own, owned by the scheduled one.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::PodTemplate;

fn one() -> u32 {
    1
}

fn six() -> u32 {
    6
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobSpec {
    /// The pods' template; its `restartPolicy` must be `Never` or `OnFailure`.
    pub template: PodTemplate,
    /// Successful pods needed for the Job to be complete (default 1).
    #[serde(default = "one")]
    pub completions: u32,
    /// Pods running at once, at most (default 1).
    #[serde(default = "one")]
    pub parallelism: u32,
    /// Failures tolerated: the Job fails at failure `backoffLimit + 1`
    /// (a pod that failed, or a restart of an `OnFailure` container).
    /// Default 6.
    #[serde(default = "six")]
    pub backoff_limit: u32,
    /// How long the Job may run, from its first pod, before it fails and
    /// its running pods are deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u64>,
    /// Delete the Job (and its pods) this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
    /// Run repeatedly, in cron syntax (5 fields, UTC): each run is a Job
    /// `NAME-<minutes since 1970>` this one owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// With a schedule: what a due run does while the last still runs.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
}

/// What a scheduled run does while an earlier run is still active.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConcurrencyPolicy {
    /// Both run.
    #[default]
    Allow,
    /// The new run is skipped.
    Forbid,
    /// The running one is deleted and the new one starts.
    Replace,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum JobPhase {
    /// No pod has started yet.
    #[default]
    Pending,
    Running,
    /// `completions` pods succeeded.
    Complete,
    /// Too many failures, or past the active deadline.
    Failed,
    /// A scheduled Job, waiting for its next run (its runs are Jobs).
    Scheduled,
}

impl JobPhase {
    /// Whether the Job is done, for good.
    pub fn is_finished(self) -> bool {
        matches!(self, JobPhase::Complete | JobPhase::Failed)
    }
}

/// What the job controller knows of a Job; it alone writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    #[serde(default)]
    pub phase: JobPhase,
    /// Why the phase: "pod web-3 exited 1; backoff limit 2 reached".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Pods running or about to.
    #[serde(default)]
    pub active: u32,
    #[serde(default)]
    pub succeeded: u32,
    /// Failures counted against the backoff limit.
    #[serde(default)]
    pub failed: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// A scheduled Job's latest run, and when it was due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_at: Option<DateTime<Utc>>,
}
