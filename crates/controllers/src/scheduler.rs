//! The scheduler controller: places pods and VirtualMachines whose `scheduler/place` step is
//! ready, writing `status.node`, or fails the step with one reason per node.

use corral_api::workflow::{StepActionKind, StepActionRequest};
use corral_api::{Kind, Object};
use corral_client::{Client, ClientError};
use corral_scheduler::{Request, Scheduler, Snapshot, Strategy};
use tokio_util::sync::CancellationToken;

use crate::steps::ready_instance;

pub const STEP: &str = "scheduler/place";

pub async fn run(client: Client, feed: crate::ChangeFeed, shutdown: CancellationToken) {
    crate::run_loop("scheduler", feed, shutdown, || round(&client)).await;
}

fn action(kind: StepActionKind, workflow: &str) -> StepActionRequest {
    let mut request = StepActionRequest::new(kind, STEP);
    request.workflow = Some(workflow.to_string());
    request
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
