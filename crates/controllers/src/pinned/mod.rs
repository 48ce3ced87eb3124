//! The PinnedDeployment controller (owns a PinnedDeployment's `status`,
//! manages its pods): keeps `replicas` pods named `NAME-0…`, of which
//! `replicasPercentNext` percent (rounded by the strategy) run
//! `templates.next` and the rest `templates.previous`.
//!
//! It creates its pods naming itself in `corral.dev/managed-by`, which
//! makes their spec, labels and annotations its own; every pod it writes
//! is a revision authored by `pinned-deployment` (a system change). A pod
//! changes version by an in-place update of its spec — same name, same
//! uid — so the node restarts it in place. Decisions are [`plan`]'s.
//!
//! Restarts are paced ([`pacing`]): at most `maxUnavailable` pods down at
//! once, the next batch when the last is ready, a halt when no progress
//! comes within `progressDeadlineSeconds`, none while `paused`.
//!
//! Each pod names its deployment in `metadata.owner`, so deleting the
//! deployment deletes its pods (the server's cascade). Pods left without
//! an owner (`delete --cascade=orphan`) keep their name and annotations; a
//! deployment of that name that comes back finds them by name and adopts
//! those carrying its selector's labels instead of making
//! new ones.

pub mod pacing;
pub mod plan;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;

use corral_api::kinds::{
    PinnedDeploymentSpec, PinnedDeploymentStatus, PodPhase, PodSpec, PodStatus, PodTemplate,
};
use corral_api::{Kind, MANAGED_BY, Object, ObjectKey, OwnerReference};
use corral_client::runtime::{self, Change, Index, Informer, Scope, WorkQueue};
use corral_client::{Client, ClientError};
use tokio_util::sync::CancellationToken;

use plan::{Action, Member, Version};

/// The controller's identity.
pub const NAME: &str = "pinned-deployment";
/// The annotation naming the PinnedDeployment a pod belongs to.
pub const DEPLOYMENT_ANNOTATION: &str = "corral.dev/pinned-deployment";
/// The annotation naming the template a pod runs (`previous`, `next`).
pub const VERSION_ANNOTATION: &str = "corral.dev/version";

/// What the controller keeps of a pod: the whole pod if a
/// PinnedDeployment manages it, nothing otherwise.
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

/// Keeps every PinnedDeployment's pods until `shutdown`: a deployment is
/// reconciled when it or one of its pods changes.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let deployments = Informer::start(
        client.clone(),
        Scope::all(Kind::PinnedDeployment),
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
    let (deployments, pods) = (deployments.cache().clone(), pods.cache().clone());
    let written = Written::default();
    runtime::run(NAME, queue, 1, shutdown, move |key: ObjectKey| {
        let (client, deployments, pods) = (client.clone(), deployments.clone(), pods.clone());
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
                // The cache has not seen our last writes: a plan from it
                // would count a restarted pod as ready.
                return Ok(runtime::Action::RequeueAfter(CACHE_LAG));
            }
            let requeue = reconcile(&client, &deployment, &members, &written).await?;
            Ok(requeue.map_or(runtime::Action::Done, runtime::Action::RequeueAfter))
        }
    })
    .await;
}

/// How long to wait for the cache to catch up with a write.
pub(crate) const CACHE_LAG: Duration = Duration::from_millis(100);

/// The pod revisions this controller wrote and its cache has not shown
/// yet (what kube's controllers call expectations).
#[derive(Debug, Clone, Default)]
pub(crate) struct Written(Arc<Mutex<HashMap<ObjectKey, u64>>>);

impl Written {
    pub(crate) fn wrote(&self, pod: &Object) {
        let mut written = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        written.insert(pod.key(), pod.metadata.revision);
    }

    /// Whether `pods` (as cached) show every write made to them; forgets
    /// the writes they show.
    pub(crate) fn seen(&self, pods: &[Object]) -> bool {
        let mut written = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = true;
        for pod in pods {
            if let Some(revision) = written.get(&pod.key()) {
                if pod.metadata.revision >= *revision {
                    written.remove(&pod.key());
                } else {
                    seen = false;
                }
            }
        }
        seen
    }
}

