//! The per-node controller (owns a PerNodeDeployment's `status`, manages
//! its pods): one pod `NAME-<node>`, pinned to its node, on every node
//! whose labels match `nodeSelector` and that is Ready or Silent and not
//! forgotten nor being deleted (a Lost, forgotten or deleted node's pod is
//! deleted, and so is the pod of a node being drained).
//! Template changes are in-place updates paced as a PinnedDeployment's
//! ([`crate::pinned::pacing`]).
//! Decisions are [`plan`]'s.
//!
//! Pods name their deployment in `metadata.owner` and carry
//! `corral.dev/per-node: NAME` (label and annotation) and their node in
//! the `corral.dev/node` annotation. A node's change that matters (its
//! labels, whether it is eligible) or its deletion requeues every
//! PerNodeDeployment; heartbeats do not.

pub mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::Utc;
use corral_api::kinds::{
    NodePhase, NodeSpec, NodeStatus, PerNodeDeploymentSpec, PerNodeDeploymentStatus, Placement,
    PodSpec, PodStatus,
};
use corral_api::{Kind, MANAGED_BY, Object, ObjectKey, OwnerReference};
use corral_client::runtime::{self, Change, Index, Informer, Scope, WorkQueue};
use corral_client::{Client, ClientError};
use tokio_util::sync::CancellationToken;

use crate::pinned::pacing::Pacing;
use crate::pinned::{CACHE_LAG, Written};
use plan::{Action, NodePod};

/// The controller's identity.
pub const NAME: &str = "per-node";
/// The label and annotation naming the PerNodeDeployment a pod belongs to.
pub const DEPLOYMENT_LABEL: &str = "corral.dev/per-node";
/// The annotation naming the node a pod is for.
pub const NODE_ANNOTATION: &str = "corral.dev/node";

/// What the controller keeps of a node: what decides whether it gets a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeView {
    labels: BTreeMap<String, String>,
    eligible: bool,
}

fn project_node(node: &Object) -> NodeView {
    let phase = node.typed_status::<NodeStatus>().unwrap_or_default().phase;
    let forgotten = node
        .typed_spec::<NodeSpec>()
        .is_ok_and(|spec| spec.forgotten);
    NodeView {
        labels: node.metadata.labels.clone(),
        eligible: matches!(phase, NodePhase::Ready | NodePhase::Silent)
            && !forgotten
            && node.metadata.deleting.is_none(),
    }
}

type Managed = Option<Object>;

fn project_pod(pod: &Object) -> Managed {
    deployment_of(pod).map(|_| pod.clone())
}

fn by_deployment(pod: &Managed) -> Vec<String> {
    pod.as_ref()
        .and_then(deployment_of)
        .map(|key| key.to_string())
        .into_iter()
        .collect()
}

const BY_DEPLOYMENT: &str = "deployment";

