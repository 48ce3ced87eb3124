//! Workflow steps: step owners' actions (claim, complete, fail, log, and
//! batches of them), the object's workflow instances and its step log.

use corral_api::ObjectKey;
use corral_api::workflow::{
    LogLevel, RecoveryReport, StepActionKind, StepActionRequest, StepBatchRequest, StepLogEntry,
    WorkflowInstance, WorkflowStatus,
};
use reqwest::Method;

use crate::{Client, ClientError, StepLogQuery, object_path};

impl Client {
    /// A step owner's action on a step of the object's newest running
    /// workflow instance (or the one `request.workflow` names). Returns the
    /// instance afterwards. Refused with 403 when the token's identity does
    /// not own the step, 409 when the step's state does not allow it.
    pub async fn step_action(
        &self,
        key: &ObjectKey,
        request: &StepActionRequest,
    ) -> Result<WorkflowInstance, ClientError> {
        let path = format!("{}/steps", object_path(key));
        self.call(self.request(Method::POST, &path).json(request))
            .await
    }

    /// Several step actions, and status fields the caller owns, in one
    /// write of the object: all or none. Returns the instance the last
    /// action moved.
    pub async fn step_batch(
        &self,
        key: &ObjectKey,
        batch: &StepBatchRequest,
    ) -> Result<WorkflowInstance, ClientError> {
        let path = format!("{}/steps", object_path(key));
        self.call(self.request(Method::POST, &path).json(batch))
            .await
    }

    /// Claims a ready step: it runs against its timeout from now.
    pub async fn claim_step(
        &self,
        key: &ObjectKey,
        step: &str,
    ) -> Result<WorkflowInstance, ClientError> {
        let request = StepActionRequest::new(StepActionKind::Claim, step);
        self.step_action(key, &request).await
    }

    /// Reports the claimed step done, with an optional note for `why`.
    pub async fn complete_step(
        &self,
        key: &ObjectKey,
        step: &str,
        note: Option<&str>,
    ) -> Result<WorkflowInstance, ClientError> {
        let mut request = StepActionRequest::new(StepActionKind::Complete, step);
        request.note = note.map(str::to_string);
        self.step_action(key, &request).await
    }

    /// Reports the claimed step failed with `error`.
    pub async fn fail_step(
        &self,
        key: &ObjectKey,
        step: &str,
        error: &str,
    ) -> Result<WorkflowInstance, ClientError> {
        let mut request = StepActionRequest::new(StepActionKind::Fail, step);
        request.error = Some(error.to_string());
        self.step_action(key, &request).await
    }

    /// Appends a log line about a step the caller owns.
    pub async fn log_step(
        &self,
        key: &ObjectKey,
        step: &str,
        level: LogLevel,
        message: &str,
    ) -> Result<WorkflowInstance, ClientError> {
        let mut request = StepActionRequest::new(StepActionKind::Log, step);
        request.level = Some(level);
        request.message = Some(message.to_string());
        self.step_action(key, &request).await
    }

    /// Runs the failed steps of the object's newest workflow instance again
    /// (each with a fresh retry budget), or brings forward the retry of
    /// steps waiting out their backoff; returns the instance afterwards.
    /// 409 when nothing failed.
    pub async fn retry(&self, key: &ObjectKey) -> Result<WorkflowInstance, ClientError> {
        let path = format!("{}/retry", object_path(key));
        self.call(self.request(Method::POST, &path)).await
    }

    /// A node's report of a pod it recovered from local state after its
    /// sandbox was found stale (a reboot): recorded as a finished
    /// `recover` workflow instance with the node's timings.
    pub async fn record_recovery(
        &self,
        key: &ObjectKey,
        report: &RecoveryReport,
    ) -> Result<(), ClientError> {
        let path = format!("{}/recoveries", object_path(key));
        let _: WorkflowInstance = self
            .call(self.request(Method::POST, &path).json(report))
            .await?;
        Ok(())
    }

    /// The object's kept workflow instances whole (each joined with its
    /// definition; finished ones replayed from the step log), oldest
    /// first: what `why` and `analyze` render.
    pub async fn workflows(&self, key: &ObjectKey) -> Result<WorkflowStatus, ClientError> {
        let path = format!("{}/workflows", object_path(key));
        self.call(self.request(Method::GET, &path)).await
    }

    /// The object's step log (transitions and owners' lines), time order.
    pub async fn step_logs(
        &self,
        key: &ObjectKey,
        query: &StepLogQuery,
    ) -> Result<Vec<StepLogEntry>, ClientError> {
        let path = format!("{}/steplogs", object_path(key));
        let params: Vec<(&str, &String)> = [
            ("step", &query.step),
            ("owner", &query.owner),
            ("workflow", &query.workflow),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.as_ref().map(|value| (name, value)))
        .collect();
        self.call(self.request(Method::GET, &path).query(&params))
            .await
    }
}
