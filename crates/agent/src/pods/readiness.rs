//! `node/await-readiness`: the step after the containers start, done once
//! every container of the admitted revision runs and passes its readiness
//! probe (one without a probe is ready once it runs); failed when the
//! longest readiness deadline passes first.

use std::time::{Duration, Instant};

use corral_api::kinds::PodSpec;

use super::PodWorkload;
use crate::executor::StepOutcome;

impl PodWorkload {
    /// `node/await-readiness`: done once every container of the admitted
    /// desired revision runs and passes its readiness probe; failed when a
    /// readiness deadline passes first.
    pub(super) fn await_readiness(&mut self, spec: &PodSpec) -> StepOutcome {
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
        if self.all_ready(spec) {
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

    /// Whether the admitted revision is the desired one and every container
    /// of it is already ready: `node/await-readiness` is settled at once.
    pub(super) fn ready_at_once(&self, spec: &PodSpec) -> bool {
        self.record.admitted_revision == self.desired.metadata.revision && self.all_ready(spec)
    }

    /// Whether every container of `spec` runs and passes its readiness
    /// probe (one without a probe is ready once it runs).
    fn all_ready(&self, spec: &PodSpec) -> bool {
        spec.containers.iter().all(|c| {
            self.record
                .containers
                .get(&c.name)
                .is_some_and(|r| r.running && r.pid.is_some() && (r.ready || c.readiness.is_none()))
        })
    }
}
