//! Paced rollouts, pure: which of a plan's in-place restarts (conversions
//! and refreshes) may go now, and whether the rollout waits, is paused or
//! halted.
//!
//! A restart takes a ready pod down until it is ready on its new spec, so
//! at most `maxUnavailable` pods may be unready at once: a restart of a
//! ready pod needs one of that budget, a pod that is not ready anyway is
//! restarted without counting. The next batch goes when the last one's
//! pods are ready. Progress is a pod becoming current and ready (or a
//! restart); a rollout without progress for `progressDeadlineSeconds`
//! halts, naming the pod it waits for, until progress or a new revision.
//! Paused, no restarts go and no deadline runs. Creating and deleting
//! pods (scaling) is never held.

use std::time::Duration;

use chrono::{DateTime, Utc};
use corral_api::kinds::{PinnedDeploymentStatus, RolloutHalt};

use super::plan::{Action, Member, Plan, settled};

/// How a deployment paces its rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    pub max_unavailable: u32,
    pub paused: bool,
    pub deadline: Duration,
    /// The spec revision being rolled out.
    pub revision: u64,
}

fn restarts(action: &Action) -> Option<u32> {
    match *action {
        Action::Convert { index, .. } | Action::Refresh { index, .. } => Some(index),
        Action::Create { .. } | Action::Delete { .. } => None,
    }
}

fn progress(status: &PinnedDeploymentStatus) -> u32 {
    status.previous.ready + status.next.ready
}

/// Holds back the restarts of `plan` that would take too many pods down,
/// and sets the status' `waitingSince` and `halted`; `previous` is the
/// status as last written. Returns when to look again (the deadline).
pub fn pace(
    name: &str,
    plan: &mut Plan,
    members: &[Member],
    previous: &PinnedDeploymentStatus,
    pacing: &Pacing,
    now: DateTime<Utc>,
) -> Option<Duration> {
    let deleted: Vec<u32> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Delete { index } => Some(*index),
            _ => None,
        })
        .collect();
    let staying = || members.iter().filter(|m| !deleted.contains(&m.index));
    let mut unavailable = staying().filter(|m| !m.ready).count() as u32;
    let same_revision = previous.observed_revision == Some(pacing.revision);
    let moved = progress(&plan.status) > progress(previous) || !same_revision;
    let mut halted = previous
        .halted
        .clone()
        .filter(|halt| halt.revision == pacing.revision && !moved);
    let pending = plan.actions.iter().any(|a| restarts(a).is_some());
    if !pending && settled(&plan.status) {
        plan.status.waiting_since = None;
        plan.status.halted = None;
        return None;
    }
    if pacing.paused {
        plan.actions.retain(|a| restarts(a).is_none());
        plan.status.waiting_since = None;
        plan.status.halted = halted;
        return None;
    }
    let waiting_since = match previous.waiting_since {
        Some(since) if !moved => since,
        _ => now,
    };
    let due = waiting_since + chrono::Duration::seconds(pacing.deadline.as_secs() as i64);
    if halted.is_none() && now >= due {
        halted = Some(RolloutHalt {
            revision: pacing.revision,
            at: now,
            reason: halt_reason(name, members, pacing.deadline),
        });
    }
    let mut went = false;
    if halted.is_some() {
        plan.actions.retain(|a| restarts(a).is_none());
    } else {
        plan.actions.retain(|action| {
            let Some(index) = restarts(action) else {
                return true;
            };
            let ready = members.iter().any(|m| m.index == index && m.ready);
            if !ready {
                went = true;
                return true;
            }
            if unavailable < pacing.max_unavailable {
                unavailable += 1;
                went = true;
                return true;
            }
            false
        });
    }
    plan.status.waiting_since = Some(if went { now } else { waiting_since });
    let requeue = (halted.is_none() && !went)
        .then(|| (due - now).to_std().ok())
        .flatten()
        .or(went.then_some(pacing.deadline));
    plan.status.halted = halted;
    requeue
}

/// "pod web-3 (next) not ready 120s after the last progress: container web is not ready".
fn halt_reason(name: &str, members: &[Member], deadline: Duration) -> String {
    let waiting = members
        .iter()
        .filter(|m| m.matches_template && !m.ready)
        .chain(members.iter().filter(|m| !m.ready))
        .next();
    match waiting {
        Some(member) => {
            let version = member.version.map_or("no version", |v| v.as_str());
            let mut reason = format!(
                "pod {name}-{} ({version}) not ready {}s after the last progress",
                member.index,
                deadline.as_secs()
            );
            if let Some(problem) = &member.problem {
                reason.push_str(": ");
                reason.push_str(problem);
            }
            reason
        }
        None => format!("no progress for {}s", deadline.as_secs()),
    }
}

#[cfg(test)]
#[path = "pacing_tests.rs"]
mod tests;
