//! The node's own `join` workflow: its node steps (register, tunnel,
//! routes, egress, runtime check) run by the same executor as pods and VMs
//! ([`crate::executor`]), fed by the informer of `Node` objects, so each
//! step starts as soon as the change that made it ready arrives. When the
//! node's `Node` is deleted (drained, design 0030) the node has left the
//! cluster: its heartbeat stops, so it does not register the node again
//! until the agent starts again.

use std::sync::Arc;

use async_trait::async_trait;
use corral_api::kinds::NodeStatus;
use corral_api::{Kind, Object, ObjectKey};
use corral_client::Client;
use corral_client::runtime::{Change, Informer};
use corral_workflow::JoinStep;
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::executor::{Executor, Message, StepOutcome, StepRun, Workload};
use crate::network::PodNetwork;
use crate::steps::{NodeWork, StepApi};

/// The node's join steps, as the executor runs them.
#[derive(Debug)]
pub struct JoinWorkload {
    node: Object,
    client: Client,
    network: Option<Arc<PodNetwork>>,
}

/// Where the node's `Node` objects reach the join steps: the heartbeat
/// sends the one it registered (so the first step starts at once), the
/// informer every later change.
pub fn channel() -> (
    mpsc::UnboundedSender<Object>,
    mpsc::UnboundedReceiver<Object>,
) {
    mpsc::unbounded_channel()
}

/// Runs the join steps of node `name` as its `Node` arrives through
/// `received` (see [`channel`]; `changes` is its sending end, given to the
/// `nodes` informer) until the agent stops. The deletion of the node's
/// `Node` cancels `heartbeat`.
pub async fn follow(
    name: String,
    nodes: Informer,
    (changes, mut received): (
        mpsc::UnboundedSender<Object>,
        mpsc::UnboundedReceiver<Object>,
    ),
    client: Client,
    api: Arc<dyn StepApi>,
    network: Option<Arc<PodNetwork>>,
    heartbeat: CancellationToken,
) {
    let own = ObjectKey::new(Kind::Node, None, &name);
    {
        let existing = changes.clone();
        let own_existing = own.clone();
        nodes.on_change(
            |key, node| {
                if *key == own_existing {
                    let _ = existing.send(node.clone());
                }
            },
            move |change| match change {
                Change::Applied { key, object, .. } if **key == own => {
                    // A closed channel means the agent stopped.
                    let _ = changes.send((*object).clone());
                }
                Change::Deleted { key, .. } if **key == own && !heartbeat.is_cancelled() => {
                    tracing::info!(node = %key.name, "the node was deleted: left the cluster; its heartbeat stops until the agent starts again");
                    heartbeat.cancel();
                }
                _ => {}
            },
        );
    }
    let Some(first) = received.recv().await else {
        return;
    };
    let (messages, inbox) = mpsc::channel(16);
    let workload = JoinWorkload {
        node: first,
        client,
        network,
    };
    tokio::spawn(Executor::new(workload, api).run(inbox));
    while let Some(node) = received.recv().await {
        if messages
            .send(Message::Desired(Box::new(node)))
            .await
            .is_err()
        {
            return;
        }
    }
}

#[async_trait]
impl Workload for JoinWorkload {
    fn desired(&self) -> &Object {
        &self.node
    }

    fn desired_mut(&mut self) -> &mut Object {
        &mut self.node
    }

    /// A node has no revision to admit without its join workflow.
    async fn admit_without_workflow(&mut self) {}

    /// The runtime check and the egress rules need nothing of the others:
    /// they run beside the tunnel and the routes.
    fn is_detached(&self, step: &str) -> bool {
        matches!(
            step.parse::<JoinStep>(),
            Ok(JoinStep::CheckRuntime | JoinStep::ConfigureEgress)
        )
    }

