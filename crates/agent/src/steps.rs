//! The node's side of workflows: everything the agent reads of an object's
//! workflow instances — which instance serves a revision, which node steps
//! are ready or running and at which attempt, what a controller delegated
//! to the node, putting an instance the step API returned into the local
//! copy of the object — and the step API that moves them ([`StepApi`]).
//!
//! Nothing else in the agent parses `status.workflow`: the rest sees a
//! [`NodeWork`] (one instance, through these questions) and builds
//! requests with [`StepBatch`].
//!
//! Objects store each workflow instance as per-step state naming its
//! definition (a `WorkflowDefinition` object); [`NodeWork::for_revision`]
//! joins the two, fetching each definition once through the [`StepApi`].

use std::sync::Arc;

use async_trait::async_trait;
use corral_api::workflow::{
    StepActionKind, StepActionRequest, StepExecutor, StepKind, StepState, StoredWorkflows,
    WorkflowInstance, WorkflowOutcome,
};
use corral_api::{Object, ObjectKey};
use corral_client::ClientError;
use corral_workflow::WorkflowDefinition;
use serde_json::{Map, Value};

mod batch;
mod client;
#[cfg(test)]
pub mod fake;

pub use batch::StepBatch;
pub use client::ClientSteps;

/// The owner name of every step the node agent executes.
pub const NODE_OWNER: &str = "node";

/// Why a request to the step API did not go through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepApiError {
    /// The API answered and refused it (a step in another state, an
    /// instance that moved on): the caller's view is stale.
    #[error("refused: {0}")]
    Refused(String),
    /// The API did not answer, or failed: try again later.
    #[error("the API is unavailable: {0}")]
    Unavailable(String),
}

impl From<ClientError> for StepApiError {
    fn from(error: ClientError) -> Self {
        let message = crate::chain(&error);
        match error.status() {
            Some(status) if (400..500).contains(&status) => StepApiError::Refused(message),
            _ => StepApiError::Unavailable(message),
        }
    }
}

/// The API's step endpoint, the node-owned status fields and the stored
/// workflow definitions, behind a trait so the executor is tested against
/// a fake.
#[async_trait]
pub trait StepApi: Send + Sync {
    /// The stored workflow definition called `name`.
    async fn definition(&self, name: &str) -> Result<Arc<WorkflowDefinition>, StepApiError>;

    /// Applies the batch's actions in order, all or none, with its status
    /// fields, in one write; returns the instance the actions moved.
    async fn batch(&self, key: &ObjectKey, batch: &StepBatch) -> Result<NodeWork, StepApiError>;

    /// Writes the node-owned status fields (a `null` removes one) without
    /// moving any step.
    async fn put_status(
        &self,
        key: &ObjectKey,
        fields: &Map<String, Value>,
    ) -> Result<(), StepApiError>;
}

/// Sets `fields` in `status`; a `null` removes the field.
pub fn merge_fields(status: &mut Map<String, Value>, fields: &Map<String, Value>) {
    for (field, value) in fields {
        if value.is_null() {
            status.remove(field);
        } else {
            status.insert(field.clone(), value.clone());
        }
    }
}

/// One step attempt of one instance: what a stale view is checked against.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attempt {
    pub instance: String,
    pub step: String,
    pub attempt: u32,
}

/// A running node step as an instance shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningStep {
    pub name: String,
    pub attempt: u32,
}

/// One workflow instance of an object, as the node sees it: the node's
/// steps (its own, and those a controller delegated to it with `executor:
/// node`) and their states.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeWork {
    instance: WorkflowInstance,
}

