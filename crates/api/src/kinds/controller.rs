//! `kind: Controller` — a registered controller identity: the fields it
//! owns, the fields it reads, and the workflow steps it contributes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControllerSpec {
    /// Field paths this controller alone may write, as `Kind:path`
    /// (`Pod:status.node`).
    #[serde(default)]
    pub owns: Vec<String>,
    /// Field paths this controller reads; everything else is stripped from
    /// what it is served.
    #[serde(default)]
    pub reads: Vec<String>,
    /// Workflow steps this controller executes.
    #[serde(default)]
    pub steps: Vec<StepRegistration>,
}

/// A step a controller adds to a kind's workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepRegistration {
    /// `owner/verb`, e.g. `acme/inject-sidecar`.
    pub name: String,
    /// The kind whose workflow gets the step (`Pod`).
    pub kind: String,
    /// The workflow (`start`, `update`, `stop`, `join`).
    pub workflow: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted_by: Option<String>,
    /// A duration like `30s` or `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// `node`: the agent of the object's node executes the step for this
    /// controller (a volume plugin's `NAME/prepare` and `NAME/mount` run
    /// the plugin executable installed on the node). The step stays this
    /// controller's: `why` names it as the owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<crate::workflow::StepExecutor>,
}
