//! Reboot recovery of one pod (design 0031): when its worker starts, the
//! pod's record is checked against what the kernel has behind its paths
//! ([`crate::recovery::judge`]); a record that outlived its sandbox is
//! recovered at once, from local state alone, as the steps of the
//! `recover` workflow:
//!
//! - `node/check-sandbox`: what is gone, in words;
//! - `node/clear-stale-sandbox`: the dead containers deleted from the
//!   runtime (their state dirs survive a reboot on the data dir), their
//!   rootfs directories, the host veth and the stale namespace files;
//! - `node/create-sandbox`: the namespaces made and wired again (the
//!   pod's address from its last-seen status, its IPv4 egress, routes);
//! - `node/prepare-volumes`: its volumes and the Secrets and Configs it
//!   reads (those need the API: they are never kept on disk);
//! - `node/start-containers`: every container meant to run started again
//!   (a new generation; its restart count and last exit kept: a reboot is
//!   not a crash).
//!
//! The steps and their timings are kept in the record until the API has
//! them ([`PodWorkload::report_recovery`]), so `corral why` shows the
//! recovery even when the control plane came back after it.

use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use corral_api::kinds::PodSpec;
use corral_runtime::oci::userns::user_namespace_path;
use corral_runtime::oci::{netns, reap};
use corral_workflow::PodStep;

use super::{PodWorkload, pod_sandbox, typed_spec};
use crate::recovery::{
    ContainerFacts, Pinned, RecoveredStep, RecoveryReport, SandboxFacts, Verdict, judge,
};

/// The wait before a failed recovery is tried again, doubled per failure
/// up to [`RECOVERY_RETRY_MAX`].
const RECOVERY_RETRY_FIRST: Duration = Duration::from_secs(2);
const RECOVERY_RETRY_MAX: Duration = Duration::from_secs(300);

/// What the kernel has behind a pinned namespace file.
fn pinned(path: &Path) -> Pinned {
    if netns::exists(path) {
        Pinned::Live
    } else if path.exists() {
        Pinned::Unmounted
    } else {
        Pinned::Missing
    }
}

impl PodWorkload {
    /// Checks the sandbox behind the pod's record and, if it is stale,
    /// recovers the pod; returns whether it did.
    pub(super) async fn recover_if_stale(&mut self) -> bool {
        if self.record.admitted_revision == 0 || self.deleting() {
            return false;
        }
        let Some(spec) = typed_spec(&self.record.pod) else {
            return false;
        };
        let began = Utc::now();
        let has_user_namespace = self.ctx.id_ranges.get(&self.uid()).is_some();
        let (runner, netns, containers, spec_copy) = (
            self.ctx.runner.clone(),
            self.record.netns.clone(),
            self.record.containers.clone(),
            spec.clone(),
        );
        let Ok(facts) = tokio::task::spawn_blocking(move || SandboxFacts {
            userns: netns
                .as_deref()
                .filter(|_| has_user_namespace)
                .map(|path| pinned(&user_namespace_path(path))),
            netns: netns.as_deref().map(pinned),
            containers: containers
                .iter()
                .map(|(name, record)| {
                    // An init whose pid no longer exists runs nowhere: the
                    // runtime (one `runc list` per container, all at once
                    // after a reboot) is asked only about a pid that is
                    // alive, which may be someone else's now.
                    let init_alive = match record.pid {
                        Some(pid) if !reap::runs(pid) => false,
                        _ => runner.is_running(&spec_copy, record),
                    };
                    let facts = ContainerFacts {
                        meant_to_run: record.running,
                        init_alive,
                    };
                    (name.clone(), facts)
                })
                .collect(),
        })
        .await
        else {
            return false;
        };
        let previous_wait = self.recovery_retry.take().map(|(_, wait)| wait);
        let Verdict::Stale { reasons } = judge(&facts) else {
            return false;
        };
        tracing::info!(pod = %self.key(), ?reasons, "the pod's sandbox is stale (a reboot?); recovering it");
        let mut steps = vec![RecoveredStep {
            step: PodStep::CheckSandbox.as_str().to_string(),
            started_at: began,
            finished_at: Utc::now(),
            note: Some(format!("stale: {}", reasons.join("; "))),
            error: None,
        }];
        let mut failed = false;
        for step in &crate::recovery::RECOVER_STEPS[1..] {
            let started_at = Utc::now();
            let result = match step {
                PodStep::ClearStaleSandbox => self.clear_stale_sandbox(&spec, &facts).await,
                PodStep::CreateSandbox => self.ensure_sandbox().await,
                PodStep::PrepareVolumes => self.reprepare_volumes(&spec).await,
                _ => self.restart_all(&spec).await,
            };
            failed = result.is_err();
            steps.push(RecoveredStep {
                step: step.as_str().to_string(),
                started_at,
                finished_at: Utc::now(),
                note: result.as_ref().ok().cloned(),
                error: result.err(),
            });
            // The steps after a failed one never run (the server's record
            // shows them blocked); supervision keeps trying on the node.
            if failed {
                break;
            }
        }
        let took = (Utc::now() - began).to_std().unwrap_or_default();
        if failed {
            let wait = previous_wait.map_or(RECOVERY_RETRY_FIRST, |wait| {
                (wait * 2).min(RECOVERY_RETRY_MAX)
            });
            self.recovery_retry = Some((Instant::now() + wait, wait));
            tracing::warn!(pod = %self.key(), ?steps, ?wait, "recovery failed; trying again");
        } else {
            tracing::info!(pod = %self.key(), ?took, "pod recovered from local state");
        }
        self.record.recovery = Some(RecoveryReport {
            revision: self.record.pod.metadata.revision,
            started_at: began,
            steps,
        });
        self.save();
        true
    }

