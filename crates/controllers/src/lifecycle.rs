//! The node-lifecycle controller (owns a Node's `status.phase` and
//! `status.silentSince`): a node is Ready once its join workflow succeeded
//! and while its heartbeat is fresh, Silent after missed heartbeats, and
//! Lost when an operator forgets it (`spec.forgotten`) or after it has been
//! silent for [`Timing::lost_after`]. A Lost node that heartbeats again
//! (and is not forgotten) is Ready again: its pods moved meanwhile, and its
//! agent stops the copies no longer bound to it.
//!
//! While a node is Silent it also owns `status.fencedBy`: when the node has
//! surely stopped its `availability: ha` pods by itself — its last lease
//! renewal plus the fencing period that renewal granted plus the margins
//! of [`corral_api::fencing::replace_after`]. The scheduler moves ha pods
//! only after it.

use chrono::{DateTime, Duration, Utc};
use corral_api::kinds::{NodePhase, NodeSpec, NodeStatus};
use corral_api::workflow::{StoredWorkflows, WorkflowOutcome};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::runtime::{self, Action, Change, Informer, Scope, WorkQueue};
use corral_client::{Client, ClientError};
use tokio_util::sync::CancellationToken;

/// A node whose last heartbeat is older than this is Silent.
pub const SILENT_AFTER_SECONDS: i64 = 20;

/// The clocks of node loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// No heartbeat for this long: Silent.
    pub silent_after: Duration,
    /// Silent for this long: Lost (default 7 days).
    pub lost_after: Duration,
    /// `availability: ha` pods on a node Silent this long are placed
    /// elsewhere (default 30 s), never before its `fencedBy`.
    pub ha_grace: Duration,
    /// The fencing period each lease renewal grants: a node that cannot
    /// renew for this long stops its ha pods itself (default 20 s).
    pub fence_after: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            silent_after: Duration::seconds(SILENT_AFTER_SECONDS),
            lost_after: Duration::days(7),
            ha_grace: Duration::seconds(30),
            fence_after: Duration::seconds(
                i64::try_from(corral_api::fencing::DEFAULT_FENCE_AFTER_SECONDS).unwrap_or(20),
            ),
        }
    }
}

/// Keeps every node's phase until `shutdown`: a node is looked at when it
/// changes and again when its next deadline (silence, loss) comes.
pub async fn run(client: Client, timing: Timing, shutdown: CancellationToken) {
    let nodes = Informer::start(
        client.clone(),
        Scope::all(Kind::Node),
        Vec::new(),
        shutdown.clone(),
    );
    nodes.synced().await;
    let queue = WorkQueue::new();
    let (existing, changed) = (queue.clone(), queue.clone());
    nodes.on_change(
        move |key, _| existing.add(key.clone()),
        move |change| {
            if let Change::Applied { key, .. } = change {
                changed.add((*key).clone());
            }
        },
    );
    let cache = nodes.cache().clone();
    let started = Utc::now();
    runtime::run(
        "node-lifecycle",
        queue,
        1,
        shutdown,
        move |key: ObjectKey| {
            let (client, cache) = (client.clone(), cache.clone());
            async move {
                match cache.get(&key) {
                    Some(node) => reconcile(&client, &node, started, timing).await,
                    None => Ok(Action::Done),
                }
            }
        },
    )
    .await;
}

/// The phase a node should have now, and since when it is silent. Pure.
/// `last_seen` is the newest sign of life: the node's lease renewal, its
/// status heartbeat, or the controller's own start (a node gets a full
/// grace after the control plane restarts).
pub fn phase(
    node: &Object,
    last_seen: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    timing: Timing,
) -> (NodePhase, Option<DateTime<Utc>>) {
    let mut status: NodeStatus = node.typed_status().unwrap_or_default();
    status.heartbeat = status.heartbeat.max(last_seen);
    let spec: NodeSpec = node.typed_spec().unwrap_or_default();
    let joined = StoredWorkflows::of(&node.status).is_ok_and(|w| {
        w.instances
            .iter()
            .any(|i| i.workflow == "join" && i.outcome == WorkflowOutcome::Succeeded)
    });
    let fresh = status
        .heartbeat
        .is_some_and(|beat| now - beat < timing.silent_after);
    let silent_since = || status.silent_since.or(status.heartbeat).or(Some(now));
    if spec.forgotten {
        return (NodePhase::Lost, silent_since());
    }
    match (joined, fresh) {
        (false, _) => (NodePhase::Joining, None),
        (true, true) => (NodePhase::Ready, None),
        (true, false) => {
            let since = silent_since();
            let lost = since.is_some_and(|since| now - since >= timing.lost_after);
            let phase = if lost || status.phase == NodePhase::Lost {
                NodePhase::Lost
            } else {
                NodePhase::Silent
            };
            (phase, since)
        }
    }
}

/// Writes the node's phase if it is not what the clock says, and asks to
/// look again when it would change next.
pub async fn reconcile(
    client: &Client,
    node: &Object,
    started: DateTime<Utc>,
    timing: Timing,
) -> Result<Action, ClientError> {
    let now = Utc::now();
    let lease = client.lease(&node.metadata.name).await?;
    let last_seen = lease
        .as_ref()
        .map(|lease| lease.renewed_at)
        .max(Some(started));
    let status: NodeStatus = node.typed_status().unwrap_or_default();
    let (next, silent_since) = phase(node, last_seen, now, timing);
    let fenced_by = (next == NodePhase::Silent).then(|| fenced_by(lease.as_ref(), started, timing));
    let again = next_change(
        status.heartbeat.max(last_seen),
        next,
        silent_since,
        now,
        timing,
    );
    if next == status.phase && silent_since == status.silent_since && fenced_by == status.fenced_by
    {
        return Ok(again);
    }
    let mut current = node.clone();
    if !current.status.is_object() {
        current.status = serde_json::json!({});
    }
    current.status["phase"] = serde_json::to_value(next).unwrap_or_default();
    match silent_since {
        Some(since) => {
            current.status["silentSince"] = serde_json::to_value(since).unwrap_or_default()
        }
        None => {
            if let Some(map) = current.status.as_object_mut() {
                map.remove("silentSince");
            }
        }
    }
    match fenced_by {
        Some(by) => current.status["fencedBy"] = serde_json::to_value(by).unwrap_or_default(),
        None => {
            if let Some(map) = current.status.as_object_mut() {
                map.remove("fencedBy");
            }
        }
    }
    client.put_status(&current).await?;
    tracing::info!(node = %current.metadata.name, phase = ?next, ?fenced_by, "node phase");
    Ok(again)
}

