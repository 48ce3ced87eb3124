//! The node's heartbeat: registering its `Node`, renewing its lease, writing
//! its status when what it offers changed, and fencing (stopping pods moved
//! away meanwhile) before it beats again after a silence. Each renewal sets
//! the self-fencing clock ([`crate::fencing`]); back from a self-fence, it
//! lifts the fence once the node is Ready again and reports what it did.

use std::sync::Arc;
use std::time::Duration;

use corral_client::Client;
use tokio_util::sync::CancellationToken;

use crate::fencing::{Fence, boottime};
use crate::{AgentConfig, chain, manager, network, node};

/// How long a node back from a self-fence waits after it is Ready again
/// before it lifts the fence: a scheduler that decided to move an ha pod
/// on the node's silence has written the move by then, so the pod is not
/// started here as well.
const SETTLE: Duration = Duration::from_secs(2);

/// The heartbeat's side of fencing.
#[derive(Debug, Clone)]
pub struct Fencing {
    /// Asks the manager to stop the pods no longer bound here.
    pub fences: tokio::sync::mpsc::Sender<manager::FenceRequest>,
    /// Asks the manager to end a self-fence.
    pub lifts: tokio::sync::mpsc::Sender<manager::LiftRequest>,
    /// The self-fencing clock each renewal sets.
    pub clock: Arc<Fence>,
}

/// Asks the manager to lift the self-fence; `None` if it did not answer
/// in time or no fence was in force.
async fn lift(
    lifts: &tokio::sync::mpsc::Sender<manager::LiftRequest>,
) -> Option<corral_api::fencing::SelfFence> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    lifts.send(reply).await.ok()?;
    tokio::time::timeout(Duration::from_secs(120), answer)
        .await
        .ok()?
        .ok()?
}

/// How often the heartbeat loop looks whether a beat is due.
const BEAT_CHECK: Duration = Duration::from_millis(500);

/// Missing this many heartbeats (frozen, cut off) makes the node fence
/// before its next one.
const FENCE_AFTER_MISSED: u32 = 3;

/// Asks the manager to fence; `None` if it did not answer in time.
async fn fence(fences: &tokio::sync::mpsc::Sender<manager::FenceRequest>) -> Option<usize> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    fences.send(reply).await.ok()?;
    tokio::time::timeout(Duration::from_secs(120), answer)
        .await
        .ok()?
        .ok()
}