    fn detach(&mut self, step: &str, _work: &NodeWork) -> BoxFuture<'static, StepRun> {
        let (node, client, network) =
            (self.node.clone(), self.client.clone(), self.network.clone());
        let Ok(typed) = step.parse::<JoinStep>() else {
            let error = format!("this node does not know step {step}");
            return Box::pin(std::future::ready(StepOutcome::Failed(error).into()));
        };
        Box::pin(async move {
            StepRun::from(
                join_step(typed, &node, &client, network.as_deref())
                    .await
                    .map(Some),
            )
        })
    }

    async fn run_step(&mut self, step: &str, _work: &NodeWork) -> StepRun {
        let Ok(typed) = step.parse::<JoinStep>() else {
            return StepOutcome::Failed(format!("this node does not know step {step}")).into();
        };
        // Registered means what the node offers is in the API: the
        // heartbeat's first status write, which the informer brings here.
        if typed == JoinStep::Register && self.node.status.get("capacity").is_none() {
            return StepOutcome::NotYet.into();
        }
        let outcome = join_step(typed, &self.node, &self.client, self.network.as_deref()).await;
        StepRun::from(outcome.map(Some))
    }

    /// Only news of the Node moves its join steps.
    fn tick(&self) -> Option<std::time::Duration> {
        None
    }
}

/// Every Node, and where each VM's guest runs: what the routes to other
/// nodes and to live-migrated VMs' addresses are made from.
async fn nodes_and_vm_places(
    client: &Client,
) -> Result<(Vec<Object>, Vec<crate::network::VmPlace>), String> {
    let nodes = client
        .list(Kind::Node, None, None)
        .await
        .map_err(|error| crate::chain(&error))?;
    let vms = client
        .list(Kind::VirtualMachine, None, None)
        .await
        .map_err(|error| crate::chain(&error))?
        .items
        .iter()
        .filter_map(crate::network::VmPlace::of)
        .collect();
    Ok((nodes.items, vms))
}

async fn join_step(
    step: JoinStep,
    node: &Object,
    client: &Client,
    network: Option<&PodNetwork>,
) -> Result<String, String> {
    let status: NodeStatus = node.typed_status().unwrap_or_default();
    match step {
        JoinStep::Register => Ok(format!(
            "{} cpu, {} memory, runtimes {:?}",
            status.capacity.cpu, status.capacity.memory, status.runtimes
        )),
        JoinStep::ConfigureRoutes => {
            // The stored object may predate the prefix IPAM just wrote.
            let fresh = client
                .get(&node.key())
                .await
                .map_err(|error| crate::chain(&error))?;
            let prefix = fresh
                .typed_status::<NodeStatus>()
                .ok()
                .and_then(|s| s.prefix)
                .unwrap_or_else(|| "?".to_string());
            let Some(network) = network else {
                return Ok(format!(
                    "node prefix {prefix}; no pod network on this node (pods have loopback only)"
                ));
            };
            // Live-migrated VMs' addresses too, so the routes loop finds
            // nothing of theirs to put back.
            let (nodes, vms) = nodes_and_vm_places(client).await?;
            let (routes, _) = network
                .reconcile_routes(&node.metadata.name, &nodes, &vms)
                .await
                .map_err(|error| crate::chain(&error))?;
            Ok(format!(
                "node prefix {prefix}; routes: {}",
                crate::network::describe(&routes)
            ))
        }
        JoinStep::ConfigureTunnel => {
            let Some(tunnel) = network.and_then(PodNetwork::tunnel) else {
                return Ok("no tunnel (no --wireguard): plain routing to other nodes".to_string());
            };
            let (nodes, vms) = nodes_and_vm_places(client).await?;
            let moved = crate::network::vm_routes::moved_addresses(&nodes, &vms);
            let peers = tunnel
                .reconcile(&node.metadata.name, &nodes, &moved)
                .await
                .map_err(|error| crate::chain(&error))?;
            Ok(tunnel.describe(&peers.0))
        }
        JoinStep::ConfigureEgress => match network {
            Some(network) => network
                .configure_node()
                .await
                .map_err(|error| crate::chain(&error)),
            None => Ok("no pod network on this node (pods have loopback only)".to_string()),
        },
        JoinStep::CheckRuntime => {
            let output = tokio::task::spawn_blocking(|| {
                // The agent reaps orphans; hold the lock so our own child
                // is not taken.
                let _spawning = corral_runtime::oci::reap::spawn_lock();
                std::process::Command::new("runc").arg("--version").output()
            })
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| format!("cannot run runc: {error}"))?;
            let version = String::from_utf8_lossy(&output.stdout);
            let first = version.lines().next().unwrap_or("runc").to_string();
            if output.status.success() {
                Ok(first)
            } else {
                Err(format!(
                    "runc --version failed: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ))
            }
        }
    }
}
