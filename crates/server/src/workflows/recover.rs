//! A node's report of a pod it recovered from local state (its sandbox
//! found stale after a reboot, the agent's `pods/recover.rs`), recorded as
//! a finished `recover` workflow instance with the node's own timings: the
//! node did the work before it could tell anyone (the control plane may
//! have been down throughout), so the record is written whole, each step
//! claimed and completed (or failed) by the node at the times it reports,
//! through the engine's transitions and their owner rule. A running
//! instance (an update) is not cancelled by it.

use corral_api::workflow::{KEPT_INSTANCES, RecoveryReport, WorkflowInstance};
use corral_api::{Identity, Kind, ObjectKey};
use corral_store::StoreError;

use super::steps::refusal;
use super::{bound_node, definitions, hydrate, put_stored, stored_status};
use crate::Server;
use crate::error::ApiError;

/// How many times the write is retried when the pod changed under it.
const ATTEMPTS: usize = 5;

/// Records `report` on the pod at `key` as a finished `recover` instance;
/// returns it. A report already recorded (its id is derived from its
/// start) is returned as it is, so a node may send it again safely.
pub async fn record_recovery(
    server: &Server,
    caller: &Identity,
    key: &ObjectKey,
    report: &RecoveryReport,
) -> Result<WorkflowInstance, ApiError> {
    if key.kind != Kind::Pod {
        return Err(ApiError::NotFound(format!(
            "{key}: only pods are recovered by their node"
        )));
    }
    if report.steps.is_empty() {
        return Err(ApiError::BadRequest(
            "steps: name at least the step that found the sandbox stale".into(),
        ));
    }
    let id = format!(
        "recover-{}-{}",
        report.revision,
        report.started_at.timestamp_millis()
    );
    for _ in 0..ATTEMPTS {
        let object = server
            .store
            .get(key)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))?;
        if object.metadata.deleting.is_some() {
            return Err(ApiError::Conflict(format!(
                "{key} is being deleted: its recovery is not recorded"
            )));
        }
        let mut stored = stored_status(&object).map_err(|error| {
            ApiError::Internal(format!("{key}: status.workflow is unreadable: {error}"))
        })?;
        if let Some(known) = stored.instances.iter().find(|i| i.id == id) {
            return Ok(hydrate(server, known, &object.metadata.uid).await?);
        }
        let Some((name, definition)) = definitions::current(server, Kind::Pod, "recover").await?
        else {
            return Err(ApiError::Internal("pods have no recover workflow".into()));
        };
        let bound = bound_node(&object);
        let (mut instance, mut logs) = corral_workflow::instantiate(
            &definition,
            &id,
            &object.metadata.uid,
            report.revision,
            report.started_at,
        );
        for step in &report.steps {
            let name = step.step.as_str();
            logs.extend(
                corral_workflow::claim(
                    &mut instance,
                    name,
                    caller,
                    bound.as_deref(),
                    step.started_at,
                )
                .map_err(refusal)?,
            );
            let moved = match &step.error {
                Some(error) => corral_workflow::fail(
                    &mut instance,
                    name,
                    caller,
                    bound.as_deref(),
                    step.finished_at,
                    error,
                ),
                None => corral_workflow::complete(
                    &mut instance,
                    name,
                    caller,
                    bound.as_deref(),
                    step.finished_at,
                    step.note.clone(),
                ),
            };
            logs.extend(moved.map_err(refusal)?);
        }
        let finished = report
            .steps
            .iter()
            .map(|step| step.finished_at)
            .max()
            .unwrap_or(report.started_at);
        logs.extend(corral_workflow::tick(&mut instance, finished));
        stored
            .instances
            .push(corral_workflow::dehydrate(&instance, &name));
        let excess = stored.instances.len().saturating_sub(KEPT_INSTANCES);
        stored.instances.drain(..excess);
        let mut next = object.clone();
        put_stored(&mut next, &stored);
        let change = crate::handlers::change(server, caller, None);
        match server
            .store
            .update_logged(next, object.metadata.resource_version, &change, &logs)
            .await
        {
            Err(StoreError::Conflict { .. }) => continue,
            Err(error) => return Err(error.into()),
            Ok(_) => return Ok(instance),
        }
    }
    Err(ApiError::Conflict(format!(
        "{key} kept changing while its recovery was recorded; try again"
    )))
}
