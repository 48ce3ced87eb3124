//! The IPAM controller: a /64 of the cluster prefix for every joining node
//! (`status.prefix`), and one random address of its node's /64 for every
//! pod (`status.address`), unique on that node and kept across in-place
//! updates because the pod object, and so its status, stays.

use std::collections::BTreeSet;
use std::net::Ipv6Addr;

use corral_api::kinds::{NodeStatus, PodStatus};
use corral_api::workflow::{StepActionKind, StepActionRequest};
use corral_api::{Kind, Object};
use corral_client::{Client, ClientError};
use corral_net::ipam::{ClusterPrefix, allocate_pod_address};
use ipnet::Ipv6Net;
use tokio_util::sync::CancellationToken;

use crate::steps::ready_instance;

pub const PREFIX_STEP: &str = "ipam/assign-prefix";
pub const ADDRESS_STEP: &str = "ipam/assign-address";

pub async fn run(
    client: Client,
    prefix: ClusterPrefix,
    feed: crate::ChangeFeed,
    shutdown: CancellationToken,
) {
    crate::run_loop("ipam", feed, shutdown, || round(&client, &prefix)).await;
}

fn action(kind: StepActionKind, step: &str, workflow: &str) -> StepActionRequest {
    let mut request = StepActionRequest::new(kind, step);
    request.workflow = Some(workflow.to_string());
    request
}

/// Claims `step`, runs `work` (which writes the status field and returns
/// the note), and completes or fails the step with its outcome.
async fn execute<F, Fut>(
    client: &Client,
    object: &Object,
    step: &str,
    workflow: &str,
    work: F,
) -> Result<(), ClientError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Result<String, String>, ClientError>>,
{
    let key = object.key();
    client
        .step_action(&key, &action(StepActionKind::Claim, step, workflow))
        .await?;
    let outcome = match work().await {
        Ok(outcome) => outcome,
        Err(error) => Err(format!("the API refused the write: {error}")),
    };
    let report = match outcome {
        Ok(note) => {
            let mut done = action(StepActionKind::Complete, step, workflow);
            done.note = Some(note);
            done
        }
        Err(error) => {
            let mut fail = action(StepActionKind::Fail, step, workflow);
            fail.error = Some(error);
            fail
        }
    };
    client.step_action(&key, &report).await?;
    Ok(())
}

/// One pass over nodes and pods.
pub async fn round(client: &Client, prefix: &ClusterPrefix) -> Result<(), ClientError> {
    let nodes = client.list(Kind::Node, None, None).await?.items;
    for node in &nodes {
        if let Some(workflow) = ready_instance(node, PREFIX_STEP) {
            let taken: BTreeSet<Ipv6Net> = nodes
                .iter()
                .filter_map(|n| n.typed_status::<NodeStatus>().ok()?.prefix?.parse().ok())
                .collect();
            execute(client, node, PREFIX_STEP, &workflow, || async {
                let current = client.get(&node.key()).await?;
                let existing = current
                    .typed_status::<NodeStatus>()
                    .ok()
                    .and_then(|s| s.prefix);
                if let Some(existing) = existing {
                    return Ok(Ok(existing));
                }
                let subnet = match prefix.allocate_node_subnet(&taken, &mut rand::rng()) {
                    Ok(subnet) => subnet.to_string(),
                    Err(error) => return Ok(Err(error.to_string())),
                };
                crate::steps::set_status_field(
                    client,
                    &node.key(),
                    "prefix",
                    subnet.clone().into(),
                )
                .await?;
                Ok(Ok(subnet))
            })
            .await?;
            // The taken set is now stale: the next prefix waits for the next
            // round, which the write just triggered.
            return Ok(());
        }
    }
    // Pods and VMs share their node's /64.
    let mut pods = client.list(Kind::Pod, None, None).await?.items;
    pods.extend(client.list(Kind::VirtualMachine, None, None).await?.items);
    // One address per node per round, for the same reason.
    let mut served_nodes = BTreeSet::new();
    for pod in &pods {
        let Some(workflow) = ready_instance(pod, ADDRESS_STEP) else {
            continue;
        };
        let status: PodStatus = pod.typed_status().unwrap_or_default();
        if !served_nodes.insert(status.node.clone()) {
            continue;
        }
        let node_prefix = status.node.as_ref().and_then(|node_name| {
            nodes
                .iter()
                .find(|n| n.metadata.name == *node_name)
                .and_then(|n| {
                    n.typed_status::<NodeStatus>()
                        .ok()?
                        .prefix?
                        .parse::<Ipv6Net>()
                        .ok()
                })
        });
        let taken: BTreeSet<Ipv6Addr> = pods
            .iter()
            .filter_map(|p| p.typed_status::<PodStatus>().ok())
            .filter(|s| s.node == status.node)
            .filter_map(|s| s.address?.parse().ok())
            .collect();
        execute(client, pod, ADDRESS_STEP, &workflow, || async {
            // An address kept across in-place updates; a pod that moved
            // to another node gets a new one in that node's /64.
            if let Some(address) = status.address.clone()
                && address
                    .parse::<Ipv6Addr>()
                    .is_ok_and(|a| node_prefix.is_none_or(|p| p.contains(&a)))
            {
                return Ok(Ok(address));
            }
            let Some(subnet) = node_prefix else {
                return Ok(Err(format!(
                    "node {} has no /64 yet (its join workflow's {PREFIX_STEP} is not done)",
                    status.node.as_deref().unwrap_or("?")
                )));
            };
            let address = match allocate_pod_address(subnet, &taken, &mut rand::rng()) {
                Ok(address) => address.to_string(),
                Err(error) => return Ok(Err(error.to_string())),
            };
            crate::steps::set_status_field(client, &pod.key(), "address", address.clone().into())
                .await?;
            Ok(Ok(address))
        })
        .await?;
    }
    Ok(())
}