impl NodeWork {
    /// The instance serving `revision` of `object` (the newest if several),
    /// joined with its definition; `None` when there is none, or its
    /// definition cannot be fetched now (the API is away: nothing to do
    /// until it is back).
    pub async fn for_revision(
        api: &dyn StepApi,
        object: &Object,
        revision: u64,
    ) -> Option<NodeWork> {
        let status = StoredWorkflows::of(&object.status).ok()?;
        let stored = status.for_revision(revision)?;
        let definition = match api.definition(&stored.definition).await {
            Ok(definition) => definition,
            Err(error) => {
                tracing::debug!(object = %object.key(), definition = %stored.definition, %error,
                    "workflow definition not at hand");
                return None;
            }
        };
        let instance = corral_workflow::hydrate(&definition, stored, &object.metadata.uid, &[]);
        Some(NodeWork { instance })
    }

    /// Whether `object` has a workflow instance serving `revision` (without
    /// its definition: no request).
    pub fn exists_for(object: &Object, revision: u64) -> bool {
        StoredWorkflows::of(&object.status)
            .ok()
            .is_some_and(|status| status.for_revision(revision).is_some())
    }

    /// The instance's id (`start-1`).
    pub fn id(&self) -> &str {
        &self.instance.id
    }

    /// Whether the instance still runs.
    pub fn is_running(&self) -> bool {
        self.instance.outcome == WorkflowOutcome::Running
    }

    /// The node's ready steps, in graph order.
    pub fn ready(&self) -> Vec<String> {
        self.node_steps()
            .filter(|step| matches!(step.state, StepState::Ready { .. }))
            .map(|step| step.definition.name.clone())
            .collect()
    }

    /// The node's running steps with their attempt, in graph order.
    pub fn running(&self) -> Vec<RunningStep> {
        self.node_steps()
            .filter_map(|step| match &step.state {
                StepState::Running { attempt, .. } => Some(RunningStep {
                    name: step.definition.name.clone(),
                    attempt: *attempt,
                }),
                _ => None,
            })
            .collect()
    }

    /// Attempts of `step` started so far (claims); the next claim is
    /// attempt `attempts + 1`.
    pub fn attempts(&self, step: &str) -> u32 {
        self.instance.step(step).map_or(0, |s| s.attempts)
    }

    /// The attempt a claim of `step` now starts.
    pub fn next_attempt(&self, step: &str) -> Attempt {
        self.attempt(step, self.attempts(step) + 1)
    }

    /// Attempt `attempt` of `step` in this instance.
    pub fn attempt(&self, step: &str, attempt: u32) -> Attempt {
        Attempt {
            instance: self.instance.id.clone(),
            step: step.to_string(),
            attempt,
        }
    }

    /// Whether `step` is in the instance, owned by `owner` and delegated
    /// to the node (`executor: node`): only the owner's own Controller can
    /// hand a step to the node.
    pub fn delegated_to_node(&self, step: &str, owner: &str) -> bool {
        self.instance.step(step).is_some_and(|s| {
            s.definition.owner == owner && s.definition.executor == Some(StepExecutor::Node)
        })
    }

    /// The node's steps that will be ready once the steps in `completing`
    /// are done (running ones completed, ready ones claimed and completed;
    /// the engine's own derivation, on a copy): what may be
    /// claimed in the request that reports them. Only a guess — the server
    /// decides, and refuses a claim of a step that is not ready.
    pub fn ready_after(&self, completing: &[&str]) -> Vec<String> {
        if completing.is_empty() {
            return self.ready();
        }
        self.after(completing).ready()
    }

    /// The node's steps that, once the steps in `completing` are done
    /// (guessed as [`ready_after`](Self::ready_after) does), still wait
    /// only on steps no node executes (a controller's: IPAM's address):
    /// ready as soon as that owner's write lands, which may be before a
    /// request sent now does.
    pub fn waiting_on_others_after(&self, completing: &[&str]) -> Vec<String> {
        let next = self.after(completing);
        next.node_steps()
            .filter(|step| match &step.state {
                StepState::Waiting { on } => {
                    !on.is_empty()
                        && on.iter().all(|before| {
                            next.instance.step(before).is_some_and(|s| {
                                s.definition.kind == StepKind::Step && !is_node_step(s)
                            })
                        })
                }
                _ => false,
            })
            .map(|step| step.definition.name.clone())
            .collect()
    }