/// Registers the node, then renews its lease every `config.heartbeat`
/// (writing its status only when it changed), fencing first when the node
/// missed beats.
pub async fn heartbeat_loop(
    client: Client,
    config: AgentConfig,
    endpoint: Option<String>,
    fencing: Fencing,
    registered: tokio::sync::mpsc::UnboundedSender<corral_api::Object>,
    network: Option<Arc<network::PodNetwork>>,
    shutdown: CancellationToken,
) {
    let mut node = None;
    let mut last_beat: Option<std::time::Instant> = None;
    // The status last written to the Node, without its heartbeat time.
    let mut reported: Option<node::NodeStatus> = None;
    // Back from a self-fence: when the node was first seen Ready again.
    let mut ready_since: Option<std::time::Instant> = None;
    // A lifted fence not yet written to the Node.
    let mut unreported: Option<corral_api::fencing::SelfFence> = None;
    let fences = fencing.fences.clone();
    // Renewals come at least three times per granted period, so one or
    // two lost ones never make the node fence.
    let mut every = config.heartbeat;
    while !shutdown.is_cancelled() {
        // A node returning from silence stops the pods moved away from it
        // before it reports in, so no ha pod runs twice past the grace.
        if last_beat.is_some_and(|at| at.elapsed() >= every * FENCE_AFTER_MISSED) {
            match fence(&fences).await {
                Some(stopped) => {
                    tracing::info!(stopped, "returned from silence: fenced before heartbeating");
                    last_beat = None;
                }
                None => {
                    tokio::select! {
                        () = tokio::time::sleep(BEAT_CHECK) => continue,
                        () = shutdown.cancelled() => return,
                    }
                }
            }
        }
        if last_beat.is_none_or(|at| at.elapsed() >= every) {
            let mut status = node::detect_status(config.address.clone());
            status.agent_endpoint = endpoint.clone();
            status.wireguard = network
                .as_deref()
                .and_then(network::PodNetwork::tunnel)
                .zip(config.address.as_deref().and_then(|a| a.parse().ok()))
                .map(|(tunnel, address)| tunnel.status(address));
            // The node's status is written when it changes; in between,
            // the heartbeat is a lease renewal, which writes no object.
            let offered = node::NodeStatus {
                heartbeat: None,
                ..status.clone()
            };
            let result =
                match &mut node {
                    None => node::register(&client, &config.node, &status).await.map(
                        |registered_node| {
                            // Its join steps start now, not when the watch
                            // brings the Node.
                            let _ = registered.send(registered_node.clone());
                            node = Some(registered_node);
                        },
                    ),
                    Some(object) if reported.as_ref() != Some(&offered) => {
                        node::heartbeat(&client, object, &status).await
                    }
                    Some(_) => Ok(()),
                };
            let result = match result {
                Ok(()) => {
                    reported = Some(offered);
                    // The period runs from the send: the server's renewal
                    // time is never earlier.
                    let (sent, sent_at) = (boottime(), chrono::Utc::now());
                    client.renew_lease(&config.node).await.map(|lease| {
                        let period = lease
                            .fence_after_seconds
                            .unwrap_or(corral_api::fencing::DEFAULT_FENCE_AFTER_SECONDS);
                        fencing.clock.renewed(sent, sent_at, period);
                        every = beat_interval(config.heartbeat, period);
                    })
                }
                Err(error) => Err(error),
            };
            match result {
                Ok(()) => last_beat = Some(std::time::Instant::now()),
                Err(error) => tracing::debug!(error = %chain(&error), "heartbeat failed; retrying"),
            }
        }
        if last_beat.is_some() && fencing.clock.is_active() {
            ready_since = back_from_fence(&client, &config.node, ready_since).await;
            if ready_since.is_some_and(|at| at.elapsed() >= SETTLE)
                && let Some(fence) = lift(&fencing.lifts).await
            {
                tracing::warn!(summary = %fence.summary(), "back from self-fencing");
                // A fence that stopped nothing (no ha pods here) is no news.
                if !fence.pods.is_empty() {
                    unreported = Some(fence);
                }
                ready_since = None;
            }
        }
        if let Some(fence) = &unreported {
            match node::report_fence(&client, &config.node, fence).await {
                Ok(()) => unreported = None,
                Err(error) => {
                    tracing::debug!(error = %chain(&error), "self-fence not reported yet; retrying");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(BEAT_CHECK) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// How often to renew a lease granted for `period` seconds: the configured
/// interval, or a third of the period when that is shorter.
fn beat_interval(configured: Duration, period: u64) -> Duration {
    configured.min(Duration::from_secs(period) / 3)
}

/// Back in contact after a self-fence: since when the node is Ready again
/// (`None` while it is not, or cannot be read).
async fn back_from_fence(
    client: &Client,
    node: &str,
    ready_since: Option<std::time::Instant>,
) -> Option<std::time::Instant> {
    let key = corral_api::ObjectKey::new(corral_api::Kind::Node, None, node);
    let object = client.get(&key).await.ok()?;
    let status: corral_api::kinds::NodeStatus = object.typed_status().ok()?;
    (status.phase == corral_api::kinds::NodePhase::Ready)
        .then(|| ready_since.unwrap_or_else(std::time::Instant::now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_fencing_period_makes_renewals_more_frequent() {
        let five = Duration::from_secs(5);
        assert_eq!(beat_interval(five, 20), five);
        assert_eq!(beat_interval(five, 6), Duration::from_secs(2));
        assert_eq!(beat_interval(five, 3), Duration::from_secs(1));
    }
}
