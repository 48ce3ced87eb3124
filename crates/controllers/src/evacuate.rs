//! Which pods leave a node that stopped answering. Pure.
//!
//! - `availability: ha` pods leave a Silent node once it has been silent
//!   for the grace (`ha_grace`) *and* the node has surely stopped them
//!   itself (`status.fencedBy`, self-fencing: `corral_api::fencing`), and
//!   a Lost node at once;
//! - `best-effort` pods stay bound to a Silent node and leave only a Lost
//!   one;
//! - every pod not pinned there leaves a node being deleted (its drain);
//! - pods pinned to their node (`spec.placement.node`) never leave: a pet
//!   waits for its node;
//! - a pod whose pin names another node moves there ([`Departure::Repinned`]);
//! - a pod whose new spec no longer fits its node moves when another node
//!   can take it (decided by the scheduler controller with the snapshot,
//!   [`Departure::NoLongerFits`]).

use chrono::{DateTime, Utc};
use corral_api::kinds::{Availability, NodePhase};

use crate::lifecycle::Timing;

/// What the scheduler knows of the node a pod is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeState {
    pub phase: NodePhase,
    pub silent_since: Option<DateTime<Utc>>,
    /// While Silent: when the node has surely stopped its ha pods itself.
    pub fenced_by: Option<DateTime<Utc>>,
    /// `metadata.deleting`: the node is being drained.
    pub deleting: bool,
}

/// Why a pod leaves its node, for the log and the move's step note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// An ha pod past the grace on a Silent node that has fenced it.
    SilentPastGrace,
    /// Any unpinned pod on a Lost node.
    NodeLost,
    /// Any unpinned pod on a node being deleted (drained).
    NodeDeleted,
    /// `spec.placement.node` names another node now.
    Repinned,
    /// Its spec no longer fits its node, and another node can run it.
    NoLongerFits,
}

