//! Pods on a real corral node: `corral up` (API server, controllers and node
//! agent in one process) with the busybox image imported, and the timed
//! operations of `corral-bench pod-start` against it. Every latency runs
//! from the API request to the watch event showing the pod running.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::{Client, StepLogQuery};
use serde_json::json;

use crate::pod_watch::PodWatch;
use crate::processes::CorralProcess;
use crate::report;
use crate::stats::median;

pub const NAMESPACE: &str = "default";

/// How long one pod may take to run (or to be updated, or to go away).
pub const POD_TIMEOUT: Duration = Duration::from_secs(120);

/// A corral node with the busybox image imported and a pod watch running.
#[derive(Debug)]
pub struct CorralNode {
    // The watch stops before the process is killed and cleaned up.
    watch: PodWatch,
    pub client: Client,
    pub process: CorralProcess,
}

/// A one-container pod: busybox `sleep 3600`, env `BENCH=<value>`. The
/// grace period is 0 because `sleep` as PID 1 of its namespace ignores
/// SIGTERM: with the default 10 s every stop (update, delete) would wait it
/// out, measuring the timer instead of corral. `runc delete --force` and
/// `podman rm -f` kill at once too.
pub fn pod(name: &str, value: usize) -> Object {
    let spec = json!({
        "terminationGraceSeconds": 0,
        "containers": [{
            "name": "c",
            "image": corral_testkit::BUSYBOX_IMAGE,
            "command": ["sleep", "3600"],
            "env": {"BENCH": value.to_string()},
        }],
    });
    Object::new(Kind::Pod, Some(NAMESPACE), name, spec)
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::Pod, Some(NAMESPACE), name)
}

impl CorralNode {
    /// Starts `corral up`, imports the image tar with `corral image import`
    /// and starts watching pods.
    pub async fn start(binary: &Path, image_tar: &Path) -> anyhow::Result<Self> {
        let process = CorralProcess::start(binary).await?;
        let output = tokio::process::Command::new(binary)
            .args(["image", "import"])
            .arg(image_tar)
            .arg("--data-dir")
            .arg(process.data_dir())
            .kill_on_drop(true)
            .output()
            .await
            .context("cannot run corral image import")?;
        if !output.status.success() {
            bail!(
                "corral image import failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let client = Client::new(&process.config)?;
        let watch = PodWatch::start(&client, NAMESPACE).await?;
        Ok(CorralNode {
            watch,
            client,
            process,
        })
    }

    /// Applies a new pod and returns the time until it is seen running.
    pub async fn start_pod(&self, name: String) -> anyhow::Result<Duration> {
        self.start_pod_under(name, None).await
    }

    /// [`start_pod`](Self::start_pod) with `spec.runtime` set (`gvisor`).
    pub async fn start_pod_under(
        &self,
        name: String,
        runtime: Option<&str>,
    ) -> anyhow::Result<Duration> {
        let mut object = pod(&name, 0);
        if let (Some(runtime), Some(spec)) = (runtime, object.spec.as_object_mut()) {
            spec.insert("runtime".into(), json!(runtime));
        }
        let started = Instant::now();
        let created = self
            .client
            .apply(&object, Some("bench: create"))
            .await
            .with_context(|| format!("cannot create pod {name}"))?;
        self.running_since(&created, started).await
    }

    /// Applies `object` (a new pod) and returns the time until it is seen
    /// running.
    pub async fn start_object(&self, object: &Object) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let created = self
            .client
            .apply(object, Some("bench: create"))
            .await
            .with_context(|| format!("cannot create pod {}", object.metadata.name))?;
        self.running_since(&created, started).await
    }

    /// Changes the env of running pod `name` to `value` and returns the time
    /// until the node reports the new revision running.
    pub async fn update_pod(&self, name: &str, value: usize) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let updated = self
            .client
            .apply(&pod(name, value), Some("bench: update"))
            .await
            .with_context(|| format!("cannot update pod {name}"))?;
        self.running_since(&updated, started).await
    }

