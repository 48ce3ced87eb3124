//! The node's side of pod workflows: which node-owned steps are ready, and
//! reporting claim/complete/fail through the API's step endpoint.
//!
//! Objects store each workflow instance as per-step state naming its
//! definition (a `WorkflowDefinition` object); [`instance_for`] joins the
//! two, fetching each definition once through the [`StepApi`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use corral_api::workflow::{
    StepActionKind, StepActionRequest, StepExecutor, StoredWorkflows, WorkflowInstance,
    WorkflowOutcome,
};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::Client;
use corral_workflow::WorkflowDefinition;

/// The owner name of every step the node agent executes.
pub const NODE_OWNER: &str = "node";

/// The API's step endpoint and workflow definitions, behind a trait so
/// workers are testable.
#[async_trait]
pub trait StepApi: Send + Sync {
    async fn act(
        &self,
        key: &ObjectKey,
        request: &StepActionRequest,
    ) -> Result<WorkflowInstance, String>;

    /// The stored workflow definition called `name`.
    async fn definition(&self, name: &str) -> Result<Arc<WorkflowDefinition>, String>;
}

/// The step API of a client, remembering the definitions it fetched (they
/// never change).
#[derive(Debug)]
pub struct ClientSteps {
    client: Client,
    definitions: Mutex<HashMap<String, Arc<WorkflowDefinition>>>,
}

impl ClientSteps {
    pub fn new(client: Client) -> Self {
        ClientSteps {
            client,
            definitions: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl StepApi for ClientSteps {
    async fn act(
        &self,
        key: &ObjectKey,
        request: &StepActionRequest,
    ) -> Result<WorkflowInstance, String> {
        self.client
            .step_action(key, request)
            .await
            .map_err(|error| crate::chain(&error))
    }

    async fn definition(&self, name: &str) -> Result<Arc<WorkflowDefinition>, String> {
        let known = self
            .definitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned();
        if let Some(definition) = known {
            return Ok(definition);
        }
        let key = ObjectKey::new(Kind::WorkflowDefinition, None, name);
        let object = self
            .client
            .get(&key)
            .await
            .map_err(|error| crate::chain(&error))?;
        let spec = object
            .typed_spec()
            .map_err(|error| format!("{key}: unreadable definition: {error}"))?;
        let definition = Arc::new(corral_workflow::definition_from_spec(spec));
        self.definitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string(), definition.clone());
        Ok(definition)
    }
}

/// A step action on one instance.
pub fn request(action: StepActionKind, step: &str, workflow: &str) -> StepActionRequest {
    let mut request = StepActionRequest::new(action, step);
    request.workflow = Some(workflow.to_string());
    request
}

/// The workflow instance serving `revision` (the newest), joined with its
/// definition; `None` when there is none, or its definition cannot be
/// fetched now (the API is away: nothing to do until it is back).
pub async fn instance_for(
    api: &dyn StepApi,
    object: &Object,
    revision: u64,
) -> Option<WorkflowInstance> {
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
    Some(corral_workflow::hydrate(
        &definition,
        stored,
        &object.metadata.uid,
        &[],
    ))
}

/// Puts an instance the step API returned into `object`'s stored status,
/// so a later look at the object does not act on an older view of it.
pub fn remember(object: &mut Object, fresh: &WorkflowInstance) {
    let Ok(mut status) = StoredWorkflows::of(&object.status) else {
        return;
    };
    let Some(slot) = status.instances.iter_mut().find(|i| i.id == fresh.id) else {
        return;
    };
    *slot = corral_workflow::dehydrate(fresh, &slot.definition);
    if let Some(fields) = object.status.as_object_mut()
        && let Ok(value) = serde_json::to_value(&status)
    {
        fields.insert("workflow".to_string(), value);
    }
}

/// Whether the instance still runs.
pub fn is_running(instance: &WorkflowInstance) -> bool {
    instance.outcome == WorkflowOutcome::Running
}

/// Steps the node executes (its own, and those a controller delegated to
/// it with `executor: node`) of the instance in the given phase (`ready`,
/// `running`, …), in graph order.
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
