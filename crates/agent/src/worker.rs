//! One task per pod: admits new revisions through the pod's workflow steps,
//! keeps its containers running per the restart policy, and reports status.
//! It works from its local record, so it keeps going with the API down.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use corral_api::kinds::{ContainerState, ContainerStatus, PodSpec, PodStatus, RuntimeClass};
use corral_api::{Object, ObjectKey};
use corral_runtime::oci::reap;
use tokio::sync::mpsc;

use crate::containers::ContainerError;
use crate::idranges::IdRanges;
use crate::plan::{RevisionPlan, plan_revision, pod_phase, restart_at};
use crate::plugins::Verb;
use crate::probes;
use crate::sandbox::{self, PodSandbox};
use crate::state::PodRecord;
use corral_api::workflow::{StepActionKind, WorkflowInstance};
use corral_runtime::oci::userns::{IdRange, user_namespace_path};

use crate::AgentContext;
use crate::steps::{instance_for, is_running, node_steps, request};

/// How often a worker looks at its containers without being told to.
pub const TICK: Duration = Duration::from_millis(500);

/// What the manager tells a worker.
#[derive(Debug)]
pub enum PodMessage {
    /// The pod as the API now has it (bound to this node).
    Desired(Box<Object>),
    /// The pod is gone from the API, or bound elsewhere: stop everything.
    Remove,
}

/// The state of one pod on this node.
#[derive(Debug)]
pub struct PodWorker {
    ctx: Arc<AgentContext>,
    record: PodRecord,
    desired: Object,
    /// The status last reported, to write only on change.
    reported: Option<serde_json::Value>,
    /// Probe bookkeeping per container (not persisted: probes start over).
    probes: BTreeMap<String, ProbeState>,
    /// When `node/await-readiness` began waiting for a revision.
    readiness_wait: Option<(u64, Instant)>,
    /// Lines the step just executed produced for its step log (a volume
    /// plugin's output), sent before its outcome.
    step_log: Vec<String>,
    /// Step attempts this worker executed and reported (instance, step,
    /// attempt): a stale view of the pod (an older watch event) can still
    /// show one running, and it must not run twice. (A step ready for a
    /// retry shows the failed attempt's number too, but is claimed first.)
    finished: std::collections::BTreeSet<(String, String, u32)>,
}

/// Where one container's probes stand.
#[derive(Debug, Default)]
struct ProbeState {
    next_at: Option<Instant>,
    readiness_failures: u32,
    liveness_failures: u32,
    last_error: Option<String>,
}

fn typed_spec(object: &Object) -> Option<PodSpec> {
    object.typed_spec().ok()
}

