//! Which pods leave a node that stopped answering. Pure.
//!
//! - `availability: ha` pods leave a Silent node once it has been silent
//!   for the grace (`ha_grace`), and a Lost node at once;
//! - `best-effort` pods stay bound to a Silent node and leave only a Lost
//!   one;
//! - pods pinned to their node (`spec.placement.node`) never leave: a pet
//!   waits for its node;
//! - a pod whose pin names another node moves there ([`Departure::Repinned`]);
//! - a pod whose new spec no longer fits its node moves when another node
//!   can take it (decided by the scheduler controller with the snapshot,
//!   [`Departure::NoLongerFits`]).

use chrono::{DateTime, Utc};
use corral_api::kinds::{Availability, NodePhase, PodSpec};

use crate::lifecycle::Timing;

/// What the scheduler knows of the node a pod is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeState {
    pub phase: NodePhase,
    pub silent_since: Option<DateTime<Utc>>,
}

/// Why a pod leaves its node, for the log and the move's step note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// An ha pod past the grace on a Silent node.
    SilentPastGrace,
    /// Any unpinned pod on a Lost node.
    NodeLost,
    /// `spec.placement.node` names another node now.
    Repinned,
    /// Its spec no longer fits its node, and another node can run it.
    NoLongerFits,
}

/// Whether the pod leaves its node now. `None` for a node the cluster
/// does not know: that is a Lost node too.
pub fn departure(
    spec: &PodSpec,
    node: &str,
    state: Option<NodeState>,
    now: DateTime<Utc>,
    timing: Timing,
) -> Option<Departure> {
    match spec.placement.as_ref().and_then(|p| p.node.as_deref()) {
        Some(pinned) if pinned == node => return None,
        Some(_) => return Some(Departure::Repinned),
        None => {}
    }
    let state = state.unwrap_or(NodeState {
        phase: NodePhase::Lost,
        silent_since: None,
    });
    match state.phase {
        NodePhase::Lost => Some(Departure::NodeLost),
        NodePhase::Silent if spec.availability == Availability::Ha => {
            let since = state.silent_since?;
            (now - since >= timing.ha_grace).then_some(Departure::SilentPastGrace)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_225_600 + seconds, 0).unwrap()
    }

    fn spec(availability: &str, pinned: Option<&str>) -> PodSpec {
        let mut value = serde_json::json!({
            "availability": availability,
            "containers": [{"name": "c", "image": "i"}],
        });
        if let Some(node) = pinned {
            value["placement"] = serde_json::json!({"node": node});
        }
        serde_json::from_value(value).unwrap()
    }

    fn state(phase: NodePhase, since: i64) -> Option<NodeState> {
        Some(NodeState {
            phase,
            silent_since: Some(at(since)),
        })
    }

    #[test]
    fn every_availability_on_every_phase() {
        let timing = Timing {
            ha_grace: Duration::seconds(30),
            ..Timing::default()
        };
        let ha = spec("ha", None);
        let best = spec("best-effort", None);
        let pet = spec("ha", Some("n1"));
        let now = at(100);
        let silent_young = state(NodePhase::Silent, 80);
        let silent_old = state(NodePhase::Silent, 70);
        let lost = state(NodePhase::Lost, 0);
        let ready = state(NodePhase::Ready, 0);
        let cases = [
            (&ha, ready, None),
            (&ha, silent_young, None),
            (&ha, silent_old, Some(Departure::SilentPastGrace)),
            (&ha, lost, Some(Departure::NodeLost)),
            (&ha, None, Some(Departure::NodeLost)),
            (&best, silent_old, None),
            (&best, lost, Some(Departure::NodeLost)),
            (&pet, silent_old, None),
            (&pet, lost, None),
        ];
        for (index, (spec, node, want)) in cases.into_iter().enumerate() {
            assert_eq!(
                departure(spec, "n1", node, now, timing),
                want,
                "case {index}"
            );
        }
    }

    #[test]
    fn a_pod_pinned_to_another_node_moves_there_whatever_its_node_does() {
        let moved = spec("best-effort", Some("n2"));
        for phase in [NodePhase::Ready, NodePhase::Silent, NodePhase::Lost] {
            let node = state(phase, 0);
            let verdict = departure(&moved, "n1", node, at(1), Timing::default());
            assert_eq!(verdict, Some(Departure::Repinned));
        }
    }
}
