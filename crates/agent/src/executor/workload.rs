//! What one kind of object does on this node ([`Workload`]): the part of
//! the executor that differs between pods, VMs and the node's own join.

use std::time::Duration;

use async_trait::async_trait;
use corral_api::Object;
use futures::future::BoxFuture;
use serde_json::{Map, Value};

use super::{StepOutcome, StepRun, TICK};
use crate::pod_data::follow::DataChange;
use crate::steps::NodeWork;

/// A step with nothing to do ([`Workload::settled_at_once`]): it is done,
/// with this note for `why`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub note: Option<String>,
}

/// What one kind of object does on this node; the executor decides when.
#[async_trait]
pub trait Workload: Send + 'static {
    /// The object as the API last showed it: its revision is the one to
    /// admit, its workflow instances say which steps are ready.
    fn desired(&self) -> &Object;

    /// The desired object, to change in place.
    fn desired_mut(&mut self) -> &mut Object;

    /// Replaces the desired object (a newer view from the API).
    fn set_desired(&mut self, object: Object) {
        *self.desired_mut() = object;
    }

    /// Puts a fresh instance from the step API into the desired object.
    fn remember(&mut self, work: &NodeWork) {
        work.remember_in(self.desired_mut());
    }

    /// Admits the desired revision when no workflow instance serves it
    /// (revisions written before workflows existed).
    async fn admit_without_workflow(&mut self);

    /// Once, when the worker starts, before anything else: check what
    /// local state says against the node (a pod's sandbox after a reboot,
    /// `pods/recover.rs`) and repair it from local state alone.
    async fn resume(&mut self) {}

    /// Whether `step` runs on its own beside the others: it needs nothing
    /// of the workload once started, so [`Workload::detach`] hands it over.
    fn is_detached(&self, _step: &str) -> bool {
        false
    }

    /// Starts a step for which [`Workload::is_detached`] said yes: its task
    /// runs concurrently with the other steps claimed with it.
    fn detach(&mut self, step: &str, _work: &NodeWork) -> BoxFuture<'static, StepRun> {
        let step = step.to_string();
        Box::pin(async move {
            StepOutcome::Failed(format!("{step} cannot run on its own on this node")).into()
        })
    }

    /// Log lines that steps running on their own produced so far (step,
    /// line), taken: the executor sends them at its next look, before the
    /// step ends (a pull's progress). Lines a step returns in its
    /// [`StepRun`] go with its outcome as before.
    fn running_log(&mut self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Whether `step` has nothing to do now — a pod without init
    /// containers, containers without a readiness probe all running — and
    /// with what note it is done. Such a step is claimed and completed in
    /// the request that reports the step before it, instead of a request
    /// of its own to claim it and another to report it. `None`: it is
    /// claimed and run as usual. Must not change anything: it is asked
    /// before the claim is sent.
    fn settled_at_once(&self, _step: &str, _work: &NodeWork) -> Option<Settled> {
        None
    }

    /// Runs `step` (one of the instance's node steps) for the desired
    /// revision, with the workload to itself.
    async fn run_step(&mut self, step: &str, work: &NodeWork) -> StepRun;

    /// Whether this agent executes the steps of `owner` for the object:
    /// its node's (and what controllers delegate to the node), but not a
    /// migration source's, unless the workload is that source.
    fn acts_for(&self, owner: &str) -> bool {
        owner != corral_workflow::MIGRATION_SOURCE_OWNER
    }

    /// Looks after what runs (exits, restarts, probes); returns whether
    /// anything changed that a running step may be waiting for.
    async fn supervise(&mut self) -> bool {
        false
    }

    /// The status fields the node owns, as they should be now (`null`
    /// removes one); `None` reports nothing.
    fn status(&self) -> Option<Map<String, Value>> {
        None
    }

    /// How long to wait for news before looking again; `None` waits for
    /// news only.
    fn tick(&self) -> Option<Duration> {
        Some(TICK)
    }

    /// A Secret or Config the object reads has a new revision: bring
    /// what uses it up to date.
    async fn data_changed(&mut self, _change: &DataChange) {}

    /// Stops and forgets everything of the object on this node.
    async fn remove(&mut self) {}
}
