//! The node-lifecycle controller (owns a Node's `status.phase` and
//! `status.silentSince`): a node is Ready once its join workflow succeeded
//! and while its heartbeat is fresh, Silent after missed heartbeats.

use chrono::{DateTime, Duration, Utc};
use corral_api::kinds::{NodePhase, NodeStatus};
use corral_api::workflow::{WorkflowOutcome, WorkflowStatus};
use corral_api::{Kind, Object};
use corral_client::{Client, ClientError};
use tokio_util::sync::CancellationToken;

/// A node whose last heartbeat is older than this is Silent.
pub const SILENT_AFTER_SECONDS: i64 = 20;

pub async fn run(client: Client, feed: crate::ChangeFeed, shutdown: CancellationToken) {
    crate::run_loop("node-lifecycle", feed, shutdown, || round(&client)).await;
}

/// The phase a node should have now. Pure.
pub fn phase(node: &Object, now: DateTime<Utc>) -> (NodePhase, Option<DateTime<Utc>>) {
    let status: NodeStatus = node.typed_status().unwrap_or_default();
    if status.phase == NodePhase::Lost {
        return (NodePhase::Lost, status.silent_since);
    }
    let joined = node
        .status
        .get("workflow")
        .and_then(|w| serde_json::from_value::<WorkflowStatus>(w.clone()).ok())
        .is_some_and(|w| {
            w.instances
                .iter()
                .any(|i| i.workflow == "join" && i.outcome == WorkflowOutcome::Succeeded)
        });
    let fresh = status
        .heartbeat
        .is_some_and(|beat| now - beat < Duration::seconds(SILENT_AFTER_SECONDS));
    match (joined, fresh) {
        (false, _) => (NodePhase::Joining, None),
        (true, true) => (NodePhase::Ready, None),
        (true, false) => (
            NodePhase::Silent,
            status.silent_since.or(status.heartbeat).or(Some(now)),
        ),
    }
}

pub async fn round(client: &Client) -> Result<(), ClientError> {
    let now = Utc::now();
    for node in client.list(Kind::Node, None, None).await?.items {
        let status: NodeStatus = node.typed_status().unwrap_or_default();
        let (next, silent_since) = phase(&node, now);
        if next == status.phase && silent_since == status.silent_since {
            continue;
        }
        let mut current = node;
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
        // One node's conflict (a heartbeat just landed) must not hold up the rest.
        match client.put_status(&current).await {
            Ok(_) => tracing::info!(node = %current.metadata.name, phase = ?next, "node phase"),
            Err(error) => {
                tracing::debug!(node = %current.metadata.name, %error, "phase not written; next round")
            }
        }
    }
    Ok(())
}
