//! The scheduler controller: places pods and VirtualMachines whose
//! `scheduler/place` step is ready, writing `status.node` in the same
//! request that completes the step, or fails the step with one reason per
//! node. It also unbinds pods that must leave a silent or lost node
//! ([`crate::evacuate`]): clearing `status.node` makes the server begin
//! the pod's `move` workflow, whose `scheduler/place` then places it
//! elsewhere. A deleted pod's `scheduler/release` (in its `stop`
//! workflow, after its node removed the sandbox) frees its room and
//! unbinds it. A node being deleted is drained ([`crate::drain`]).
//!
//! It follows pods, VMs and nodes through informers that keep only what
//! it needs of each (a workload's reservation and its placement request),
//! and keeps one long-lived [`Scheduler`] whose reservations follow the
//! changes: a placement costs the same with 10 or 10,000 pods. The
//! scheduler is rebuilt from the caches only when a node changes.
//!
//! A workload that could not be placed is tried again as soon as a node
//! changes (one becomes Ready, gains room or a label), not only when the
//! engine's backoff ends: the scheduler claims the failed step early when a
//! node now fits, and writes nothing while none does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use corral_api::kinds::{Availability, NodeStatus, PodSpec};
use corral_api::workflow::StoredWorkflows;
use corral_api::{Kind, Object, ObjectKey};
use corral_client::runtime::{self, Action, Cache, Change, Index, Informer, Scope, WorkQueue};
use corral_client::{Client, ClientError};
use corral_scheduler::{BoundWorkload, NodeInfo, Request, Scheduler, Snapshot, Strategy};
use tokio_util::sync::CancellationToken;

use crate::drain::DrainStep;
use crate::evacuate::NodeState;
use crate::lifecycle::Timing;
use crate::steps::ReadyStep;

#[path = "scheduler_leaving.rs"]
mod leaving;
use leaving::{drain, evacuate, update_refused};

pub const STEP: &str = "scheduler/place";
/// A deleted pod's `stop` step: its room is freed and it is unbound.
pub const RELEASE_STEP: &str = "scheduler/release";

/// A VM's `migrate` step: it is bound to the node its migration names.
pub const REBIND_STEP: &str = "scheduler/rebind";

/// Workloads answered at once: placements are decided one at a time on the
/// shared reservations, the writes that record them go out together (and
/// share the store's commits).
const WORKERS: usize = 16;

/// What the scheduler keeps of a pod or VM.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Its reservation, while bound and not finished.
    bound: Option<BoundWorkload>,
    /// The instance whose `scheduler/place` is ready, and what to place
    /// (or why it cannot be read).
    placing: Option<(String, Result<Request, String>)>,
    /// The instance whose `scheduler/place` failed and waits for its
    /// retry, and what to place.
    retrying: Option<(String, Request)>,
    /// The instance whose `scheduler/release` is ready (a pod being
    /// deleted).
    releasing: Option<String>,
    /// The instance whose `scheduler/rebind` is ready (a VM migrating),
    /// what to place, and the node `spec.migration` names.
    rebinding: Option<(String, Result<Request, String>, crate::migration::Ask)>,
    /// `status.node`.
    node: Option<String>,
    /// What a departure depends on (pods only; none while it is deleted).
    leaving: Option<Leaving>,
}

/// A pod's facts that decide whether it leaves its node.
#[derive(Debug, Clone)]
struct Leaving {
    availability: Availability,
    pinned: Option<String>,
    /// Its newest instance is a failed update of its current revision (the
    /// node refused it for room), and the request of that revision.
    refused: Option<Request>,
}

fn project_workload(object: &Object) -> Workload {
    // Each pod event is projected: its spec and its newest workflow
    // instance are decoded once here, not once per question asked of them.
    let pod_spec = (object.kind == Kind::Pod).then(|| object.typed_spec::<PodSpec>());
    let request = match &pod_spec {
        Some(Ok(spec)) => Ok(Request::from_pod_spec(object.key(), spec)),
        _ => Request::from_object(object),
    };
    let latest = StoredWorkflows::latest_of(&object.status).ok().flatten();
    let ready = |step: &str| {
        latest
            .as_ref()
            .filter(|instance| instance.is_ready(step))
            .map(|instance| instance.id.clone())
    };
    let request = request.map_err(|error| error.to_string());
    let placing = ready(STEP).map(|id| (id, request.clone()));
    let retrying = latest
        .as_ref()
        .filter(|instance| instance.awaits_retry(STEP))
        .map(|instance| instance.id.clone())
        .zip(request.clone().ok());
    let node = object
        .status
        .get("node")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string);
    let deleting = object.metadata.deleting.is_some();
    let leaving = pod_spec
        .filter(|_| !deleting)
        .and_then(Result::ok)
        .map(|spec| Leaving {
            availability: spec.availability,
            pinned: spec.placement.and_then(|p| p.node),
            refused: update_refused(object, latest.as_ref())
                .then(|| request.clone().ok())
                .flatten(),
        });
    Workload {
        bound: request
            .as_ref()
            .ok()
            .and_then(|request| BoundWorkload::of_request(object, request).ok().flatten()),
        placing,
        retrying,
        releasing: ready(RELEASE_STEP),
        rebinding: ready(REBIND_STEP)
            .map(|id| (id, request.clone(), crate::migration::Ask::of(object))),
        node,
        leaving,
    }
}