    /// Whether `step` is running at attempt `attempt`.
    pub fn runs_at(&self, step: &str, attempt: u32) -> bool {
        self.instance.step(step).is_some_and(|s| {
            matches!(s.state, StepState::Running { attempt: running, .. } if running == attempt)
        })
    }

    /// A copy with the steps in `completing` done and the engine's
    /// derivation run (which also says what a waiting step waits on: the
    /// stored form does not keep it): the guess behind
    /// [`ready_after`](Self::ready_after).
    fn after(&self, completing: &[&str]) -> NodeWork {
        let mut next = self.clone();
        // The instance's own latest time, not this node's clock: nothing
        // times out or comes due for a retry in the guess.
        let now = next.latest_time();
        // A running step completes; a ready one is claimed and completed in
        // the same request (settled at once), which may need the steps
        // before it in `completing` done first: one round per such link.
        for _ in 0..=completing.len() {
            let mut moved = false;
            for step in next.instance.steps.iter_mut() {
                if !completing.contains(&step.definition.name.as_str()) {
                    continue;
                }
                let (started, attempt) = match step.state {
                    StepState::Running { since, attempt, .. } => (since, attempt),
                    StepState::Ready { .. } => (now, step.attempts + 1),
                    _ => continue,
                };
                step.state = StepState::Done {
                    started,
                    finished: now,
                    attempt,
                    note: None,
                };
                moved = true;
            }
            corral_workflow::tick(&mut next.instance, now);
            if !moved {
                break;
            }
        }
        next
    }

    /// The latest time any step of the instance moved.
    fn latest_time(&self) -> chrono::DateTime<chrono::Utc> {
        self.instance
            .steps
            .iter()
            .filter_map(|step| match &step.state {
                StepState::Ready { since } | StepState::Running { since, .. } => Some(*since),
                StepState::Done { finished, .. } => Some(*finished),
                StepState::Failed { at, .. }
                | StepState::TimedOut { at, .. }
                | StepState::Blocked { at, .. } => Some(*at),
                StepState::Waiting { .. } => None,
            })
            .chain([self.instance.started_at])
            .max()
            .unwrap_or(self.instance.started_at)
    }

    /// Puts this instance into `object`'s stored `status.workflow` in place
    /// of the instance with its id, so the next look does not act on an
    /// older view.
    pub fn remember_in(&self, object: &mut Object) {
        let Ok(mut status) = StoredWorkflows::of(&object.status) else {
            return;
        };
        let Some(slot) = status
            .instances
            .iter_mut()
            .find(|stored| stored.id == self.instance.id)
        else {
            return;
        };
        *slot = corral_workflow::dehydrate(&self.instance, &slot.definition);
        if let Some(fields) = object.status.as_object_mut()
            && let Ok(value) = serde_json::to_value(&status)
        {
            fields.insert("workflow".to_string(), value);
        }
    }

    /// The owner of `step` in this instance.
    pub fn owner_of(&self, step: &str) -> Option<&str> {
        self.instance
            .step(step)
            .map(|step| step.definition.owner.as_str())
    }

    /// The note `step` finished with, if it is done.
    pub fn note_of(&self, step: &str) -> Option<&str> {
        match &self.instance.step(step)?.state {
            StepState::Done { note, .. } => note.as_deref(),
            _ => None,
        }
    }

    /// Steps some node agent executes: the bound node's, a migration
    /// source's, and those delegated to the node. Which of them this
    /// agent acts for, the workload says (`Workload::acts_for`).
    fn node_steps(&self) -> impl Iterator<Item = &corral_api::workflow::StepInstance> {
        self.instance.steps.iter().filter(|step| is_node_step(step))
    }
}

/// Whether some node agent executes `step` (see [`NodeWork::node_steps`]).
fn is_node_step(step: &corral_api::workflow::StepInstance) -> bool {
    step.definition.owner == NODE_OWNER
        || step.definition.owner == corral_workflow::MIGRATION_SOURCE_OWNER
        || step.definition.executor == Some(StepExecutor::Node)
}

