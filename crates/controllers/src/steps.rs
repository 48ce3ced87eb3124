//! Finding ready steps a controller owns, and moving one in one request.

use std::collections::BTreeMap;

use corral_api::workflow::{StepActionKind, StepActionRequest, StepBatchRequest, StoredWorkflows};
use corral_api::{Object, ObjectKey};
use corral_client::{Client, ClientError};
use serde_json::Value;

/// For each of `steps`, the id of the object's newest workflow instance
/// if the step is ready in it; the instance is decoded once (a projection
/// runs for every event of every object it watches).
pub fn ready_instances<const N: usize>(object: &Object, steps: [&str; N]) -> [Option<String>; N] {
    let latest = StoredWorkflows::latest_of(&object.status).ok().flatten();
    steps.map(|step| {
        latest
            .as_ref()
            .filter(|instance| instance.is_ready(step))
            .map(|instance| instance.id.clone())
    })
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