    /// `node/clear-stale-sandbox`: what is left of the dead sandbox goes.
    async fn clear_stale_sandbox(
        &mut self,
        spec: &PodSpec,
        facts: &SandboxFacts,
    ) -> Result<String, String> {
        let runner = self.ctx.runner.clone();
        let (uid, spec_copy) = (self.uid(), spec.clone());
        // A dead init's pid may belong to another process after a reboot:
        // only a live container is stopped by pid.
        let containers: Vec<_> = self
            .record
            .containers
            .iter()
            .map(|(name, record)| {
                let mut record = record.clone();
                if !facts.containers.get(name).is_some_and(|c| c.init_alive) {
                    record.pid = None;
                }
                record
            })
            .collect();
        let cleared = containers.len();
        // A container the runtime cannot delete (its state half gone) is
        // left behind and noted: the restart uses a new id, so it blocks
        // nothing.
        let left: Vec<String> = tokio::task::spawn_blocking(move || {
            containers
                .iter()
                .filter_map(|record| {
                    runner
                        .stop(&uid, &spec_copy, record, Duration::ZERO)
                        .err()
                        .map(|error| format!("{}: {}", record.runtime_id, crate::chain(&error)))
                })
                .collect()
        })
        .await
        .map_err(|e| e.to_string())?;
        for record in self.record.containers.values_mut() {
            record.pid = None;
            record.ready = false;
        }
        if let Some(network) = self.ctx.network.clone() {
            network
                .unwire_pod(&self.network_owner())
                .await
                .map_err(|e| crate::chain(&e))?;
        }
        // The record keeps the path: until a namespace is pinned there
        // again the sandbox stays stale, and a failed recovery is tried
        // again rather than taken for a pod that never had one.
        if let Some(path) = self.record.netns.clone() {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            let manager = self.ctx.netns.clone();
            tokio::task::spawn_blocking(move || manager.remove(&name))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| crate::chain(&e))?;
        }
        self.save();
        let mut note = format!(
            "{} dead container(s) deleted from the runtime, their files and the namespace files removed",
            cleared - left.len()
        );
        if !left.is_empty() {
            note.push_str(&format!("; left behind: {}", left.join("; ")));
        }
        Ok(note)
    }

    /// `node/prepare-volumes` of a recovery: the volumes (idempotent) and
    /// the data the pod reads.
    async fn reprepare_volumes(&self, spec: &PodSpec) -> Result<String, String> {
        let (pods_dir, uid) = (self.ctx.runner.pods_dir.clone(), self.uid());
        let (ranges, spec_copy) = (self.ctx.id_ranges.clone(), spec.clone());
        let pool = self.ctx.sandbox_pool.clone();
        let note = tokio::task::spawn_blocking(move || {
            let host_base = super::pod_host_base(&pool, &ranges, &uid, &spec_copy)?;
            crate::volumes::prepare(
                &pods_dir,
                &uid,
                &spec_copy,
                &crate::volumes::PodRange { host_base },
            )
            .map_err(|e| crate::chain(&e))
        })
        .await
        .map_err(|e| e.to_string())??;
        self.ensure_data(spec).await?;
        Ok(if note.is_empty() {
            "no volumes".to_string()
        } else {
            note
        })
    }

    /// `node/start-containers` of a recovery: every container meant to run,
    /// started again in the new sandbox.
    async fn restart_all(&mut self, spec: &PodSpec) -> Result<String, String> {
        let netns = self.record.netns.clone().ok_or("the pod has no sandbox")?;
        let mut started = Vec::new();
        for container in &spec.containers {
            let Some(old) = self.record.containers.get(&container.name).cloned() else {
                continue;
            };
            if !old.running {
                continue;
            }
            let generation = self.next_generation(&container.name);
            let runner = self.ctx.runner.clone();
            let ranges = self.ctx.id_ranges.clone();
            let (uid, pod_name, spec, container, netns) = (
                self.uid(),
                self.record.pod.metadata.name.clone(),
                spec.clone(),
                container.clone(),
                netns.clone(),
            );
            let name = container.name.clone();
            let result = tokio::task::spawn_blocking(move || {
                let sandbox = pod_sandbox(&ranges, &uid, &spec, &container.name, &netns)?;
                runner.start(&uid, &pod_name, &spec, &container, generation, &sandbox)
            })
            .await
            .map_err(|e| e.to_string())?;
            let entry = self
                .record
                .containers
                .get_mut(&name)
                .ok_or("INVARIANT: the container was recorded above")?;
            match result {
                Ok(mut fresh) => {
                    // A reboot is not a crash: the count and the last exit
                    // stay what they were.
                    fresh.restarts = old.restarts;
                    fresh.last_exit = old.last_exit;
                    *entry = fresh;
                    started.push(name);
                }
                Err(error) => {
                    let error = crate::chain(&error);
                    // Supervision tries again with backoff.
                    entry.start_error = Some(error.clone());
                    entry.restart_after = Some(Utc::now());
                    self.save();
                    return Err(format!("container {name}: {error}"));
                }
            }
            self.save();
        }
        Ok(if started.is_empty() {
            "no container was meant to run".to_string()
        } else {
            format!("started again: {}", started.join(", "))
        })
    }

    /// Tries a failed recovery again once its backoff has passed.
    pub(super) async fn retry_recovery(&mut self) -> bool {
        match self.recovery_retry {
            Some((at, _)) if Instant::now() >= at => self.recover_if_stale().await,
            _ => false,
        }
    }

    /// Sends a recovery the API has not seen yet (kept in the record until
    /// it has); returns whether one was sent.
    pub(super) async fn report_recovery(&mut self) -> bool {
        let Some(report) = self.record.recovery.clone() else {
            return false;
        };
        let Some(client) = self.ctx.client.clone() else {
            return false;
        };
        match client.record_recovery(&self.key(), &report).await {
            Ok(()) => {}
            Err(error) if matches!(error.status(), Some(400 | 403 | 404 | 422)) => {
                tracing::warn!(pod = %self.key(), error = %crate::chain(&error), "the API refused the pod's recovery record; dropped");
            }
            Err(error) => {
                tracing::debug!(pod = %self.key(), error = %crate::chain(&error), "recovery not reported yet; will retry");
                return false;
            }
        }
        self.record.recovery = None;
        self.save();
        true
    }
}
