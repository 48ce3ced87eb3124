//! Self-fencing: a node cut off from the control plane for the fencing
//! period its last lease granted stops its `availability: ha` pods by
//! itself, while still cut off (`corral_api::fencing` has the promise and
//! the control plane's side).
//!
//! - The heartbeat records every successful renewal: when it was *sent*, on
//!   `CLOCK_BOOTTIME` (monotonic, and counting while the machine sleeps),
//!   and the period it granted ([`Fence::renewed`]). The wall time and the
//!   period are kept in `agent/lease.json`, so an agent that restarts
//!   knows how much of the period is left.
//! - [`watch`] looks every [`CHECK`]: past the deadline it begins a fence
//!   ([`Fence::begin`], kept in `agent/fence.json` until the node is back)
//!   and, while the fence lasts, stops every live container of an ha pod
//!   this node records (SIGTERM, at most `fencing::STOP_GRACE_SECONDS`,
//!   SIGKILL), again at every look: a container started meanwhile by any
//!   path is stopped within one look. Pod workers start no ha container
//!   while the fence [`holds`](Fence::holds) (`pods/supervision.rs`).
//! - Back in contact, the heartbeat waits until the node is Ready again and
//!   the scheduler's view has settled, then the manager removes the pods
//!   moved away meanwhile and lifts the fence ([`Fence::lift`]): the pods
//!   still bound here start again, and the node reports what it did
//!   (`Node:status.lastFence`, a revision of its history).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use corral_api::fencing::{DEFAULT_FENCE_AFTER_SECONDS, STOP_GRACE_SECONDS, SelfFence};
use corral_api::kinds::{Availability, PodSpec};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::AgentContext;

/// How often [`watch`] looks at the deadline (and, fencing, at the pods).
pub const CHECK: Duration = Duration::from_millis(200);

/// `CLOCK_BOOTTIME` now: monotonic, and it keeps counting while the
/// machine is suspended (`Instant`'s `CLOCK_MONOTONIC` does not).
pub fn boottime() -> Duration {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(now) => Duration::new(
            u64::try_from(now.tv_sec()).unwrap_or(0),
            u32::try_from(now.tv_nsec()).unwrap_or(0),
        ),
        // Linux always has CLOCK_BOOTTIME; should it fail, the latest
        // possible time makes the node fence early, never late.
        Err(_) => Duration::MAX,
    }
}

/// The last renewal, as `agent/lease.json` keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseMark {
    /// When the renewal was sent (this node's wall clock).
    pub sent_at: DateTime<Utc>,
    pub fence_after_seconds: u64,
}

/// How much of the fencing period is left for an agent starting at
/// `now`, from the last renewal its previous run recorded. Without one the
/// node never renewed (a new node, or one whose state was wiped): it gets
/// the default period from now. Pure.
pub fn left_at_start(mark: Option<LeaseMark>, now: DateTime<Utc>) -> Duration {
    let Some(mark) = mark else {
        return Duration::from_secs(DEFAULT_FENCE_AFTER_SECONDS);
    };
    let period = Duration::from_secs(mark.fence_after_seconds);
    let passed = (now - mark.sent_at).to_std().unwrap_or_default();
    // A wall clock stepped back cannot lengthen the period.
    period.saturating_sub(passed).min(period)
}

#[derive(Debug)]
struct State {
    /// When the node must have fenced (`boottime`).
    deadline: Duration,
    /// The period of the last renewal, in seconds.
    period: u64,
    /// When the last successful renewal was sent (`boottime`), if in this run.
    sent: Option<Duration>,
    /// The fence in force, until the node is back.
    active: Option<SelfFence>,
}

/// The node's fencing clock and the fence in force.
#[derive(Debug)]
pub struct Fence {
    state: Mutex<State>,
    lease_file: PathBuf,
    fence_file: PathBuf,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Writes `value` to `path` through a temporary file and a rename.
fn write_json<T: Serialize>(path: &Path, value: &T) {
    let temporary = path.with_extension("json.tmp");
    let written = serde_json::to_vec(value)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(&temporary, bytes))
        .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(error) = written {
        tracing::warn!(path = %path.display(), %error, "cannot record the fencing state");
    }
}