impl Departure {
    /// The history message of the move: why the pod left `node`.
    pub fn message(
        self,
        pinned: Option<&str>,
        node: &str,
        state: Option<NodeState>,
        timing: Timing,
    ) -> String {
        let why = match self {
            Departure::SilentPastGrace => {
                let since = state
                    .and_then(|state| state.silent_since)
                    .map(|since| format!(" since {}", since.format("%Y-%m-%dT%H:%M:%SZ")))
                    .unwrap_or_default();
                let fenced = state
                    .and_then(|state| state.fenced_by)
                    .map(|by| {
                        format!(
                            "; by {} the node has stopped its copy itself (self-fencing)",
                            by.format("%H:%M:%SZ")
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "the node is silent{since}, past the {}s grace of an availability: ha pod{fenced}",
                    timing.ha_grace.num_seconds()
                )
            }
            Departure::NodeLost => "the node is lost".to_string(),
            Departure::NodeDeleted => "the node is being deleted (drained)".to_string(),
            Departure::Repinned => format!(
                "spec.placement.node names {}",
                pinned.unwrap_or("another node")
            ),
            Departure::NoLongerFits => {
                "its spec no longer fits there and another node can run it".to_string()
            }
        };
        format!("moved off {node}: {why}")
    }
}

/// Whether the pod leaves its node now. `None` for a node the cluster
/// does not know: that is a Lost node too.
pub fn departure(
    availability: Availability,
    pinned: Option<&str>,
    node: &str,
    state: Option<NodeState>,
    now: DateTime<Utc>,
    timing: Timing,
) -> Option<Departure> {
    match pinned {
        Some(pinned) if pinned == node => return None,
        Some(_) => return Some(Departure::Repinned),
        None => {}
    }
    let state = state.unwrap_or(NodeState {
        phase: NodePhase::Lost,
        silent_since: None,
        fenced_by: None,
        deleting: false,
    });
    if state.deleting {
        return Some(Departure::NodeDeleted);
    }
    match state.phase {
        NodePhase::Lost => Some(Departure::NodeLost),
        NodePhase::Silent if availability == Availability::Ha => {
            let since = state.silent_since?;
            // Never before the node has stopped its copy by itself.
            let fenced = state.fenced_by.is_none_or(|by| by <= now);
            (fenced && now - since >= timing.ha_grace).then_some(Departure::SilentPastGrace)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn a_move_message_says_where_from_and_why() {
        let timing = Timing::default();
        let silent = state(NodePhase::Silent, 0);
        assert_eq!(
            Departure::SilentPastGrace.message(None, "node-1", silent, timing),
            format!(
                "moved off node-1: the node is silent since 2026-01-01T00:00:00Z, past the {}s grace of an availability: ha pod",
                timing.ha_grace.num_seconds()
            )
        );
        assert_eq!(
            Departure::NodeLost.message(None, "node-1", None, timing),
            "moved off node-1: the node is lost"
        );
        assert_eq!(
            Departure::Repinned.message(Some("node-2"), "node-1", None, timing),
            "moved off node-1: spec.placement.node names node-2"
        );
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_225_600 + seconds, 0).unwrap()
    }

    /// A pod's availability and pin.
    type Spec = (Availability, Option<&'static str>);

    fn spec(availability: &str, pinned: Option<&'static str>) -> Spec {
        let availability = match availability {
            "ha" => Availability::Ha,
            _ => Availability::BestEffort,
        };
        (availability, pinned)
    }

    fn state(phase: NodePhase, since: i64) -> Option<NodeState> {
        Some(NodeState {
            phase,
            silent_since: Some(at(since)),
            fenced_by: None,
            deleting: false,
        })
    }

    #[test]
    fn every_pod_but_those_pinned_there_leaves_a_node_being_deleted() {
        let deleting = Some(NodeState {
            phase: NodePhase::Ready,
            silent_since: None,
            fenced_by: None,
            deleting: true,
        });
        for (spec, want) in [
            (spec("ha", None), Some(Departure::NodeDeleted)),
            (spec("best-effort", None), Some(Departure::NodeDeleted)),
            (spec("ha", Some("n1")), None),
            (spec("ha", Some("n2")), Some(Departure::Repinned)),
        ] {
            let verdict = departure(spec.0, spec.1, "n1", deleting, at(1), Timing::default());
            assert_eq!(verdict, want, "{spec:?}");
        }
        assert_eq!(
            Departure::NodeDeleted.message(None, "n1", deleting, Timing::default()),
            "moved off n1: the node is being deleted (drained)"
        );
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
                departure(spec.0, spec.1, "n1", node, now, timing),
                want,
                "case {index}"
            );
        }
    }

    #[test]
    fn an_ha_pod_waits_for_its_silent_node_to_have_fenced_it() {
        let timing = Timing {
            ha_grace: Duration::seconds(3),
            ..Timing::default()
        };
        let (ha, best) = (spec("ha", None), spec("best-effort", None));
        let fencing = |by: i64| {
            Some(NodeState {
                phase: NodePhase::Silent,
                silent_since: Some(at(0)),
                fenced_by: Some(at(by)),
                deleting: false,
            })
        };
        // Past the grace, not yet past the node's fence: it stays.
        assert_eq!(
            departure(ha.0, ha.1, "n1", fencing(27), at(26), timing),
            None
        );
        // Past both.
        assert_eq!(
            departure(ha.0, ha.1, "n1", fencing(27), at(27), timing),
            Some(Departure::SilentPastGrace)
        );
        // Past the fence, not the grace.
        assert_eq!(departure(ha.0, ha.1, "n1", fencing(1), at(2), timing), None);
        // Best-effort pods never leave a Silent node.
        assert_eq!(
            departure(best.0, best.1, "n1", fencing(1), at(99), timing),
            None
        );
        assert_eq!(
            Departure::SilentPastGrace.message(None, "n1", fencing(27), timing),
            "moved off n1: the node is silent since 2026-01-01T00:00:00Z, past the 3s grace of an availability: ha pod; by 00:00:27Z the node has stopped its copy itself (self-fencing)"
        );
    }

    #[test]
    fn a_pod_pinned_to_another_node_moves_there_whatever_its_node_does() {
        let moved = spec("best-effort", Some("n2"));
        for phase in [NodePhase::Ready, NodePhase::Silent, NodePhase::Lost] {
            let node = state(phase, 0);
            let verdict = departure(moved.0, moved.1, "n1", node, at(1), Timing::default());
            assert_eq!(verdict, Some(Departure::Repinned));
        }
    }
}
