//! The PinnedDeployment plan, pure: the pods that exist in, the actions
//! that bring them to the spec out.
//!
//! Pods are named `NAME-0` … `NAME-(replicas-1)` and keep their names for
//! life. Moving a pod between versions is an in-place update of its spec
//! (a [`Action::Convert`]), never a delete and a create. The plan converts
//! as few pods as it can: new pods take the version that is short first
//! (the highest indices get `next`); when the share changes, the
//! lowest-indexed `next` pods go back to `previous` and the highest-indexed
//! `previous` pods go to `next`. Scaling down deletes the highest indices.

use corral_api::kinds::{PinnedDeploymentStatus, VersionStatus};

/// Which template a pod runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    Previous,
    Next,
}

impl Version {
    /// `previous` or `next`, as in `templates.previous` and the
    /// `corral.dev/version` annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Previous => "previous",
            Version::Next => "next",
        }
    }

    pub fn parse(text: &str) -> Option<Version> {
        match text {
            "previous" => Some(Version::Previous),
            "next" => Some(Version::Next),
            _ => None,
        }
    }
}

/// One pod the PinnedDeployment manages, as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// `N` of `NAME-N`.
    pub index: u32,
    /// Its `corral.dev/version`; `None` when missing or unreadable.
    pub version: Option<Version>,
    /// Its spec and labels are its version's template.
    pub matches_template: bool,
    /// Running its current revision with every container ready.
    pub ready: bool,
    /// Why it is not ready, when its node said (for a halted rollout's
    /// reason).
    pub problem: Option<String>,
}

/// One change to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Create `NAME-index` from the version's template.
    Create { index: u32, version: Version },
    /// Update `NAME-index` in place to the other version's template.
    Convert { index: u32, to: Version },
    /// Update `NAME-index` in place to its own version's template, which
    /// changed (or which the pod drifted from).
    Refresh { index: u32, version: Version },
    /// Delete `NAME-index` (scaled down).
    Delete { index: u32 },
}

/// What to do, and the status the pods have now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub status: PinnedDeploymentStatus,
}

/// Plans `replicas` pods of which `next` run `templates.next`, given the
/// members that exist (any order; one per index).
pub fn plan(replicas: u32, next: u32, members: &[Member]) -> Plan {
    let next = next.min(replicas);
    let mut members: Vec<&Member> = members.iter().collect();
    members.sort_by_key(|member| member.index);
    let (kept, extra): (Vec<&Member>, Vec<&Member>) =
        members.into_iter().partition(|m| m.index < replicas);

    let mut status = PinnedDeploymentStatus {
        observed_revision: None,
        previous: VersionStatus {
            desired: replicas - next,
            ..VersionStatus::default()
        },
        next: VersionStatus {
            desired: next,
            ..VersionStatus::default()
        },
        ..PinnedDeploymentStatus::default()
    };
    for member in &kept {
        let Some(version) = member.version else {
            continue;
        };
        let counts = match version {
            Version::Previous => &mut status.previous,
            Version::Next => &mut status.next,
        };
        if member.matches_template {
            counts.current += 1;
            counts.ready += u32::from(member.ready);
        }
    }

    // The version each kept or missing index ends with.
    let mut assigned: Vec<(u32, Option<Version>, Option<Version>)> = Vec::new();
    let mut by_index = kept.iter().peekable();
    for index in 0..replicas {
        match by_index.next_if(|member| member.index == index) {
            Some(member) => assigned.push((index, Some(member).and_then(|m| m.version), None)),
            None => assigned.push((index, None, None)),
        }
    }
    let mut on_next = assigned
        .iter()
        .filter(|(_, has, _)| *has == Some(Version::Next))
        .count() as u32;
    // Pods without a version (new or unreadable) fill the shortfall first,
    // highest indices taking `next`.
    for (_, has, wants) in assigned.iter_mut().rev() {
        match has {
            Some(version) => *wants = Some(*version),
            None if on_next < next => {
                on_next += 1;
                *wants = Some(Version::Next);
            }
            None => *wants = Some(Version::Previous),
        }
    }
    // Too many on next: the lowest indices go back.
    for (_, has, wants) in assigned.iter_mut() {
        if on_next <= next {
            break;
        }
        if *has == Some(Version::Next) {
            *wants = Some(Version::Previous);
            on_next -= 1;
        }
    }
    // Too few: the highest indices on previous move on.
    for (_, has, wants) in assigned.iter_mut().rev() {
        if on_next >= next {
            break;
        }
        if *has == Some(Version::Previous) {
            *wants = Some(Version::Next);
            on_next += 1;
        }
    }

    let mut actions = Vec::new();
    let existing = |index: u32| kept.iter().find(|member| member.index == index);
    for (index, has, wants) in assigned {
        let Some(wants) = wants else { continue };
        match existing(index) {
            None => actions.push(Action::Create {
                index,
                version: wants,
            }),
            Some(_) if has != Some(wants) => actions.push(Action::Convert { index, to: wants }),
            Some(member) if !member.matches_template => actions.push(Action::Refresh {
                index,
                version: wants,
            }),
            Some(_) => {}
        }
    }
    for member in extra.iter().rev() {
        actions.push(Action::Delete {
            index: member.index,
        });
    }
    Plan { actions, status }
}

