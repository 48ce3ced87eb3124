//! A pod leaving this node, as the steps of its `stop` workflow (design
//! 0023) and, for a pod removed without one (its deletion forced, or it
//! was bound elsewhere), all at once:
//!
//! - `node/mark-unready`: every container reports not ready (DNS and load
//!   balancers stop sending to it); supervision stops restarting;
//! - `node/stop-containers`: each container's `preStop` hook, then SIGTERM,
//!   the rest of the grace period, SIGKILL — all containers at once;
//! - `node/release-volumes`: the containers' root filesystems, memory
//!   emptyDirs and the Secret/Config files (plugin volumes are their
//!   plugin's `unmount` and `release` steps; without those steps in the
//!   workflow the node calls the plugin here);
//! - `node/remove-sandbox`: veth, network namespace, whatever is still
//!   mounted below the pod's directory, the directory, cgroups and id range.
//!
//! A directory with something still mounted in it is kept, so no mounted
//! data is deleted.

use std::time::{Duration, Instant};

use corral_api::kinds::{Container, PodSpec};
use corral_runtime::oci::ExecSpec;

use super::{PodWorkload, short, typed_spec};
use crate::executor::{StepOutcome, StepRun};
use crate::plugins::Verb;
use crate::steps::NodeWork;

/// The grace period when the pod names none.
const DEFAULT_GRACE_SECONDS: u32 = 10;

impl PodWorkload {
    /// Whether the API asked for the pod's deletion: its containers are
    /// no longer restarted or probed, and none counts as ready.
    pub(super) fn deleting(&self) -> bool {
        self.desired.metadata.deleting.is_some()
    }

    fn removal_spec(&self) -> PodSpec {
        // An undecodable spec still names no other runtime than runc.
        typed_spec(&self.record.pod).unwrap_or_else(|| {
            serde_json::from_value(serde_json::json!({"containers": []}))
                .expect("INVARIANT: an empty container list is a valid pod spec")
        })
    }

    /// `node/mark-unready`: the status this step reports with says every
    /// container is not ready ([`Self::deleting`]).
    pub(super) fn mark_unready(&self) -> StepRun {
        let note = "no container counts as ready; DNS no longer answers with its address";
        StepOutcome::Done(Some(note.to_string())).into()
    }

    /// `node/stop-containers`: every container's `preStop` hook within the
    /// grace period, then SIGTERM, what is left of it, SIGKILL; all
    /// containers at once.
    pub(super) async fn stop_containers(&mut self) -> StepRun {
        let spec = self.removal_spec();
        let grace = Duration::from_secs(u64::from(
            spec.termination_grace_seconds
                .unwrap_or(DEFAULT_GRACE_SECONDS),
        ));
        let mut records = std::mem::take(&mut self.record.containers);
        self.save();
        // An init container still running goes with the others.
        if let Some((name, record)) = self.take_running_init() {
            records.insert(name, record);
        }
        let mut stops = Vec::new();
        for (name, record) in records {
            let runner = self.ctx.runner.clone();
            let (uid, spec) = (self.uid(), spec.clone());
            let hook = spec
                .containers
                .iter()
                .find(|c| c.name == name)
                .and_then(pre_stop_command);
            stops.push(async move {
                let began = Instant::now();
                let mut lines = Vec::new();
                if let (Some(command), Some(_)) = (hook, record.pid) {
                    lines.push(
                        run_pre_stop(&runner, &spec, &record.runtime_id, &name, command, grace)
                            .await,
                    );
                }
                let left = grace.saturating_sub(began.elapsed());
                let stopped = tokio::task::spawn_blocking(move || {
                    runner.stop(&uid, &spec, &record, left).map_err(|error| {
                        let _ = runner.cleanup(&uid, &record);
                        crate::chain(&error)
                    })
                })
                .await;
                lines.push(match stopped {
                    Ok(Ok(())) => format!(
                        "{name}: stopped after {:.1}s",
                        began.elapsed().as_secs_f64()
                    ),
                    Ok(Err(error)) => {
                        format!("{name}: stop failed ({error}); its files were removed anyway")
                    }
                    Err(error) => format!("{name}: stop failed: {error}"),
                });
                lines
            });
        }
        let log: Vec<String> = futures::future::join_all(stops)
            .await
            .into_iter()
            .flatten()
            .collect();
        let note = format!(
            "{} container(s) stopped",
            log.iter().filter(|l| l.contains(": stopped after")).count()
        );
        StepRun {
            outcome: StepOutcome::Done(Some(note)),
            log,
        }
    }

