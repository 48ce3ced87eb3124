//! A PerNodeDeployment's plan, pure: the nodes and pods in, the pods to
//! create, refresh and delete out, paced as a PinnedDeployment's rollout.
//!
//! Each pod is `NAME-<node>`, pinned to its node. The plan is put in the
//! PinnedDeployment planner's terms (each node an index, in name order; one
//! version) so [`crate::pinned::pacing`] paces its refreshes the same way.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use corral_api::kinds::{PerNodeDeploymentStatus, PinnedDeploymentStatus, VersionStatus};

use crate::pinned::pacing::{self, Pacing};
use crate::pinned::plan::{Action as PinnedAction, Member, Plan as PinnedPlan, Version};

/// One existing pod, as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePod {
    pub node: String,
    pub matches_template: bool,
    pub ready: bool,
    pub problem: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Create {
        node: String,
    },
    Refresh {
        node: String,
    },
    /// Its node left (deleted, lost, or no longer matching).
    Delete {
        node: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub status: PerNodeDeploymentStatus,
    pub requeue_after: Option<Duration>,
}

/// Plans one pod on each of `nodes` (the nodes that match) given the pods
/// that exist, paced by `pacing`; `previous` is the status last written.
pub fn plan(
    name: &str,
    nodes: &BTreeSet<String>,
    pods: &[NodePod],
    previous: &PerNodeDeploymentStatus,
    pacing: &Pacing,
    now: DateTime<Utc>,
) -> Plan {
    let mut every: BTreeSet<&String> = nodes.iter().collect();
    every.extend(pods.iter().map(|p| &p.node));
    let every: Vec<&String> = every.into_iter().collect();
    let index = |node: &String| every.iter().position(|n| *n == node).unwrap_or_default() as u32;
    let members: Vec<Member> = pods
        .iter()
        .map(|pod| Member {
            index: index(&pod.node),
            version: Some(Version::Next),
            matches_template: pod.matches_template,
            ready: pod.ready,
            problem: pod.problem.clone(),
        })
        .collect();
    let mut actions = Vec::new();
    let mut counts = VersionStatus {
        desired: nodes.len() as u32,
        ..VersionStatus::default()
    };
    for node in nodes {
        match pods.iter().find(|p| &p.node == node) {
            None => actions.push(PinnedAction::Create {
                index: index(node),
                version: Version::Next,
            }),
            Some(pod) if !pod.matches_template => actions.push(PinnedAction::Refresh {
                index: index(node),
                version: Version::Next,
            }),
            Some(pod) => {
                counts.current += 1;
                counts.ready += u32::from(pod.ready);
            }
        }
    }
    for pod in pods.iter().filter(|p| !nodes.contains(&p.node)) {
        actions.push(PinnedAction::Delete {
            index: index(&pod.node),
        });
    }
    let as_pinned =
        |status: &PerNodeDeploymentStatus, next: VersionStatus| PinnedDeploymentStatus {
            observed_revision: status.observed_revision,
            next,
            waiting_since: status.waiting_since,
            halted: status.halted.clone(),
            ..PinnedDeploymentStatus::default()
        };
    let mut pinned = PinnedPlan {
        actions,
        status: as_pinned(
            &PerNodeDeploymentStatus {
                observed_revision: Some(pacing.revision),
                ..PerNodeDeploymentStatus::default()
            },
            counts,
        ),
    };
    let before = as_pinned(
        previous,
        VersionStatus {
            desired: previous.desired,
            current: previous.current,
            ready: previous.ready,
        },
    );
    let requeue_after = pacing::pace(name, &mut pinned, &members, &before, pacing, now);
    let node_of = |index: u32| every[index as usize].clone();
    let actions = pinned
        .actions
        .iter()
        .map(|action| match *action {
            PinnedAction::Create { index, .. } => Action::Create {
                node: node_of(index),
            },
            PinnedAction::Refresh { index, .. } | PinnedAction::Convert { index, .. } => {
                Action::Refresh {
                    node: node_of(index),
                }
            }
            PinnedAction::Delete { index } => Action::Delete {
                node: node_of(index),
            },
        })
        .collect();
    let status = PerNodeDeploymentStatus {
        observed_revision: Some(pacing.revision),
        desired: pinned.status.next.desired,
        current: pinned.status.next.current,
        ready: pinned.status.next.ready,
        waiting_since: pinned.status.waiting_since,
        halted: pinned.status.halted,
    };
    Plan {
        actions,
        status,
        requeue_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pacing() -> Pacing {
        Pacing {
            max_unavailable: 1,
            paused: false,
            deadline: Duration::from_secs(120),
            revision: 1,
        }
    }

    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn pod(node: &str, matches_template: bool) -> NodePod {
        NodePod {
            node: node.into(),
            matches_template,
            ready: true,
            problem: None,
        }
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-03-01T10:00:00Z")
            .unwrap()
            .to_utc()
    }

    #[test]
    fn one_pod_per_matching_node_created_at_once() {
        let planned = plan(
            "agent",
            &nodes(&["a", "b", "c"]),
            &[],
            &Default::default(),
            &pacing(),
            now(),
        );
        assert_eq!(
            planned.actions,
            ["a", "b", "c"].map(|n| Action::Create { node: n.into() })
        );
        assert_eq!(planned.status.desired, 3);
    }

    #[test]
    fn a_joining_node_gets_a_pod_and_a_leaving_one_loses_it() {
        let pods = [pod("a", true), pod("b", true)];
        let planned = plan(
            "agent",
            &nodes(&["a", "c"]),
            &pods,
            &Default::default(),
            &pacing(),
            now(),
        );
        assert_eq!(
            planned.actions,
            [
                Action::Create { node: "c".into() },
                Action::Delete { node: "b".into() }
            ]
        );
        assert_eq!((planned.status.desired, planned.status.current), (2, 1));
    }

    #[test]
    fn template_changes_are_paced_one_node_at_a_time() {
        let pods = [pod("a", false), pod("b", false), pod("c", false)];
        let planned = plan(
            "agent",
            &nodes(&["a", "b", "c"]),
            &pods,
            &Default::default(),
            &pacing(),
            now(),
        );
        assert_eq!(planned.actions, [Action::Refresh { node: "a".into() }]);
        assert_eq!(planned.requeue_after, Some(Duration::from_secs(120)));
    }
}