/// The node protocol for other speakers of it (the benchmark's hollow
/// nodes): the newest instance serving `revision`, whole.
pub async fn instance_for(
    api: &dyn StepApi,
    object: &Object,
    revision: u64,
) -> Option<WorkflowInstance> {
    NodeWork::for_revision(api, object, revision)
        .await
        .map(|work| work.instance)
}

/// Whether the instance still runs.
pub fn is_running(instance: &WorkflowInstance) -> bool {
    instance.outcome == WorkflowOutcome::Running
}

/// The node's steps of the instance in `phase` (`ready`, `running`, …), in
/// graph order.
pub fn node_steps(instance: &WorkflowInstance, phase: &str) -> Vec<String> {
    instance
        .steps
        .iter()
        .filter(|step| {
            (step.definition.owner == NODE_OWNER
                || step.definition.executor == Some(StepExecutor::Node))
                && step.state.phase() == phase
        })
        .map(|step| step.definition.name.clone())
        .collect()
}

/// A step action on one instance.
pub fn request(action: StepActionKind, step: &str, workflow: &str) -> StepActionRequest {
    let mut request = StepActionRequest::new(action, step);
    request.workflow = Some(workflow.to_string());
    request
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::Kind;
    use corral_api::workflow::StepDefinition;
    use futures::executor::block_on;

    fn pod() -> Object {
        fake::pod("start", &["scheduler/place"])
    }

    fn work_of(api: &fake::FakeApi, object: &Object) -> NodeWork {
        block_on(NodeWork::for_revision(api, object, 1)).expect("an instance for revision 1")
    }

    #[test]
    fn the_node_sees_its_ready_steps_of_the_revision() {
        let object = pod();
        let api = fake::FakeApi::new(object.clone());
        let work = work_of(&api, &object);
        assert_eq!(work.id(), "start-1");
        assert!(work.is_running());
        assert_eq!(work.ready(), ["node/pull-image", "node/prepare-volumes"]);
        assert!(work.running().is_empty());
        assert_eq!(work.next_attempt("node/pull-image").attempt, 1);
        assert!(NodeWork::exists_for(&object, 1));
        assert!(!NodeWork::exists_for(&object, 2));
        assert!(block_on(NodeWork::for_revision(&api, &object, 2)).is_none());
    }

    #[test]
    fn the_node_knows_which_steps_wait_only_on_another_owner() {
        let object = pod();
        let api = fake::FakeApi::new(object.clone());
        let work = work_of(&api, &object);
        // The sandbox waits on IPAM alone; the init containers wait on
        // the node's own steps too.
        assert_eq!(work.waiting_on_others_after(&[]), ["node/create-sandbox"]);
        assert_eq!(
            work.waiting_on_others_after(&["node/pull-image", "node/prepare-volumes"]),
            ["node/create-sandbox"]
        );
        let addressed = fake::pod("start", &["scheduler/place", "ipam/assign-address"]);
        let api = fake::FakeApi::new(addressed.clone());
        let work = work_of(&api, &addressed);
        assert!(work.waiting_on_others_after(&[]).is_empty());
        assert!(!work.runs_at("node/create-sandbox", 1));
        let mut batch = StepBatch::default();
        batch.claim(&work, "node/create-sandbox");
        let fresh = block_on(api.batch(&addressed.key(), &batch)).expect("claimed");
        assert!(fresh.runs_at("node/create-sandbox", 1));
        assert!(!fresh.runs_at("node/create-sandbox", 2));
    }

    #[test]
    fn an_instance_whose_definition_is_not_at_hand_is_not_acted_on() {
        let mut definition = corral_workflow::builtin(Kind::Pod, "start").expect("pod start");
        definition.steps[0].description = Some("another definition".into());
        let object = fake::object_with(&definition, &[]);
        let api = fake::FakeApi::new(pod());
        assert!(NodeWork::exists_for(&object, 1));
        assert!(block_on(NodeWork::for_revision(&api, &object, 1)).is_none());
    }

    #[test]
    fn a_fresh_instance_replaces_the_one_with_its_id() {
        let mut object = pod();
        let api = fake::FakeApi::new(object.clone());
        let work = work_of(&api, &object);
        let mut batch = StepBatch::default();
        batch.claim(&work, "node/pull-image");
        let fresh = block_on(api.batch(&object.key(), &batch)).expect("claimed");
        fresh.remember_in(&mut object);
        let seen = work_of(&api, &object);
        assert_eq!(
            seen.running(),
            [RunningStep {
                name: "node/pull-image".into(),
                attempt: 1
            }]
        );
        assert_eq!(seen.ready(), ["node/prepare-volumes"]);
    }

    #[test]
    fn only_the_owner_can_delegate_a_step_to_the_node() {
        let mut definition =
            corral_workflow::builtin(Kind::Pod, "start").expect("the pod start workflow");
        let delegated = |name: &str, owner: &str, executor| StepDefinition {
            name: name.into(),
            owner: owner.into(),
            executor,
            ..definition.steps[0].clone()
        };
        let extra = [
            delegated("dirvol/prepare", "dirvol", Some(StepExecutor::Node)),
            delegated("dirvol/mount", "dirvol", None),
        ];
        definition.steps.extend(extra);
        let object = fake::object_with(&definition, &[]);
        let api = fake::FakeApi::with_definitions(object.clone(), &[definition]);
        let work = work_of(&api, &object);
        assert!(work.delegated_to_node("dirvol/prepare", "dirvol"));
        assert!(!work.delegated_to_node("dirvol/prepare", "other"));
        assert!(!work.delegated_to_node("dirvol/mount", "dirvol"));
        assert!(!work.delegated_to_node("node/pull-image", "node"));
    }

    #[test]
    fn what_a_completion_makes_ready_can_be_claimed_with_it() {
        let object = fake::pod("start", &["scheduler/place", "ipam/assign-address"]);
        let api = fake::FakeApi::new(object.clone());
        let work = work_of(&api, &object);
        let mut batch = StepBatch::default();
        for step in [
            "node/create-sandbox",
            "node/pull-image",
            "node/prepare-volumes",
        ] {
            batch.claim(&work, step);
        }
        let work = block_on(api.batch(&object.key(), &batch)).expect("claimed");
        assert!(
            work.ready_after(&["node/create-sandbox", "node/pull-image"])
                .is_empty(),
            "the containers wait for the volumes too"
        );
        let next = work.ready_after(&[
            "node/create-sandbox",
            "node/pull-image",
            "node/prepare-volumes",
        ]);
        assert_eq!(next, ["node/run-init-containers"]);
        let mut batch = StepBatch::default();
        for step in [
            "node/create-sandbox",
            "node/pull-image",
            "node/prepare-volumes",
        ] {
            batch.complete(&work, step, None);
        }
        batch.claim(&work, &next[0]);
        let work = block_on(api.batch(&object.key(), &batch)).expect("the server agrees");
        assert_eq!(work.running()[0].name, "node/run-init-containers");
    }

    #[test]
    fn reports_go_before_claims_and_can_be_sent_without_them() {
        let object = pod();
        let api = fake::FakeApi::new(object.clone());
        let work = work_of(&api, &object);
        let mut batch = StepBatch::default();
        batch.claim(&work, "node/prepare-volumes");
        batch.log(&work, "node/pull-image", "pulled".into());
        batch.complete(&work, "node/pull-image", None);
        let actions: Vec<StepActionKind> =
            batch.request().actions.iter().map(|a| a.action).collect();
        assert_eq!(
            actions,
            [
                StepActionKind::Log,
                StepActionKind::Complete,
                StepActionKind::Claim
            ]
        );
        assert!(
            batch
                .request()
                .actions
                .iter()
                .all(|a| a.workflow.as_deref() == Some("start-1"))
        );
        assert_eq!(batch.without_claims().request().actions.len(), 2);
    }
}
