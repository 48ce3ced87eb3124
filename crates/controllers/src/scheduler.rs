//! The scheduler controller: places pods and VirtualMachines whose `scheduler/place` step is
//! ready, writing `status.node`, or fails the step with one reason per node.
//! It also unbinds pods that must leave a silent or lost node
//! ([`crate::evacuate`]): clearing `status.node` makes the server begin the
//! pod's `move` workflow, whose `scheduler/place` then places it elsewhere.

use std::collections::BTreeMap;

use corral_api::kinds::{NodeStatus, PodSpec, PodStatus};
use corral_api::workflow::{StepActionKind, StepActionRequest, WorkflowOutcome, WorkflowStatus};
use corral_api::{Kind, Object};
use corral_client::{Client, ClientError};
use corral_scheduler::{Request, Scheduler, Snapshot, Strategy};
use tokio_util::sync::CancellationToken;

use crate::evacuate::{Departure, NodeState, departure};
use crate::steps::ready_instance;

pub const STEP: &str = "scheduler/place";

pub async fn run(
    client: Client,
    timing: crate::lifecycle::Timing,
    feed: crate::ChangeFeed,
    shutdown: CancellationToken,
) {
    crate::run_loop("scheduler", feed, shutdown, || async {
        evacuate(&client, timing).await?;
        round(&client).await
    })
    .await;
}

/// Unbinds every pod that must leave its node now.
pub async fn evacuate(
    client: &Client,
    timing: crate::lifecycle::Timing,
) -> Result<(), ClientError> {
    let pods = client.list(Kind::Pod, None, None).await?.items;
    let bound: Vec<(Object, String)> = pods
        .into_iter()
        .filter_map(|pod| {
            let node = pod.typed_status::<PodStatus>().ok()?.node?;
            Some((pod, node))
        })
        .collect();
    if bound.is_empty() {
        return Ok(());
    }
    let nodes: BTreeMap<String, NodeState> = client
        .list(Kind::Node, None, None)
        .await?
        .items
        .iter()
        .map(|node| {
            let status: NodeStatus = node.typed_status().unwrap_or_default();
            let state = NodeState {
                phase: status.phase,
                silent_since: status.silent_since,
            };
            (node.metadata.name.clone(), state)
        })
        .collect();
    let now = chrono::Utc::now();
    // Built only when a bound pod's update was refused for room.
    let mut scheduler: Option<Scheduler> = None;
    for (pod, node) in bound {
        let Ok(spec) = pod.typed_spec::<PodSpec>() else {
            continue;
        };
        let why = match departure(&spec, &node, nodes.get(&node).copied(), now, timing) {
            Some(why) => why,
            None if update_refused(&pod) => {
                if scheduler.is_none() {
                    scheduler = Some(snapshot_scheduler(client).await?);
                }
                let Some(scheduler) = scheduler.as_mut() else {
                    continue;
                };
                if !fits_elsewhere(scheduler, &pod, &node) {
                    continue;
                }
                Departure::NoLongerFits
            }
            None => continue,
        };
        let key = pod.key();
        let message = why.message(&spec, &node, nodes.get(&node).copied(), timing);
        match unbind(client, &pod, &message).await {
            Ok(_) => tracing::info!(pod = %key, %node, ?why, "unbound; moving"),
            Err(error) => tracing::debug!(pod = %key, %error, "not unbound; next round"),
        }
    }
    Ok(())
}

/// Clears the pod's `status.node` as read (compare-and-swap on its
/// `resourceVersion`: a pod changed meanwhile is looked at again next
/// round). The server starts its `move` workflow and records `message` in
/// its history.
async fn unbind(client: &Client, pod: &Object, message: &str) -> Result<Object, ClientError> {
    let mut next = pod.clone();
    if let Some(status) = next.status.as_object_mut() {
        status.insert("node".to_string(), serde_json::Value::Null);
    }
    client.put_status_with_message(&next, Some(message)).await
}

fn action(kind: StepActionKind, workflow: &str) -> StepActionRequest {
    let mut request = StepActionRequest::new(kind, STEP);
    request.workflow = Some(workflow.to_string());
    request
}

