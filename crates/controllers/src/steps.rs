//! Finding ready steps a controller owns.

use corral_api::Object;
use corral_api::workflow::{WorkflowOutcome, WorkflowStatus};

/// The id of the newest running instance in which `step` is ready.
pub fn ready_instance(object: &Object, step: &str) -> Option<String> {
    let status: WorkflowStatus =
        serde_json::from_value(object.status.get("workflow")?.clone()).ok()?;
    let instance = status.latest()?;
    (instance.outcome == WorkflowOutcome::Running
        && instance
            .step(step)
            .is_some_and(|s| s.state.phase() == "ready"))
    .then(|| instance.id.clone())
}