impl PodWorker {
    pub fn new(ctx: Arc<AgentContext>, record: PodRecord) -> Self {
        let desired = record.pod.clone();
        PodWorker {
            ctx,
            record,
            desired,
            reported: None,
            probes: BTreeMap::new(),
            readiness_wait: None,
            step_log: Vec::new(),
            finished: Default::default(),
        }
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

    /// Runs until the pod is removed or the channel closes (agent shutdown,
    /// which leaves containers running).
    pub async fn run(mut self, mut messages: mpsc::Receiver<PodMessage>) {
        loop {
            self.reconcile().await;
            let message = tokio::select! {
                message = messages.recv() => message,
                () = tokio::time::sleep(TICK) => continue,
            };
            match message {
                Some(PodMessage::Desired(object)) => self.desired = *object,
                Some(PodMessage::Remove) => {
                    self.remove().await;
                    return;
                }
                None => return,
            }
        }
    }

    async fn reconcile(&mut self) {
        self.admit().await;
        self.supervise().await;
        self.probe().await;
        self.report().await;
    }

    /// Runs the readiness and liveness probes that are due.
    async fn probe(&mut self) {
        let Some(spec) = typed_spec(&self.record.pod) else {
            return;
        };
        let Some(netns) = self.record.netns.clone() else {
            return;
        };
        let Ok(runtime) = self.ctx.runner.runtimes.for_class(spec.runtime).cloned() else {
            return;
        };
        let mut changed = false;
        for container in &spec.containers {
            if container.readiness.is_none() && container.liveness.is_none() {
                continue;
            }
            let Some(record) = self.record.containers.get(&container.name).cloned() else {
                continue;
            };
            if !(record.running && record.pid.is_some()) {
                self.probes.remove(&container.name);
                continue;
            }
            let state = self.probes.entry(container.name.clone()).or_default();
            let now = Instant::now();
            let first_delay = container
                .readiness
                .iter()
                .chain(container.liveness.iter())
                .filter_map(|p| p.initial_delay_seconds)
                .min()
                .unwrap_or(0);
            let due = *state
                .next_at
                .get_or_insert(now + Duration::from_secs(u64::from(first_delay)));
            if now < due {
                continue;
            }
            let period = container
                .readiness
                .iter()
                .chain(container.liveness.iter())
                .filter_map(|p| p.period_seconds)
                .min()
                .unwrap_or(probes::DEFAULT_PERIOD_SECONDS);
            state.next_at = Some(now + Duration::from_secs(u64::from(period.max(1))));
            for (kind, probe) in [
                ("readiness", &container.readiness),
                ("liveness", &container.liveness),
            ] {
                let Some(probe) = probe.clone() else {
                    continue;
                };
                let (probe_runtime, id, netns) =
                    (runtime.clone(), record.runtime_id.clone(), netns.clone());
                let result = tokio::task::spawn_blocking(move || {
                    probes::run(&probe, probe_runtime.as_ref(), &id, &netns)
                })
                .await
                .unwrap_or_else(|error| Err(error.to_string()));
                let threshold = match kind {
                    "readiness" => container.readiness.as_ref(),
                    _ => container.liveness.as_ref(),
                }
                .and_then(|p| p.failure_threshold)
                .unwrap_or(probes::DEFAULT_FAILURE_THRESHOLD);
                let state = self.probes.entry(container.name.clone()).or_default();
                let entry = self
                    .record
                    .containers
                    .get_mut(&container.name)
                    .expect("INVARIANT: checked above");
                match (kind, result) {
                    ("readiness", Ok(())) => {
                        state.readiness_failures = 0;
                        changed |= !entry.ready;
                        entry.ready = true;
                    }
                    ("readiness", Err(error)) => {
                        state.readiness_failures += 1;
                        state.last_error = Some(error);
                        if state.readiness_failures >= threshold && entry.ready {
                            entry.ready = false;
                            changed = true;
                        }
                    }
                    (_, Ok(())) => state.liveness_failures = 0,
                    (_, Err(error)) => {
                        state.liveness_failures += 1;
                        if state.liveness_failures >= threshold {
                            tracing::info!(pod = %self.record.pod.key(), container = %container.name, %error, "liveness failed; killing the container");
                            state.liveness_failures = 0;
                            let _ = runtime
                                .kill(&entry.runtime_id, corral_runtime::oci::Signal::SIGKILL);
                        }
                        state.last_error = Some(error);
                    }
                }
            }
        }
        if changed {
            self.save();
        }
    }

    fn save(&self) {
        if let Err(error) = self.ctx.state.save(&self.record) {
            tracing::error!(pod = %self.key(), error = %crate::chain(&error), "cannot save local pod state");
        }
    }

    /// Moves the pod towards the desired revision, one ready workflow step
    /// at a time, following the instance the API returns after each
    /// transition so no step is executed twice.
    async fn admit(&mut self) {
        let desired_revision = self.desired.metadata.revision;
        let Some(mut instance) =
            instance_for(&*self.ctx.steps, &self.desired, desired_revision).await
        else {
            if desired_revision > self.record.admitted_revision {
                // No workflow for this revision (none was recorded): admit directly.
                let _ = self.run_step("node/start-containers", None).await;
            }
            return;
        };
        let mut attempted = std::collections::BTreeSet::new();
        while is_running(&instance) {
            let running = node_steps(&instance, "running");
            let attempt_of = |instance: &WorkflowInstance, step: &str| {
                let attempts = instance.step(step).map_or(0, |s| s.attempts);
                (instance.id.clone(), step.to_string(), attempts)
            };
            let Some(step) = running
                .iter()
                .chain(node_steps(&instance, "ready").iter())
                .find(|step| {
                    // A ready step is claimed first (a stale one is refused);
                    // a running one we already reported is a stale view.
                    let reported = running.contains(*step)
                        && self.finished.contains(&attempt_of(&instance, step));
                    !attempted.contains(*step) && !reported
                })
                .cloned()
            else {
                return;
            };
            attempted.insert(step.clone());
            if !running.contains(&step) {
                let claim = request(StepActionKind::Claim, &step, &instance.id);
                match self.ctx.steps.act(&self.key(), &claim).await {
                    Ok(fresh) => instance = self.remember(fresh),
                    Err(error) => {
                        // Our view is stale (or the API is away): wait for the next update.
                        tracing::debug!(pod = %self.key(), %step, %error, "claim refused");
                        return;
                    }
                }
            }
            let outcome = self.run_step(&step, Some(&instance)).await;
            for line in std::mem::take(&mut self.step_log) {
                let mut log = request(StepActionKind::Log, &step, &instance.id);
                log.message = Some(line);
                if let Err(error) = self.ctx.steps.act(&self.key(), &log).await {
                    tracing::debug!(pod = %self.key(), %step, %error, "cannot log for step");
                }
            }
            let action = match outcome {
                StepOutcome::Done(note) => {
                    let mut done = request(StepActionKind::Complete, &step, &instance.id);
                    done.note = note;
                    done
                }
                StepOutcome::Failed(error) => {
                    let mut failed = request(StepActionKind::Fail, &step, &instance.id);
                    failed.error = Some(error);
                    failed
                }
                StepOutcome::NotYet => continue,
            };
            let attempt = attempt_of(&instance, &step);
            match self.ctx.steps.act(&self.key(), &action).await {
                Ok(fresh) => {
                    self.finished.insert(attempt);
                    instance = self.remember(fresh);
                }
                Err(error) => {
                    tracing::debug!(pod = %self.key(), %step, %error, "cannot report step");
                    return;
                }
            }
        }
    }

    /// Puts an instance the API returned into the local copy of the pod, so
    /// the next round does not act on an older view of it.
    fn remember(&mut self, fresh: WorkflowInstance) -> WorkflowInstance {
        crate::steps::remember(&mut self.desired, &fresh);
        fresh
    }

    /// Executes one node step for the desired revision (`instance`: the
    /// workflow instance it belongs to, if any).
    async fn run_step(&mut self, step: &str, instance: Option<&WorkflowInstance>) -> StepOutcome {
        let Some(spec) = typed_spec(&self.desired) else {
            return StepOutcome::Failed("the pod's spec does not decode".into());
        };
        match step {
            "node/create-sandbox" => match self.ensure_sandbox().await {
                Ok(path) => StepOutcome::Done(Some(path)),
                Err(error) => StepOutcome::Failed(error),
            },
            "node/pull-image" => {
                let runner = self.ctx.runner.clone();
                let images: Vec<String> = spec.containers.iter().map(|c| c.image.clone()).collect();
                // Recorded first, so image GC never takes what is being pulled.
                self.record.pulling.clone_from(&images);
                self.save();
                let pulled = tokio::task::spawn_blocking(move || {
                    images
                        .iter()
                        .map(|image| runner.ensure_image(image).map(|_| ()))
                        .collect::<Result<Vec<()>, ContainerError>>()
                })
                .await;
                match pulled {
                    Ok(Ok(_)) => StepOutcome::Done(None),
                    Ok(Err(error)) => StepOutcome::Failed(crate::chain(&error)),
                    Err(error) => StepOutcome::Failed(error.to_string()),
                }
            }
            "node/prepare-volumes" => {
                let missing = instance
                    .map(|i| crate::plugin_volumes::missing_steps(i, &spec))
                    .unwrap_or_default();
                if !missing.is_empty() {
                    return StepOutcome::Failed(format!(
                        "the pod's plugin volumes need the steps {} executed by the node, and this workflow has none: an operator registers them with a Controller named after the plugin (steps PLUGIN/prepare and PLUGIN/mount, executor: node; see examples/volume-plugins)",
                        missing.join(", ")
                    ));
                }
                let (pods_dir, uid) = (self.ctx.runner.pods_dir.clone(), self.uid());
                let ranges = self.ctx.id_ranges.clone();
                let prepared = tokio::task::spawn_blocking(move || {
                    let host_base = pod_host_base(&ranges, &uid, &spec)?;
                    let owner = crate::volumes::PodRange { host_base };
                    crate::volumes::prepare(&pods_dir, &uid, &spec, &owner)
                        .map_err(|e| crate::chain(&e))
                })
                .await;
                match prepared {
                    Ok(Ok(note)) => StepOutcome::Done(Some(note).filter(|n| !n.is_empty())),
                    Ok(Err(error)) => StepOutcome::Failed(error),
                    Err(error) => StepOutcome::Failed(error.to_string()),
                }
            }
            "node/start-containers"
            | "node/start-changed-containers"
            | "node/stop-changed-containers" => {
                if let Err(error) = self.ensure_sandbox().await {
                    return StepOutcome::Failed(error);
                }
                let stop_only = step == "node/stop-changed-containers";
                if stop_only && let Err(short) = self.fits_here(&spec) {
                    return StepOutcome::Failed(format!(
                        "revision {} no longer fits node {}: {short} (the pod stays on revision {}; moving pods comes with the scheduler)",
                        self.desired.metadata.revision,
                        self.ctx.node,
                        self.record.admitted_revision
                    ));
                }
                let plan = plan_revision(&spec, &self.record.containers);
                match self.apply_revision(&spec, &plan, stop_only).await {
                    Ok(()) => StepOutcome::Done(None),
                    Err(error) => StepOutcome::Failed(error),
                }
            }
            "node/await-readiness" => {
                let revision = self.desired.metadata.revision;
                if self.record.admitted_revision != revision {
                    return StepOutcome::NotYet;
                }
                let began = match self.readiness_wait {
                    Some((waiting_for, began)) if waiting_for == revision => began,
                    _ => {
                        let now = Instant::now();
                        self.readiness_wait = Some((revision, now));
                        now
                    }
                };
                let deadline = spec
                    .containers
                    .iter()
                    .filter_map(|c| c.readiness.as_ref()?.deadline_seconds)
                    .max();
                let all_ready = spec.containers.iter().all(|c| {
                    self.record.containers.get(&c.name).is_some_and(|r| {
                        r.running && r.pid.is_some() && (r.ready || c.readiness.is_none())
                    })
                });
                if all_ready {
                    StepOutcome::Done(None)
                } else if let Some(seconds) =
                    deadline.filter(|s| began.elapsed() >= Duration::from_secs(u64::from(*s)))
                {
                    let why = self
                        .probes
                        .values()
                        .find_map(|p| p.last_error.clone())
                        .unwrap_or_else(|| "no probe passed yet".to_string());
                    StepOutcome::Failed(format!("not ready within {seconds}s: {why}"))
                } else {
                    StepOutcome::NotYet
                }
            }
            other => {
                let step = instance.and_then(|i| i.step(other));
                match Verb::of_step(other) {
                    // Only the plugin's own Controller can hand its steps
                    // to the node: a step of another owner named like it
                    // must not make the node run the plugin.
                    Some((plugin, verb))
                        if step.is_some_and(|s| {
                            s.definition.owner == plugin
                                && s.definition.executor
                                    == Some(corral_api::workflow::StepExecutor::Node)
                        }) =>
                    {
                        self.plugin_step(spec, plugin.to_string(), verb).await
                    }
                    _ => StepOutcome::Failed(format!("this node does not know step {other}")),
                }
            }
        }
    }

    /// Runs a volume plugin's delegated step (`PLUGIN/prepare` or
    /// `PLUGIN/mount`) for the desired revision's volumes of that plugin.
    async fn plugin_step(&mut self, spec: PodSpec, plugin: String, verb: Verb) -> StepOutcome {
        let (pods_dir, uid) = (self.ctx.runner.pods_dir.clone(), self.uid());
        let (ranges, plugins) = (self.ctx.id_ranges.clone(), self.ctx.plugins.clone());
        let pod = self.desired.clone();
        let run = tokio::task::spawn_blocking(move || {
            let host_base = pod_host_base(&ranges, &uid, &spec)?;
            let range = crate::volumes::PodRange { host_base };
            Ok::<_, String>(crate::plugin_volumes::run_step(
                &plugins, &pods_dir, &pod, &spec, range, &plugin, verb,
            ))
        })
        .await;
        match run {
            Ok(Ok(run)) => {
                self.step_log = run.log;
                match run.result {
                    Ok(note) => StepOutcome::Done(note),
                    Err(error) => StepOutcome::Failed(error),
                }
            }
            Ok(Err(error)) => StepOutcome::Failed(error),
            Err(error) => StepOutcome::Failed(error.to_string()),
        }
    }

    /// Whether `spec` fits this node next to the other pods it runs.
    fn fits_here(&self, spec: &PodSpec) -> Result<(), String> {
        let capacity = crate::node::detect_status(None).capacity;
        let others: Vec<PodSpec> = self
            .ctx
            .state
            .load_all()
            .unwrap_or_default()
            .into_iter()
            .filter(|record| record.pod.key() != self.key())
            .filter_map(|record| typed_spec(&record.pod))
            .collect();
        crate::plan::fits((capacity.cpu.millis, capacity.memory.bytes), &others, spec)
    }

    /// The pod's network namespace (and, unless it runs without one, the
    /// user namespace that owns it, with the pod's host id range), wired
    /// to the node's pod network.
    async fn ensure_sandbox(&mut self) -> Result<String, String> {
        let path = match &self.record.netns {
            Some(path) if path.exists() => path.clone(),
            _ => {
                let path = self.create_sandbox().await?;
                self.record.netns = Some(path.clone());
                self.save();
                path
            }
        };
        match self.ensure_network(&path).await? {
            Some(note) => Ok(format!("{}; {note}", path.display())),
            None => Ok(path.display().to_string()),
        }
    }

    async fn create_sandbox(&self) -> Result<PathBuf, String> {
        let spec = typed_spec(&self.desired).ok_or("the pod's spec does not decode")?;
        let relax = sandbox::relaxations(&spec).map_err(|e| e.to_string())?;
        let runtime = spec.runtime.unwrap_or(RuntimeClass::Runc);
        let user_namespace = sandbox::wants_user_namespace(&relax, runtime);
        let (netns, ranges, uid) = (
            self.ctx.netns.clone(),
            self.ctx.id_ranges.clone(),
            self.uid(),
        );
        let name = format!("pod-{}", short(&uid));
        tokio::task::spawn_blocking(move || -> Result<PathBuf, String> {
            if !user_namespace {
                return netns.create(&name).map_err(|e| crate::chain(&e));
            }
            let host_base = ranges.allocate(&uid)?;
            let ids = IdRange {
                host_base,
                size: sandbox::IDS_PER_POD,
            };
            netns
                .create_with_user_namespace(&name, ids)
                .map(|pinned| pinned.net)
                .map_err(|e| crate::chain(&e))
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Wires the pod's network namespace (veth, its IPv6 address from
    /// `status.address`, IPv4 egress); `None` when the node has no pod network.
    async fn ensure_network(&mut self, netns: &std::path::Path) -> Result<Option<String>, String> {
        let Some(network) = self.ctx.network.clone() else {
            return Ok(None);
        };
        let ipv6 = match crate::network::pod_address(&self.desired) {
            Ok(address) => address,
            Err(crate::network::NetworkError::NoAddress) if self.ctx.client.is_some() => {
                // Our copy may predate the address IPAM wrote: ask once.
                let client = self.ctx.client.as_ref().expect("INVARIANT: checked above");
                let fresh = client
                    .get(&self.key())
                    .await
                    .map_err(|e| crate::chain(&e))?;
                crate::network::pod_address(&fresh).map_err(|e| crate::chain(&e))?
            }
            Err(error) => return Err(crate::chain(&error)),
        };
        if self.record.egress_ipv4.is_none() {
            let taken = self
                .ctx
                .state
                .load_all()
                .unwrap_or_default()
                .into_iter()
                .filter(|record| record.pod.key() != self.key())
                .filter_map(|record| record.egress_ipv4)
                .collect();
            self.record.egress_ipv4 = network
                .allocate_egress(&taken)
                .map_err(|e| crate::chain(&e))?;
            self.save();
        }
        if network.dns_address().is_none()
            && let Ok(prefix) = ipnet::Ipv6Net::new(ipv6, 64)
            && let Err(error) = network.start_dns(prefix.trunc())
        {
            tracing::warn!(pod = %self.key(), error = %crate::chain(&error), "the pod gets no DNS");
        }
        let owner = self.network_owner();
        let note = network
            .wire_pod(&owner, netns, ipv6, self.record.egress_ipv4)
            .await
            .map_err(|e| crate::chain(&e))?;
        if let Some(server) = network.dns_address() {
            let dir = crate::containers::pod_dir(&self.ctx.runner.pods_dir, &self.uid());
            let text = corral_net::dns::pod_resolv_conf(server, &self.key().namespace);
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(dir.join(crate::containers::RESOLV_CONF), text))
                .map_err(|e| format!("cannot write the pod's resolv.conf: {e}"))?;
        }
        Ok(Some(note))
    }

    /// Stops what the plan stops and (unless `stop_only`) starts what it
    /// starts; then the desired revision is the admitted one.
    async fn apply_revision(
        &mut self,
        spec: &PodSpec,
        plan: &RevisionPlan,
        stop_only: bool,
    ) -> Result<(), String> {
        let grace = Duration::from_secs(u64::from(spec.termination_grace_seconds.unwrap_or(10)));
        let old_spec = typed_spec(&self.record.pod).unwrap_or_else(|| spec.clone());
        for name in plan.to_stop() {
            // Forgotten only once stopped: a failed stop keeps it tracked.
            if let Some(record) = self.record.containers.get(name).cloned() {
                let runner = self.ctx.runner.clone();
                let uid = self.uid();
                let old_spec = old_spec.clone();
                tokio::task::spawn_blocking(move || runner.stop(&uid, &old_spec, &record, grace))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| crate::chain(&e))?;
                self.record.containers.remove(name);
            }
        }
        self.save();
        if stop_only {
            return Ok(());
        }
        let netns = self.record.netns.clone().ok_or("the pod has no sandbox")?;
        for name in plan.to_start() {
            let Some(container) = spec.containers.iter().find(|c| c.name == *name).cloned() else {
                continue;
            };
            let generation = self.next_generation(name);
            let runner = self.ctx.runner.clone();
            let ranges = self.ctx.id_ranges.clone();
            let (uid, pod_name, spec2, netns2) = (
                self.uid(),
                self.desired.metadata.name.clone(),
                spec.clone(),
                netns.clone(),
            );
            let started = tokio::task::spawn_blocking(move || {
                let sandbox = pod_sandbox(&ranges, &uid, &spec2, &container.name, &netns2)?;
                runner.start(&uid, &pod_name, &spec2, &container, generation, &sandbox)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| crate::chain(&e))?;
            self.record.containers.insert(name.clone(), started);
            self.save();
        }
        self.admit_desired(spec);
        Ok(())
    }

    /// The next generation of a container, recorded as taken.
    fn next_generation(&mut self, name: &str) -> u64 {
        let current = self
            .record
            .containers
            .get(name)
            .map_or(0, |r| r.generation)
            .max(self.record.generations.get(name).copied().unwrap_or(0));
        self.record
            .generations
            .insert(name.to_string(), current + 1);
        current + 1
    }

    /// Records the desired revision as the one this node runs.
    fn admit_desired(&mut self, spec: &PodSpec) {
        let images: Vec<String> = spec.containers.iter().map(|c| c.image.clone()).collect();
        if self.record.recent_images.last() != Some(&images) {
            self.record.recent_images.push(images);
        }
        let keep = self.ctx.image_revisions;
        let excess = self.record.recent_images.len().saturating_sub(keep);
        self.record.recent_images.drain(..excess);
        self.record.pod = self.desired.clone();
        self.record.admitted_revision = self.desired.metadata.revision;
        self.record.pulling.clear();
        self.save();
    }

    /// Notices exited containers and restarts them per the restart policy.
    async fn supervise(&mut self) {
        let Some(spec) = typed_spec(&self.record.pod) else {
            return;
        };
        let now = Utc::now();
        let mut changed = false;
        let names: Vec<String> = self.record.containers.keys().cloned().collect();
        for name in names {
            let Some(record) = self.record.containers.get(&name).cloned() else {
                continue;
            };
            if let (true, Some(pid)) = (record.running, record.pid) {
                let exit_code = match liveness(pid) {
                    Liveness::Alive => continue,
                    Liveness::Exited(code) => code,
                };
                let restart = restart_at(spec.restart_policy, exit_code, record.restarts, now);
                tracing::info!(pod = %self.key(), container = %name, ?exit_code, restart = ?restart, "container exited");
                let entry = self
                    .record
                    .containers
                    .get_mut(&name)
                    .expect("INVARIANT: name came from the map");
                entry.pid = None;
                entry.exit_code = exit_code;
                entry.ready = false;
                entry.running = restart.is_some();
                entry.restart_after = restart;
                changed = true;
            } else if record.running && record.restart_after.is_some_and(|at| at <= now) {
                let Some(container) = spec.containers.iter().find(|c| c.name == name).cloned()
                else {
                    continue;
                };
                let Some(netns) = self.record.netns.clone() else {
                    continue;
                };
                let runner = self.ctx.runner.clone();
                let ranges = self.ctx.id_ranges.clone();
                let (uid, pod_name, spec2) = (
                    self.uid(),
                    self.record.pod.metadata.name.clone(),
                    spec.clone(),
                );
                let generation = self.next_generation(&name);
                let old = record.clone();
                let result = tokio::task::spawn_blocking(move || {
                    let _ = runner.cleanup(&uid, &old);
                    let sandbox = pod_sandbox(&ranges, &uid, &spec2, &container.name, &netns)?;
                    runner.start(&uid, &pod_name, &spec2, &container, generation, &sandbox)
                })
                .await;
                let key = self.key();
                let entry = self
                    .record
                    .containers
                    .get_mut(&name)
                    .expect("INVARIANT: name came from the map");
                match result {
                    Ok(Ok(mut started)) => {
                        started.restarts = record.restarts + 1;
                        *entry = started;
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(pod = %key, container = %name, error = %crate::chain(&error), "restart failed");
                        entry.restarts += 1;
                        entry.restart_after =
                            restart_at(spec.restart_policy, None, entry.restarts, now);
                    }
                    Err(error) => tracing::error!(%error, "restart task failed"),
                }
                changed = true;
            }
        }
        if changed {
            self.save();
        }
    }

    /// The status fields this node owns, from the local record.
    fn status(&self) -> PodStatus {
        let spec = typed_spec(&self.record.pod);
        let containers = spec
            .as_ref()
            .map(|spec| {
                spec.containers
                    .iter()
                    .filter_map(|c| self.record.containers.get(&c.name).map(|r| (c, r)))
                    .map(|(c, r)| ContainerStatus {
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
                        ready: r.pid.is_some() && (r.ready || c.readiness.is_none()),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let empty = BTreeMap::new();
        PodStatus {
            phase: spec
                .as_ref()
                .map_or(corral_api::kinds::PodPhase::Pending, |s| {
                    pod_phase(
                        s,
                        if self.record.containers.is_empty() {
                            &empty
                        } else {
                            &self.record.containers
                        },
                    )
                }),
            observed_revision: Some(self.record.pod.metadata.revision)
                .filter(|r| *r > 0 && !self.record.containers.is_empty()),
            containers,
            ..PodStatus::default()
        }
    }

    /// Writes the node-owned status fields when they changed; on failure
    /// (API down) tries again next tick.
    async fn report(&mut self) {
        let Some(client) = &self.ctx.client else {
            return;
        };
        let status = self.status();
        let value = serde_json::to_value(&status).unwrap_or_default();
        if self.reported.as_ref() == Some(&value) {
            return;
        }
        let key = self.key();
        let result: Result<(), corral_client::ClientError> = async {
            let mut current = client.get(&key).await?;
            let mut merged = current.status.as_object().cloned().unwrap_or_default();
            for field in ["phase", "containers", "observedRevision", "message"] {
                match value.get(field) {
                    Some(v) if !v.is_null() => merged.insert(field.to_string(), v.clone()),
                    _ => merged.remove(field),
                };
            }
            current.status = serde_json::Value::Object(merged);
            client.put_status(&current).await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => self.reported = Some(value),
            Err(error) => {
                tracing::debug!(pod = %key, error = %crate::chain(&error), "status not reported; will retry")
            }
        }
    }

    /// Stops every container, removes the sandbox and forgets the pod.
    async fn remove(&mut self) {
        let spec = typed_spec(&self.record.pod);
        let grace = Duration::from_secs(u64::from(
            spec.as_ref()
                .and_then(|s| s.termination_grace_seconds)
                .unwrap_or(10),
        ));
        // An undecodable spec still names no other runtime than runc.
        let spec = spec.unwrap_or_else(|| {
            serde_json::from_value(serde_json::json!({"containers": []}))
                .expect("INVARIANT: an empty container list is a valid pod spec")
        });
        for record in std::mem::take(&mut self.record.containers).into_values() {
            let runner = self.ctx.runner.clone();
            let (uid, spec) = (self.uid(), spec.clone());
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(error) = runner.stop(&uid, &spec, &record, grace) {
                    tracing::warn!(container = %record.runtime_id, error = %crate::chain(&error), "stop failed; removing its files anyway");
                    let _ = runner.cleanup(&uid, &record);
                }
            })
            .await;
        }
        if let Some(network) = self.ctx.network.clone()
            && let Err(error) = network.unwire_pod(&self.network_owner()).await
        {
            tracing::warn!(pod = %self.key(), error = %crate::chain(&error), "cannot remove the pod's veth");
        }
        let netns = self.ctx.netns.clone();
        let name = format!("pod-{}", short(&self.uid()));
        let _ = tokio::task::spawn_blocking(move || netns.remove(&name)).await;
        let (plugins, pods_dir, pod) = (
            self.ctx.plugins.clone(),
            self.ctx.runner.pods_dir.clone(),
            self.record.pod.clone(),
        );
        let host_uid = self.ctx.id_ranges.get(&self.uid());
        let spec2 = spec.clone();
        if let Ok(problems) = tokio::task::spawn_blocking(move || {
            crate::plugin_volumes::teardown(&plugins, &pods_dir, &pod, &spec2, host_uid)
        })
        .await
        {
            for problem in problems {
                tracing::warn!(pod = %self.key(), %problem, "volume plugin teardown failed; removing the pod's directory anyway");
            }
        }
        if crate::volumes::release(&self.ctx.runner.pods_dir, &self.uid(), &spec) {
            let _ = std::fs::remove_dir_all(crate::containers::pod_dir(
                &self.ctx.runner.pods_dir,
                &self.uid(),
            ));
        } else {
            tracing::error!(pod = %self.key(), "something stays mounted in the pod's directory; it is kept so no mounted data is deleted");
        }
        let uid = self.uid();
        let ranges = self.ctx.id_ranges.clone();
        let released = tokio::task::spawn_blocking(move || {
            crate::containers::remove_pod_cgroups(&uid);
            ranges.release(&uid)
        })
        .await;
        if let Ok(Err(error)) = released {
            tracing::error!(pod = %self.key(), error = %crate::chain(&error), "cannot free the pod's id range");
        }
        if let Err(error) = self.ctx.state.remove_if_uid(&self.key(), &self.uid()) {
            tracing::error!(pod = %self.key(), error = %crate::chain(&error), "cannot forget the pod");
        }
        tracing::info!(pod = %self.key(), "pod removed from this node");
    }
}

/// The host id of the pod's root when it gets its own user namespace
/// (allocated here if the sandbox is not made yet; allocation is
/// idempotent): volumes belong to the pod's id range.
fn pod_host_base(ranges: &IdRanges, uid: &str, spec: &PodSpec) -> Result<Option<u32>, String> {
    let relax = sandbox::relaxations(spec).map_err(|e| e.to_string())?;
    let runtime = spec.runtime.unwrap_or(RuntimeClass::Runc);
    if sandbox::wants_user_namespace(&relax, runtime) {
        Ok(Some(ranges.allocate(uid)?))
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

enum Liveness {
    Alive,
    /// Gone; the exit code when this process could collect it.
    Exited(Option<i32>),
}

/// Whether a container's init process still runs. Its own children (the
/// agent is their subreaper) are waited for, which yields the exit code;
/// processes adopted after an agent restart are looked up in `/proc`.
fn liveness(pid: u32) -> Liveness {
    match reap::try_wait(pid) {
        Ok(None) => Liveness::Alive,
        Ok(Some(status)) => Liveness::Exited(Some(status.code())),
        Err(_) => {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The state is the field after the parenthesised command name.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            match state {
                Some("Z") | Some("X") | None => Liveness::Exited(None),
                Some(_) => Liveness::Alive,
            }
        }
    }
}

enum StepOutcome {
    Done(Option<String>),
    Failed(String),
    NotYet,
}

fn short(uid: &str) -> String {
    uid.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(12)
        .collect()
}