impl Fence {
    /// The clock of an agent keeping its state in `dir` (`DATA/agent`),
    /// going on from what its previous run recorded: the last renewal and
    /// a fence still in force.
    pub fn open(dir: &Path) -> Fence {
        let lease_file = dir.join("lease.json");
        let fence_file = dir.join("fence.json");
        let mark: Option<LeaseMark> = read_json(&lease_file);
        let active: Option<SelfFence> =
            read_json(&fence_file).filter(|fence: &SelfFence| fence.returned_at.is_none());
        Fence {
            state: Mutex::new(State {
                deadline: boottime().saturating_add(left_at_start(mark, Utc::now())),
                period: mark.map_or(DEFAULT_FENCE_AFTER_SECONDS, |m| m.fence_after_seconds),
                sent: None,
                active,
            }),
            lease_file,
            fence_file,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding it left plain data behind: go on with it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A renewal sent at `sent` (`boottime`) and `sent_at` (wall) succeeded,
    /// granting `period` seconds.
    pub fn renewed(&self, sent: Duration, sent_at: DateTime<Utc>, period: u64) {
        {
            let mut state = self.lock();
            // Renewals answer in order of sending; an older one never
            // shortens what a newer one granted.
            if state.sent.is_some_and(|last| last > sent) {
                return;
            }
            state.sent = Some(sent);
            state.period = period;
            state.deadline = sent.saturating_add(Duration::from_secs(period));
        }
        write_json(
            &self.lease_file,
            &LeaseMark {
                sent_at,
                fence_after_seconds: period,
            },
        );
    }

    /// Begins a fence if the deadline has passed at `now` (`boottime`) and
    /// none is in force; returns it.
    pub fn begin_if_due(&self, now: Duration) -> Option<SelfFence> {
        let fence = {
            let mut state = self.lock();
            if state.active.is_some() || now < state.deadline {
                return None;
            }
            let silent = match state.sent {
                Some(sent) => now.saturating_sub(sent).as_secs(),
                None => state.period,
            };
            let fence = SelfFence {
                at: Utc::now(),
                silent_seconds: silent,
                fence_after_seconds: state.period,
                ..SelfFence::default()
            };
            state.active = Some(fence.clone());
            fence
        };
        write_json(&self.fence_file, &fence);
        Some(fence)
    }

    /// Whether a fence is in force.
    pub fn is_active(&self) -> bool {
        self.lock().active.is_some()
    }

    /// The fence in force, if any.
    pub fn active(&self) -> Option<SelfFence> {
        self.lock().active.clone()
    }

    /// Whether a pod of `spec` must not run now: a fence is in force and
    /// it is an `availability: ha` pod.
    pub fn holds(&self, spec: &PodSpec) -> bool {
        spec.availability == Availability::Ha && self.is_active()
    }

    /// The sentence a container stopped by the fence keeps as its exit's
    /// cause.
    pub fn cause(&self) -> Option<String> {
        self.lock().active.as_ref().map(|fence| {
            format!(
                "stopped by its node: self-fencing after {}s without the control plane",
                fence.silent_seconds
            )
        })
    }

    /// Notes `pod` (`namespace/name`) among those the fence stopped.
    fn stopped(&self, pod: &str) {
        let fence = {
            let mut state = self.lock();
            let Some(fence) = state.active.as_mut() else {
                return;
            };
            if fence.pods.iter().any(|p| p == pod) {
                return;
            }
            fence.pods.push(pod.to_string());
            fence.clone()
        };
        write_json(&self.fence_file, &fence);
    }

    /// Ends the fence in force: the node is back. `moved` are the stopped
    /// pods bound elsewhere now; the others start again here.
    pub fn lift(&self, moved: &[String]) -> Option<SelfFence> {
        let fence = {
            let mut state = self.lock();
            let mut fence = state.active.take()?;
            fence.returned_at = Some(Utc::now());
            let (gone, kept): (Vec<String>, Vec<String>) =
                fence.pods.iter().cloned().partition(|p| moved.contains(p));
            fence.moved = gone;
            fence.restarted = kept;
            fence
        };
        write_json(&self.fence_file, &fence);
        Some(fence)
    }
}

/// Watches the fencing deadline until `shutdown`; past it, stops the ha
/// pods' containers and keeps them stopped while the fence lasts.
pub async fn watch(ctx: Arc<AgentContext>, shutdown: CancellationToken) {
    loop {
        if let Some(fence) = ctx.fence.begin_if_due(boottime()) {
            tracing::warn!(
                silent_seconds = fence.silent_seconds,
                fence_after_seconds = fence.fence_after_seconds,
                "no lease renewal for the fencing period: stopping this node's ha pods (self-fencing)"
            );
        }
        if ctx.fence.is_active() {
            sweep(&ctx).await;
        }
        tokio::select! {
            () = tokio::time::sleep(CHECK) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Stops every live container of every ha pod this node records.
async fn sweep(ctx: &Arc<AgentContext>) {
    let records = ctx.state.load_all().unwrap_or_default();
    for record in records {
        let Ok(spec) = record.pod.typed_spec::<PodSpec>() else {
            continue;
        };
        if spec.availability != Availability::Ha {
            continue;
        }
        let key = record.pod.key();
        ctx.fence
            .stopped(&format!("{}/{}", key.namespace, key.name));
        let grace = Duration::from_secs(
            spec.termination_grace_seconds
                .map_or(STOP_GRACE_SECONDS, u64::from)
                .min(STOP_GRACE_SECONDS),
        );
        for container in record.containers.values() {
            let Some(pid) = container.pid else {
                continue;
            };
            if !matches!(
                corral_runtime::oci::reap::liveness(pid),
                corral_runtime::oci::reap::Liveness::Alive
            ) {
                continue;
            }
            let (runner, spec, container) = (ctx.runner.clone(), spec.clone(), container.clone());
            let halted =
                tokio::task::spawn_blocking(move || runner.halt(&spec, &container, grace)).await;
            match halted {
                Ok(Ok(())) => {
                    tracing::warn!(pod = %key, container = %pid, "fenced: container stopped")
                }
                Ok(Err(error)) => {
                    tracing::error!(pod = %key, error = %crate::chain(&error), "fencing: cannot stop a container");
                }
                Err(error) => tracing::error!(pod = %key, %error, "fencing: stop task failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_225_600 + seconds, 0).unwrap()
    }

    #[test]
    fn a_restarted_agent_keeps_what_is_left_of_its_period() {
        let mark = LeaseMark {
            sent_at: at(0),
            fence_after_seconds: 20,
        };
        assert_eq!(left_at_start(Some(mark), at(5)), Duration::from_secs(15));
        assert_eq!(left_at_start(Some(mark), at(25)), Duration::ZERO);
        // A clock stepped back: never more than the period.
        assert_eq!(left_at_start(Some(mark), at(-100)), Duration::from_secs(20));
        assert_eq!(
            left_at_start(None, at(0)),
            Duration::from_secs(DEFAULT_FENCE_AFTER_SECONDS)
        );
    }

    #[test]
    fn a_fence_begins_past_the_deadline_once_and_lifts_with_what_moved() {
        let dir = tempfile::tempdir().unwrap();
        let fence = Fence::open(dir.path());
        let now = boottime();
        fence.renewed(now, Utc::now(), 5);
        assert!(fence.begin_if_due(now + Duration::from_secs(4)).is_none());
        let begun = fence
            .begin_if_due(now + Duration::from_secs(6))
            .expect("due");
        assert_eq!((begun.silent_seconds, begun.fence_after_seconds), (6, 5));
        assert!(fence.begin_if_due(now + Duration::from_secs(7)).is_none());
        fence.stopped("default/a");
        fence.stopped("default/b");
        fence.stopped("default/a");
        // Kept across a restart of the agent, still in force.
        let reopened = Fence::open(dir.path());
        assert_eq!(
            reopened.active().map(|f| f.pods),
            Some(vec!["default/a".to_string(), "default/b".to_string()])
        );
        let lifted = reopened.lift(&["default/b".to_string()]).expect("lifted");
        assert_eq!(lifted.restarted, vec!["default/a".to_string()]);
        assert_eq!(lifted.moved, vec!["default/b".to_string()]);
        assert!(lifted.returned_at.is_some());
        assert!(!reopened.is_active());
        assert!(
            Fence::open(dir.path()).active().is_none(),
            "lifted for good"
        );
    }

    #[test]
    fn an_older_renewal_never_shortens_a_newer_grant() {
        let dir = tempfile::tempdir().unwrap();
        let fence = Fence::open(dir.path());
        let now = boottime();
        fence.renewed(now + Duration::from_secs(10), Utc::now(), 5);
        fence.renewed(now, Utc::now(), 5);
        assert!(fence.begin_if_due(now + Duration::from_secs(14)).is_none());
        assert!(fence.begin_if_due(now + Duration::from_secs(15)).is_some());
    }
}
