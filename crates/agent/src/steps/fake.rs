//! A step API in memory for tests: one object whose workflow instance moves
//! by the engine's own transitions (so the owner rule and the states are
//! the server's) and is stored as the server stores it (per-step state
//! naming its definition), with every request recorded and the API's
//! absence or a refused claim simulated on demand.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use corral_api::workflow::{StepActionKind, StepBatchRequest, StoredWorkflows, WorkflowInstance};
use corral_api::{Identity, Kind, Object, ObjectKey, Role};
use corral_workflow::WorkflowDefinition;
use serde_json::{Map, Value, json};

use super::{NodeWork, StepApi, StepApiError, StepBatch, merge_fields};

/// The node the fake's objects are bound to.
pub const NODE: &str = "node-1";

#[derive(Debug)]
struct State {
    object: Object,
    /// The newest instance, whole: the fake's truth (a finished instance
    /// stores no steps, so the object alone would not say how they ended).
    instance: WorkflowInstance,
    /// The name of its definition.
    definition: String,
    requests: Vec<StepBatchRequest>,
    status_writes: Vec<Map<String, Value>>,
    unavailable: bool,
    /// Requests that still succeed before the API goes away.
    away_after: Option<usize>,
    /// Steps whose claims are refused (as if another view had won).
    refused: Vec<String>,
    now: DateTime<Utc>,
    /// How long each batch takes to be answered.
    delay: std::time::Duration,
}

/// See the module documentation.
#[derive(Debug)]
pub struct FakeApi {
    state: Mutex<State>,
    definitions: Mutex<HashMap<String, Arc<WorkflowDefinition>>>,
}

/// A pod bound to [`NODE`] with a fresh instance of its built-in
/// `workflow` serving revision 1, and `steps_done` (controllers' steps)
/// already done.
pub fn pod(workflow: &str, steps_done: &[&str]) -> Object {
    object(Kind::Pod, workflow, steps_done)
}

/// Like [`pod`] for any kind with a built-in workflow.
pub fn object(kind: Kind, workflow: &str, steps_done: &[&str]) -> Object {
    let definition = corral_workflow::builtin(kind, workflow).expect("a built-in workflow");
    object_with(&definition, steps_done)
}

/// An object of `definition`'s kind bound to [`NODE`] with a fresh
/// instance of `definition` (give it to [`FakeApi::with_definitions`]
/// unless it is a built-in one) serving revision 1, `steps_done` already done.
pub fn object_with(definition: &WorkflowDefinition, steps_done: &[&str]) -> Object {
    let kind = definition.kind;
    let namespace = (kind != Kind::Node).then_some("default");
    let mut object = Object::new(kind, namespace, "web", json!({"containers": []}));
    object.metadata.uid = "uid-1".into();
    object.metadata.revision = 1;
    let now = start_time();
    let id = format!("{}-1", definition.workflow);
    let (mut instance, _) = corral_workflow::instantiate(definition, &id, "uid-1", 1, now);
    for step in steps_done {
        finish_as_owner(&mut instance, step, now);
    }
    let stored =
        corral_workflow::dehydrate(&instance, &corral_workflow::definition_name(definition));
    object.status = json!({"node": NODE, "workflow": StoredWorkflows { instances: vec![stored] }});
    object
}

fn start_time() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .expect("a valid time")
        .with_timezone(&Utc)
}

/// Claims and completes `step` as its owner (a controller, or the node).
fn finish_as_owner(instance: &mut WorkflowInstance, step: &str, now: DateTime<Utc>) {
    let owner = instance
        .step(step)
        .map(|s| s.definition.owner.clone())
        .expect("a step of the instance");
    let actor = if owner == super::NODE_OWNER {
        Identity::new(NODE, Role::Node)
    } else {
        Identity::new(owner, Role::Controller)
    };
    corral_workflow::claim(instance, step, &actor, Some(NODE), now).expect("claimable");
    corral_workflow::complete(instance, step, &actor, Some(NODE), now, None).expect("completes");
}

impl FakeApi {
    /// A fake serving `object`, knowing every built-in definition.
    pub fn new(object: Object) -> Self {
        Self::with_definitions(object, &[])
    }

