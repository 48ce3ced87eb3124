use super::*;
use crate::pinned::plan::{Version, plan};

const N: Version = Version::Next;

fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-03-01T10:00:00Z")
        .unwrap()
        .to_utc()
        + chrono::Duration::seconds(seconds)
}

fn pacing(max_unavailable: u32) -> Pacing {
    Pacing {
        max_unavailable,
        paused: false,
        deadline: Duration::from_secs(120),
        revision: 2,
    }
}

/// Four pods on next, ready; the next template just changed.
fn changed() -> Vec<Member> {
    (0..4)
        .map(|index| Member {
            index,
            version: Some(N),
            matches_template: false,
            ready: true,
            problem: None,
        })
        .collect()
}

fn restarted(plan: &Plan) -> Vec<u32> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Refresh { index, .. } | Action::Convert { index, .. } => Some(*index),
            _ => None,
        })
        .collect()
}

/// One round: plan, pace, and the status it writes.
fn round(
    members: &[Member],
    previous: &PinnedDeploymentStatus,
    pacing: &Pacing,
    now: DateTime<Utc>,
) -> (Plan, Option<Duration>) {
    let mut planned = plan(4, 4, members);
    planned.status.observed_revision = Some(pacing.revision);
    let requeue = pace("web", &mut planned, members, previous, pacing, now);
    (planned, requeue)
}

#[test]
fn a_template_change_restarts_one_ready_pod_at_a_time() {
    let mut members = changed();
    let mut status = PinnedDeploymentStatus {
        observed_revision: Some(1),
        ..PinnedDeploymentStatus::default()
    };
    let mut order = Vec::new();
    for step in 0..20 {
        let now = at(step);
        let (planned, _) = round(&members, &status, &pacing(1), now);
        let went = restarted(&planned);
        assert!(went.len() <= 1, "one at a time: {went:?}");
        let unready = members.iter().filter(|m| !m.ready).count();
        assert!(
            unready + went.len() <= 1,
            "never two down: {members:?} {went:?}"
        );
        for index in &went {
            order.push(*index);
            // Restarted: current, not ready yet.
            members[*index as usize].matches_template = true;
            members[*index as usize].ready = false;
        }
        status = planned.status;
        if went.is_empty() {
            // The restarted pod becomes ready.
            for m in members.iter_mut().filter(|m| !m.ready) {
                m.ready = true;
            }
        }
    }
    assert_eq!(order, [0, 1, 2, 3]);
    assert!(members.iter().all(|m| m.matches_template && m.ready));
    assert_eq!(status.waiting_since, None, "settled");
}

#[test]
fn a_percent_budget_restarts_a_batch() {
    let (planned, requeue) = round(
        &changed(),
        &PinnedDeploymentStatus::default(),
        &pacing(2),
        at(0),
    );
    assert_eq!(restarted(&planned), [0, 1]);
    assert_eq!(requeue, Some(Duration::from_secs(120)));
}

#[test]
fn pods_not_ready_anyway_are_restarted_without_counting() {
    let mut members = changed();
    members[2].ready = false;
    members[3].ready = false;
    let (planned, _) = round(
        &members,
        &PinnedDeploymentStatus::default(),
        &pacing(1),
        at(0),
    );
    assert_eq!(
        restarted(&planned),
        [2, 3],
        "the budget is spent by the two already down"
    );
}

#[test]
fn no_progress_within_the_deadline_halts_naming_the_pod() {
    let mut members = changed();
    let (planned, _) = round(
        &members,
        &PinnedDeploymentStatus::default(),
        &pacing(1),
        at(0),
    );
    assert_eq!(restarted(&planned), [0]);
    members[0].matches_template = true;
    members[0].ready = false;
    members[0].problem = Some("container web is not ready: its readiness probe fails".into());
    let status = planned.status;
    let (waiting, requeue) = round(&members, &status, &pacing(1), at(60));
    assert!(restarted(&waiting).is_empty());
    assert_eq!(
        requeue,
        Some(Duration::from_secs(60)),
        "looks again at the deadline"
    );
    assert_eq!(waiting.status.waiting_since, Some(at(0)));
    let (halted, requeue) = round(&members, &waiting.status, &pacing(1), at(120));
    assert_eq!(requeue, None);
    let halt = halted.status.halted.clone().expect("halted");
    assert_eq!(
        halt.reason,
        "pod web-0 (next) not ready 120s after the last progress: container web is not ready: its readiness probe fails"
    );
    assert_eq!((halt.revision, halt.at), (2, at(120)));
    // Halted, even a free restart waits.
    members[1].ready = false;
    let (still, _) = round(&members, &halted.status, &pacing(1), at(130));
    assert!(restarted(&still).is_empty());
    assert!(still.status.halted.is_some());
    // A new revision clears it.
    let mut next = pacing(1);
    next.revision = 3;
    let (fixed, _) = round(&members, &still.status, &next, at(140));
    assert_eq!(fixed.status.halted, None);
    assert_eq!(restarted(&fixed), [1]);
}

#[test]
fn progress_clears_a_halt() {
    let mut members = changed();
    members[0].matches_template = true;
    members[0].ready = false;
    let halted = PinnedDeploymentStatus {
        observed_revision: Some(2),
        halted: Some(RolloutHalt {
            revision: 2,
            at: at(0),
            reason: "r".into(),
        }),
        waiting_since: Some(at(-120)),
        ..PinnedDeploymentStatus::default()
    };
    let (still, _) = round(&members, &halted, &pacing(1), at(5));
    assert!(still.status.halted.is_some());
    members[0].ready = true;
    let (moving, _) = round(&members, &still.status, &pacing(1), at(10));
    assert_eq!(moving.status.halted, None);
    assert_eq!(restarted(&moving), [1]);
}

#[test]
fn paused_holds_every_restart_and_no_deadline_runs() {
    let mut paused = pacing(1);
    paused.paused = true;
    let (planned, requeue) = round(
        &changed(),
        &PinnedDeploymentStatus::default(),
        &paused,
        at(0),
    );
    assert!(restarted(&planned).is_empty());
    assert_eq!((requeue, planned.status.waiting_since), (None, None));
    let (later, _) = round(&changed(), &planned.status, &paused, at(1000));
    assert_eq!(later.status.halted, None);
}

#[test]
fn scaling_is_never_held() {
    let members = changed();
    let mut planned = plan(6, 6, &members);
    planned.status.observed_revision = Some(2);
    let mut paused = pacing(1);
    paused.paused = true;
    pace(
        "web",
        &mut planned,
        &members,
        &PinnedDeploymentStatus::default(),
        &paused,
        at(0),
    );
    assert_eq!(
        planned.actions,
        [
            Action::Create {
                index: 4,
                version: N
            },
            Action::Create {
                index: 5,
                version: N
            }
        ]
    );
}