/// When a silent node has surely stopped its ha pods itself: its last
/// renewal plus the period that renewal granted, plus the margins. The
/// controller's own start, with the period it would grant, stands in for
/// a renewal too (the later wins): a store that keeps no leases across a
/// restart (SQLite) has none, and a node gets a full period after the
/// control plane restarts, as it gets a full silence. Pure.
pub fn fenced_by(
    lease: Option<&corral_client::Lease>,
    started: DateTime<Utc>,
    timing: Timing,
) -> DateTime<Utc> {
    let since_start = corral_api::fencing::replace_after(started, timing.fence_after);
    let Some(lease) = lease else {
        return since_start;
    };
    let granted = lease
        .fence_after_seconds
        .and_then(|s| i64::try_from(s).ok())
        .map_or(timing.fence_after, Duration::seconds);
    corral_api::fencing::replace_after(lease.renewed_at, granted).max(since_start)
}

/// When the node's phase would change next with no word from it: Ready
/// turns Silent when its heartbeat gets old, Silent turns Lost.
fn next_change(
    heartbeat: Option<DateTime<Utc>>,
    phase: NodePhase,
    silent_since: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    timing: Timing,
) -> Action {
    let at = match phase {
        NodePhase::Ready => heartbeat.map(|beat| beat + timing.silent_after),
        NodePhase::Silent => silent_since.map(|since| since + timing.lost_after),
        _ => None,
    };
    match at {
        Some(at) => Action::RequeueAfter(
            (at - now)
                .to_std()
                .unwrap_or_default()
                .max(std::time::Duration::from_millis(100)),
        ),
        None => Action::Done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_225_600 + seconds, 0).unwrap()
    }

    fn node(heartbeat: i64, forgotten: bool, phase: &str) -> Object {
        let mut node = Object::new(Kind::Node, None, "n1", json!({"forgotten": forgotten}));
        node.status = json!({
            "phase": phase,
            "heartbeat": at(heartbeat),
            "workflow": {"instances": [{
                "id": "join-1", "workflow": "join", "revision": 1, "definition": "node-join-x",
                "outcome": "succeeded", "startedAt": at(0)
            }]}
        });
        node
    }

    #[test]
    fn ready_silent_lost_by_the_clock() {
        let timing = Timing {
            lost_after: Duration::seconds(100),
            ..Timing::default()
        };
        let fresh = node(0, false, "Ready");
        let joined = phase(&fresh, None, at(5), timing);
        assert_eq!(joined, (NodePhase::Ready, None));
        assert_eq!(
            phase(&fresh, None, at(25), timing),
            (NodePhase::Silent, Some(at(0)))
        );
        assert_eq!(
            phase(&fresh, None, at(100), timing),
            (NodePhase::Lost, Some(at(0)))
        );
    }

    #[test]
    fn a_silent_node_is_fenced_by_its_last_grant_plus_the_margins() {
        let timing = Timing::default();
        let lease = |renewed: i64, grant: Option<u64>| corral_client::Lease {
            node: "n1".into(),
            holder: "n1".into(),
            renewed_at: at(renewed),
            fence_after_seconds: grant,
        };
        let margin = corral_api::fencing::margin;
        // The grant the lease records, not today's setting.
        assert_eq!(
            fenced_by(Some(&lease(10, Some(5))), at(-100), timing),
            at(15) + margin(Duration::seconds(5))
        );
        // A lease of an older server: today's setting.
        assert_eq!(
            fenced_by(Some(&lease(10, None)), at(-100), timing),
            at(10) + timing.fence_after + margin(timing.fence_after)
        );
        // No lease since the controller started: its start stands in.
        assert_eq!(
            fenced_by(None, at(50), timing),
            at(50) + timing.fence_after + margin(timing.fence_after)
        );
        // A controller that started after the renewal gives a full period.
        assert_eq!(
            fenced_by(Some(&lease(10, Some(5))), at(50), timing),
            at(50) + timing.fence_after + margin(timing.fence_after)
        );
        // A grant longer than today's setting still counts in full.
        assert_eq!(
            fenced_by(Some(&lease(10, Some(600))), at(50), timing),
            at(610) + margin(Duration::seconds(600))
        );
    }

    #[test]
    fn a_forgotten_node_is_lost_at_once() {
        let forgotten = node(0, true, "Ready");
        assert_eq!(
            phase(&forgotten, None, at(1), Timing::default()).0,
            NodePhase::Lost
        );
    }

    #[test]
    fn a_lost_node_stays_lost_while_silent_and_returns_when_it_beats() {
        let lost = node(0, false, "Lost");
        assert_eq!(
            phase(&lost, None, at(25), Timing::default()).0,
            NodePhase::Lost
        );
        let back = node(30, false, "Lost");
        assert_eq!(
            phase(&back, None, at(31), Timing::default()),
            (NodePhase::Ready, None)
        );
    }
}
