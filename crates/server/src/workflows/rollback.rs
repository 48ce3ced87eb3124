//! Automatic rollback: a pod whose spec says `rollback: auto` and whose
//! update workflow for its current revision failed is put back on the
//! previous revision by the system.
//!
//! This is the one spec write the engine makes. It is authorized by the
//! pod's own `rollback: auto` (the person's half of the decision) and it
//! only ever restores a spec that a person wrote before; the history
//! record names the engine (`workflow`, class `system`) and says why. A
//! revision that was itself an automatic rollback is never rolled back
//! again, so two bad revisions cannot ping-pong.

use corral_api::kinds::{PodSpec, RollbackPolicy};
use corral_api::workflow::WorkflowOutcome;
use corral_api::{AuthorClass, Object};
use corral_store::{ChangeMeta, StoreError};

use super::stored_status;
use crate::Server;

/// The message prefix of every automatic rollback in history.
pub const AUTOMATIC: &str = "automatic rollback";

/// Rolls `pod` back if it asked for it and its update failed. Returns
/// whether it did.
pub async fn maybe_roll_back(server: &Server, pod: &Object) -> Result<bool, StoreError> {
    // Asked for by few pods and checked on every change of every pod: the
    // stored (canonical) spec says `rollback: auto` before it is decoded.
    if pod.spec.get("rollback").and_then(serde_json::Value::as_str) != Some("auto") {
        return Ok(false);
    }
    let Ok(spec) = pod.typed_spec::<PodSpec>() else {
        return Ok(false);
    };
    if spec.rollback != Some(RollbackPolicy::Auto) || pod.metadata.revision < 2 {
        return Ok(false);
    }
    let Ok(status) = stored_status(pod) else {
        return Ok(false);
    };
    let revision = pod.metadata.revision;
    let Some(failed) = status
        .instances
        .iter()
        .rev()
        .find(|i| i.revision == revision)
    else {
        return Ok(false);
    };
    if failed.workflow != "update" || failed.outcome != WorkflowOutcome::Failed {
        return Ok(false);
    }
    let key = pod.key();
    let history = server.store.history(&key).await?;
    if history
        .iter()
        .any(|r| r.revision == revision && r.message.starts_with(AUTOMATIC))
    {
        return Ok(false);
    }
    let previous = server.store.revision(&key, revision - 1).await?;
    let Some(previous_spec) = previous.spec else {
        return Ok(false);
    };
    let reason = failed
        .steps
        .iter()
        .find_map(|(name, step)| match &step.state {
            corral_api::workflow::StepState::Failed { error, .. } => {
                Some(format!("{name}: {error}"))
            }
            corral_api::workflow::StepState::TimedOut { .. } => Some(format!("{name} timed out")),
            _ => None,
        })
        .unwrap_or_else(|| "its update workflow failed".to_string());
    let change = ChangeMeta {
        author: corral_workflow::ENGINE_OWNER.to_string(),
        class: AuthorClass::System,
        message: format!(
            "{AUTOMATIC} to revision {}: revision {revision} never became ready ({reason})",
            revision - 1
        ),
        time: server.clock.now(),
        always_record: false,
    };
    let mut next = pod.clone();
    next.spec = previous_spec;
    let expected = pod.metadata.resource_version;
    match super::update(server, pod, next, expected, &change).await {
        Ok(_) => {
            tracing::info!(pod = %key, to = revision - 1, %reason, "automatic rollback");
            Ok(true)
        }
        Err(super::WriteError::Store(StoreError::Conflict { .. })) => Ok(false),
        Err(super::WriteError::Store(error)) => Err(error),
        Err(other) => {
            tracing::warn!(pod = %key, error = %crate::error::error_chain(&other), "automatic rollback refused");
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quick_check_spells_auto_as_a_stored_spec_does() {
        // `maybe_roll_back` looks for this string before decoding the spec.
        let asked = serde_json::json!({"containers": [{"name": "app", "image": "app:1"}]});
        let mut spec: PodSpec = serde_json::from_value(asked).expect("a pod spec");
        spec.rollback = Some(RollbackPolicy::Auto);
        let stored = serde_json::to_value(&spec).expect("a spec encodes");
        assert_eq!(stored["rollback"], "auto");
    }
}