    /// `node/release-volumes`: container root filesystems, memory
    /// emptyDirs, Secret/Config files; plugin volumes too when the
    /// workflow has no `PLUGIN/unmount` step for them.
    pub(super) async fn release_volumes(&mut self, work: Option<&NodeWork>) -> StepRun {
        self.finish_cleanups().await;
        let spec = self.removal_spec();
        let (runner, uid) = (self.ctx.runner.clone(), self.uid());
        let pods_dir = runner.pods_dir.clone();
        let own = spec.clone();
        let _ = tokio::task::spawn_blocking(move || {
            runner.cleanup_all(&uid, &own);
            crate::volumes::release_own(&pods_dir, &uid, &own);
        })
        .await;
        let mut log = Vec::new();
        let unstepped: Vec<String> = plugin_drivers(&spec)
            .into_iter()
            .filter(|driver| {
                let step = format!("{driver}/unmount");
                !work.is_some_and(|work| work.delegated_to_node(&step, driver))
            })
            .collect();
        if !unstepped.is_empty() {
            log.push(format!(
                "plugin(s) {} have no unmount/release steps in this workflow: the node calls them here",
                unstepped.join(", ")
            ));
            for problem in self.teardown_plugins(&spec, &unstepped).await {
                log.push(problem);
            }
        }
        StepRun {
            outcome: StepOutcome::Done(None),
            log,
        }
    }

    /// `PLUGIN/unmount` or `PLUGIN/release` of the pod's volumes of that
    /// plugin, delegated to the node by the plugin's Controller.
    pub(super) async fn plugin_teardown_step(&self, plugin: String, verb: Verb) -> StepRun {
        let spec = self.removal_spec();
        let (plugins, pods_dir, pod) = (
            self.ctx.plugins.clone(),
            self.ctx.runner.pods_dir.clone(),
            self.record.pod.clone(),
        );
        let host_uid = self.ctx.id_ranges.get(&self.uid());
        let run = tokio::task::spawn_blocking(move || {
            crate::plugin_volumes::teardown_verb(
                &plugins, &pods_dir, &pod, &spec, host_uid, &plugin, verb,
            )
        })
        .await;
        match run {
            Ok(run) => StepRun {
                outcome: match run.result {
                    Ok(note) => StepOutcome::Done(note),
                    Err(error) => StepOutcome::Failed(error),
                },
                log: run.log,
            },
            Err(error) => StepOutcome::Failed(error.to_string()).into(),
        }
    }

    /// `node/remove-sandbox`: the pod's network, namespaces, directory,
    /// cgroups and id range.
    pub(super) async fn remove_sandbox(&mut self) -> StepRun {
        let spec = self.removal_spec();
        let mut log = Vec::new();
        if let Some(network) = self.ctx.network.clone()
            && let Err(error) = network.unwire_pod(&self.network_owner()).await
        {
            log.push(format!(
                "cannot remove the pod's veth: {}",
                crate::chain(&error)
            ));
        }
        crate::sandbox_pool::discard_reserved(&self.ctx, &self.uid()).await;
        self.ctx.sandbox_pool.start_done(&self.uid());
        let netns = self.ctx.netns.clone();
        let name = format!("pod-{}", short(&self.uid()));
        let _ = tokio::task::spawn_blocking(move || netns.remove(&name)).await;
        let (pods_dir, uid) = (self.ctx.runner.pods_dir.clone(), self.uid());
        let ranges = self.ctx.id_ranges.clone();
        let removed = tokio::task::spawn_blocking(move || {
            let unmounted = crate::volumes::release(&pods_dir, &uid, &spec);
            if unmounted {
                let _ = std::fs::remove_dir_all(crate::containers::pod_dir(&pods_dir, &uid));
            }
            crate::pod_cgroups::remove_pod(&uid);
            (unmounted, ranges.release(&uid))
        })
        .await;
        let outcome = match removed {
            Ok((true, Ok(()))) => StepOutcome::Done(None),
            Ok((false, _)) => StepOutcome::Failed(
                "something stays mounted below the pod's directory; it is kept so no mounted data is deleted".into(),
            ),
            Ok((true, Err(error))) => {
                StepOutcome::Failed(format!("cannot free the pod's id range: {}", crate::chain(&error)))
            }
            Err(error) => StepOutcome::Failed(error.to_string()),
        };
        if outcome == StepOutcome::Done(None) {
            self.sandbox_removed = true;
        }
        StepRun { outcome, log }
    }

