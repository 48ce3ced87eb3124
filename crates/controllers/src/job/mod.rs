//! The Job controller (owns a Job's `status`, manages its pods and, for a
//! scheduled Job, its runs): runs `completions` pods to success, at most
//! `parallelism` at once, with retries up to `backoffLimit`, failing at the
//! active deadline and deleting the Job its TTL after it finished.
//!
//! Pods are named `NAME-0`, `NAME-1`, … and carry the label and annotation
//! `corral.dev/job: NAME` (`corral logs job/NAME` finds them by the label)
//! and the Job as `metadata.owner`, so deleting the Job deletes them. A
//! Job with a `schedule` makes no pods itself: each run is a Job of its
//! own, owned by it and managed by this controller. Decisions are
//! [`plan`]'s and [`schedule`]'s; this module moves data.

pub mod plan;
pub mod schedule;

use chrono::Utc;
use corral_api::cron::Schedule;
use corral_api::kinds::{JobPhase, JobSpec, JobStatus, PodStatus};
use corral_api::{Kind, MANAGED_BY, Object, ObjectKey, OwnerReference};
use corral_client::runtime::{self, Change, Index, Informer, Scope, WorkQueue};
use corral_client::{Client, ClientError};
use tokio_util::sync::CancellationToken;

use plan::JobPod;

/// The controller's identity.
pub const NAME: &str = "job";
/// The label and annotation naming the Job a pod belongs to.
pub const JOB_LABEL: &str = "corral.dev/job";
/// The annotation naming the scheduled Job a run belongs to.
pub const SCHEDULED_ANNOTATION: &str = "corral.dev/scheduled-job";

/// What the controller keeps of a pod: the whole pod if a Job manages it.
type Managed = Option<Object>;

fn project_pod(pod: &Object) -> Managed {
    job_of(pod).map(|_| pod.clone())
}

fn by_job(pod: &Managed) -> Vec<String> {
    pod.as_ref()
        .and_then(job_of)
        .map(|key| key.to_string())
        .into_iter()
        .collect()
}

fn by_parent(job: &Object) -> Vec<String> {
    parent_of(job)
        .map(|key| key.to_string())
        .into_iter()
        .collect()
}

const BY_JOB: &str = "job";
const BY_PARENT: &str = "parent";

/// Keeps every Job running until `shutdown`: a Job is reconciled when it,
/// one of its pods or one of its runs changes, and when a deadline, its TTL
/// or its next scheduled run is due.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let jobs = Informer::start(
        client.clone(),
        Scope::all(Kind::Job),
        vec![Index {
            name: BY_PARENT,
            values: by_parent,
        }],
        shutdown.clone(),
    );
    // Only the pods this controller made: the others' changes are not even
    // sent to it.
    let pods = Informer::start_projected(
        client.clone(),
        Scope::managed_by(Kind::Pod, NAME),
        project_pod,
        vec![Index {
            name: BY_JOB,
            values: by_job,
        }],
        shutdown.clone(),
    );
    jobs.synced().await;
    pods.synced().await;
    let queue = WorkQueue::new();
    let (existing, changed) = (queue.clone(), queue.clone());
    jobs.on_change(
        move |key, _| existing.add(key.clone()),
        move |change| {
            let job = match change {
                Change::Applied { key, new, .. } => {
                    changed.add((*key).clone());
                    new
                }
                Change::Deleted { old, .. } => old,
            };
            if let Some(parent) = parent_of(job) {
                changed.add(parent);
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
            if let Some(job) = pod.as_ref().and_then(job_of) {
                owners.add(job);
            }
        },
    );
    let (jobs, pods) = (jobs.cache().clone(), pods.cache().clone());
    runtime::run(NAME, queue, 2, shutdown, move |key: ObjectKey| {
        let (client, jobs, pods) = (client.clone(), jobs.clone(), pods.clone());
        async move {
            let Some(job) = jobs.get(&key) else {
                return Ok::<_, ClientError>(runtime::Action::Done);
            };
            let spec: JobSpec = match job.typed_spec() {
                Ok(spec) => spec,
                Err(error) => {
                    tracing::warn!(job = %key, %error, "unreadable spec");
                    return Ok(runtime::Action::Done);
                }
            };
            let requeue = match spec.schedule.as_deref() {
                Some(text) => {
                    let runs: Vec<Object> = jobs
                        .by_index(BY_PARENT, &key.to_string())
                        .into_iter()
                        .map(|(_, run)| run.as_ref().clone())
                        .collect();
                    reconcile_schedule(&client, &job, &spec, text, &runs).await?
                }
                None => {
                    let members: Vec<Object> = pods
                        .by_index(BY_JOB, &key.to_string())
                        .into_iter()
                        .filter_map(|(_, pod)| pod.as_ref().clone())
                        .collect();
                    reconcile_job(&client, &job, &spec, &members).await?
                }
            };
            Ok(match requeue {
                Some(after) => runtime::Action::RequeueAfter(after),
                None => runtime::Action::Done,
            })
        }
    })
    .await;
}

