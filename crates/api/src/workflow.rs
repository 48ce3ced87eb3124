//! Workflow data as stored in objects' `status.workflow`: step definitions,
//! workflow instances with per-step state, and step log entries.
//!
//! These are the stored contract and nothing else: the graph logic, the
//! state machine and the renderers live in `corral-workflow`.
//!
//! Who writes what (enforced by `corral-workflow`'s write check):
//! - a step's definition is snapshotted when the instance is created and
//!   never changes afterwards;
//! - a step's state moves to `running`, `done` or `failed` only by its owner
//!   (through claim / complete / fail);
//! - it moves to `waiting`, `ready`, `blocked` or `timedOut` only by the
//!   workflow engine, which derives them from the graph and the clock.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How many finished instances an object keeps in `status.workflow`.
pub const KEPT_INSTANCES: usize = 5;

/// Whether a graph node does work (a step) or is a named synchronisation
/// point reached when everything ordered before it is done (a target).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum StepKind {
    #[default]
    Step,
    Target,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Step => "step",
            StepKind::Target => "target",
        }
    }
}

/// How often a step is attempted and how long to wait between attempts.
/// The wait doubles after every failed attempt, up to `maxBackoffMs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    /// Attempts in total, the first included; at least 1.
    pub max_attempts: u32,
    /// Wait before the second attempt.
    pub backoff_ms: u64,
    /// Upper bound of the doubling wait.
    pub max_backoff_ms: u64,
}

impl Default for RetryPolicy {
    /// One attempt, no retry.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 1,
            backoff_ms: 1_000,
            max_backoff_ms: 60_000,
        }
    }
}

/// Whom a controller delegates the execution of one of its steps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum StepExecutor {
    /// The agent of the node the object is bound to.
    Node,
}

/// One node of a workflow graph, declared like a systemd unit.
///
/// `after` and `before` only order; `requires` orders too and propagates
/// failure (the dependent becomes blocked). `wantedBy` makes the step a
/// member of a target: the target is not reached until the step is done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepDefinition {
    /// `owner/verb` for steps (`node/start-containers`), a plain word for
    /// targets (`network`).
    pub name: String,
    /// The controller identity that executes the step (`scheduler`, `ipam`,
    /// `node` for the agent of the object's node, or a registered
    /// controller's name). Targets are owned by `workflow`, the engine.
    pub owner: String,
    /// Who executes the step on its owner's behalf: `node`, the agent of
    /// the object's node (a controller's volume plugin steps). The owner
    /// may still move it too. Absent: the owner executes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<StepExecutor>,
    #[serde(default)]
    pub kind: StepKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted_by: Option<String>,
    /// How long one attempt may run before it times out; none means forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub retry: RetryPolicy,
}

/// The spec of a `WorkflowDefinition` object: one version of a kind's
/// workflow — the built-in steps merged with those `Controller`s
/// registered — stored once and named by its content
/// (`pod-start-3f2a9c1d4e5f`). Workflow instances in objects' status refer
/// to it by name and keep only each step's state. The server writes it
/// when an instance first needs it and never changes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkflowDefinitionSpec {
    /// The kind whose objects run it (`Pod`).
    pub kind: crate::Kind,
    /// `start`, `update`, `move`, `stop`, `join`.
    pub workflow: String,
    /// The target whose completion completes the workflow.
    pub goal: String,
    /// Steps and targets, in a topological order.
    pub steps: Vec<StepDefinition>,
}

