//! Self-fencing: the promise a node's lease carries, and when the control
//! plane may rely on it. Pure.
//!
//! Every lease renewal grants the node a fencing period (`fenceAfter`). A
//! node that cannot renew for that long — timed on its own monotonic clock
//! (`CLOCK_BOOTTIME`, which keeps counting while the machine sleeps) from
//! the moment it *sent* its last successful renewal — stops its
//! `availability: ha` pods by itself, while still cut off. The control plane
//! replaces them only after [`replace_after`]: the lease's renewal time (its
//! own clock, never earlier than the node's send) plus the period, a rate
//! margin for a node clock that runs slow ([`RATE_MARGIN_PER_MILLE`]), the
//! time the node may take to stop them ([`STOP_BUDGET_SECONDS`]) and a fixed
//! margin for servers of one cluster whose clocks disagree
//! ([`SERVER_SKEW_SECONDS`]). Wall-clock skew between node and server does
//! not enter: the node only measures a duration.

use chrono::{DateTime, Duration, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The fencing period a server grants when none is configured (seconds):
/// the time after which a node is Silent by default.
pub const DEFAULT_FENCE_AFTER_SECONDS: u64 = 20;

/// How much slower than the server's a node's monotonic clock may run,
/// per mille (1 %: a crystal drifts 0.01 %; this covers a throttled VM's
/// clock too).
pub const RATE_MARGIN_PER_MILLE: i64 = 10;

/// How long a fencing node may take from its deadline until its ha pods
/// are stopped: its check interval, the capped grace [`STOP_GRACE_SECONDS`]
/// and the runtime's kill and delete.
pub const STOP_BUDGET_SECONDS: i64 = 5;

/// The longest SIGTERM grace a fencing node gives a container before it
/// kills it (a pod's own `terminationGraceSeconds` when shorter).
pub const STOP_GRACE_SECONDS: u64 = 3;

/// How far the clocks of two servers of one cluster may disagree (one
/// renews the lease, another leads the controllers).
pub const SERVER_SKEW_SECONDS: i64 = 2;

/// When a node whose lease was last renewed at `renewed_at` with a
/// fencing period of `fence_after` has surely stopped its ha pods.
pub fn replace_after(renewed_at: DateTime<Utc>, fence_after: Duration) -> DateTime<Utc> {
    renewed_at + fence_after + margin(fence_after)
}

/// What [`replace_after`] adds to the fencing period.
pub fn margin(fence_after: Duration) -> Duration {
    // A clock that runs r slow counts the period in period / (1 - r):
    // the extra is period * r / (1 - r), rounded up to the millisecond.
    let slack = 1000 - RATE_MARGIN_PER_MILLE;
    let rate = Duration::milliseconds(
        (fence_after.num_milliseconds() * RATE_MARGIN_PER_MILLE + slack - 1) / slack,
    );
    rate + Duration::seconds(STOP_BUDGET_SECONDS + SERVER_SKEW_SECONDS)
}

/// What a node did when it fenced itself, as it reports it on return
/// (`Node:status.lastFence`, and a revision in the node's history).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelfFence {
    /// When the node stopped its ha pods (its own clock).
    pub at: DateTime<Utc>,
    /// How long it had been unable to renew its lease then, in seconds.
    pub silent_seconds: u64,
    /// The fencing period of its last lease, in seconds.
    pub fence_after_seconds: u64,
    /// The pods it stopped (`namespace/name`).
    #[serde(default)]
    pub pods: Vec<String>,
    /// When it reached the control plane again; absent while cut off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned_at: Option<DateTime<Utc>>,
    /// The stopped pods it started again on return (still bound to it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarted: Vec<String>,
    /// The stopped pods moved to another node meanwhile (not started again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<String>,
}

impl SelfFence {
    /// The sentence for the node's history and `why node/NAME`.
    pub fn summary(&self) -> String {
        let pods = if self.pods.is_empty() {
            "no ha pods ran".to_string()
        } else {
            format!("stopped its ha pods {}", self.pods.join(", "))
        };
        let mut text = format!(
            "fenced itself at {}: no lease renewal for {}s (fencing period {}s), {pods}",
            self.at.format("%H:%M:%S UTC"),
            self.silent_seconds,
            self.fence_after_seconds
        );
        if let Some(back) = self.returned_at {
            text.push_str(&format!("; back at {}", back.format("%H:%M:%S UTC")));
        }
        if !self.restarted.is_empty() {
            text.push_str(&format!(
                "; started again here (not moved): {}",
                self.restarted.join(", ")
            ));
        }
        if !self.moved.is_empty() {
            text.push_str(&format!(
                "; moved meanwhile, not started again: {}",
                self.moved.join(", ")
            ));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_225_600 + seconds, 0).unwrap()
    }

    #[test]
    fn the_replace_deadline_adds_rate_stop_and_server_margins() {
        // 20 s: 203 ms of rate, 5 s to stop, 2 s between servers.
        assert_eq!(
            replace_after(at(0), Duration::seconds(20)),
            at(27) + Duration::milliseconds(203)
        );
        // A 3 s period: 31 ms of rate.
        assert_eq!(margin(Duration::seconds(3)), Duration::milliseconds(7_031));
        // Rounded up, never down.
        assert_eq!(
            margin(Duration::milliseconds(1)),
            Duration::milliseconds(7_001)
        );
    }

    #[test]
    fn the_margin_covers_a_node_clock_one_percent_slow() {
        for seconds in [1, 5, 20, 300, 3600, 86_400] {
            let period = Duration::seconds(seconds);
            // Real time the node needs to count `period` at 99 % speed,
            // plus its stop budget.
            let node_done = period * 100 / 99 + Duration::seconds(STOP_BUDGET_SECONDS);
            assert!(
                at(0) + node_done <= replace_after(at(0), period),
                "{seconds}s"
            );
        }
    }

    #[test]
    fn the_summary_says_what_the_node_did() {
        let fence = SelfFence {
            at: at(25),
            silent_seconds: 21,
            fence_after_seconds: 20,
            pods: vec!["default/ha".into()],
            returned_at: Some(at(60)),
            restarted: vec![],
            moved: vec!["default/ha".into()],
        };
        assert_eq!(
            fence.summary(),
            "fenced itself at 00:00:25 UTC: no lease renewal for 21s (fencing period 20s), stopped its ha pods default/ha; back at 00:01:00 UTC; moved meanwhile, not started again: default/ha"
        );
    }
}
