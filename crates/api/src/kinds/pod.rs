//! `kind: Pod` — one or more containers sharing a network namespace and an
//! IPv6 address. Pods are mutable: editing the spec updates them in place.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::pod_data::{DataVolume, EnvValue};
use crate::quantity::{Cpu, Memory};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodSpec {
    /// `best-effort` (default) stays bound to a silent node; `ha` is placed
    /// elsewhere after the grace period.
    #[serde(default)]
    pub availability: Availability,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// `runc` or `gvisor`; absent means the namespace default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackPolicy>,
    #[serde(default, skip_serializing_if = "SecurityRequest::is_empty")]
    pub security: SecurityRequest,
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// Seconds between SIGTERM and SIGKILL when a container stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// A Secret whose key `config.json` (or `.dockerconfigjson`) holds
    /// registry credentials in Docker's `config.json` format, used for this
    /// pod's pulls instead of the node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
    /// Run one after another when the pod starts, each to a successful
    /// exit, before `containers` start (in the start workflow's
    /// `node/run-init-containers`; an update does not run them again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<Container>,
    pub containers: Vec<Container>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Availability {
    #[default]
    BestEffort,
    Ha,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Placement {
    /// Pin to this node (a pet): the pod never moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Only nodes whose labels match all of these.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeClass {
    Runc,
    Gvisor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RollbackPolicy {
    /// Revert to the previous revision if the new one never gets ready.
    Auto,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecurityRequest {
    /// Named relaxations of the default sandbox (`run-as-root`,
    /// `capability:NET_BIND_SERVICE`, …); each needs a Policy too.
    #[serde(default)]
    pub relax: Vec<String>,
}

impl SecurityRequest {
    pub fn is_empty(&self) -> bool {
        self.relax.is_empty()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDir>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalVolume>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<PluginVolume>,
    /// A Secret's keys as read-only files (kept in memory on the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<DataVolume>,
    /// A Config's keys as read-only files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<DataVolume>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EmptyDir {
    /// `Memory` for a tmpfs; a directory on the node's disk otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalVolume {
    /// The node-local volume's name; it outlives the pod.
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginVolume {
    /// The plugin executable's registered name.
    pub driver: String,
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Container {
    pub name: String,
    pub image: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Values by name: text, or one key of a Secret or Config
    /// (`{secret: db, key: password}`); a container whose value changes
    /// restarts on its own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, EnvValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Probe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<Probe>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Runs in the container when the pod is deleted, before SIGTERM,
    /// within the grace period (`preStop: {exec: {command: [...]}}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_stop: Option<Hook>,
}

/// A command run in a container at a point of its lifecycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    pub exec: ExecProbe,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Probe {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    /// For readiness with `rollback: auto`: seconds a new revision has to
    /// become ready before it is rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_seconds: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecProbe {
    pub command: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpProbe {
    pub port: u16,
    #[serde(default = "root_path")]
    pub path: String,
}

fn root_path() -> String {
    "/".to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpProbe {
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub volume: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// What the cluster knows of a pod. Written by the scheduler (`node`), IPAM
/// (`address`) and the node agent (everything else).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default)]
    pub phase: PodPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The spec revision the node is running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_revision: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<ContainerStatus>,
}

impl PodStatus {
    /// Whether the pod should receive traffic: running, with every
    /// container ready. DNS names of a PinnedDeployment and load balancer
    /// backends list exactly these pods.
    pub fn is_ready(&self) -> bool {
        self.phase == PodPhase::Running
            && !self.containers.is_empty()
            && self.containers.iter().all(|c| c.ready)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PodPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    pub name: String,
    pub state: ContainerState,
    #[serde(default)]
    pub restarts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub ready: bool,
    /// Why the container is in its state, in a word (`get pods` shows the
    /// pod's worst).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ContainerReason>,
    /// The reason in a sentence: the last exit and why, what happens next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The container's last exit, kept across its restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<ContainerExit>,
    /// When the node starts it again (restart backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_restart_at: Option<DateTime<Utc>>,
}

/// Why a container is in its state.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum ContainerReason {
    /// Running (ready or not).
    Running,
    /// Being started (or restarted) by the node.
    Starting,
    /// Exited 0 and is not restarted (restart policy).
    Completed,
    /// Running, but its readiness probe fails: no traffic reaches it.
    NotReady,
    /// Exited and waits for its restart backoff.
    CrashLoop,
    /// Killed by the node after its liveness probe failed; restarted.
    Unhealthy,
    /// Killed by the kernel for using more memory than its limit.
    OutOfMemory,
    /// Exited non-zero and is not restarted (restart policy).
    Error,
    /// The node could not start it again (the runtime refused).
    StartFailed,
}

impl ContainerReason {
    /// Whether a pod with a container in this state is healthy.
    pub fn is_healthy(self) -> bool {
        matches!(
            self,
            ContainerReason::Running | ContainerReason::Starting | ContainerReason::Completed
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ContainerReason::Running => "Running",
            ContainerReason::Starting => "Starting",
            ContainerReason::Completed => "Completed",
            ContainerReason::NotReady => "NotReady",
            ContainerReason::CrashLoop => "CrashLoop",
            ContainerReason::Unhealthy => "Unhealthy",
            ContainerReason::OutOfMemory => "OutOfMemory",
            ContainerReason::Error => "Error",
            ContainerReason::StartFailed => "StartFailed",
        }
    }
}

/// A container's exit as the node saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerExit {
    /// The exit code (128 + N for signal N); none when the node could not
    /// collect it (after an agent restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    pub at: DateTime<Utc>,
    /// Why it ended, when the node knows more than the code, as a phrase:
    /// "was killed: its liveness probe failed: …", "was killed by the
    /// kernel: out of memory (limit 16Mi)".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// The reason that cause gives the container (`Unhealthy`,
    /// `OutOfMemory`); none for a plain exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ContainerReason>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContainerState {
    Waiting,
    Running,
    Exited,
}
