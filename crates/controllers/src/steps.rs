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

/// Sets `status.FIELD` of the object at `key` to `value`, reading it afresh
/// and retrying when someone else wrote in between (status writes are
/// compare-and-swap; the workflow driver and agents write status too).
pub async fn set_status_field(
    client: &corral_client::Client,
    key: &corral_api::ObjectKey,
    field: &str,
    value: serde_json::Value,
) -> Result<corral_api::Object, corral_client::ClientError> {
    let mut attempt = 0;
    loop {
        let mut current = client.get(key).await?;
        if !current.status.is_object() {
            current.status = serde_json::json!({});
        }
        current.status[field] = value.clone();
        match client.put_status(&current).await {
            Err(error) if error.status() == Some(409) && attempt < 10 => attempt += 1,
            other => return other,
        }
    }
}