/// Whether the pod's newest instance is an update of its current revision
/// that failed (the node refuses an update that no longer fits it).
fn update_refused(pod: &Object) -> bool {
    let Some(Ok(status)) = pod
        .status
        .get("workflow")
        .map(|w| serde_json::from_value::<WorkflowStatus>(w.clone()))
    else {
        return false;
    };
    status.latest().is_some_and(|instance| {
        instance.workflow == "update"
            && instance.revision == pod.metadata.revision
            && instance.outcome == WorkflowOutcome::Failed
    })
}

async fn snapshot_scheduler(client: &Client) -> Result<Scheduler, ClientError> {
    let nodes = client.list(Kind::Node, None, None).await?.items;
    let pods = client.list(Kind::Pod, None, None).await?.items;
    let objects: Vec<Object> = nodes.into_iter().chain(pods).collect();
    let snapshot = Snapshot::from_objects(&objects).unwrap_or_default();
    Ok(Scheduler::new(&snapshot, Strategy::Spread))
}

/// Whether the pod's spec does not fit `node` but fits another node.
fn fits_elsewhere(scheduler: &mut Scheduler, pod: &Object, node: &str) -> bool {
    let Ok(request) = Request::from_object(pod) else {
        return false;
    };
    if scheduler.fits(&request, node).is_ok() {
        return false;
    }
    // `place` moves the reservation on success; the real move places again
    // later, so the scheduler of this pass only has to stay plausible.
    scheduler
        .place(&request)
        .is_ok_and(|placement| placement.node != node)
}

/// One pass: every pod waiting for placement is placed or told why not.
pub async fn round(client: &Client) -> Result<(), ClientError> {
    // VMs are placed like pods, against the same capacity.
    let mut pods = client.list(Kind::Pod, None, None).await?.items;
    pods.extend(client.list(Kind::VirtualMachine, None, None).await?.items);
    let waiting: Vec<(Object, String)> = pods
        .iter()
        .filter_map(|pod| ready_instance(pod, STEP).map(|id| (pod.clone(), id)))
        .collect();
    if waiting.is_empty() {
        return Ok(());
    }
    let nodes = client.list(Kind::Node, None, None).await?.items;
    let objects: Vec<Object> = nodes.into_iter().chain(pods).collect();
    let snapshot = match Snapshot::from_objects(&objects) {
        Ok(snapshot) => snapshot,
        Err(error) => {
            tracing::warn!(%error, "cannot build a scheduling snapshot");
            return Ok(());
        }
    };
    // One scheduler for the round: each placement counts against the next.
    let mut scheduler = Scheduler::new(&snapshot, Strategy::Spread);
    for (pod, workflow) in waiting {
        let key = pod.key();
        if let Err(error) = place(client, &mut scheduler, pod, &workflow).await {
            tracing::debug!(pod = %key, %error, "placement not recorded; retried later");
        }
    }
    Ok(())
}

async fn place(
    client: &Client,
    scheduler: &mut Scheduler,
    pod: Object,
    workflow: &str,
) -> Result<(), ClientError> {
    let key = pod.key();
    let request = match Request::from_object(&pod) {
        Ok(request) => request,
        Err(error) => {
            client
                .step_action(&key, &action(StepActionKind::Claim, workflow))
                .await?;
            let mut fail = action(StepActionKind::Fail, workflow);
            fail.error = Some(format!("cannot read the pod: {error}"));
            client.step_action(&key, &fail).await?;
            return Ok(());
        }
    };
    client
        .step_action(&key, &action(StepActionKind::Claim, workflow))
        .await?;
    match scheduler.place(&request) {
        Ok(placement) => {
            if let Err(error) =
                crate::steps::set_status_field(client, &key, "node", placement.node.clone().into())
                    .await
            {
                // Never leave the claimed step hanging: fail it (it is retried).
                let mut fail = action(StepActionKind::Fail, workflow);
                fail.error = Some(format!("cannot bind to {}: {error}", placement.node));
                client.step_action(&key, &fail).await?;
                return Ok(());
            }
            let mut done = action(StepActionKind::Complete, workflow);
            done.note = Some(placement.node.clone());
            client.step_action(&key, &done).await?;
            tracing::info!(pod = %key, node = %placement.node, "placed");
        }
        Err(unschedulable) => {
            let mut fail = action(StepActionKind::Fail, workflow);
            fail.error = Some(unschedulable.to_string());
            client.step_action(&key, &fail).await?;
            tracing::info!(pod = %key, reason = %unschedulable, "unschedulable");
        }
    }
    Ok(())
}