    /// Calls `unmount`, then `release`, of each of `drivers` for the pod's
    /// volumes; returns the problems.
    async fn teardown_plugins(&self, spec: &PodSpec, drivers: &[String]) -> Vec<String> {
        let (plugins, pods_dir, pod) = (
            self.ctx.plugins.clone(),
            self.ctx.runner.pods_dir.clone(),
            self.record.pod.clone(),
        );
        let host_uid = self.ctx.id_ranges.get(&self.uid());
        let (spec, drivers) = (spec.clone(), drivers.to_vec());
        tokio::task::spawn_blocking(move || {
            crate::plugin_volumes::teardown(&plugins, &pods_dir, &pod, &spec, host_uid, &drivers)
        })
        .await
        .unwrap_or_default()
    }

    /// Stops every container, removes the sandbox and forgets the pod: what
    /// the stop workflow did not do already (all of it when the pod goes
    /// without one).
    pub(super) async fn remove_pod(&mut self) {
        if !self.sandbox_removed {
            for line in self.stop_containers().await.log {
                tracing::info!(pod = %self.key(), "{line}");
            }
            let released = self.release_volumes(None).await;
            let sandbox = self.remove_sandbox().await;
            for line in released.log.into_iter().chain(sandbox.log) {
                tracing::warn!(pod = %self.key(), "{line}");
            }
            if let StepOutcome::Failed(error) = sandbox.outcome {
                tracing::error!(pod = %self.key(), %error, "pod removed from this node incompletely");
            }
        }
        self.ctx.pulls.end(&self.uid());
        if let Err(error) = self.ctx.state.remove_if_uid(&self.key(), &self.uid()) {
            tracing::error!(pod = %self.key(), error = %crate::chain(&error), "cannot forget the pod");
        }
        tracing::info!(pod = %self.key(), "pod removed from this node");
    }
}

/// The command of a container's `preStop` hook.
fn pre_stop_command(container: &Container) -> Option<Vec<String>> {
    container
        .pre_stop
        .as_ref()
        .map(|hook| hook.exec.command.clone())
}

/// Runs `command` in the container, for at most `grace`; the line for the
/// step log says how it ended.
async fn run_pre_stop(
    runner: &crate::containers::ContainerRunner,
    spec: &PodSpec,
    container_id: &str,
    name: &str,
    command: Vec<String>,
    grace: Duration,
) -> String {
    let runtime = match runner.runtimes.for_class(spec.runtime) {
        Ok(runtime) => runtime.clone(),
        Err(error) => return format!("{name}: preStop not run: {error}"),
    };
    let (id, args) = (container_id.to_string(), command.clone());
    let began = Instant::now();
    let exec = tokio::task::spawn_blocking(move || {
        let spec = ExecSpec {
            args,
            ..ExecSpec::default()
        };
        runtime.exec_output(&id, &spec)
    });
    // The hook is not waited for past the grace period; stopping the
    // container ends it.
    match tokio::time::timeout(grace, exec).await {
        Ok(Ok(Ok(output))) if output.status.success() => format!(
            "{name}: preStop {command:?} done in {:.1}s",
            began.elapsed().as_secs_f64()
        ),
        Ok(Ok(Ok(output))) => format!(
            "{name}: preStop {command:?} exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Ok(Ok(Err(error))) => format!("{name}: preStop {command:?} failed: {error}"),
        Ok(Err(error)) => format!("{name}: preStop {command:?} failed: {error}"),
        Err(_) => format!(
            "{name}: preStop {command:?} still ran when the grace period of {}s ended",
            grace.as_secs()
        ),
    }
}

/// The plugins that make the pod's volumes.
fn plugin_drivers(spec: &PodSpec) -> Vec<String> {
    let mut drivers: Vec<String> = spec
        .volumes
        .iter()
        .filter_map(|volume| Some(volume.plugin.as_ref()?.driver.clone()))
        .collect();
    drivers.sort_unstable();
    drivers.dedup();
    drivers
}
