//! A pod on this node, as the executor ([`crate::executor`]) runs it: what
//! each of the pod's node steps does, how its containers are supervised,
//! which status fields the node reports, and how the pod is removed. It
//! works from the pod's local record ([`crate::state::PodRecord`]), saved
//! with fsync before anything acts on it.
//!
//! - [`namespaces`]: the pod's user and network namespaces, wired to the
//!   node's pod network (`node/create-sandbox`);
//! - [`init`]: the init containers, in order, before the others start;
//! - [`revision`]: starting and stopping containers for a revision, and
//!   recording it as admitted;
//! - [`supervision`]: restarts after exits, and the probes;
//! - [`removal`]: everything the pod holds on the node, freed;
//! - [`data`]: the Secrets and Configs the pod reads, in its tmpfs, kept
//!   up to date in place;
//! - [`recover`]: a record that outlived its sandbox (a reboot) recovered
//!   from local state when the worker starts.

mod data;
mod init;
mod namespaces;
mod readiness;
mod recover;
mod removal;
mod revision;
mod supervision;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use corral_api::kinds::RuntimeClass;
use corral_api::kinds::{ContainerState, ContainerStatus, PodPhase, PodSpec, PodStatus};
use corral_api::{Object, ObjectKey};
use corral_runtime::image::{BlobProgress, PullOptions};
use corral_runtime::oci::userns::user_namespace_path;
use corral_workflow::PodStep;
use futures::future::BoxFuture;
use serde_json::{Map, Value};

use crate::AgentContext;
use crate::containers::ContainerError;
use crate::executor::{Settled, StepOutcome, StepRun, Workload};
use crate::idranges::IdRanges;
use crate::plan::{container_health, plan_revision, pod_phase};
use crate::plugins::Verb;
use crate::pod_data::follow::DataChange;
use crate::registries::{PROGRESS_INTERVAL, PullLog};
use crate::sandbox::{self, PodSandbox};
use crate::sandbox_pool::SandboxPool;
use crate::state::PodRecord;
use crate::steps::NodeWork;
use init::NO_INIT_CONTAINERS;
use supervision::ProbeState;

/// How often a recovery the API has not seen is sent again.
const RECOVERY_REPORT_RETRY: Duration = Duration::from_secs(3);

/// The status fields the node owns on a pod.
const STATUS_FIELDS: [&str; 4] = ["phase", "containers", "observedRevision", "message"];

/// One pod on this node: its local record and the pod as the API last
/// showed it.
#[derive(Debug)]
pub struct PodWorkload {
    ctx: Arc<AgentContext>,
    record: PodRecord,
    desired: Object,
    /// Probe bookkeeping per container (not persisted: probes start over).
    probes: BTreeMap<String, ProbeState>,
    /// When `node/await-readiness` began waiting for a revision.
    readiness_wait: Option<(u64, Instant)>,
    /// Stopped containers' files being removed.
    cleanups: Vec<tokio::task::JoinHandle<()>>,
    /// The progress lines of the running (or last) `node/pull-image`.
    pull_log: Option<Arc<PullLog>>,
    /// A Secret or Config change whose fetch failed, and when to try again.
    data_retry: Option<(DataChange, Instant)>,
    /// `node/remove-sandbox` of the pod's stop workflow is done: its
    /// removal only forgets it.
    sandbox_removed: bool,
    /// The init containers' progress while `node/run-init-containers` runs.
    init: Option<init::InitRun>,
    /// When a recovery the API has not seen may be sent again.
    recovery_report_at: Instant,
    /// A failed recovery: when to try again, and the wait that led there.
    recovery_retry: Option<(Instant, Duration)>,
    /// Where the pod stands with the node's self-fence.
    fence: supervision::FenceHold,
    /// The namespace was wired and no container has started in it since:
    /// the next start on gVisor's own stack needs no wiring again.
    freshly_wired: bool,
    /// Keeps the sandbox pool idle until [`Workload::resume`] is done.
    resume_hold: Option<crate::sandbox_pool::PoolHold>,
}

fn typed_spec(object: &Object) -> Option<PodSpec> {
    object.typed_spec().ok()
}

impl PodWorkload {
    pub fn new(ctx: Arc<AgentContext>, record: PodRecord) -> Self {
        let desired = record.pod.clone();
        PodWorkload {
            ctx,
            record,
            desired,
            probes: BTreeMap::new(),
            readiness_wait: None,
            cleanups: Vec::new(),
            pull_log: None,
            data_retry: None,
            sandbox_removed: false,
            init: None,
            recovery_report_at: Instant::now(),
            recovery_retry: None,
            fence: supervision::FenceHold::default(),
            freshly_wired: false,
            resume_hold: None,
        }
    }

