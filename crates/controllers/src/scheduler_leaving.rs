//! The scheduler's side of workloads leaving their node: evacuating a pod
//! from a silent, lost or draining node (or one it no longer fits), and
//! the drain of a node being deleted ([`crate::drain`]).

use std::time::Duration;

use chrono::Utc;
use corral_api::kinds::Availability;
use corral_api::workflow::{StoredInstance, WorkflowOutcome};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::ClientError;
use corral_client::runtime::Action;
use corral_scheduler::{BoundWorkload, Request, Scheduler};

use super::{BY_NODE, Leaving, Shared};
use crate::drain::Holders;
use crate::evacuate::{Departure, NodeState, departure};
use crate::lifecycle::Timing;

/// Unbinds the pod if it must leave `node` now; an ha pod on a Silent
/// node is looked at again when its grace runs out.
pub(super) async fn evacuate(
    shared: &Shared,
    key: &ObjectKey,
    node: &str,
    leaving: &Leaving,
) -> Result<Action, ClientError> {
    let state = shared
        .nodes
        .get(&ObjectKey::new(Kind::Node, None, node))
        .map(|facts| facts.state);
    let now = Utc::now();
    let timing = shared.timing;
    let pinned = leaving.pinned.as_deref();
    let why = match departure(leaving.availability, pinned, node, state, now, timing) {
        Some(why) => why,
        None if leaving.refused.as_ref().is_some_and(|request| {
            shared.with_scheduler(|scheduler| fits_elsewhere(scheduler, request, node))
        }) =>
        {
            Departure::NoLongerFits
        }
        None => return Ok(grace_left(leaving, state, now, timing)),
    };
    let message = why.message(pinned, node, state, timing);
    let mut pod = shared.client.get(key).await?;
    // Moved or rebound meanwhile: the change brings it back if needed.
    if pod.status.get("node").and_then(serde_json::Value::as_str) != Some(node) {
        return Ok(Action::Done);
    }
    if let Some(status) = pod.status.as_object_mut() {
        status.insert("node".to_string(), serde_json::Value::Null);
    }
    shared
        .client
        .put_status_with_message(&pod, Some(&message))
        .await?;
    tracing::info!(pod = %key, %node, ?why, "unbound; moving");
    Ok(Action::Done)
}

/// Moves the drain of a node being deleted: done once nothing is bound to
/// it (its pods are moved by [`evacuate`] as its change arrives).
pub(super) async fn drain(shared: &Shared, key: &ObjectKey) -> Result<Action, ClientError> {
    let Some(step) = shared.nodes.get(key).and_then(|facts| facts.drain.clone()) else {
        return Ok(Action::Done);
    };
    let mut holders = Holders::default();
    for (pod, workload) in shared.pods.by_index(BY_NODE, &key.name) {
        let name = pod.to_string();
        match &workload.leaving {
            None => holders.stopping.push(name),
            Some(leaving) if leaving.pinned.as_deref() == Some(key.name.as_str()) => {
                holders.pinned.push(name);
            }
            Some(_) => holders.moving.push(name),
        }
    }
    for (vm, _) in shared.vms.by_index(BY_NODE, &key.name) {
        holders.vms.push(vm.to_string());
    }
    crate::drain::advance(&shared.client, key, &step, &holders, &shared.drain_logged).await?;
    Ok(Action::Done)
}

/// When an ha pod on a Silent node must be looked at again: when its grace
/// runs out, or when its node has surely fenced it, whichever is later.
fn grace_left(
    leaving: &Leaving,
    state: Option<NodeState>,
    now: chrono::DateTime<Utc>,
    timing: Timing,
) -> Action {
    let Some(since) = state.and_then(|state| state.silent_since) else {
        return Action::Done;
    };
    if leaving.availability != Availability::Ha {
        return Action::Done;
    }
    let due = (since + timing.ha_grace).max(state.and_then(|s| s.fenced_by).unwrap_or(since));
    let left = (due - now).to_std().unwrap_or_default();
    Action::RequeueAfter(left.max(Duration::from_millis(100)))
}

/// Whether the pod's newest instance (`latest`) is an update of its
/// current revision that failed (the node refuses an update that no longer
/// fits it).
pub(super) fn update_refused(pod: &Object, latest: Option<&StoredInstance>) -> bool {
    latest.is_some_and(|instance| {
        instance.workflow == "update"
            && instance.revision == pod.metadata.revision
            && instance.outcome == WorkflowOutcome::Failed
    })
}

/// Whether the request does not fit `node` but fits another node.
fn fits_elsewhere(scheduler: &mut Scheduler, request: &Request, node: &str) -> bool {
    if scheduler.fits(request, node).is_ok() {
        return false;
    }
    // Asking `place` reserves the other node; the real move places again
    // later, so put the reservation back where the cache has it.
    let placed = scheduler.place(request);
    let elsewhere = placed
        .as_ref()
        .is_ok_and(|placement| placement.node != node);
    if placed.is_ok() {
        scheduler.reserve(BoundWorkload::new(request, node));
    }
    elsewhere
}