/// Where a step stands in one workflow instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(
    tag = "phase",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum StepState {
    /// Some step ordered before this one has not settled yet.
    Waiting {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        on: Vec<String>,
    },
    /// Everything ordered before is settled; the owner may claim it.
    Ready { since: DateTime<Utc> },
    /// Claimed by an identity and in progress.
    Running {
        claimed_by: String,
        since: DateTime<Utc>,
        attempt: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<DateTime<Utc>>,
    },
    /// Finished successfully. For targets, `started == finished`.
    Done {
        started: DateTime<Utc>,
        finished: DateTime<Utc>,
        attempt: u32,
        /// What the owner reports, e.g. the chosen node or the address.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// The owner reported an error. With `nextRetryAt` the step is retried
    /// then; without it the failure is final.
    Failed {
        error: String,
        started: DateTime<Utc>,
        at: DateTime<Utc>,
        attempt: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_retry_at: Option<DateTime<Utc>>,
    },
    /// The attempt ran past its deadline. Retried like `failed`.
    TimedOut {
        started: DateTime<Utc>,
        at: DateTime<Utc>,
        attempt: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_retry_at: Option<DateTime<Utc>>,
    },
    /// A required dependency failed for good; this step will not run.
    Blocked {
        /// The direct dependency that failed or is itself blocked.
        dependency: String,
        /// The step whose failure started the chain.
        cause: String,
        at: DateTime<Utc>,
    },
}

impl StepState {
    /// Whether the step failed (or timed out) and waits for its retry: the
    /// engine makes it ready at `nextRetryAt`, and its owner may claim it
    /// sooner when what made it fail has changed.
    pub fn awaits_retry(&self) -> bool {
        matches!(
            self,
            StepState::Failed {
                next_retry_at: Some(_),
                ..
            } | StepState::TimedOut {
                next_retry_at: Some(_),
                ..
            }
        )
    }

    /// The lowercase name of the phase, as serialized.
    pub fn phase(&self) -> &'static str {
        match self {
            StepState::Waiting { .. } => "waiting",
            StepState::Ready { .. } => "ready",
            StepState::Running { .. } => "running",
            StepState::Done { .. } => "done",
            StepState::Failed { .. } => "failed",
            StepState::TimedOut { .. } => "timedOut",
            StepState::Blocked { .. } => "blocked",
        }
    }
}

/// A step of an instance: its definition as it was when the instance was
/// created, and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepInstance {
    #[serde(flatten)]
    pub definition: StepDefinition,
    pub state: StepState,
    /// Attempts started so far (claims); the next claim is attempt
    /// `attempts + 1`.
    #[serde(default)]
    pub attempts: u32,
    /// Attempts made before a person's retry (`corral retry`) gave the step
    /// a fresh budget: it may run until attempt `retryBase + maxAttempts`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_base: u32,
    /// When the first attempt started; kept across retries for durations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_started_at: Option<DateTime<Utc>>,
}

impl StepInstance {
    /// The number of the last attempt the step may make: its policy's
    /// `maxAttempts`, counted from the last person's retry.
    pub fn max_attempts(&self) -> u32 {
        self.retry_base
            .saturating_add(self.definition.retry.max_attempts)
    }
}

/// How an instance ended, or that it has not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WorkflowOutcome {
    #[default]
    Running,
    /// The goal target was reached.
    Succeeded,
    /// The goal target can no longer be reached.
    Failed,
    /// A newer operation replaced this one before it finished.
    Cancelled,
}

impl WorkflowOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowOutcome::Running => "running",
            WorkflowOutcome::Succeeded => "succeeded",
            WorkflowOutcome::Failed => "failed",
            WorkflowOutcome::Cancelled => "cancelled",
        }
    }
}

/// One run of a workflow for one operation on one object (a pod start, an
/// in-place update, a stop, a node join).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowInstance {
    /// Unique per object, chosen by the server (e.g. `start-3`).
    pub id: String,
    /// `start`, `update`, `stop`, `join`.
    pub workflow: String,
    pub object_uid: String,
    /// The spec revision this operation serves.
    pub revision: u64,
    /// The target whose completion completes the workflow (`running`).
    pub goal: String,
    pub started_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub outcome: WorkflowOutcome,
    /// Steps in a topological order of the graph.
    pub steps: Vec<StepInstance>,
}

impl WorkflowInstance {
    pub fn step(&self, name: &str) -> Option<&StepInstance> {
        self.steps.iter().find(|step| step.definition.name == name)
    }
}

