//! Workflow commands: `why`, `analyze blame|critical-chain|dot`,
//! `logs --steps`, and the follower behind `apply --wait`. They fetch the
//! object and render with `corral_workflow`'s pure renderers, with `now` the
//! client's clock.

mod logs;
mod wait;
mod why;

pub use logs::{LogsArgs, logs};
pub use wait::follow;
pub use why::{AnalyzeArgs, WhyArgs, analyze, why};

use anyhow::{Context, bail};
use corral_api::workflow::{WorkflowInstance, WorkflowStatus};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::Client;

/// How `why` and friends name an object: `pod/web`, `vm/builder`.
pub fn display_name(key: &ObjectKey) -> String {
    format!("{}/{}", key.kind.short(), key.name)
}

/// The object's `status.workflow`; empty when it has none.
pub fn workflow_status(object: &Object) -> anyhow::Result<WorkflowStatus> {
    match object.status.get("workflow") {
        None | Some(serde_json::Value::Null) => Ok(WorkflowStatus::default()),
        Some(value) => serde_json::from_value(value.clone())
            .with_context(|| format!("{}: status.workflow is unreadable", object.key())),
    }
}

/// The object and the instance to explain: the one named, else the newest.
pub async fn load_instance(
    client: &Client,
    key: &ObjectKey,
    id: Option<&str>,
) -> anyhow::Result<(Object, WorkflowInstance)> {
    let object = client.get(key).await?;
    let status = workflow_status(&object)?;
    let instance = match id {
        Some(id) => status.find(id).cloned().with_context(|| {
            let kept: Vec<&str> = status.instances.iter().map(|i| i.id.as_str()).collect();
            format!(
                "{} has no workflow instance {id} (kept: {})",
                display_name(key),
                if kept.is_empty() {
                    "none".to_string()
                } else {
                    kept.join(", ")
                }
            )
        })?,
        None => match status.latest() {
            Some(instance) => instance.clone(),
            None if !matches!(key.kind, Kind::Pod | Kind::VirtualMachine | Kind::Node) => bail!(
                "{} has no workflow: only pods, VMs and nodes have lifecycles to explain",
                display_name(key)
            ),
            None => bail!(
                "{} has no workflow instance yet (it was created before workflows were recorded)",
                display_name(key)
            ),
        },
    };
    Ok((object, instance))
}
