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
    // The failed revision itself an automatic rollback: never roll back again.
    let automatic = match server.store.revision(&key, revision).await {
        Ok(record) => record.message.starts_with(AUTOMATIC),
        Err(StoreError::RevisionNotFound { .. }) => false,
        Err(error) => return Err(error),
    };
    if automatic {
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
    use corral_api::Kind;

    /// Pod `name` (rollback: auto) at revision 2, written with `message`,
    /// as its failed update leaves it.
    async fn failed_at_two(server: &Server, name: &str, message: &str) -> Object {
        let change = |message: &str| ChangeMeta {
            author: "alice".into(),
            class: AuthorClass::External,
            message: message.into(),
            time: chrono::Utc::now(),
            always_record: false,
        };
        let pod = |image: &str| {
            let spec = serde_json::json!({"rollback": "auto", "containers": [{"name": "app", "image": image}]});
            let mut object = Object::new(Kind::Pod, Some("default"), name, spec);
            object.metadata.uid = format!("uid-{name}");
            object
        };
        let first = server
            .store
            .create(pod("app:1"), &change("first"))
            .await
            .expect("create");
        let mut next = pod("app:2");
        next.metadata = first.metadata.clone();
        let mut second = server
            .store
            .update(next, first.metadata.resource_version, &change(message))
            .await
            .expect("update");
        assert_eq!(second.metadata.revision, 2);
        second.status = serde_json::json!({"workflow": {"instances": [{
            "id": "update-2", "workflow": "update", "definition": "pod-update", "revision": 2,
            "startedAt": chrono::Utc::now(), "outcome": "failed",
        }]}});
        second
    }

    #[tokio::test]
    async fn a_failed_revision_is_rolled_back_unless_it_is_an_automatic_rollback() {
        let server = Server::in_memory();
        let web = failed_at_two(&server, "web", "new image").await;
        assert!(maybe_roll_back(&server, &web).await.expect("rollback"));
        let rolled = server
            .store
            .get(&web.key())
            .await
            .expect("get")
            .expect("web");
        assert_eq!(rolled.metadata.revision, 3);
        assert_eq!(rolled.spec["containers"][0]["image"], "app:1");
        let newest = server
            .store
            .recent_history(&web.key(), 1)
            .await
            .expect("history");
        assert!(newest[0].message.starts_with(AUTOMATIC), "{:?}", newest[0]);

        let looping = format!("{AUTOMATIC} to revision 1: revision 0 never became ready");
        let api = failed_at_two(&server, "api", &looping).await;
        assert!(!maybe_roll_back(&server, &api).await.expect("no rollback"));
        let kept = server
            .store
            .get(&api.key())
            .await
            .expect("get")
            .expect("api");
        assert_eq!(
            kept.metadata.revision, 2,
            "an automatic rollback is not rolled back"
        );
    }

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