/// The pods of `deployment`, by index.
fn members<'a>(deployment: &Object, pods: &'a [Object]) -> BTreeMap<u32, &'a Object> {
    let name = &deployment.metadata.name;
    let namespace = deployment.key().namespace;
    let prefix = format!("{name}-");
    pods.iter()
        .filter(|pod| pod.key().namespace == namespace)
        .filter(|pod| corral_api::manager_of(&pod.metadata) == Some(NAME))
        .filter(|pod| pod.metadata.annotations.get(DEPLOYMENT_ANNOTATION) == Some(name))
        .filter_map(|pod| {
            let index = pod.metadata.name.strip_prefix(&prefix)?.parse().ok()?;
            Some((index, pod))
        })
        .collect()
}

fn template(spec: &PinnedDeploymentSpec, version: Version) -> &PodTemplate {
    match version {
        Version::Previous => &spec.templates.previous,
        Version::Next => &spec.templates.next,
    }
}

/// The labels a pod of `version` carries: the template's and the selector's.
fn labels(spec: &PinnedDeploymentSpec, version: Version) -> BTreeMap<String, String> {
    let mut labels = template(spec, version).metadata.labels.clone();
    labels.extend(spec.selector.clone());
    labels
}

fn member(spec: &PinnedDeploymentSpec, index: u32, pod: &Object) -> Member {
    let version = pod
        .metadata
        .annotations
        .get(VERSION_ANNOTATION)
        .and_then(|v| Version::parse(v));
    let matches_template = version.is_some_and(|version| {
        let wanted = template(spec, version);
        pod.typed_spec::<PodSpec>().ok().as_ref() == Some(&wanted.spec)
            && labels(spec, version)
                .iter()
                .all(|(k, v)| pod.metadata.labels.get(k) == Some(v))
    });
    let status: PodStatus = pod.typed_status().unwrap_or_default();
    let ready = status.phase == PodPhase::Running
        && status.observed_revision == Some(pod.metadata.revision)
        && !status.containers.is_empty()
        && status.containers.iter().all(|c| c.ready);
    let problem = (!ready).then(|| {
        status.unhealthy(Utc::now()).unwrap_or_else(|| {
            if status.observed_revision == Some(pod.metadata.revision) {
                format!("it is {:?}", status.phase)
            } else {
                "its node has not started its revision yet".to_string()
            }
        })
    });
    Member {
        index,
        version,
        matches_template,
        ready,
        problem,
    }
}

async fn reconcile(
    client: &Client,
    deployment: &Object,
    pods: &[Object],
    written: &Written,
) -> Result<Option<Duration>, ClientError> {
    let key = deployment.key();
    let spec: PinnedDeploymentSpec = match deployment.typed_spec() {
        Ok(spec) => spec,
        Err(error) => {
            tracing::warn!(deployment = %key, %error, "unreadable spec");
            return Ok(None);
        }
    };
    let existing = members(deployment, pods);
    let views: Vec<Member> = existing
        .iter()
        .map(|(index, pod)| member(&spec, *index, pod))
        .collect();
    let mut planned = plan::plan(spec.replicas, spec.next_replicas(), &views);
    planned.status.observed_revision = Some(deployment.metadata.revision);
    let pacing = pacing::Pacing {
        max_unavailable: spec.max_unavailable(),
        paused: spec.paused,
        deadline: Duration::from_secs(u64::from(spec.progress_deadline_seconds())),
        revision: deployment.metadata.revision,
    };
    let current: PinnedDeploymentStatus = deployment.typed_status().unwrap_or_default();
    let requeue = pacing::pace(
        &key.name,
        &mut planned,
        &views,
        &current,
        &pacing,
        Utc::now(),
    );
    let mut failed = None;
    for index in adoptable(deployment, &spec, &existing, &planned.actions) {
        if let Some(pod) = existing.get(&index)
            && let Err(error) = adopt(client, deployment, pod).await
        {
            tracing::info!(deployment = %key, pod = %pod.key(), %error, "adoption failed; retried");
            failed = Some(error);
        }
    }
    for action in &planned.actions {
        let result = match *action {
            Action::Create { index, version } => create(client, deployment, &spec, index, version)
                .await
                .map(|pod| written.wrote(&pod)),
            Action::Convert { index, to } => match existing.get(&index) {
                Some(pod) => convert(client, deployment, &spec, pod, to, true)
                    .await
                    .map(|pod| written.wrote(&pod)),
                None => Ok(()),
            },
            Action::Refresh { index, version } => match existing.get(&index) {
                Some(pod) => convert(client, deployment, &spec, pod, version, false)
                    .await
                    .map(|pod| written.wrote(&pod)),
                None => Ok(()),
            },
            Action::Delete { index } => match existing.get(&index) {
                Some(pod) => client
                    .delete(
                        &pod.key(),
                        Some(&format!("{key}: scaled to {}", spec.replicas)),
                    )
                    .await
                    .map(|_| ()),
                None => Ok(()),
            },
        };
        if let Err(error) = result {
            tracing::info!(deployment = %key, ?action, %error, "action failed; retried");
            failed = Some(error);
        }
    }
    crate::status::write_if_changed(client, deployment, &planned.status).await?;
    // A failed action is retried with the deployment's backoff.
    failed.map_or(Ok(requeue), Err)
}

