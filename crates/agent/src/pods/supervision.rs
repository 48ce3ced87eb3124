//! Keeping the admitted revision running from local state alone: noticing
//! exited containers and restarting them per the restart policy (with
//! backoff), and running the readiness and liveness probes that are due.

use std::time::{Duration, Instant};

use chrono::Utc;
use corral_api::kinds::{ContainerExit, ContainerReason, RuntimeClass};
use corral_api::security::{NetworkStack, Relaxation, network_stack};
use corral_runtime::oci::reap::{Liveness, liveness};

use super::{PodWorkload, pod_sandbox, typed_spec};
use crate::plan::restart_at;
use crate::probes;
use crate::sandbox;

/// Where one container's probes stand.
#[derive(Debug, Default)]
pub(super) struct ProbeState {
    next_at: Option<Instant>,
    readiness_failures: u32,
    liveness_failures: u32,
    pub(super) last_error: Option<String>,
}

/// A pod under the node's self-fence.
#[derive(Debug, Default)]
pub(super) struct FenceHold {
    /// While the fence holds the pod: the cause its stopped containers
    /// keep.
    cause: Option<String>,
    /// After it lifted: the message of the containers started again.
    note: Option<String>,
}

impl PodWorkload {
    /// Notices exited containers and restarts them per the restart policy;
    /// returns whether anything changed.
    pub(super) async fn restart_exited(&mut self) -> bool {
        let Some(spec) = typed_spec(&self.record.pod) else {
            return false;
        };
        let now = Utc::now();
        let mut changed = self.follow_fence(&spec, now);
        let held = self.fence.cause.is_some();
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
                let out_of_memory = exit_code == Some(137)
                    && crate::pod_cgroups::oom_killed(&self.uid(), &name, record.generation);
                let limit = spec
                    .containers
                    .iter()
                    .find(|c| c.name == name)
                    .and_then(|c| c.resources.memory)
                    .map(|memory| format!(" (memory limit {memory})"))
                    .unwrap_or_default();
                tracing::info!(pod = %self.key(), container = %name, ?exit_code, restart = ?restart, "container exited");
                let read_only_write = exit_code.is_some_and(|code| code != 0)
                    && record.stop_cause.is_none()
                    && !out_of_memory
                    && wrote_to_read_only_fs(&crate::containers::log_path(
                        &self.ctx.runner.pods_dir,
                        &self.uid(),
                        &name,
                    ));
                // The default profile refuses a 64-bit call with EPERM; only
                // a call through an ABI it does not admit kills (SIGSYS).
                let refused_abi = exit_code == Some(SIGSYS_EXIT)
                    && record.stop_cause.is_none()
                    && spec.runtime.unwrap_or(RuntimeClass::Runc) == RuntimeClass::Runc
                    && sandbox::relaxations(&spec).is_ok_and(|relax| {
                        !relax.contains(&Relaxation::UnconfinedSeccomp)
                            && !relax.contains(&Relaxation::Syscalls32Bit)
                    });
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
                let stop_cause = entry.stop_cause.take();
                let (cause, reason) = if out_of_memory {
                    (
                        Some(format!("was killed by the kernel: out of memory{limit}")),
                        Some(ContainerReason::OutOfMemory),
                    )
                } else if read_only_write {
                    (Some(read_only_hint(exit_code)), None)
                } else if refused_abi {
                    (Some(SIGSYS_HINT.to_string()), None)
                } else {
                    let reason = stop_cause.as_ref().map(|_| ContainerReason::Unhealthy);
                    (stop_cause, reason)
                };
                entry.last_exit = Some(ContainerExit {
                    code: exit_code,
                    at: now,
                    cause,
                    reason,
                });
                if held {
                    // Stopped by the fence: it starts again when the fence
                    // lifts, whatever its restart policy says.
                    entry.running = true;
                    entry.restart_after = None;
                    if let Some(exit) = entry.last_exit.as_mut() {
                        exit.cause.clone_from(&self.fence.cause);
                    }
                }
                changed = true;
            } else if record.running && !held && record.restart_after.is_some_and(|at| at <= now) {
                let Some(container) = spec.containers.iter().find(|c| c.name == name).cloned()
                else {
                    continue;
                };
                // Never into a sandbox that is gone (a reboot): recovery
                // makes it again first (`recover.rs`).
                let Some(netns) = self.record.netns.clone().filter(|_| self.has_sandbox()) else {
                    continue;
                };
                if let Err(error) = self.ensure_data(&spec).await {
                    tracing::warn!(pod = %self.key(), container = %name, %error, "cannot restart: the pod's data is missing");
                    continue;
                }
                let runner = self.ctx.runner.clone();
                let ranges = self.ctx.id_ranges.clone();
                let (uid, pod_name, pod_spec) = (
                    self.uid(),
                    self.record.pod.metadata.name.clone(),
                    spec.clone(),
                );
                let generation = self.next_generation(&name);
                let old = record.clone();
                let (stopper, stop_uid, stop_spec) =
                    (runner.clone(), uid.clone(), pod_spec.clone());
                // The exited generation leaves the runtime too (its state
                // and cgroup), not only its files: a container that keeps
                // exiting must not pile up runc containers. Gone before
                // the namespace is wired again for gVisor's stack.
                let _ = tokio::task::spawn_blocking(move || {
                    if let Err(error) = stopper.stop(&stop_uid, &stop_spec, &old, Duration::ZERO) {
                        tracing::warn!(container = %old.runtime_id, error = %crate::chain(&error), "cannot remove the exited container");
                    }
                })
                .await;
                if let Err(error) = self.rewire_for_gvisor_stack(&spec).await {
                    tracing::warn!(pod = %self.key(), container = %name, %error, "cannot wire the pod's namespace again");
                }
                let result = tokio::task::spawn_blocking(move || {
                    let sandbox = pod_sandbox(&ranges, &uid, &pod_spec, &container.name, &netns)?;
                    runner.start(&uid, &pod_name, &pod_spec, &container, generation, &sandbox)
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
                        started.last_exit = record.last_exit.clone();
                        started.data_restart.clone_from(&self.fence.note);
                        *entry = started;
                    }
                    Ok(Err(error)) => {
                        let error = crate::chain(&error);
                        tracing::warn!(pod = %key, container = %name, %error, "restart failed");
                        entry.start_error = Some(error);
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
        changed
    }

    /// Follows the node's self-fence ([`crate::fencing`]): while it holds
    /// this pod its containers are not started again; when it lifts with
    /// the pod still here, what it stopped starts again at once, with a
    /// note for `why`. Returns whether anything changed.
    fn follow_fence(
        &mut self,
        spec: &corral_api::kinds::PodSpec,
        now: chrono::DateTime<Utc>,
    ) -> bool {
        if self.ctx.fence.holds(spec) {
            if self.fence.cause.is_none() {
                self.fence.cause = self.ctx.fence.cause();
                tracing::warn!(pod = %self.key(), "held by the node's self-fence");
            }
            return false;
        }
        let Some(cause) = self.fence.cause.take() else {
            // Once every container runs again, later restarts are ordinary.
            if self.fence.note.is_some()
                && self
                    .record
                    .containers
                    .values()
                    .all(|c| !c.running || c.pid.is_some())
            {
                self.fence.note = None;
            }
            return false;
        };
        self.fence.note = Some(format!(
            "restarted: {cause}; started again on its return (it had not been moved)"
        ));
        for entry in self.record.containers.values_mut() {
            if entry.running && entry.pid.is_none() {
                entry.restart_after = Some(now);
                entry.start_error = None;
            }
        }
        tracing::info!(pod = %self.key(), "the node's self-fence lifted: starting the pod again");
        true
    }

    /// Runs the readiness and liveness probes that are due; returns whether
    /// a container's readiness changed.
    pub(super) async fn probe(&mut self) -> bool {
        let Some(spec) = typed_spec(&self.record.pod) else {
            return false;
        };
        let Some(netns) = self.record.netns.clone() else {
            return false;
        };
        let Ok(runtime) = self.ctx.runner.runtimes.for_class(spec.runtime).cloned() else {
            return false;
        };
        let relax = crate::sandbox::relaxations(&spec).unwrap_or_default();
        let stack = network_stack(spec.runtime.unwrap_or(RuntimeClass::Runc), &relax);
        let target = match stack {
            NetworkStack::Gvisor => probes::ProbeTarget::Address(self.record.address),
            NetworkStack::HostKernel => probes::ProbeTarget::Loopback(netns),
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
                let (probe_runtime, id, target) =
                    (runtime.clone(), record.runtime_id.clone(), target.clone());
                let result = tokio::task::spawn_blocking(move || {
                    probes::run(&probe, probe_runtime.as_ref(), &id, &target)
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
                        changed |= !entry.ready || entry.readiness_error.is_some();
                        entry.ready = true;
                        entry.readiness_error = None;
                    }
                    ("readiness", Err(error)) => {
                        state.readiness_failures += 1;
                        if state.readiness_failures >= threshold {
                            // Written when readiness flips or its error
                            // changes, not on every failed probe.
                            let failing = Some(error.clone());
                            if entry.ready || entry.readiness_error != failing {
                                entry.ready = false;
                                entry.readiness_error = failing;
                                changed = true;
                            }
                        }
                        state.last_error = Some(error);
                    }
                    (_, Ok(())) => state.liveness_failures = 0,
                    (_, Err(error)) => {
                        state.liveness_failures += 1;
                        if state.liveness_failures >= threshold {
                            tracing::info!(pod = %self.record.pod.key(), container = %container.name, %error, "liveness failed; killing the container");
                            state.liveness_failures = 0;
                            entry.stop_cause =
                                Some(format!("was killed: its liveness probe failed: {error}"));
                            changed = true;
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
        changed
    }
}

/// The exit code of a process killed by `SIGSYS` (128 + 31).
const SIGSYS_EXIT: i32 = 128 + 31;

/// The exit cause of a container killed by `SIGSYS` under the default
/// seccomp profile: what the profile refused, and how to allow it.
const SIGSYS_HINT: &str = "was killed by signal 31 (SIGSYS, exit code 159): it made a system call \
     through a 32-bit ABI (a program built for i386?), which the default sandbox refuses; \
     ask for the 32-bit-syscalls relaxation in spec.security.relax, granted by a Policy";

/// Whether the end of a container's log says a write failed on a
/// read-only file system (EROFS, as libc and most runtimes word it).
fn wrote_to_read_only_fs(log: &std::path::Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL: u64 = 16 << 10;
    let Ok(mut file) = std::fs::File::open(log) else {
        return false;
    };
    let length = file.metadata().map(|meta| meta.len()).unwrap_or(0);
    if file
        .seek(SeekFrom::Start(length.saturating_sub(TAIL)))
        .is_err()
    {
        return false;
    }
    let mut tail = Vec::new();
    if file.take(TAIL).read_to_end(&mut tail).is_err() {
        return false;
    }
    String::from_utf8_lossy(&tail).contains("Read-only file system")
}

/// The exit cause of a container that failed writing to a read-only file
/// system: what happened, and how to give the program somewhere to write.
fn read_only_hint(code: Option<i32>) -> String {
    let exited = code.map_or_else(
        || "exited".to_string(),
        |code| format!("exited with code {code}"),
    );
    format!(
        "{exited} after a write to a read-only file system (its log says so): a container's root \
         filesystem is read-only; give the path it writes a volume (an emptyDir in spec.volumes \
         with a volumeMount) or write under /tmp, /var/tmp or /run"
    )
}