/// Keeps every PerNodeDeployment's pods until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let deployments = Informer::start(
        client.clone(),
        Scope::all(Kind::PerNodeDeployment),
        Vec::new(),
        shutdown.clone(),
    );
    let nodes = Informer::start_projected(
        client.clone(),
        Scope::all(Kind::Node),
        project_node,
        Vec::new(),
        shutdown.clone(),
    );
    // Only the pods this controller made: the others' changes are not even
    // sent to it.
    let pods = Informer::start_projected(
        client.clone(),
        Scope::managed_by(Kind::Pod, NAME),
        project_pod,
        vec![Index {
            name: BY_DEPLOYMENT,
            values: by_deployment,
        }],
        shutdown.clone(),
    );
    deployments.synced().await;
    nodes.synced().await;
    pods.synced().await;
    let queue = WorkQueue::new();
    let (existing, changed) = (queue.clone(), queue.clone());
    deployments.on_change(
        move |key, _| existing.add(key.clone()),
        move |change| {
            if let Change::Applied { key, .. } = change {
                changed.add((*key).clone());
            }
        },
    );
    let (every, all) = (queue.clone(), deployments.cache().clone());
    nodes.on_change(
        |_, _| {},
        move |change| {
            let matters = match change {
                Change::Applied { old, new, .. } => (*old).is_none_or(|old: &NodeView| old != *new),
                Change::Deleted { .. } => true,
            };
            if matters {
                for (key, _) in all.list() {
                    every.add(key);
                }
            }
        },
    );
    let owners = queue.clone();
    pods.on_change(
        |_, _| {},
        move |change| {
            let pod: &Managed = match change {
                Change::Applied { new, .. } => new,
                Change::Deleted { old, .. } => old,
            };
            if let Some(deployment) = pod.as_ref().and_then(deployment_of) {
                owners.add(deployment);
            }
        },
    );
    let (deployments, nodes, pods) = (
        deployments.cache().clone(),
        nodes.cache().clone(),
        pods.cache().clone(),
    );
    let written = Written::default();
    runtime::run(NAME, queue, 1, shutdown, move |key: ObjectKey| {
        let (client, deployments, nodes, pods) = (
            client.clone(),
            deployments.clone(),
            nodes.clone(),
            pods.clone(),
        );
        let written = written.clone();
        async move {
            let Some(deployment) = deployments.get(&key) else {
                return Ok::<_, ClientError>(runtime::Action::Done);
            };
            let members: Vec<Object> = pods
                .by_index(BY_DEPLOYMENT, &key.to_string())
                .into_iter()
                .filter_map(|(_, pod)| pod.as_ref().clone())
                .collect();
            if !written.seen(&members) {
                return Ok(runtime::Action::RequeueAfter(CACHE_LAG));
            }
            let nodes: Vec<(String, NodeView)> = nodes
                .list()
                .into_iter()
                .map(|(key, view)| (key.name, view.as_ref().clone()))
                .collect();
            let requeue = reconcile(&client, &deployment, &nodes, &members, &written).await?;
            Ok(requeue.map_or(runtime::Action::Done, runtime::Action::RequeueAfter))
        }
    })
    .await;
}

/// The pod for `node` as the template makes it.
fn desired_pod(
    deployment: &Object,
    spec: &PerNodeDeploymentSpec,
    node: &str,
) -> Result<Object, ClientError> {
    let key = deployment.key();
    let mut pod_spec = spec.template.spec.clone();
    let selector = pod_spec
        .placement
        .take()
        .map(|p| p.selector)
        .unwrap_or_default();
    pod_spec.placement = Some(Placement {
        node: Some(node.to_string()),
        selector,
    });
    let body = serde_json::to_value(&pod_spec).map_err(ClientError::Decode)?;
    let name = format!("{}-{node}", key.name);
    let mut pod = Object::new(Kind::Pod, Some(&key.namespace), &name, body);
    pod.metadata.owner = Some(OwnerReference::to(deployment));
    pod.metadata.labels = spec.template.metadata.labels.clone();
    pod.metadata
        .labels
        .insert(DEPLOYMENT_LABEL.to_string(), key.name.clone());
    pod.metadata.annotations = spec.template.metadata.annotations.clone();
    for (name, value) in [
        (MANAGED_BY, NAME),
        (DEPLOYMENT_LABEL, key.name.as_str()),
        (NODE_ANNOTATION, node),
    ] {
        pod.metadata
            .annotations
            .insert(name.to_string(), value.to_string());
    }
    Ok(pod)
}

fn node_pod(desired: &Object, pod: &Object, node: &str) -> NodePod {
    let matches_template = pod.typed_spec::<PodSpec>().ok() == desired.typed_spec::<PodSpec>().ok()
        && desired
            .metadata
            .labels
            .iter()
            .all(|(k, v)| pod.metadata.labels.get(k) == Some(v));
    let status: PodStatus = pod.typed_status().unwrap_or_default();
    let ready = status.observed_revision == Some(pod.metadata.revision) && status.is_ready();
    let problem = (!ready).then(|| {
        status
            .unhealthy(Utc::now())
            .unwrap_or_else(|| format!("it is {:?}", status.phase))
    });
    NodePod {
        node: node.to_string(),
        matches_template,
        ready,
        problem,
    }
}