/// The indexes of `deployment`'s pods that name no owner, or an earlier
/// object of its name (one deleted while they were orphaned), and carry
/// its selector's labels: it adopts them as they are. A pod an action
/// rewrites anyway (convert, refresh) is adopted by that write instead,
/// and one about to be deleted is not adopted at all.
fn adoptable(
    deployment: &Object,
    spec: &PinnedDeploymentSpec,
    pods: &BTreeMap<u32, &Object>,
    actions: &[Action],
) -> Vec<u32> {
    let rewritten = |index: u32| {
        actions.iter().any(|action| match *action {
            Action::Convert { index: i, .. }
            | Action::Refresh { index: i, .. }
            | Action::Delete { index: i } => i == index,
            Action::Create { .. } => false,
        })
    };
    pods.iter()
        .filter(|(_, pod)| {
            !pod.metadata
                .owner
                .as_ref()
                .is_some_and(|owner| owner.names(deployment))
        })
        .filter(|(_, pod)| {
            spec.selector
                .iter()
                .all(|(k, v)| pod.metadata.labels.get(k) == Some(v))
        })
        .map(|(index, _)| *index)
        .filter(|index| !rewritten(*index))
        .collect()
}

/// Names `deployment` as `pod`'s owner, at the version read.
async fn adopt(client: &Client, deployment: &Object, pod: &Object) -> Result<(), ClientError> {
    let mut next = pod.clone();
    next.metadata.owner = Some(OwnerReference::to(deployment));
    let message = format!("{}: adopted", deployment.key());
    client.apply(&next, Some(&message)).await?;
    tracing::info!(pod = %pod.key(), "adopted");
    Ok(())
}

/// The pod `NAME-index` as `version`'s template makes it.
fn desired_pod(
    deployment: &Object,
    spec: &PinnedDeploymentSpec,
    index: u32,
    version: Version,
) -> Result<Object, ClientError> {
    let key = deployment.key();
    let wanted = template(spec, version);
    let body = serde_json::to_value(&wanted.spec).map_err(ClientError::Decode)?;
    let name = format!("{}-{index}", key.name);
    let mut pod = Object::new(Kind::Pod, Some(&key.namespace), &name, body);
    pod.metadata.owner = Some(OwnerReference::to(deployment));
    pod.metadata.labels = labels(spec, version);
    pod.metadata.annotations = wanted.metadata.annotations.clone();
    pod.metadata
        .annotations
        .insert(MANAGED_BY.to_string(), NAME.to_string());
    pod.metadata
        .annotations
        .insert(DEPLOYMENT_ANNOTATION.to_string(), key.name.clone());
    pod.metadata
        .annotations
        .insert(VERSION_ANNOTATION.to_string(), version.as_str().to_string());
    Ok(pod)
}

async fn create(
    client: &Client,
    deployment: &Object,
    spec: &PinnedDeploymentSpec,
    index: u32,
    version: Version,
) -> Result<Object, ClientError> {
    let pod = desired_pod(deployment, spec, index, version)?;
    let message = format!("{}: created on {}", deployment.key(), version.as_str());
    let created = client.create(&pod, Some(&message)).await?;
    tracing::info!(pod = %pod.key(), version = version.as_str(), "created");
    Ok(created)
}

