//! `kind: PinnedDeployment` — two pinned versions of a pod template and the
//! share of replicas on the next one.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
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
    /// Pods a template change may take down at once: a count (`2`) or a
    /// percent of replicas (`"25%"`, rounded down); at least 1, default 1.
    /// A pod that is not ready anyway is converted without counting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrPercent>,
    /// How long a rollout may go without progress (a converted pod
    /// becoming ready) before the controller halts it; default 120.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<u32>,
    /// Convert no pods to a changed template until false again
    /// (`corral rollout pause|resume pd/NAME`); scaling goes on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// The default of `progressDeadlineSeconds`.
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: u32 = 120;

/// A count, or a percent of some total (`"25%"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum IntOrPercent {
    Count(u32),
    Percent(String),
}

impl IntOrPercent {
    /// The count for `total`: a percent rounded down; `None` for a
    /// percent that is not `0%`–`100%`.
    pub fn resolve(&self, total: u32) -> Option<u32> {
        match self {
            IntOrPercent::Count(count) => Some(*count),
            IntOrPercent::Percent(text) => {
                let percent: u32 = text.strip_suffix('%')?.parse().ok()?;
                (percent <= 100).then(|| {
                    // INVARIANT: at most total, which is a u32.
                    u32::try_from(u64::from(total) * u64::from(percent) / 100).unwrap_or(total)
                })
            }
        }
    }
}

impl PinnedDeploymentSpec {
    /// Pods a template change may take down at once (at least 1).
    pub fn max_unavailable(&self) -> u32 {
        self.max_unavailable
            .as_ref()
            .and_then(|m| m.resolve(self.replicas))
            .unwrap_or(1)
            .max(1)
    }

    pub fn progress_deadline_seconds(&self) -> u32 {
        self.progress_deadline_seconds
            .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS)
    }

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
    /// Since when the rollout waits for progress (a converted pod becoming
    /// ready); none when settled or paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<DateTime<Utc>>,
    /// The rollout halted: no progress within `progressDeadlineSeconds`.
    /// Cleared by progress or by a new revision of the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<RolloutHalt>,
}

/// Why and when a rollout halted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutHalt {
    /// The spec revision that halted.
    pub revision: u64,
    pub at: DateTime<Utc>,
    /// "pod web-3 (next) not ready 120s after the last progress: …".
    pub reason: String,
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
            max_unavailable: None,
            progress_deadline_seconds: None,
            paused: false,
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

    #[test]
    fn max_unavailable_is_a_count_or_a_percent_rounded_down_at_least_one() {
        let mut four = spec(4, 0, RoundingStrategy::Nearest);
        assert_eq!(four.max_unavailable(), 1, "default");
        four.max_unavailable = Some(IntOrPercent::Percent("50%".into()));
        assert_eq!(four.max_unavailable(), 2);
        four.max_unavailable = Some(IntOrPercent::Percent("10%".into()));
        assert_eq!(four.max_unavailable(), 1, "rounded down, at least one");
        four.max_unavailable = Some(IntOrPercent::Count(3));
        assert_eq!(four.max_unavailable(), 3);
        let parsed: IntOrPercent = serde_json::from_value(serde_json::json!("25%")).unwrap();
        assert_eq!(parsed.resolve(8), Some(2));
        assert_eq!(IntOrPercent::Percent("150%".into()).resolve(8), None);
        assert_eq!(IntOrPercent::Percent("x".into()).resolve(8), None);
    }
}