    /// Deletes pod `name` and creates it again; returns the time from the
    /// delete request until the new pod is seen running. The name is free
    /// again once the pod's stop workflow finished and it is removed.
    pub async fn recreate_pod(&self, name: &str, value: usize) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let deleted = self
            .client
            .delete(&key(name), Some("bench: delete"))
            .await
            .with_context(|| format!("cannot delete pod {name}"))?;
        self.watch.gone(&deleted.metadata.uid, POD_TIMEOUT).await?;
        let created = self
            .client
            .apply(&pod(name, value), Some("bench: create again"))
            .await
            .with_context(|| format!("cannot create pod {name} again"))?;
        self.running_since(&created, started).await
    }

    async fn running_since(&self, pod: &Object, started: Instant) -> anyhow::Result<Duration> {
        self.process.remember_pod(&pod.metadata.uid);
        let at = self
            .watch
            .running_at(
                &pod.metadata.name,
                &pod.metadata.uid,
                pod.metadata.revision,
                POD_TIMEOUT,
            )
            .await?;
        Ok(at.saturating_duration_since(started))
    }

    /// Deletes every pod in the namespace through the API, then waits until
    /// the node has removed their containers.
    pub async fn delete_all_pods(&self) -> anyhow::Result<()> {
        let pods = self.client.list(Kind::Pod, Some(NAMESPACE), None).await?;
        for pod in &pods.items {
            self.client
                .delete(&pod.key(), Some("bench: clean up"))
                .await
                .with_context(|| format!("cannot delete pod {}", pod.metadata.name))?;
        }
        let deadline = Instant::now() + POD_TIMEOUT;
        loop {
            let left = self.containers().await?;
            // The node is done with the pods once their directories (the
            // last thing it removes) are gone too: the next phase does not
            // measure this one's teardown.
            let dirs = self.pod_dirs();
            if left == 0 && dirs == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{left} containers and {dirs} pod directories still exist {POD_TIMEOUT:?} after deleting every pod"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many pod directories the node keeps (`DATA/pods/UID`).
    fn pod_dirs(&self) -> usize {
        std::fs::read_dir(self.process.data_dir().join("pods"))
            .map(|entries| entries.flatten().filter(|e| e.path().is_dir()).count())
            .unwrap_or(0)
    }

    /// How many containers runc knows on this node.
    async fn containers(&self) -> anyhow::Result<usize> {
        let output = tokio::process::Command::new("runc")
            .arg(format!(
                "--root={}",
                self.process.data_dir().join("runc").display()
            ))
            .args(["list", "-q"])
            .kill_on_drop(true)
            .output()
            .await
            .context("cannot run runc list")?;
        Ok(String::from_utf8_lossy(&output.stdout).lines().count())
    }

    /// Adds the step times of pod `name`'s instances of `workflow`
    /// (`start`, `update`) to `times`, from its step log.
    pub async fn collect_step_times(
        &self,
        name: &str,
        workflow: &str,
        times: &mut StepTimes,
    ) -> anyhow::Result<()> {
        self.collect_object_step_times(&key(name), workflow, times)
            .await
    }

    /// [`collect_step_times`](Self::collect_step_times) of any object (the
    /// node's `join`).
    pub async fn collect_object_step_times(
        &self,
        key: &ObjectKey,
        workflow: &str,
        times: &mut StepTimes,
    ) -> anyhow::Result<()> {
        let entries = self
            .client
            .step_logs(key, &StepLogQuery::default())
            .await
            .with_context(|| format!("cannot read the step log of {key}"))?;
        let mut instances: BTreeMap<String, Vec<Transition>> = BTreeMap::new();
        for entry in entries.iter().filter(|e| e.workflow == workflow) {
            let Some(phase) = entry.fields.get("phase").and_then(|p| p.as_str()) else {
                continue;
            };
            instances
                .entry(entry.workflow_id.clone())
                .or_default()
                .push(Transition {
                    step: entry.step.clone(),
                    owner: entry.owner.clone(),
                    phase: phase.to_string(),
                    at: entry.time,
                });
        }
        for transitions in instances.values() {
            times.add(transitions);
        }
        Ok(())
    }

    /// The key of the node `corral up` runs (the only one).
    pub async fn node_key(&self) -> anyhow::Result<ObjectKey> {
        let nodes = self.client.list(Kind::Node, None, None).await?;
        nodes
            .items
            .first()
            .map(Object::key)
            .context("corral up has no node")
    }

    /// `VmRSS` and `VmHWM` (peak) of the `corral up` process, in KiB.
    pub fn rss_kib(&mut self) -> anyhow::Result<(u64, u64)> {
        self.process.ensure_running()?;
        let pid = self.process.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("cannot read /proc/{pid}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<u64>().ok())
                .with_context(|| format!("no {name} in /proc/{pid}/status"))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }
}

/// One transition from a step log: the engine records each with its phase.
#[derive(Debug, Clone)]
struct Transition {
    step: String,
    owner: String,
    phase: String,
    at: DateTime<Utc>,
}

/// Where workflows spent their time, per step, summed over pods from their
/// step logs (the engine's transitions carry their phase, so this does not
/// depend on how instances are stored).
#[derive(Debug, Default)]
pub struct StepTimes {
    /// Steps in the order they were first seen ready (graph order, roughly).
    order: Vec<(String, String)>,
    /// Per step: from ready to claimed, and from claimed to done.
    waited: BTreeMap<String, Vec<Duration>>,
    ran: BTreeMap<String, Vec<Duration>>,
    /// Per instance: from its first transition to its last step done.
    spans: Vec<Duration>,
}

fn between(from: DateTime<Utc>, to: DateTime<Utc>) -> Duration {
    (to - from).to_std().unwrap_or_default()
}

impl StepTimes {
    fn add(&mut self, transitions: &[Transition]) {
        let Some(first) = transitions.iter().map(|t| t.at).min() else {
            return;
        };
        let mut last_done = first;
        let mut steps: Vec<(String, String)> = Vec::new();
        for t in transitions {
            if t.owner != "workflow" && !steps.iter().any(|(s, _)| *s == t.step) {
                steps.push((t.step.clone(), t.owner.clone()));
            }
        }
        for (step, owner) in steps {
            let at = |phase: &str| -> Vec<DateTime<Utc>> {
                transitions
                    .iter()
                    .filter(|t| t.step == step && t.phase == phase)
                    .map(|t| t.at)
                    .collect()
            };
            let ready = at("ready").into_iter().min();
            let claimed = at("running").into_iter().min();
            let done = at("done").into_iter().max();
            if let (Some(ready), Some(claimed)) = (ready, claimed) {
                self.waited
                    .entry(step.clone())
                    .or_default()
                    .push(between(ready, claimed));
            }
            if let (Some(claimed), Some(done)) = (claimed, done) {
                self.ran
                    .entry(step.clone())
                    .or_default()
                    .push(between(claimed, done));
                last_done = last_done.max(done);
            }
            if !self.order.iter().any(|(s, _)| *s == step) {
                self.order.push((step, owner));
            }
        }
        self.spans.push(between(first, last_done));
    }

    /// A Markdown table: per step the median wait from ready to claimed and
    /// the median run from claimed to done, then the whole instance.
    pub fn table(&self, title: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{title}: {} instances, medians from the step log",
            self.spans.len()
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "| step | owner | ready → claimed | claimed → done |");
        let _ = writeln!(out, "|---|---|---:|---:|");
        let show = |samples: Option<&Vec<Duration>>| {
            samples
                .and_then(|samples| {
                    let mut sorted = samples.clone();
                    sorted.sort_unstable();
                    median(&sorted)
                })
                .map_or_else(|| "-".to_string(), report::millis)
        };
        for (step, owner) in &self.order {
            let _ = writeln!(
                out,
                "| {step} | {owner} | {} | {} |",
                show(self.waited.get(step)),
                show(self.ran.get(step)),
            );
        }
        let _ = writeln!(
            out,
            "| whole instance, first transition → last step done | | | {} |",
            show(Some(&self.spans))
        );
        out
    }
}
