//! `node/run-init-containers`: a pod's init containers, one after another
//! in the order given, each to a successful exit, in the pod's sandbox;
//! its regular containers start only after the last one. The step stays
//! running while one runs (the executor looks again at each tick, so news
//! such as a deletion is not held up); an exit other than 0 fails the
//! step, naming the container and its code, and a retry starts over from
//! the first.

use std::time::Instant;

use corral_api::kinds::PodSpec;
use corral_runtime::oci::reap::{Liveness, liveness};

use super::{PodWorkload, pod_sandbox};
use crate::executor::{StepOutcome, StepRun};
use crate::state::ContainerRecord;

/// The note of `node/run-init-containers` for a pod without any.
pub(super) const NO_INIT_CONTAINERS: &str = "no init containers";

/// Where a pod's init containers stand (in memory: an agent restart runs
/// them again from the first).
#[derive(Debug)]
pub(super) struct InitRun {
    /// The revision they run for.
    revision: u64,
    /// How many finished with 0.
    done: usize,
    /// The one running, and since when.
    running: Option<(ContainerRecord, Instant)>,
}

impl PodWorkload {
    /// The init container running now, if any, taken: the pod is being
    /// stopped, and it is stopped with the others.
    pub(super) fn take_running_init(&mut self) -> Option<(String, ContainerRecord)> {
        let init = self.init.take()?;
        let (record, _) = init.running?;
        let spec = super::typed_spec(&self.desired)?;
        let name = spec.init_containers.get(init.done)?.name.clone();
        Some((name, record))
    }

    pub(super) async fn run_init_containers(&mut self, spec: &PodSpec) -> StepRun {
        let revision = self.desired.metadata.revision;
        if spec.init_containers.is_empty() {
            return StepOutcome::Done(Some(NO_INIT_CONTAINERS.into())).into();
        }
        let mut init = match self.init.take() {
            Some(init) if init.revision == revision => init,
            _ => InitRun {
                revision,
                done: 0,
                running: None,
            },
        };
        let mut log = Vec::new();
        let outcome = loop {
            if let Some((record, since)) = &init.running {
                let name = &spec.init_containers[init.done].name;
                let code = match record.pid.map(liveness) {
                    Some(Liveness::Alive) => break StepOutcome::NotYet,
                    Some(Liveness::Exited(code)) => code,
                    None => None,
                };
                let took = since.elapsed().as_secs_f64();
                self.remove_init(spec, record.clone()).await;
                init.running = None;
                if code != Some(0) {
                    let code =
                        code.map_or_else(|| "an unknown code".to_string(), |c| c.to_string());
                    let error =
                        format!("init container {name} exited with {code} after {took:.1}s");
                    log.push(error.clone());
                    init.done = 0;
                    break StepOutcome::Failed(error);
                }
                log.push(format!("{name}: exited 0 after {took:.1}s"));
                init.done += 1;
            }
            let Some(container) = spec.init_containers.get(init.done).cloned() else {
                let names: Vec<&str> = spec
                    .init_containers
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect();
                break StepOutcome::Done(Some(format!("{} succeeded, in order", names.join(", "))));
            };
            if !self.has_sandbox()
                && let Err(error) = self.ensure_sandbox().await
            {
                break StepOutcome::Failed(error);
            }
            if let Err(error) = self.ensure_data(spec).await {
                break StepOutcome::Failed(error);
            }
            if let Err(error) = self.rewire_for_gvisor_stack(spec).await {
                break StepOutcome::Failed(error);
            }
            let Some(netns) = self.record.netns.clone() else {
                break StepOutcome::Failed("the pod has no sandbox".into());
            };
            let generation = self.next_generation(&container.name);
            let (runner, ranges) = (self.ctx.runner.clone(), self.ctx.id_ranges.clone());
            let (uid, pod_name, pod_spec) =
                (self.uid(), self.desired.metadata.name.clone(), spec.clone());
            let name = container.name.clone();
            let started = tokio::task::spawn_blocking(move || {
                let sandbox = pod_sandbox(&ranges, &uid, &pod_spec, &container.name, &netns)?;
                runner.start(&uid, &pod_name, &pod_spec, &container, generation, &sandbox)
            })
            .await;
            match started {
                Ok(Ok(record)) => {
                    log.push(format!("{name}: started ({})", record.runtime_id));
                    init.running = Some((record, Instant::now()));
                }
                Ok(Err(error)) => {
                    break StepOutcome::Failed(format!(
                        "init container {name} did not start: {}",
                        crate::chain(&error)
                    ));
                }
                Err(error) => break StepOutcome::Failed(error.to_string()),
            }
        };
        self.init = Some(init);
        StepRun { outcome, log }
    }

    /// Deletes a finished init container from the runtime, with its files.
    async fn remove_init(&self, spec: &PodSpec, record: ContainerRecord) {
        let (runner, uid, spec) = (self.ctx.runner.clone(), self.uid(), spec.clone());
        let stopped = tokio::task::spawn_blocking(move || {
            runner.stop(&uid, &spec, &record, std::time::Duration::ZERO)
        })
        .await;
        if let Ok(Err(error)) = stopped {
            tracing::warn!(pod = %self.key(), error = %crate::chain(&error), "cannot remove a finished init container");
        }
    }
}
