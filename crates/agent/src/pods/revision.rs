//! A revision's containers: stopping the ones it changes or drops, starting
//! the ones it changes or adds (in the pod's existing sandbox), and
//! recording the revision as the one this node runs. Whether an update
//! still fits the node is checked here too.

use std::time::Duration;

use corral_api::kinds::PodSpec;

use super::{PodWorkload, pod_sandbox, typed_spec};
use crate::plan::RevisionPlan;

impl PodWorkload {
    /// Stops what the plan stops and (unless `stop_only`) starts what it
    /// starts; then the desired revision is the admitted one.
    pub(super) async fn apply_revision(
        &mut self,
        spec: &PodSpec,
        plan: &RevisionPlan,
        stop_only: bool,
    ) -> Result<(), String> {
        let began = std::time::Instant::now();
        let grace = Duration::from_secs(u64::from(spec.termination_grace_seconds.unwrap_or(10)));
        let old_spec = typed_spec(&self.record.pod).unwrap_or_else(|| spec.clone());
        let mut stopped = false;
        for name in plan.to_stop() {
            // Forgotten only once stopped: a failed stop keeps it tracked.
            if let Some(record) = self.record.containers.get(name).cloned() {
                stopped = true;
                let (runner, ending, halted) =
                    (self.ctx.runner.clone(), old_spec.clone(), record.clone());
                let ended = tokio::task::spawn_blocking(move || {
                    runner.end_process(&ending, &halted, grace)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| crate::chain(&e))?;
                if !ended {
                    // Only the runtime's forced delete can end it: here.
                    let (runner, old_spec, halted) =
                        (self.ctx.runner.clone(), old_spec.clone(), record.clone());
                    tokio::task::spawn_blocking(move || runner.delete(&old_spec, &halted))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| crate::chain(&e))?;
                }
                self.record.containers.remove(name);
                // Its runtime state and cgroup (its generation's own) and
                // its files go while the new container starts; removal
                // waits for that (and sweeps what an agent stop left).
                let (runner, uid, old_spec) =
                    (self.ctx.runner.clone(), self.uid(), old_spec.clone());
                self.cleanups.push(tokio::task::spawn_blocking(move || {
                    if ended && let Err(error) = runner.delete(&old_spec, &record) {
                        // Its directory stays, so the pod's removal tries
                        // the delete again (`ContainerRunner::cleanup_all`).
                        tracing::warn!(container = %record.runtime_id, error = %crate::chain(&error), "cannot delete a stopped container from the runtime");
                        return;
                    }
                    if let Err(error) = runner.cleanup(&uid, &record) {
                        tracing::warn!(container = %record.runtime_id, error = %crate::chain(&error), "cannot remove a stopped container's files");
                    }
                }));
            }
        }
        if stopped {
            self.save();
        }
        tracing::debug!(pod = %self.key(), stopped = ?plan.to_stop().collect::<Vec<_>>(), took = ?began.elapsed(), "containers stopped");
        if stop_only {
            return Ok(());
        }
        let netns = self.record.netns.clone().ok_or("the pod has no sandbox")?;
        let to_start: Vec<&String> = plan.to_start().collect();
        if !to_start.is_empty() {
            self.ensure_data(spec).await?;
            self.rewire_for_gvisor_stack(spec).await?;
        }
        for (index, name) in to_start.iter().enumerate() {
            let name = *name;
            let Some(container) = spec.containers.iter().find(|c| c.name == *name).cloned() else {
                continue;
            };
            let generation = self.next_generation(name);
            let runner = self.ctx.runner.clone();
            let ranges = self.ctx.id_ranges.clone();
            let (uid, pod_name, spec, netns) = (
                self.uid(),
                self.desired.metadata.name.clone(),
                spec.clone(),
                netns.clone(),
            );
            let started = tokio::task::spawn_blocking(move || {
                let sandbox = pod_sandbox(&ranges, &uid, &spec, &container.name, &netns)?;
                runner.start(&uid, &pod_name, &spec, &container, generation, &sandbox)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| crate::chain(&e))?;
            self.record.containers.insert(name.clone(), started);
            // Saved before anything else happens; the last one is saved
            // with the admitted revision, below.
            if index + 1 < to_start.len() {
                self.save();
            }
        }
        self.admit_desired(spec);
        tracing::debug!(pod = %self.key(), started = ?plan.to_start().collect::<Vec<_>>(), took = ?began.elapsed(), "revision admitted");
        Ok(())
    }

    /// Waits for the removal of stopped containers' files.
    pub(super) async fn finish_cleanups(&mut self) {
        for cleanup in std::mem::take(&mut self.cleanups) {
            let _ = cleanup.await;
        }
    }

    /// The next generation of a container, recorded as taken.
    pub(super) fn next_generation(&mut self, name: &str) -> u64 {
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
        self.ctx.pulls.end(&self.uid());
        self.save();
    }

    /// Whether `spec` fits this node next to the other pods it runs.
    pub(super) fn fits_here(&self, spec: &PodSpec) -> Result<(), String> {
        let capacity = crate::node::detect_status(None).capacity;
        let neighbours = self.ctx.state.neighbours().unwrap_or_default();
        let others = neighbours
            .iter()
            .filter(|pod| pod.key != self.key())
            .filter_map(|pod| pod.spec.as_deref());
        crate::plan::fits((capacity.cpu.millis, capacity.memory.bytes), others, spec)
    }
}