/// The index of a pod named `JOB-N`.
fn index_of(job: &str, pod: &Object) -> Option<u32> {
    pod.metadata
        .name
        .strip_prefix(job)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

fn job_pod(index: u32, pod: &Object) -> JobPod {
    let status: PodStatus = pod.typed_status().unwrap_or_default();
    let failed = status
        .containers
        .iter()
        .find(|c| c.exit_code.is_some_and(|code| code != 0))
        .map(|c| (c.name.clone(), c.exit_code))
        .or_else(|| {
            status.containers.iter().find_map(|c| {
                let exit = c.last_exit.as_ref()?;
                (exit.code != Some(0)).then(|| (c.name.clone(), exit.code))
            })
        });
    JobPod {
        index,
        phase: status.phase,
        restarts: status.restarts(),
        exit: failed,
    }
}

async fn reconcile_job(
    client: &Client,
    job: &Object,
    spec: &JobSpec,
    pods: &[Object],
) -> Result<Option<std::time::Duration>, ClientError> {
    let key = job.key();
    let name = &job.metadata.name;
    let indexed: Vec<(u32, &Object)> = pods
        .iter()
        .filter(|pod| pod.key().namespace == key.namespace)
        .filter_map(|pod| Some((index_of(name, pod)?, pod)))
        .collect();
    // Pods of an earlier Job of this name (orphaned) take their indexes
    // but count for nothing.
    let next_index = indexed.iter().map(|(i, _)| i + 1).max().unwrap_or(0);
    let own: Vec<JobPod> = indexed
        .iter()
        .filter(|(_, pod)| pod.metadata.owner.as_ref().is_some_and(|o| o.names(job)))
        .map(|(index, pod)| job_pod(*index, pod))
        .collect();
    let current: JobStatus = job.typed_status().unwrap_or_default();
    let planned = plan::plan(name, spec, &current, &own, next_index, Utc::now());
    let mut failed = None;
    for action in &planned.actions {
        let result = match *action {
            plan::Action::Create { index } => create_pod(client, job, spec, index).await,
            plan::Action::Delete { index } => {
                let pod =
                    ObjectKey::new(Kind::Pod, Some(&key.namespace), &format!("{name}-{index}"));
                let why = format!("{key} {}", phase_word(planned.status.phase));
                gone_is_fine(client.delete(&pod, Some(&why)).await)
            }
            plan::Action::DeleteJob => {
                let why = format!(
                    "ttlSecondsAfterFinished: {}s after it finished",
                    spec.ttl_seconds_after_finished.unwrap_or_default()
                );
                // Its pods go with it (they name it as owner).
                return gone_is_fine(client.delete(&key, Some(&why)).await).map(|()| None);
            }
        };
        if let Err(error) = result {
            tracing::info!(job = %key, ?action, %error, "action failed; retried");
            failed = Some(error);
            // Indexes are made in order: a refused one stops the rest.
            break;
        }
    }
    crate::status::write_if_changed(client, job, &planned.status).await?;
    failed.map_or(Ok(planned.requeue_after), Err)
}

fn phase_word(phase: JobPhase) -> &'static str {
    match phase {
        JobPhase::Complete => "completed",
        JobPhase::Failed => "failed",
        _ => "stopped",
    }
}

fn gone_is_fine(result: Result<Object, ClientError>) -> Result<(), ClientError> {
    match result {
        Ok(_) => Ok(()),
        Err(error) if error.status() == Some(404) => Ok(()),
        Err(error) => Err(error),
    }
}

/// The pod `JOB-index` as the template makes it.
fn desired_pod(job: &Object, spec: &JobSpec, index: u32) -> Result<Object, ClientError> {
    let key = job.key();
    let body = serde_json::to_value(&spec.template.spec).map_err(ClientError::Decode)?;
    let name = format!("{}-{index}", key.name);
    let mut pod = Object::new(Kind::Pod, Some(&key.namespace), &name, body);
    pod.metadata.owner = Some(OwnerReference::to(job));
    pod.metadata.labels = spec.template.metadata.labels.clone();
    pod.metadata
        .labels
        .insert(JOB_LABEL.to_string(), key.name.clone());
    pod.metadata.annotations = spec.template.metadata.annotations.clone();
    pod.metadata
        .annotations
        .insert(MANAGED_BY.to_string(), NAME.to_string());
    pod.metadata
        .annotations
        .insert(JOB_LABEL.to_string(), key.name.clone());
    Ok(pod)
}

async fn create_pod(
    client: &Client,
    job: &Object,
    spec: &JobSpec,
    index: u32,
) -> Result<(), ClientError> {
    let pod = desired_pod(job, spec, index)?;
    let message = format!("{}: pod {} of {}", job.key(), index + 1, spec.completions);
    client.create(&pod, Some(&message)).await?;
    tracing::info!(pod = %pod.key(), "created");
    Ok(())
}