    /// Holds the sandbox pool until the worker has resumed (a restored pod).
    pub fn holding(mut self, hold: Option<crate::sandbox_pool::PoolHold>) -> Self {
        self.resume_hold = hold;
        self
    }

    fn key(&self) -> ObjectKey {
        self.record.pod.key()
    }

    /// The pod's name on its host veth's alias: `NAMESPACE/NAME`.
    fn network_owner(&self) -> String {
        let key = self.key();
        format!("{}/{}", key.namespace, key.name)
    }

    fn uid(&self) -> String {
        self.record.pod.metadata.uid.clone()
    }

    fn save(&self) {
        if let Err(error) = self.ctx.state.save(&self.record) {
            tracing::error!(pod = %self.key(), error = %crate::chain(&error), "cannot save local pod state");
        }
    }

    /// `node/pull-image`: every image of the desired revision on the node.
    /// Needs nothing of the pod once started (it runs beside the others).
    fn pull_images(&mut self, spec: &PodSpec) -> BoxFuture<'static, StepRun> {
        let runner = self.ctx.runner.clone();
        // Progress lines go to the step's log while it runs (taken by
        // `running_log`) and, the last ones, with its outcome.
        let log = Arc::new(PullLog::new(PROGRESS_INTERVAL));
        self.pull_log = Some(log.clone());
        let images: Vec<String> = spec
            .init_containers
            .iter()
            .chain(&spec.containers)
            .map(|c| c.image.clone())
            .collect();
        // Registered first, so image GC never takes what is being pulled.
        self.ctx.pulls.begin(&self.uid(), images.clone());
        let pull_secret = spec.image_pull_secret.clone();
        let data = self.data_step();
        Box::pin(async move {
            // The pod's own credentials, if it names a pull secret.
            let auth = match &pull_secret {
                Some(secret) => match data.pull_credentials(secret).await {
                    Ok(auth) => Some(auth),
                    Err(error) => return StepOutcome::Failed(error).into(),
                },
                None => None,
            };
            let pulled = tokio::task::spawn_blocking(move || {
                let result = images.iter().try_for_each(|image| {
                    let progress = |p: BlobProgress<'_>| log.observe(image, p, Instant::now());
                    let credentials = auth
                        .as_ref()
                        .and_then(|auth| pull_host(image).and_then(|host| auth.lookup(&host)));
                    let options = PullOptions {
                        credentials,
                        progress: Some(&progress),
                    };
                    runner.ensure_image_with(image, options).map(|_| ())
                });
                (result, log.take())
            })
            .await;
            match pulled {
                Ok((Ok(()), log)) => StepRun {
                    outcome: StepOutcome::Done(None),
                    log,
                },
                Ok((Err(error), log)) => StepRun {
                    outcome: StepOutcome::Failed(crate::chain(&error)),
                    log,
                },
                Err(error) => StepOutcome::Failed(error.to_string()).into(),
            }
        })
    }

    /// `node/prepare-volumes`: the desired revision's volumes, owned by
    /// the pod's id range. Needs nothing of the pod once started.
    fn prepare_volumes(&self, spec: PodSpec, work: &NodeWork) -> BoxFuture<'static, StepRun> {
        let missing = crate::plugin_volumes::missing_steps(&spec, |step, owner| {
            work.delegated_to_node(step, owner)
        });
        if !missing.is_empty() {
            let error = format!(
                "the pod's plugin volumes need the steps {} executed by the node, and this workflow has none: an operator registers them with a Controller named after the plugin (steps PLUGIN/prepare and PLUGIN/mount, executor: node; see examples/volume-plugins)",
                missing.join(", ")
            );
            return Box::pin(std::future::ready(StepOutcome::Failed(error).into()));
        }
        let (pods_dir, uid) = (self.ctx.runner.pods_dir.clone(), self.uid());
        let (ranges, pool) = (self.ctx.id_ranges.clone(), self.ctx.sandbox_pool.clone());
        let data_step = self.data_step();
        Box::pin(async move {
            let data = match data_step.fetch(&spec).await {
                Ok(data) => data,
                Err(error) => return StepOutcome::Failed(error).into(),
            };
            let prepared = tokio::task::spawn_blocking(move || {
                let host_base = pod_host_base(&pool, &ranges, &uid, &spec)?;
                let owner = crate::volumes::PodRange { host_base };
                let volumes = crate::volumes::prepare(&pods_dir, &uid, &spec, &owner)
                    .map_err(|e| crate::chain(&e))?;
                let data = data
                    .map(|data| data::write_all(&pods_dir, &uid, &spec, &data, host_base))
                    .transpose()?;
                Ok::<_, String>((volumes, data))
            })
            .await;
            match prepared {
                Ok(Ok((volumes, data))) => data::outcome(volumes, data),
                Ok(Err(error)) => StepOutcome::Failed(error),
                Err(error) => StepOutcome::Failed(error.to_string()),
            }
            .into()
        })
    }

    /// `node/start-containers`, `node/stop-changed-containers` and
    /// `node/start-changed-containers`: the containers whose config the
    /// desired revision changes are stopped (and, unless `stop_only`,
    /// started again with the others it adds).
    async fn apply_containers(&mut self, spec: &PodSpec, stop_only: bool) -> StepOutcome {
        // The node's self-fence holds its ha pods: nothing starts until it
        // lifts (the step stays running and is looked at again).
        if !stop_only && self.ctx.fence.holds(spec) {
            return StepOutcome::NotYet;
        }
        if stop_only {
            // `node/start-changed-containers` comes next and runc then
            // moves the new containers into their cgroups: the kernel's
            // lock for that is made warm while the old ones stop.
            self.ctx.runner.cgroup_primer.nudge();
        }
        let outcome = self.stop_or_start_containers(spec, stop_only).await;
        if !stop_only {
            // Started or failed: the warm pool may refill now.
            self.ctx.sandbox_pool.start_done(&self.uid());
        }
        outcome
    }

    async fn stop_or_start_containers(&mut self, spec: &PodSpec, stop_only: bool) -> StepOutcome {
        // `node/create-sandbox` made and wired it; only a sandbox lost
        // since (a reboot) or never made (a revision without a workflow)
        // is made here.
        if !self.has_sandbox()
            && let Err(error) = self.ensure_sandbox().await
        {
            return StepOutcome::Failed(error);
        }
        if stop_only && let Err(short) = self.fits_here(spec) {
            return StepOutcome::Failed(format!(
                "revision {} no longer fits node {}: {short} (the pod stays on revision {}; moving pods comes with the scheduler)",
                self.desired.metadata.revision, self.ctx.node, self.record.admitted_revision
            ));
        }
        let plan = plan_revision(spec, &self.record.containers);
        match self.apply_revision(spec, &plan, stop_only).await {
            Ok(()) => StepOutcome::Done(None),
            Err(error) => StepOutcome::Failed(error),
        }
    }

    /// A step a volume plugin's Controller delegated to the node
    /// (`PLUGIN/prepare` or `PLUGIN/mount`), for the desired revision's
    /// volumes of that plugin.
    async fn plugin_step(&self, spec: PodSpec, plugin: String, verb: Verb) -> StepRun {
        let (pods_dir, uid) = (self.ctx.runner.pods_dir.clone(), self.uid());
        let (ranges, plugins) = (self.ctx.id_ranges.clone(), self.ctx.plugins.clone());
        let pool = self.ctx.sandbox_pool.clone();
        let pod = self.desired.clone();
        let run = tokio::task::spawn_blocking(move || {
            let host_base = pod_host_base(&pool, &ranges, &uid, &spec)?;
            let range = crate::volumes::PodRange { host_base };
            Ok::<_, String>(crate::plugin_volumes::run_step(
                &plugins, &pods_dir, &pod, &spec, range, &plugin, verb,
            ))
        })
        .await;
        match run {
            Ok(Ok(run)) => StepRun {
                outcome: match run.result {
                    Ok(note) => StepOutcome::Done(note),
                    Err(error) => StepOutcome::Failed(error),
                },
                log: run.log,
            },
            Ok(Err(error)) => StepOutcome::Failed(error).into(),
            Err(error) => StepOutcome::Failed(error.to_string()).into(),
        }
    }

    /// The status fields this node owns, from the local record.
    fn pod_status(&self) -> PodStatus {
        let spec = typed_spec(&self.record.pod);
        let containers = spec
            .as_ref()
            .map(|spec| {
                spec.containers
                    .iter()
                    .filter_map(|c| self.record.containers.get(&c.name).map(|r| (c, r)))
                    .map(|(c, r)| {
                        let (reason, message) = container_health(r);
                        ContainerStatus {
                            name: c.name.clone(),
                            state: match (r.running, r.pid) {
                                (true, Some(_)) => ContainerState::Running,
                                (true, None) => ContainerState::Waiting,
                                (false, _) => ContainerState::Exited,
                            },
                            restarts: r.restarts,
                            started_at: r.started_at,
                            container_id: Some(r.runtime_id.clone()),
                            exit_code: r.exit_code,
                            ready: !self.deleting()
                                && r.pid.is_some()
                                && (r.ready || c.readiness.is_none()),
                            reason: Some(reason),
                            message,
                            last_exit: r.last_exit.clone(),
                            next_restart_at: r
                                .restart_after
                                .filter(|_| r.running && r.pid.is_none()),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        PodStatus {
            phase: spec
                .as_ref()
                .map_or(PodPhase::Pending, |s| pod_phase(s, &self.record.containers)),
            observed_revision: Some(self.record.pod.metadata.revision)
                .filter(|r| *r > 0 && !self.record.containers.is_empty()),
            containers,
            ..PodStatus::default()
        }
    }
}

#[async_trait]
impl Workload for PodWorkload {
    fn desired(&self) -> &Object {
        &self.desired
    }

    fn desired_mut(&mut self) -> &mut Object {
        &mut self.desired
    }

    async fn admit_without_workflow(&mut self) {
        if self.desired.metadata.revision > self.record.admitted_revision
            && let Some(spec) = typed_spec(&self.desired)
            && let StepOutcome::Failed(error) = self.apply_containers(&spec, false).await
        {
            tracing::warn!(pod = %self.key(), %error, "cannot admit the revision; retrying");
        }
    }

    /// Pulling images and preparing volumes need nothing of the pod once
    /// started: they run beside the sandbox's creation.
    fn is_detached(&self, step: &str) -> bool {
        matches!(
            step.parse::<PodStep>(),
            Ok(PodStep::PullImage | PodStep::PrepareVolumes)
        )
    }

    fn running_log(&mut self) -> Vec<(String, String)> {
        let Some(log) = &self.pull_log else {
            return Vec::new();
        };
        let step = PodStep::PullImage.as_str();
        log.take()
            .into_iter()
            .map(|line| (step.to_string(), line))
            .collect()
    }

    fn detach(&mut self, step: &str, work: &NodeWork) -> BoxFuture<'static, StepRun> {
        let Some(spec) = typed_spec(&self.desired) else {
            return Box::pin(std::future::ready(
                StepOutcome::Failed("the pod's spec does not decode".into()).into(),
            ));
        };
        match step.parse::<PodStep>() {
            Ok(PodStep::PullImage) => self.pull_images(&spec),
            Ok(PodStep::PrepareVolumes) => self.prepare_volumes(spec, work),
            _ => {
                let error = format!("{step} does not run on its own");
                Box::pin(std::future::ready(StepOutcome::Failed(error).into()))
            }
        }
    }

    /// Running no init container, and waiting for readiness once every
    /// container of the admitted revision already runs and is ready, are
    /// settled in the request that reports the step before them.
    fn settled_at_once(&self, step: &str, _work: &NodeWork) -> Option<Settled> {
        let spec = typed_spec(&self.desired)?;
        match step.parse::<PodStep>().ok()? {
            PodStep::RunInitContainers if spec.init_containers.is_empty() => Some(Settled {
                note: Some(NO_INIT_CONTAINERS.into()),
            }),
            PodStep::AwaitReadiness if self.ready_at_once(&spec) => Some(Settled { note: None }),
            _ => None,
        }
    }

    async fn run_step(&mut self, step: &str, work: &NodeWork) -> StepRun {
        let Some(spec) = typed_spec(&self.desired) else {
            return StepOutcome::Failed("the pod's spec does not decode".into()).into();
        };
        let Ok(typed) = step.parse::<PodStep>() else {
            return match Verb::of_step(step) {
                // Only the plugin's own Controller can hand its steps to
                // the node: a step of another owner named like it must not
                // make the node run the plugin.
                Some((plugin, verb)) if work.delegated_to_node(step, plugin) => {
                    if verb.is_teardown() {
                        self.plugin_teardown_step(plugin.to_string(), verb).await
                    } else {
                        self.plugin_step(spec, plugin.to_string(), verb).await
                    }
                }
                _ => StepOutcome::Failed(format!("this node does not know step {step}")).into(),
            };
        };
        match typed {
            PodStep::CreateSandbox => StepRun::from(self.ensure_sandbox().await.map(Some)),
            PodStep::PullImage => self.pull_images(&spec).await,
            PodStep::PrepareVolumes => self.prepare_volumes(spec, work).await,
            PodStep::RunInitContainers => self.run_init_containers(&spec).await,
            PodStep::StartContainers | PodStep::StartChangedContainers => {
                self.apply_containers(&spec, false).await.into()
            }
            PodStep::StopChangedContainers => self.apply_containers(&spec, true).await.into(),
            PodStep::AwaitReadiness => self.await_readiness(&spec).into(),
            PodStep::MarkUnready => self.mark_unready(),
            PodStep::StopContainers => self.stop_containers().await,
            PodStep::ReleaseVolumes => self.release_volumes(Some(work)).await,
            PodStep::RemoveSandbox => self.remove_sandbox().await,
            // The agent runs these itself when it finds a stale sandbox
            // (`recover.rs`); the server only records them.
            PodStep::CheckSandbox | PodStep::ClearStaleSandbox => StepOutcome::Failed(format!(
                "{step} runs only in the node's own recovery of a stale sandbox"
            ))
            .into(),
        }
    }

    async fn resume(&mut self) {
        self.recover_if_stale().await;
        self.resume_hold = None;
    }

    async fn supervise(&mut self) -> bool {
        self.cleanups.retain(|cleanup| !cleanup.is_finished());
        if self.record.recovery.is_some() && Instant::now() >= self.recovery_report_at {
            // The API may be away for long: a try every few seconds.
            self.recovery_report_at = Instant::now() + RECOVERY_REPORT_RETRY;
            self.report_recovery().await;
        }
        if self.deleting() {
            // Its stop workflow stops the containers: nothing restarts.
            return false;
        }
        let recovered = self.retry_recovery().await;
        let restarted = self.restart_exited().await;
        let probed = self.probe().await;
        let data = self.retry_data_change().await;
        recovered || restarted || probed || data
    }

    fn status(&self) -> Option<Map<String, Value>> {
        let value = serde_json::to_value(self.pod_status()).unwrap_or_default();
        Some(crate::executor::owned_fields(&value, &STATUS_FIELDS))
    }

    async fn data_changed(&mut self, change: &DataChange) {
        self.apply_data_change(change).await;
    }

    async fn remove(&mut self) {
        self.remove_pod().await;
    }
}

/// The host id of the pod's root when it gets its own user namespace
/// (taken from a spare sandbox or allocated here if the sandbox is not
/// made yet; idempotent): volumes belong to the pod's id range.
fn pod_host_base(
    pool: &SandboxPool,
    ranges: &IdRanges,
    uid: &str,
    spec: &PodSpec,
) -> Result<Option<u32>, String> {
    let relax = sandbox::relaxations(spec).map_err(|e| e.to_string())?;
    let runtime = spec.runtime.unwrap_or(RuntimeClass::Runc);
    if sandbox::wants_user_namespace(&relax, runtime) {
        Ok(Some(pool.reserve_range(ranges, uid)?))
    } else {
        Ok(None)
    }
}

/// The sandbox `spec`'s containers run in: its relaxations, and the pod's
/// user namespace and host id range when its sandbox has one.
fn pod_sandbox(
    ranges: &IdRanges,
    uid: &str,
    spec: &PodSpec,
    container: &str,
    netns: &Path,
) -> Result<PodSandbox, ContainerError> {
    let config_error = |message: String| ContainerError::Config {
        container: container.to_string(),
        message,
    };
    let relax = sandbox::relaxations(spec).map_err(|e| config_error(e.to_string()))?;
    let runtime = spec.runtime.unwrap_or(RuntimeClass::Runc);
    let user_namespace = user_namespace_path(netns);
    let host_id_base = ranges.get(uid);
    let has_one = user_namespace.exists() && host_id_base.is_some();
    if has_one != sandbox::wants_user_namespace(&relax, runtime) {
        return Err(config_error(
            "the pod's sandbox was made with a different user-namespace setting (runtime or no-user-namespace changed): delete and recreate the pod to change it".to_string(),
        ));
    }
    Ok(PodSandbox {
        netns: netns.to_path_buf(),
        relax,
        host_id_base: host_id_base.filter(|_| has_one),
        user_namespace: has_one.then_some(user_namespace),
        runtime,
    })
}

/// The first 12 alphanumeric characters of a uid, for names.
fn short(uid: &str) -> String {
    uid.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(12)
        .collect()
}

/// The registry host an image is pulled from (`docker.io` for a Docker Hub
/// short name), to find its credentials; `None` for a local-only name.
fn pull_host(image: &str) -> Option<String> {
    let reference: corral_runtime::image::Reference = image.parse().ok()?;
    reference.pull_name()?.registry
}