/// Updates `pod` in place to `version`'s template, at the version read
/// (a concurrent write makes it retry next round).
async fn convert(
    client: &Client,
    deployment: &Object,
    spec: &PinnedDeploymentSpec,
    pod: &Object,
    version: Version,
    switching: bool,
) -> Result<Object, ClientError> {
    let index = pod
        .metadata
        .name
        .rsplit('-')
        .next()
        .and_then(|i| i.parse().ok())
        .unwrap_or_default();
    let desired = desired_pod(deployment, spec, index, version)?;
    let mut next = pod.clone();
    next.spec = desired.spec;
    next.metadata.labels = desired.metadata.labels;
    next.metadata.annotations = desired.metadata.annotations;
    // A rewrite adopts the pod too, should it have been orphaned.
    next.metadata.owner = desired.metadata.owner;
    let message = if switching {
        let from = pod
            .metadata
            .annotations
            .get(VERSION_ANNOTATION)
            .map_or("no version", String::as_str);
        format!("{}: {from} → {}", deployment.key(), version.as_str())
    } else {
        format!(
            "{}: {} template changed",
            deployment.key(),
            version.as_str()
        )
    };
    let written = client.apply(&next, Some(&message)).await?;
    tracing::info!(pod = %pod.key(), version = version.as_str(), "converted in place");
    Ok(written)
}

/// The PinnedDeployment's key a pod belongs to, if any.
pub fn deployment_of(pod: &Object) -> Option<ObjectKey> {
    if corral_api::manager_of(&pod.metadata) != Some(NAME) {
        return None;
    }
    let name = pod.metadata.annotations.get(DEPLOYMENT_ANNOTATION)?;
    Some(ObjectKey::new(
        Kind::PinnedDeployment,
        Some(&pod.key().namespace),
        name,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(uid: &str) -> (Object, PinnedDeploymentSpec) {
        let template = json!({"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "busybox"}]}});
        let spec = json!({"replicas": 2, "selector": {"app": "web"},
                          "templates": {"previous": template, "next": template}});
        let mut object = Object::new(Kind::PinnedDeployment, None, "web", spec);
        object.metadata.uid = uid.into();
        let spec = object.typed_spec().expect("a valid spec");
        (object, spec)
    }

    fn pod_of(deployment: &Object, spec: &PinnedDeploymentSpec, index: u32) -> Object {
        desired_pod(deployment, spec, index, Version::Previous).expect("a pod")
    }

    #[test]
    fn pods_name_their_deployment_as_owner() {
        let (web, spec) = deployment("u-1");
        let pod = pod_of(&web, &spec, 0);
        let owner = pod.metadata.owner.clone().expect("an owner");
        assert!(owner.names(&web));
        assert_eq!(owner.to_string(), "pd/web");
        assert_eq!(deployment_of(&pod), Some(web.key()));
    }

    #[test]
    fn orphans_with_the_selector_labels_are_adopted() {
        let (old, spec) = deployment("u-old");
        let (web, _) = deployment("u-new");
        let mut orphan = pod_of(&old, &spec, 0);
        orphan.metadata.owner = None;
        let stale = pod_of(&old, &spec, 1);
        let mut unselected = pod_of(&old, &spec, 2);
        unselected.metadata.owner = None;
        unselected.metadata.labels.clear();
        let owned = pod_of(&web, &spec, 3);
        let pods = BTreeMap::from([(0, &orphan), (1, &stale), (2, &unselected), (3, &owned)]);
        assert_eq!(adoptable(&web, &spec, &pods, &[]), [0, 1]);
        let rewritten = [Action::Refresh {
            index: 0,
            version: Version::Previous,
        }];
        assert_eq!(
            adoptable(&web, &spec, &pods, &rewritten),
            [1],
            "a pod an action rewrites is adopted by that write"
        );
        assert_eq!(
            adoptable(&web, &spec, &pods, &[Action::Delete { index: 1 }]),
            [0],
            "a pod about to go is left alone"
        );
    }
}