/// What the scheduler keeps of a node.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    info: Option<NodeInfo>,
    state: NodeState,
    /// Its `scheduler/drain` step, while the node is being deleted.
    drain: Option<DrainStep>,
}

fn project_node(object: &Object) -> NodeFacts {
    let status: NodeStatus = object.typed_status().unwrap_or_default();
    NodeFacts {
        info: NodeInfo::from_node(object).ok(),
        state: NodeState {
            phase: status.phase,
            silent_since: status.silent_since,
            fenced_by: status.fenced_by,
            deleting: object.metadata.deleting.is_some(),
        },
        drain: DrainStep::of(object),
    }
}

fn by_node(workload: &Workload) -> Vec<String> {
    workload.node.clone().into_iter().collect()
}

const BY_NODE: &str = "node";

/// The index of workloads waiting for a retry of their placement (one key).
const RETRYING: &str = "retrying";

fn retrying(workload: &Workload) -> Vec<String> {
    workload
        .retrying
        .as_ref()
        .map(|_| RETRYING.to_string())
        .into_iter()
        .collect()
}

/// The controller's state, shared by its informers' handlers and its
/// reconciler.
struct Shared {
    client: Client,
    timing: Timing,
    pods: Cache<Workload>,
    vms: Cache<Workload>,
    nodes: Cache<NodeFacts>,
    /// The reservations as the caches say; `None` after a node changed,
    /// until the next placement rebuilds it.
    scheduler: Mutex<Option<Scheduler>>,
    /// The line last logged on each draining node's step.
    drain_logged: Mutex<BTreeMap<ObjectKey, String>>,
}

