//! Finding ready steps a controller owns, and moving one in one request.

use std::collections::BTreeMap;

use corral_api::workflow::{StepActionKind, StepActionRequest, StepBatchRequest, StoredWorkflows};
use corral_api::{Object, ObjectKey};
use corral_client::{Client, ClientError};
use serde_json::Value;

/// The id of the newest instance, if `step` is ready in it.
pub fn ready_instance(object: &Object, step: &str) -> Option<String> {
    let instance = StoredWorkflows::latest_of(&object.status).ok()??;
    instance.is_ready(step).then_some(instance.id)
}

/// The id of the newest instance, if `step` failed in it and waits for its
/// retry (its owner may claim it before the backoff ends).
pub fn retrying_instance(object: &Object, step: &str) -> Option<String> {
    let instance = StoredWorkflows::latest_of(&object.status).ok()??;
    instance.awaits_retry(step).then_some(instance.id)
}

/// A ready step to move: which object, which step, which instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyStep<'a> {
    pub key: &'a ObjectKey,
    pub step: &'a str,
    pub workflow: &'a str,
}

impl ReadyStep<'_> {
    fn action(&self, kind: StepActionKind) -> StepActionRequest {
        let mut request = StepActionRequest::new(kind, self.step);
        request.workflow = Some(self.workflow.to_string());
        request
    }

    /// Claims the step and completes it with `note` — or fails it with the
    /// error — setting the status fields given, all in one write.
    pub async fn finish(
        &self,
        client: &Client,
        outcome: Result<String, String>,
        status: BTreeMap<String, Value>,
    ) -> Result<(), ClientError> {
        let claim = self.action(StepActionKind::Claim);
        let report = match outcome {
            Ok(note) => {
                let mut done = self.action(StepActionKind::Complete);
                done.note = Some(note);
                done
            }
            Err(error) => {
                let mut failed = self.action(StepActionKind::Fail);
                failed.error = Some(error);
                failed
            }
        };
        let batch = StepBatchRequest {
            actions: vec![claim, report],
            status,
        };
        client.step_batch(self.key, &batch).await.map(|_| ())
    }
}