async fn reconcile_schedule(
    client: &Client,
    job: &Object,
    spec: &JobSpec,
    text: &str,
    runs: &[Object],
) -> Result<Option<std::time::Duration>, ClientError> {
    let key = job.key();
    let schedule: Schedule = match text.parse() {
        Ok(schedule) => schedule,
        Err(error) => {
            tracing::warn!(job = %key, %error, "unreadable schedule");
            return Ok(None);
        }
    };
    let views: Vec<schedule::Run> = runs
        .iter()
        .filter(|run| run.metadata.owner.as_ref().is_some_and(|o| o.names(job)))
        .map(|run| schedule::Run {
            name: run.metadata.name.clone(),
            created_at: run.metadata.created_at.unwrap_or_default(),
            phase: run.typed_status::<JobStatus>().unwrap_or_default().phase,
        })
        .collect();
    let current: JobStatus = job.typed_status().unwrap_or_default();
    let created_at = job.metadata.created_at.unwrap_or_else(Utc::now);
    let planned = schedule::plan(
        &key.name,
        &schedule,
        spec.concurrency_policy,
        created_at,
        &current,
        &views,
        Utc::now(),
    );
    let mut failed = None;
    for action in &planned.actions {
        let result = match action {
            schedule::Action::Create { name, due } => {
                create_run(client, job, spec, name, *due).await
            }
            schedule::Action::Delete { name, why } => {
                let run = ObjectKey::new(Kind::Job, Some(&key.namespace), name);
                gone_is_fine(client.delete(&run, Some(why)).await)
            }
        };
        if let Err(error) = result {
            tracing::info!(job = %key, ?action, %error, "action failed; retried");
            failed = Some(error);
        }
    }
    crate::status::write_if_changed(client, job, &planned.status).await?;
    failed.map_or(Ok(planned.requeue_after), Err)
}

/// Creates the run `name`: the Job's spec without the schedule. A run
/// that exists already (the status naming it was not written yet) is the
/// same run.
async fn create_run(
    client: &Client,
    job: &Object,
    spec: &JobSpec,
    name: &str,
    due: chrono::DateTime<Utc>,
) -> Result<(), ClientError> {
    let key = job.key();
    let mut run_spec = spec.clone();
    run_spec.schedule = None;
    run_spec.concurrency_policy = Default::default();
    let body = serde_json::to_value(&run_spec).map_err(ClientError::Decode)?;
    let mut run = Object::new(Kind::Job, Some(&key.namespace), name, body);
    run.metadata.owner = Some(OwnerReference::to(job));
    run.metadata.labels = job.metadata.labels.clone();
    run.metadata
        .annotations
        .insert(MANAGED_BY.to_string(), NAME.to_string());
    run.metadata
        .annotations
        .insert(SCHEDULED_ANNOTATION.to_string(), key.name.clone());
    let message = format!("{key}: run due at {}", due.format("%Y-%m-%dT%H:%M:%SZ"));
    match client.create(&run, Some(&message)).await {
        Err(error) if error.status() == Some(409) => Ok(()),
        other => other.map(|_| ()),
    }
}

/// The Job a pod belongs to, if this controller manages it.
pub fn job_of(pod: &Object) -> Option<ObjectKey> {
    if corral_api::manager_of(&pod.metadata) != Some(NAME) {
        return None;
    }
    let name = pod.metadata.annotations.get(JOB_LABEL)?;
    Some(ObjectKey::new(Kind::Job, Some(&pod.key().namespace), name))
}

/// The scheduled Job a run belongs to, if this controller made it.
pub fn parent_of(job: &Object) -> Option<ObjectKey> {
    if corral_api::manager_of(&job.metadata) != Some(NAME) {
        return None;
    }
    let name = job.metadata.annotations.get(SCHEDULED_ANNOTATION)?;
    Some(ObjectKey::new(Kind::Job, Some(&job.key().namespace), name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job() -> (Object, JobSpec) {
        let spec = json!({"completions": 3, "template": {
            "metadata": {"labels": {"app": "batch"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}});
        let mut object = Object::new(Kind::Job, None, "batch", spec);
        object.metadata.uid = "u-1".into();
        let spec = object.typed_spec().expect("a valid spec");
        (object, spec)
    }

    #[test]
    fn pods_name_their_job_as_owner_and_carry_its_label() {
        let (batch, spec) = job();
        let pod = desired_pod(&batch, &spec, 2).expect("a pod");
        assert_eq!(pod.metadata.name, "batch-2");
        assert!(pod.metadata.owner.as_ref().expect("an owner").names(&batch));
        assert_eq!(pod.metadata.labels[JOB_LABEL], "batch");
        assert_eq!(pod.metadata.labels["app"], "batch");
        assert_eq!(job_of(&pod), Some(batch.key()));
        assert_eq!(index_of("batch", &pod), Some(2));
        assert_eq!(index_of("bat", &pod), None, "another job's prefix");
    }
}