impl Shared {
    fn workloads(&self, kind: Kind) -> &Cache<Workload> {
        if kind == Kind::VirtualMachine {
            &self.vms
        } else {
            &self.pods
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Scheduler>> {
        self.scheduler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps the live scheduler's reservation of `key` as the cache has it.
    fn follow_binding(&self, key: &ObjectKey, bound: Option<&BoundWorkload>) {
        if let Some(scheduler) = self.lock().as_mut() {
            match bound {
                Some(bound) => scheduler.reserve(bound.clone()),
                None => {
                    scheduler.release(key);
                }
            }
        }
    }

    /// Runs `decide` on the scheduler, built from the caches if a node
    /// changed since it was last used.
    fn with_scheduler<R>(&self, decide: impl FnOnce(&mut Scheduler) -> R) -> R {
        let mut guard = self.lock();
        let scheduler = guard.get_or_insert_with(|| {
            let snapshot = Snapshot {
                nodes: self
                    .nodes
                    .list()
                    .into_iter()
                    .filter_map(|(_, node)| node.info.clone())
                    .collect(),
                bound: self
                    .pods
                    .list()
                    .into_iter()
                    .chain(self.vms.list())
                    .filter_map(|(_, workload)| workload.bound.clone())
                    .collect(),
                volumes: BTreeMap::new(),
            };
            Scheduler::new(&snapshot, Strategy::Spread)
        });
        decide(scheduler)
    }
}

/// Places and evacuates until `shutdown`.
pub async fn run(client: Client, timing: Timing, shutdown: CancellationToken) {
    let workload_index = || {
        vec![
            Index {
                name: BY_NODE,
                values: by_node,
            },
            Index {
                name: RETRYING,
                values: retrying,
            },
        ]
    };
    let pods = Informer::start_projected(
        client.clone(),
        Scope::all(Kind::Pod),
        project_workload,
        workload_index(),
        shutdown.clone(),
    );
    let vms = Informer::start_projected(
        client.clone(),
        Scope::all(Kind::VirtualMachine),
        project_workload,
        workload_index(),
        shutdown.clone(),
    );
    let nodes = Informer::start_projected(
        client.clone(),
        Scope::all(Kind::Node),
        project_node,
        Vec::new(),
        shutdown.clone(),
    );
    pods.synced().await;
    vms.synced().await;
    nodes.synced().await;
    let shared = Arc::new(Shared {
        client,
        timing,
        pods: pods.cache().clone(),
        vms: vms.cache().clone(),
        nodes: nodes.cache().clone(),
        scheduler: Mutex::new(None),
        drain_logged: Mutex::new(BTreeMap::new()),
    });
    let queue = WorkQueue::new();
    for informer in [&pods, &vms] {
        let (shared, queue) = (shared.clone(), queue.clone());
        let existing = queue.clone();
        informer.on_change(
            move |key, workload| {
                if wants_attention(workload) {
                    existing.add(key.clone());
                }
            },
            move |change| match change {
                Change::Applied { key, old, new, .. } => {
                    shared.follow_binding(key, new.bound.as_ref());
                    if wants_attention(new) || just_failed(*old, new) {
                        queue.add((*key).clone());
                    }
                    // A node being drained waits for this one to leave.
                    if let Some(left) = old.and_then(|old| old.node.as_ref())
                        && new.node.as_ref() != Some(left)
                    {
                        queue.add(ObjectKey::new(Kind::Node, None, left));
                    }
                }
                Change::Deleted { key, old } => {
                    shared.follow_binding(key, None);
                    if let Some(left) = &old.node {
                        queue.add(ObjectKey::new(Kind::Node, None, left));
                    }
                }
            },
        );
    }
    {
        let (shared, queue) = (shared.clone(), queue.clone());
        let existing = queue.clone();
        nodes.on_change(
            move |key, node| {
                if node.drain.is_some() {
                    existing.add(key.clone());
                }
            },
            move |change| {
                // Capacity, labels or phase changed: rebuild at the next
                // placement, look at the pods on the node again, and try
                // the workloads waiting for a retry of their placement.
                *shared.lock() = None;
                let node = &change.key().name;
                if let Change::Applied { new, .. } = &change
                    && new.drain.is_some()
                {
                    queue.add(change.key().clone());
                }
                for (key, _) in shared.pods.by_index(BY_NODE, node) {
                    queue.add(key);
                }
                for cache in [&shared.pods, &shared.vms] {
                    for (key, _) in cache.by_index(RETRYING, RETRYING) {
                        queue.add(key);
                    }
                }
            },
        );
    }
    runtime::run(
        "scheduler",
        queue,
        WORKERS,
        shutdown,
        move |key: ObjectKey| {
            let shared = shared.clone();
            async move { reconcile(&shared, &key).await }
        },
    )
    .await;
}

/// Whether this change records a placement that just failed: it is tried
/// once more on the newest view of the nodes (and writes nothing if it
/// still fits nowhere). A node that became Ready while the failure was
/// being written was announced before the workload waited for a retry,
/// and would otherwise be noticed only at the end of the backoff — the
/// first pod applied right after `corral up` waited a whole second so.
fn just_failed(old: Option<&Workload>, new: &Workload) -> bool {
    new.retrying.is_some() && old.is_some_and(|old| old.placing.is_some())
}

/// Whether a workload's change may need the scheduler: its place step is
/// ready, or it is bound and its pin or room may have changed.
fn wants_attention(workload: &Workload) -> bool {
    workload.placing.is_some()
        || workload.releasing.is_some()
        || workload.rebinding.is_some()
        || workload.leaving.as_ref().is_some_and(|leaving| {
            leaving.refused.is_some()
                || (workload.node.is_some()
                    && leaving.pinned.is_some()
                    && leaving.pinned != workload.node)
        })
}

async fn reconcile(shared: &Shared, key: &ObjectKey) -> Result<Action, ClientError> {
    if key.kind == Kind::Node {
        return drain(shared, key).await;
    }
    let Some(workload) = shared.workloads(key.kind).get(key) else {
        return Ok(Action::Done);
    };
    if let Some((workflow, request)) = &workload.placing {
        place(shared, key, workflow, request).await?;
        return Ok(Action::Done);
    }
    if let Some((workflow, request)) = &workload.retrying {
        retry(shared, key, workflow, request).await?;
        return Ok(Action::Done);
    }
    if let Some(workflow) = &workload.releasing {
        release(shared, key, workflow, workload.node.as_deref()).await?;
        return Ok(Action::Done);
    }
    if let Some((workflow, request, ask)) = &workload.rebinding {
        let migration = crate::migration::Migration {
            from: workload.node.as_deref(),
            ask,
        };
        rebind(shared, key, workflow, request, migration).await?;
        return Ok(Action::Done);
    }
    match (&workload.node, &workload.leaving) {
        (Some(node), Some(leaving)) => evacuate(shared, key, node, leaving).await,
        _ => Ok(Action::Done),
    }
}

async fn place(
    shared: &Shared,
    key: &ObjectKey,
    workflow: &str,
    request: &Result<Request, String>,
) -> Result<(), ClientError> {
    let step = ReadyStep {
        key,
        step: STEP,
        workflow,
    };
    let request = match request {
        Ok(request) => request,
        Err(error) => {
            let outcome = Err(format!("cannot read the workload: {error}"));
            return step.finish(&shared.client, outcome, BTreeMap::new()).await;
        }
    };
    match shared.with_scheduler(|scheduler| scheduler.place(request)) {
        Ok(placement) => {
            let status = BTreeMap::from([("node".to_string(), placement.node.clone().into())]);
            let written = step
                .finish(&shared.client, Ok(placement.node.clone()), status)
                .await;
            if written.is_err() {
                // The reservation was never made real: the cache will say so.
                shared.with_scheduler(|scheduler| scheduler.release(key));
            } else {
                tracing::info!(workload = %key, node = %placement.node, "placed");
            }
            written
        }
        Err(unschedulable) => {
            tracing::info!(workload = %key, reason = %unschedulable, "unschedulable");
            step.finish(
                &shared.client,
                Err(unschedulable.to_string()),
                BTreeMap::new(),
            )
            .await
        }
    }
}

/// Frees a deleted pod's room and unbinds it (`status.node` cleared in the
/// request that completes `scheduler/release`); its node's steps are done.
async fn release(
    shared: &Shared,
    key: &ObjectKey,
    workflow: &str,
    node: Option<&str>,
) -> Result<(), ClientError> {
    let step = ReadyStep {
        key,
        step: RELEASE_STEP,
        workflow,
    };
    let note = match node {
        Some(node) => format!("freed its room on {node}"),
        None => "it held no room".to_string(),
    };
    let status = BTreeMap::from([("node".to_string(), serde_json::Value::Null)]);
    step.finish(&shared.client, Ok(note), status).await?;
    shared.with_scheduler(|scheduler| scheduler.release(key));
    Ok(())
}

/// Binds a migrating VM to its target when the target has room for it
/// (its disks go with it), in the request that completes
/// `scheduler/rebind`; `status.migration` names both ends.
async fn rebind(
    shared: &Shared,
    key: &ObjectKey,
    workflow: &str,
    request: &Result<Request, String>,
    migration: crate::migration::Migration<'_>,
) -> Result<(), ClientError> {
    let step = ReadyStep {
        key,
        step: REBIND_STEP,
        workflow,
    };
    let decided = match request {
        Ok(request) => shared
            .with_scheduler(|scheduler| crate::migration::decide(scheduler, request, &migration)),
        Err(error) => Err(format!("cannot read the VM: {error}")),
    };
    match decided {
        Ok(moved) => {
            let status = crate::migration::status(&moved);
            let note = format!(
                "bound to {}; the guest still runs on {} until the switch-over",
                moved.to, moved.from
            );
            step.finish(&shared.client, Ok(note), status).await?;
            shared.with_scheduler(|scheduler| scheduler.relocate(moved.reservation));
            Ok(())
        }
        Err(reason) => {
            tracing::info!(workload = %key, %reason, "migration refused");
            step.finish(&shared.client, Err(reason), BTreeMap::new())
                .await
        }
    }
}

/// Places a workload whose placement failed before its backoff ends, if a
/// node fits now; writes nothing otherwise (the engine retries it later,
/// and its failure still says why).
async fn retry(
    shared: &Shared,
    key: &ObjectKey,
    workflow: &str,
    request: &Request,
) -> Result<(), ClientError> {
    let Ok(placement) = shared.with_scheduler(|scheduler| scheduler.place(request)) else {
        return Ok(());
    };
    let step = ReadyStep {
        key,
        step: STEP,
        workflow,
    };
    let status = BTreeMap::from([("node".to_string(), placement.node.clone().into())]);
    let written = step
        .finish(&shared.client, Ok(placement.node.clone()), status)
        .await;
    match &written {
        Ok(()) => tracing::info!(workload = %key, node = %placement.node, "placed on retry"),
        Err(_) => {
            shared.with_scheduler(|scheduler| scheduler.release(key));
        }
    }
    // A step that moved on meanwhile (409) is the next event's to place.
    match written {
        Err(error) if error.status() == Some(409) => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests;