/// Whether a rollout has settled: every version has its desired pods
/// current and ready.
pub fn settled(status: &PinnedDeploymentStatus) -> bool {
    [&status.previous, &status.next]
        .iter()
        .all(|v| v.current == v.desired && v.ready == v.desired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::kinds::{PinnedDeploymentSpec, RoundingStrategy};

    fn member(index: u32, version: Version) -> Member {
        Member {
            index,
            version: Some(version),
            matches_template: true,
            ready: true,
            problem: None,
        }
    }

    fn pods(versions: &[Version]) -> Vec<Member> {
        (0u32..)
            .zip(versions)
            .map(|(index, version)| member(index, *version))
            .collect()
    }

    /// Applies a plan's actions to members, as the controller would.
    fn apply(members: &[Member], plan: &Plan) -> Vec<Member> {
        let mut out: Vec<Member> = members.to_vec();
        for action in &plan.actions {
            match *action {
                Action::Create { index, version } => out.push(member(index, version)),
                Action::Convert { index, to: version } | Action::Refresh { index, version } => {
                    for m in out.iter_mut().filter(|m| m.index == index) {
                        *m = member(index, version);
                    }
                }
                Action::Delete { index } => out.retain(|m| m.index != index),
            }
        }
        out.sort_by_key(|m| m.index);
        out
    }

    fn versions(members: &[Member]) -> Vec<Version> {
        members.iter().filter_map(|m| m.version).collect()
    }

    use Version::{Next as N, Previous as P};

    #[test]
    fn a_new_deployment_creates_every_pod_the_highest_on_next() {
        let plan = plan(4, 1, &[]);
        assert_eq!(
            plan.actions,
            vec![
                Action::Create {
                    index: 0,
                    version: P
                },
                Action::Create {
                    index: 1,
                    version: P
                },
                Action::Create {
                    index: 2,
                    version: P
                },
                Action::Create {
                    index: 3,
                    version: N
                },
            ]
        );
        assert_eq!(plan.status.previous.desired, 3);
        assert_eq!(plan.status.next.desired, 1);
        assert_eq!(plan.status.next.current, 0);
    }

    #[test]
    fn raising_the_share_converts_the_highest_previous_pods_in_place() {
        let now = pods(&[P, P, P, N]);
        let plan = plan(4, 2, &now);
        assert_eq!(plan.actions, vec![Action::Convert { index: 2, to: N }]);
        assert_eq!(versions(&apply(&now, &plan)), vec![P, P, N, N]);
        assert_eq!(plan.status.previous.current, 3);
        assert_eq!(plan.status.previous.desired, 2);
    }

    #[test]
    fn lowering_the_share_converts_the_lowest_next_pods_back() {
        let now = pods(&[P, N, N, N]);
        let plan = plan(4, 1, &now);
        assert_eq!(
            plan.actions,
            vec![
                Action::Convert { index: 1, to: P },
                Action::Convert { index: 2, to: P },
            ]
        );
    }

    #[test]
    fn a_settled_deployment_plans_nothing() {
        let now = pods(&[P, P, N, N]);
        let plan = plan(4, 2, &now);
        assert!(plan.actions.is_empty());
        assert!(settled(&plan.status));
    }

    #[test]
    fn scaling_down_deletes_the_highest_indices_then_rebalances() {
        let now = pods(&[P, P, N, N, N, N]);
        let plan = plan(4, 2, &now);
        assert_eq!(
            plan.actions,
            vec![Action::Delete { index: 5 }, Action::Delete { index: 4 }]
        );
        assert_eq!(versions(&apply(&now, &plan)), vec![P, P, N, N]);
    }

    #[test]
    fn scaling_up_gives_new_pods_the_short_version_first() {
        let now = pods(&[P, N]);
        let plan = plan(4, 2, &now);
        assert_eq!(
            plan.actions,
            vec![
                Action::Create {
                    index: 2,
                    version: P
                },
                Action::Create {
                    index: 3,
                    version: N
                },
            ]
        );
    }

    #[test]
    fn drifted_or_template_changed_pods_are_refreshed_in_place() {
        let mut now = pods(&[P, N]);
        now[1].matches_template = false;
        now[1].ready = false;
        let plan = plan(2, 1, &now);
        assert_eq!(
            plan.actions,
            vec![Action::Refresh {
                index: 1,
                version: N
            }]
        );
        assert_eq!(plan.status.next.current, 0);
        assert!(!settled(&plan.status));
    }

    #[test]
    fn pods_without_a_version_are_converted_not_recreated() {
        let now = vec![
            Member {
                index: 0,
                version: None,
                matches_template: false,
                ready: false,
                problem: None,
            },
            member(1, P),
        ];
        let plan = plan(2, 1, &now);
        assert_eq!(plan.actions, vec![Action::Convert { index: 0, to: N }]);
    }

    #[test]
    fn ready_counts_only_current_ready_pods() {
        let mut now = pods(&[P, P, N]);
        now[0].ready = false;
        let plan = plan(3, 1, &now);
        assert_eq!(plan.status.previous.current, 2);
        assert_eq!(plan.status.previous.ready, 1);
        assert_eq!(plan.status.next.ready, 1);
    }

    fn spec(replicas: u32, percent: u8, rounding: RoundingStrategy) -> PinnedDeploymentSpec {
        serde_json::from_value(serde_json::json!({
            "replicas": replicas,
            "replicasPercentNext": percent,
            "replicasRoundingStrategy": rounding,
            "selector": {"app": "web"},
            "templates": {
                "previous": {"spec": {"containers": [{"name": "c", "image": "a"}]}},
                "next": {"spec": {"containers": [{"name": "c", "image": "b"}]}},
            }
        }))
        .unwrap()
    }

    /// Every replicas × percent × rounding: the plan applied once reaches
    /// exactly the desired split, converts only as many pods as the split
    /// moved, and then plans nothing.
    #[test]
    fn every_share_converges_in_one_plan_with_minimal_conversions() {
        for rounding in [
            RoundingStrategy::Up,
            RoundingStrategy::Down,
            RoundingStrategy::Nearest,
        ] {
            for replicas in 0..=7u32 {
                let mut members = apply(&[], &plan(replicas, 0, &[]));
                let mut on_next = 0u32;
                for percent in [0u8, 10, 25, 33, 50, 66, 75, 90, 100, 40, 0] {
                    let want = spec(replicas, percent, rounding).next_replicas();
                    let planned = plan(replicas, want, &members);
                    let conversions = planned
                        .actions
                        .iter()
                        .filter(|a| matches!(a, Action::Convert { .. }))
                        .count() as u32;
                    assert_eq!(conversions, want.abs_diff(on_next), "{replicas} {percent}%");
                    assert!(
                        planned
                            .actions
                            .iter()
                            .all(|a| matches!(a, Action::Convert { .. })),
                        "only conversions: {:?}",
                        planned.actions
                    );
                    members = apply(&members, &planned);
                    let next_count = versions(&members).iter().filter(|v| **v == N).count();
                    assert_eq!(next_count as u32, want);
                    assert_eq!(members.len() as u32, replicas);
                    assert!(plan(replicas, want, &members).actions.is_empty());
                    on_next = want;
                }
            }
        }
    }

    #[test]
    fn rounding_strategies_round_as_named() {
        assert_eq!(spec(4, 25, RoundingStrategy::Nearest).next_replicas(), 1);
        assert_eq!(spec(3, 50, RoundingStrategy::Nearest).next_replicas(), 2);
        assert_eq!(spec(3, 50, RoundingStrategy::Down).next_replicas(), 1);
        assert_eq!(spec(3, 50, RoundingStrategy::Up).next_replicas(), 2);
        assert_eq!(spec(3, 34, RoundingStrategy::Nearest).next_replicas(), 1);
        assert_eq!(spec(3, 1, RoundingStrategy::Up).next_replicas(), 1);
        assert_eq!(spec(3, 99, RoundingStrategy::Down).next_replicas(), 2);
        assert_eq!(spec(7, 100, RoundingStrategy::Down).next_replicas(), 7);
        assert_eq!(spec(7, 0, RoundingStrategy::Up).next_replicas(), 0);
    }
}
