//! The node's side of pod workflows: which node-owned steps are ready, and
//! reporting claim/complete/fail through the API's step endpoint.

use async_trait::async_trait;
use corral_api::Object;
use corral_api::ObjectKey;
use corral_api::workflow::{
    StepActionKind, StepActionRequest, StepExecutor, WorkflowInstance, WorkflowOutcome,
    WorkflowStatus,
};
use corral_client::Client;

/// The owner name of every step the node agent executes.
pub const NODE_OWNER: &str = "node";

/// The API's step endpoint, behind a trait so workers are testable.
#[async_trait]
pub trait StepApi: Send + Sync {
    async fn act(
        &self,
        key: &ObjectKey,
        request: &StepActionRequest,
    ) -> Result<WorkflowInstance, String>;
}

#[async_trait]
impl StepApi for Client {
    async fn act(
        &self,
        key: &ObjectKey,
        request: &StepActionRequest,
    ) -> Result<WorkflowInstance, String> {
        self.step_action(key, request)
            .await
            .map_err(|error| crate::chain(&error))
    }
}

/// A step action on one instance.
pub fn request(action: StepActionKind, step: &str, workflow: &str) -> StepActionRequest {
    let mut request = StepActionRequest::new(action, step);
    request.workflow = Some(workflow.to_string());
    request
}

/// The workflow instance serving `revision`, newest first.
pub fn instance_for(object: &Object, revision: u64) -> Option<WorkflowInstance> {
    let status: WorkflowStatus =
        serde_json::from_value(object.status.get("workflow")?.clone()).ok()?;
    status
        .instances
        .into_iter()
        .rev()
        .find(|instance| instance.revision == revision)
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
