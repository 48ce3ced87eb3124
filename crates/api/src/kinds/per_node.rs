//! `kind: PerNodeDeployment` — one pod on every node whose labels match a
//! selector (log shippers, node exporters), following nodes as they join
//! and leave, updated in place with the same pacing as a PinnedDeployment.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::{IntOrPercent, PodTemplate, RolloutHalt};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PerNodeDeploymentSpec {
    /// Nodes whose labels match all of these; empty: every node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The pods' template; each pod is pinned to its node.
    pub template: PodTemplate,
    /// Pods a template change may take down at once (as a
    /// PinnedDeployment's); default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrPercent>,
    /// As a PinnedDeployment's; default 120.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<u32>,
}

/// What the per-node controller knows of a PerNodeDeployment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PerNodeDeploymentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_revision: Option<u64>,
    /// Nodes that match (and are not lost): one pod each.
    #[serde(default)]
    pub desired: u32,
    /// Pods running the current template.
    #[serde(default)]
    pub current: u32,
    /// Of those, ready.
    #[serde(default)]
    pub ready: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<RolloutHalt>,
}