    /// A fake serving `object`, knowing every built-in definition and
    /// `extra` (register custom ones here, before the object is read).
    pub fn with_definitions(object: Object, extra: &[WorkflowDefinition]) -> Self {
        let mut definitions = HashMap::new();
        let builtins = corral_workflow::BUILTIN_WORKFLOWS
            .iter()
            .filter_map(|(kind, workflow)| corral_workflow::builtin(*kind, workflow));
        for definition in builtins.chain(extra.iter().cloned()) {
            let name = corral_workflow::definition_name(&definition);
            definitions.insert(name, Arc::new(definition));
        }
        let status = StoredWorkflows::of(&object.status).expect("a stored workflow status");
        let stored = status.instances.last().expect("an instance").clone();
        let definition = definitions
            .get(&stored.definition)
            .expect("a known definition")
            .clone();
        let instance = corral_workflow::hydrate(&definition, &stored, &object.metadata.uid, &[]);
        FakeApi {
            state: Mutex::new(State {
                object,
                instance,
                definition: stored.definition,
                requests: Vec::new(),
                status_writes: Vec::new(),
                unavailable: false,
                away_after: None,
                refused: Vec::new(),
                now: start_time(),
                delay: std::time::Duration::ZERO,
            }),
            definitions: Mutex::new(definitions),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("the fake's lock is not poisoned")
    }

    /// The object as the fake API has it now.
    pub fn object(&self) -> Object {
        self.state().object.clone()
    }

    /// Every batch request applied or refused, in order.
    pub fn requests(&self) -> Vec<StepBatchRequest> {
        self.state().requests.clone()
    }

    /// The actions of every request, as `"claim node/pull-image"` (a claim
    /// if ready as `"claim-if-ready node/create-sandbox"`).
    pub fn actions(&self) -> Vec<Vec<String>> {
        self.requests()
            .iter()
            .map(|request| {
                request
                    .actions
                    .iter()
                    .map(|a| {
                        let action = if a.if_ready {
                            "claim-if-ready"
                        } else {
                            a.action.as_str()
                        };
                        format!("{action} {}", a.step)
                    })
                    .collect()
            })
            .collect()
    }

    /// Status writes made without a step action.
    pub fn status_writes(&self) -> Vec<Map<String, Value>> {
        self.state().status_writes.clone()
    }

    /// Makes every request fail as if the API were down (or back).
    pub fn set_unavailable(&self, unavailable: bool) {
        let mut state = self.state();
        state.unavailable = unavailable;
        state.away_after = None;
    }

    /// Refuses every claim of `step` from now on.
    pub fn refuse_claims_of(&self, step: &str) {
        self.state().refused.push(step.to_string());
    }

    /// Answers every batch `delay` after it is sent (a slow API).
    pub fn delay_batches(&self, delay: std::time::Duration) {
        self.state().delay = delay;
    }

    /// Lets `requests` more requests through, then goes away.
    pub fn go_away_after(&self, requests: usize) {
        self.state().away_after = Some(requests);
    }

    /// Whether this request finds the API away.
    fn away(state: &mut State) -> bool {
        match &mut state.away_after {
            Some(0) => state.unavailable = true,
            Some(left) => *left -= 1,
            None => {}
        }
        state.unavailable
    }

    /// `step` claimed and completed by its owner, as a controller would.
    pub fn finish_as_owner(&self, step: &str) {
        let mut state = self.state();
        state.now += TimeDelta::milliseconds(10);
        let now = state.now;
        let mut instance = state.instance.clone();
        finish_as_owner(&mut instance, step, now);
        store(&mut state, instance);
    }

    /// The state of `step` (`ready`, `running`, `done`, …) and its attempts.
    pub fn step(&self, step: &str) -> (&'static str, u32) {
        let state = self.state();
        let found = state.instance.step(step).expect("a step of the instance");
        (found.state.phase(), found.attempts)
    }
}

/// Makes `instance` the newest, in the fake and in its object.
fn store(state: &mut State, instance: WorkflowInstance) {
    let stored = corral_workflow::dehydrate(&instance, &state.definition);
    state.object.status["workflow"] = json!(StoredWorkflows {
        instances: vec![stored]
    });
    state.instance = instance;
}

#[async_trait]
impl StepApi for FakeApi {
    async fn definition(&self, name: &str) -> Result<Arc<WorkflowDefinition>, StepApiError> {
        self.definitions
            .lock()
            .expect("the fake's lock is not poisoned")
            .get(name)
            .cloned()
            .ok_or_else(|| StepApiError::Refused(format!("no workflow definition {name}")))
    }

    async fn batch(&self, _key: &ObjectKey, batch: &StepBatch) -> Result<NodeWork, StepApiError> {
        let delay = self.state().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut state = self.state();
        let request = batch.request();
        state.requests.push(request.clone());
        if Self::away(&mut state) {
            return Err(StepApiError::Unavailable("the fake API is down".into()));
        }
        state.now += TimeDelta::milliseconds(10);
        let now = state.now;
        let node = Identity::new(NODE, Role::Node);
        let mut instance = state.instance.clone();
        for action in &request.actions {
            let step = action.step.as_str();
            let applied = match action.action {
                StepActionKind::Claim if state.refused.iter().any(|s| s == step) => {
                    return Err(StepApiError::Refused(format!(
                        "{step} was claimed elsewhere"
                    )));
                }
                StepActionKind::Claim if action.if_ready => {
                    corral_workflow::claim_if_ready(&mut instance, step, &node, Some(NODE), now)
                        .map(|(logs, _)| logs)
                }
                StepActionKind::Claim => {
                    corral_workflow::claim(&mut instance, step, &node, Some(NODE), now)
                }
                StepActionKind::Complete => corral_workflow::complete(
                    &mut instance,
                    step,
                    &node,
                    Some(NODE),
                    now,
                    action.note.clone(),
                ),
                StepActionKind::Fail => corral_workflow::fail(
                    &mut instance,
                    step,
                    &node,
                    Some(NODE),
                    now,
                    action.error.as_deref().unwrap_or("failed"),
                ),
                StepActionKind::Log => Ok(Vec::new()),
            };
            if let Err(error) = applied {
                return Err(StepApiError::Refused(error.to_string()));
            }
        }
        store(&mut state, instance.clone());
        let mut status = state.object.status.as_object().cloned().unwrap_or_default();
        let fields: Map<String, Value> = request.status.clone().into_iter().collect();
        merge_fields(&mut status, &fields);
        state.object.status = Value::Object(status);
        Ok(NodeWork { instance })
    }

    async fn put_status(
        &self,
        _key: &ObjectKey,
        fields: &Map<String, Value>,
    ) -> Result<(), StepApiError> {
        let mut state = self.state();
        if Self::away(&mut state) {
            return Err(StepApiError::Unavailable("the fake API is down".into()));
        }
        state.status_writes.push(fields.clone());
        let mut status = state.object.status.as_object().cloned().unwrap_or_default();
        merge_fields(&mut status, fields);
        state.object.status = Value::Object(status);
        Ok(())
    }
}
