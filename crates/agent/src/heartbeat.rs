//! The node's heartbeat: registering its `Node`, renewing its lease, writing
//! its status when what it offers changed, and fencing (stopping pods moved
//! away meanwhile) before it beats again after a silence.

use std::sync::Arc;
use std::time::Duration;

use corral_client::Client;
use tokio_util::sync::CancellationToken;

use crate::{AgentConfig, chain, manager, network, node};

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
    fences: tokio::sync::mpsc::Sender<manager::FenceRequest>,
    registered: tokio::sync::mpsc::UnboundedSender<corral_api::Object>,
    network: Option<Arc<network::PodNetwork>>,
    shutdown: CancellationToken,
) {
    let mut node = None;
    let mut last_beat: Option<std::time::Instant> = None;
    // The status last written to the Node, without its heartbeat time.
    let mut reported: Option<node::NodeStatus> = None;
    while !shutdown.is_cancelled() {
        // A node returning from silence stops the pods moved away from it
        // before it reports in, so no ha pod runs twice past the grace.
        if last_beat.is_some_and(|at| at.elapsed() >= config.heartbeat * FENCE_AFTER_MISSED) {
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
        if last_beat.is_none_or(|at| at.elapsed() >= config.heartbeat) {
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
                    client.renew_lease(&config.node).await.map(|_| ())
                }
                Err(error) => Err(error),
            };
            match result {
                Ok(()) => last_beat = Some(std::time::Instant::now()),
                Err(error) => tracing::debug!(error = %chain(&error), "heartbeat failed; retrying"),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(BEAT_CHECK) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