/// `status.workflow` of an object: its latest instances, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<WorkflowInstance>,
}

impl WorkflowStatus {
    /// The newest instance, the one `why` explains.
    pub fn latest(&self) -> Option<&WorkflowInstance> {
        self.instances.last()
    }

    pub fn find(&self, id: &str) -> Option<&WorkflowInstance> {
        self.instances.iter().find(|instance| instance.id == id)
    }
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

#[path = "workflow_stored.rs"]
mod stored;
pub use stored::{StoredInstance, StoredStep, StoredWorkflows};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// One structured log line of a step: a state transition recorded by the
/// engine, or a line the step's owner appended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepLogEntry {
    pub time: DateTime<Utc>,
    pub object_uid: String,
    pub workflow_id: String,
    pub workflow: String,
    pub step: String,
    pub owner: String,
    pub level: LogLevel,
    pub message: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, Value>,
}

/// What a step owner asks of the server, as `POST …/{name}/steps` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StepActionKind {
    /// Take a ready step: it becomes running against its timeout.
    Claim,
    /// Report success of the claimed step (optional `note`).
    Complete,
    /// Report failure of the claimed step (`error` required).
    Fail,
    /// Append a log line about the step (`message` required).
    Log,
}

impl StepActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepActionKind::Claim => "claim",
            StepActionKind::Complete => "complete",
            StepActionKind::Fail => "fail",
            StepActionKind::Log => "log",
        }
    }
}

/// The body of `POST …/{name}/steps`. Which fields apply depends on
/// `action`; the server refuses a request missing one it needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepActionRequest {
    pub action: StepActionKind,
    /// The step's name, `acme/slow-mount`.
    pub step: String,
    /// The instance id (`start-1`); default: the newest running instance
    /// (for `log`, the newest instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// `complete`: what the owner reports, shown by `why`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// `fail`: the error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `log`: the line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `log`: its level, `info` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<LogLevel>,
    /// `log`: structured fields.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, Value>,
    /// `claim`: take the step only if it is no longer waiting on steps
    /// ordered before it; a step still waiting is left alone and the rest
    /// of the batch goes on (without it, such a claim is refused). For a
    /// claim that rides along with an owner's other actions, betting that
    /// another owner's step before it is done by the time the request
    /// lands. Whether it was taken, the returned instance says.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub if_ready: bool,
}

/// The body of `POST …/pods/{name}/recoveries`: a node recovered the pod
/// from its local state after its sandbox was found stale (a reboot), and
/// reports the steps it ran — possibly long after, the control plane having
/// been away. The server records them as a finished `recover` workflow
/// instance with the node's timings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecoveryReport {
    /// The pod revision the node ran again.
    pub revision: u64,
    pub started_at: DateTime<Utc>,
    /// The `recover` workflow's node steps, in the order they ran.
    pub steps: Vec<RecoveredStep>,
}

/// One step of a node's recovery of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecoveredStep {
    /// `node/check-sandbox`, `node/clear-stale-sandbox`, …
    pub step: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    /// What it did, when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The body of `POST …/{name}/steps` for several actions at once: applied
/// in order, all or none, in one write of the object — with, optionally,
/// status fields the caller owns (`status.node`, `status.address`, a
/// node's container statuses) written in that same write. An owner that
/// claims a step, does the work and completes it sends one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepBatchRequest {
    pub actions: Vec<StepActionRequest>,
    /// Top-level status fields to set (a `null` removes one); never
    /// `workflow`, which only the actions change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub status: BTreeMap<String, Value>,
}

impl StepActionRequest {
    /// A request of `action` on `step` with every optional field empty.
    pub fn new(action: StepActionKind, step: impl Into<String>) -> Self {
        StepActionRequest {
            action,
            step: step.into(),
            workflow: None,
            note: None,
            error: None,
            message: None,
            level: None,
            fields: BTreeMap::new(),
            if_ready: false,
        }
    }
}

#[cfg(test)]
#[path = "workflow_tests.rs"]
mod tests;
