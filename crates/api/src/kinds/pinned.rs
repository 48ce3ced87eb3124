//! `kind: PinnedDeployment` — two pinned versions of a pod template and the
//! share of replicas on the next one.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::PodSpec;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PinnedDeploymentSpec {
    pub replicas: u32,
    /// Percent of replicas on `templates.next`, 0–100.
    #[serde(default)]
    pub replicas_percent_next: u8,
    #[serde(default)]
    pub replicas_rounding_strategy: RoundingStrategy,
    pub selector: BTreeMap<String, String>,
    pub templates: Templates,
}

impl PinnedDeploymentSpec {
    /// Replicas that run `templates.next`: replicas × percent / 100, rounded
    /// by the strategy; the rest run `templates.previous`.
    pub fn next_replicas(&self) -> u32 {
        let exact = u64::from(self.replicas) * u64::from(self.replicas_percent_next.min(100));
        let (whole, remainder) = (exact / 100, exact % 100);
        let rounded = match self.replicas_rounding_strategy {
            RoundingStrategy::Down => whole,
            RoundingStrategy::Up => whole + u64::from(remainder > 0),
            RoundingStrategy::Nearest => whole + u64::from(remainder >= 50),
        };
        // INVARIANT: rounded <= replicas, which is a u32.
        u32::try_from(rounded).unwrap_or(self.replicas)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RoundingStrategy {
    Up,
    Down,
    #[default]
    Nearest,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Templates {
    pub previous: PodTemplate,
    pub next: PodTemplate,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodTemplate {
    #[serde(default)]
    pub metadata: TemplateMeta,
    pub spec: PodSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateMeta {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinnedDeploymentStatus {
    /// The spec revision this status was computed for; a rollout has
    /// settled when it equals `metadata.revision` and every version has
    /// its desired replicas current and ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_revision: Option<u64>,
    #[serde(default)]
    pub previous: VersionStatus,
    #[serde(default)]
    pub next: VersionStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionStatus {
    pub desired: u32,
    pub current: u32,
    pub ready: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(replicas: u32, percent: u8, strategy: RoundingStrategy) -> PinnedDeploymentSpec {
        let template: PodTemplate = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        PinnedDeploymentSpec {
            replicas,
            replicas_percent_next: percent,
            replicas_rounding_strategy: strategy,
            selector: BTreeMap::new(),
            templates: Templates {
                previous: template.clone(),
                next: template,
            },
        }
    }

    #[test]
    fn next_replicas_rounds_by_strategy() {
        assert_eq!(spec(4, 25, RoundingStrategy::Nearest).next_replicas(), 1);
        assert_eq!(spec(4, 50, RoundingStrategy::Nearest).next_replicas(), 2);
        assert_eq!(spec(3, 50, RoundingStrategy::Nearest).next_replicas(), 2);
        assert_eq!(spec(3, 50, RoundingStrategy::Down).next_replicas(), 1);
        assert_eq!(spec(3, 10, RoundingStrategy::Up).next_replicas(), 1);
        assert_eq!(spec(3, 10, RoundingStrategy::Nearest).next_replicas(), 0);
        assert_eq!(spec(5, 100, RoundingStrategy::Up).next_replicas(), 5);
        assert_eq!(spec(0, 100, RoundingStrategy::Up).next_replicas(), 0);
    }
}
