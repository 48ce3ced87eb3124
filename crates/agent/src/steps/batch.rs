//! Step actions and node-owned status fields the node sends in one request.

use std::collections::BTreeMap;

use corral_api::workflow::{StepActionKind, StepActionRequest, StepBatchRequest};
use serde_json::{Map, Value};

use super::NodeWork;

/// Step actions on one instance, and node-owned status fields, to send in
/// one request: reports first (log lines, completions, failures), then the
/// steps settled at once (each claimed and completed), then claims, so a
/// claim may take a step the reports and settled steps made ready; last,
/// claims if ready, which the server skips while their step still waits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepBatch {
    reports: Vec<StepActionRequest>,
    settled: Vec<StepActionRequest>,
    claims: Vec<StepActionRequest>,
    /// Claims the server applies only if their step is ready by then.
    riding: Vec<StepActionRequest>,
    status: BTreeMap<String, Value>,
}

impl StepBatch {
    fn action(kind: StepActionKind, work: &NodeWork, step: &str) -> StepActionRequest {
        let mut request = StepActionRequest::new(kind, step);
        request.workflow = Some(work.id().to_string());
        request
    }

    /// Claims `step`: it runs against its timeout from now.
    pub fn claim(&mut self, work: &NodeWork, step: &str) {
        self.claims
            .push(Self::action(StepActionKind::Claim, work, step));
    }

    /// Claims `step` if it is ready when the request lands: a step waiting
    /// only on another owner's step (the address IPAM is writing), whose
    /// claim rides along with this request instead of costing one of its
    /// own after that owner's write. The server skips it while it waits.
    pub fn claim_if_ready(&mut self, work: &NodeWork, step: &str) {
        let mut request = Self::action(StepActionKind::Claim, work, step);
        request.if_ready = true;
        self.riding.push(request);
    }

    /// Claims `step` and reports it done with `note` in the same request:
    /// a step that had nothing to do (a pod without init containers), so
    /// its claim need not wait for a round trip of its own.
    pub fn settle(&mut self, work: &NodeWork, step: &str, note: Option<String>) {
        self.settled
            .push(Self::action(StepActionKind::Claim, work, step));
        let mut complete = Self::action(StepActionKind::Complete, work, step);
        complete.note = note;
        self.settled.push(complete);
    }

    /// A line for `step`'s log.
    pub fn log(&mut self, work: &NodeWork, step: &str, line: String) {
        let mut request = Self::action(StepActionKind::Log, work, step);
        request.message = Some(line);
        self.reports.push(request);
    }

    /// Reports `step` done, with a note for `why`.
    pub fn complete(&mut self, work: &NodeWork, step: &str, note: Option<String>) {
        let mut request = Self::action(StepActionKind::Complete, work, step);
        request.note = note;
        self.reports.push(request);
    }

    /// Reports `step` failed.
    pub fn fail(&mut self, work: &NodeWork, step: &str, error: String) {
        let mut request = Self::action(StepActionKind::Fail, work, step);
        request.error = Some(error);
        self.reports.push(request);
    }

    /// Writes node-owned status fields in the same write.
    pub fn set_status(&mut self, fields: &Map<String, Value>) {
        self.status
            .extend(fields.iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    /// Adds `other`'s actions and status fields to this batch.
    pub fn append(&mut self, other: StepBatch) {
        self.reports.extend(other.reports);
        self.claims.extend(other.claims);
        self.riding.extend(other.riding);
        self.status.extend(other.status);
    }

    /// The steps this batch reports done (settled ones included).
    pub fn completed(&self) -> Vec<&str> {
        self.reports
            .iter()
            .chain(&self.settled)
            .filter(|r| r.action == StepActionKind::Complete)
            .map(|r| r.step.as_str())
            .collect()
    }

    /// The steps this batch claims to run them (not the settled ones).
    pub fn claimed(&self) -> impl Iterator<Item = &str> {
        self.claims.iter().map(|c| c.step.as_str())
    }

    /// The steps this batch claims if they are ready by then.
    pub fn claimed_if_ready(&self) -> impl Iterator<Item = &str> {
        self.riding.iter().map(|c| c.step.as_str())
    }

    /// The steps this batch claims and completes at once.
    pub fn settled(&self) -> impl Iterator<Item = &str> {
        self.settled
            .iter()
            .filter(|a| a.action == StepActionKind::Claim)
            .map(|a| a.step.as_str())
    }

    /// Whether the batch has no action (status fields alone are not sent
    /// through the step API).
    pub fn is_empty(&self) -> bool {
        self.reports.is_empty()
            && self.settled.is_empty()
            && self.claims.is_empty()
            && self.riding.is_empty()
    }

    /// Whether the batch claims a step (to run it, settled at once, or if
    /// ready).
    pub fn has_claims(&self) -> bool {
        !self.claims.is_empty() || !self.settled.is_empty() || !self.riding.is_empty()
    }

    /// Whether the batch moves a step (a claim, an outcome), not only
    /// logs lines.
    pub fn moves_a_step(&self) -> bool {
        self.has_claims() || self.reports.iter().any(|r| r.action != StepActionKind::Log)
    }

    pub fn has_reports(&self) -> bool {
        !self.reports.is_empty()
    }

    /// Whether the batch sets status fields.
    pub fn has_status(&self) -> bool {
        !self.status.is_empty()
    }

    /// The same batch without its claims, settled steps included (to send
    /// the reports alone after a claim was refused).
    pub fn without_claims(&self) -> StepBatch {
        StepBatch {
            claims: Vec::new(),
            settled: Vec::new(),
            riding: Vec::new(),
            ..self.clone()
        }
    }

    /// The request body.
    pub fn request(&self) -> StepBatchRequest {
        StepBatchRequest {
            actions: self
                .reports
                .iter()
                .chain(&self.settled)
                .chain(&self.claims)
                .chain(&self.riding)
                .cloned()
                .collect(),
            status: self.status.clone(),
        }
    }
}