async fn reconcile(
    client: &Client,
    deployment: &Object,
    nodes: &[(String, NodeView)],
    pods: &[Object],
    written: &Written,
) -> Result<Option<Duration>, ClientError> {
    let key = deployment.key();
    let spec: PerNodeDeploymentSpec = match deployment.typed_spec() {
        Ok(spec) => spec,
        Err(error) => {
            tracing::warn!(deployment = %key, %error, "unreadable spec");
            return Ok(None);
        }
    };
    let wanted: BTreeSet<String> = nodes
        .iter()
        .filter(|(_, view)| view.eligible)
        .filter(|(_, view)| {
            spec.node_selector
                .iter()
                .all(|(k, v)| view.labels.get(k) == Some(v))
        })
        .map(|(name, _)| name.clone())
        .collect();
    let mut by_node: BTreeMap<String, &Object> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.key().namespace == key.namespace) {
        if let Some(node) = pod.metadata.annotations.get(NODE_ANNOTATION) {
            by_node.insert(node.clone(), pod);
        }
    }
    let mut views = Vec::new();
    for (node, pod) in &by_node {
        let desired = desired_pod(deployment, &spec, node)?;
        views.push(node_pod(&desired, pod, node));
    }
    let revision = deployment.metadata.revision;
    let max_unavailable = spec
        .max_unavailable
        .as_ref()
        .and_then(|m| m.resolve(wanted.len() as u32))
        .unwrap_or(1)
        .max(1);
    let pacing = Pacing {
        max_unavailable,
        paused: false,
        deadline: Duration::from_secs(u64::from(
            spec.progress_deadline_seconds
                .unwrap_or(corral_api::kinds::DEFAULT_PROGRESS_DEADLINE_SECONDS),
        )),
        revision,
    };
    let current: PerNodeDeploymentStatus = deployment.typed_status().unwrap_or_default();
    let planned = plan::plan(&key.name, &wanted, &views, &current, &pacing, Utc::now());
    let mut failed = None;
    for action in &planned.actions {
        let result = match action {
            Action::Create { node } => {
                let pod = desired_pod(deployment, &spec, node)?;
                let message = format!("{key}: for node/{node}");
                client
                    .create(&pod, Some(&message))
                    .await
                    .map(|pod| written.wrote(&pod))
            }
            Action::Refresh { node } => match by_node.get(node) {
                Some(pod) => {
                    let desired = desired_pod(deployment, &spec, node)?;
                    let mut next = (*pod).clone();
                    next.spec = desired.spec;
                    next.metadata.labels = desired.metadata.labels;
                    next.metadata.annotations = desired.metadata.annotations;
                    next.metadata.owner = desired.metadata.owner;
                    let message = format!("{key}: template changed");
                    client
                        .apply(&next, Some(&message))
                        .await
                        .map(|pod| written.wrote(&pod))
                }
                None => Ok(()),
            },
            Action::Delete { node } => match by_node.get(node) {
                Some(pod) => {
                    let message = format!("{key}: node/{node} left");
                    match client.delete(&pod.key(), Some(&message)).await {
                        Err(error) if error.status() != Some(404) => Err(error),
                        _ => Ok(()),
                    }
                }
                None => Ok(()),
            },
        };
        if let Err(error) = result {
            tracing::info!(deployment = %key, ?action, %error, "action failed; retried");
            failed = Some(error);
        }
    }
    crate::status::write_if_changed(client, deployment, &planned.status).await?;
    failed.map_or(Ok(planned.requeue_after), Err)
}

/// The PerNodeDeployment a pod belongs to, if this controller manages it.
pub fn deployment_of(pod: &Object) -> Option<ObjectKey> {
    if corral_api::manager_of(&pod.metadata) != Some(NAME) {
        return None;
    }
    let name = pod.metadata.annotations.get(DEPLOYMENT_LABEL)?;
    Some(ObjectKey::new(
        Kind::PerNodeDeployment,
        Some(&pod.key().namespace),
        name,
    ))
}
