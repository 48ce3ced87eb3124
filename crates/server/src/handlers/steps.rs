//! The step API: `POST …/{name}/steps` (claim, complete, fail, log) and
//! `GET …/{name}/steplogs?step=&owner=&workflow=`, and a person's
//! `POST …/{name}/retry`, and a node's `POST …/pods/{name}/recoveries`.
//! Parsing only; the
//! behaviour is in [`crate::workflows`].

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use bytes::Bytes;
use corral_api::workflow::{
    RecoveryReport, StepActionRequest, StepBatchRequest, StepLogEntry, WorkflowInstance,
    WorkflowStatus,
};
use corral_store::StepLogFilter;

use super::Target;
use crate::SharedServer;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::query::Params;
use crate::workflows::{self, StepAction};

/// `POST …/{name}/steps {"action", "step", "workflow"?, …}`, or
/// `{"actions": […], "status": {…}?}` for several actions (and status
/// fields the caller owns) in one write: returns the instance after the
/// transitions.
pub async fn act(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    body: Bytes,
) -> Result<Json<WorkflowInstance>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    let value: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("request body is not valid JSON: {e}")))?;
    if value.get("actions").is_some() {
        let batch: StepBatchRequest = serde_json::from_value(value).map_err(|error| {
            ApiError::BadRequest(format!(
                "request body is not a step batch ({{\"actions\": [{{\"action\": …, \"step\": …}}, …], \"status\": {{…}}}}): {error}"
            ))
        })?;
        let actions = batch
            .actions
            .into_iter()
            .map(StepAction::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        let status = batch.status.into_iter().collect();
        return Ok(Json(
            workflows::act_batch(&server, &caller, &key, actions, status).await?,
        ));
    }
    let request: StepActionRequest = serde_json::from_value(value).map_err(|error| {
        ApiError::BadRequest(format!(
            "request body is not a step action ({{\"action\": \"claim\"|\"complete\"|\"fail\"|\"log\", \"step\": …}}): {error}"
        ))
    })?;
    let action = StepAction::try_from(request)?;
    Ok(Json(workflows::act(&server, &caller, &key, action).await?))
}

/// `POST …/pods/{name}/recoveries`: the pod's node reports a recovery it
/// ran from local state (its sandbox found stale after a reboot); recorded
/// as a finished `recover` workflow instance, which is returned.
pub async fn record_recovery(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    body: Bytes,
) -> Result<Json<WorkflowInstance>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    let report: RecoveryReport = serde_json::from_slice(&body).map_err(|error| {
        ApiError::BadRequest(format!(
            "request body is not a recovery report ({{\"revision\": …, \"startedAt\": …, \"steps\": [{{\"step\": …, \"startedAt\": …, \"finishedAt\": …}}, …]}}): {error}"
        ))
    })?;
    Ok(Json(
        workflows::record_recovery(&server, &caller, &key, &report).await?,
    ))
}

/// `POST …/{name}/retry`: a person asks for the newest workflow instance's
/// failed steps to run again; returns the instance afterwards.
pub async fn retry(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Json<WorkflowInstance>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    Ok(Json(workflows::retry(&server, &caller, &key).await?))
}

/// `GET …/{name}/workflows`: the object's kept workflow instances whole —
/// each joined with its definition, finished ones replayed from the step
/// log — as `why` and `analyze` render them.
pub async fn instances(
    State(server): State<SharedServer>,
    Caller(_caller): Caller,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Json<WorkflowStatus>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    let object = server
        .store
        .get(&key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))?;
    Ok(Json(workflows::instances(&server, &object).await?))
}

/// `GET …/{name}/steplogs`: everything recorded about the object's steps,
/// in time order, optionally only one step's, one owner's or one
/// instance's.
pub async fn logs(
    State(server): State<SharedServer>,
    Caller(_caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
) -> Result<Json<Vec<StepLogEntry>>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    let query = Params::parse(query.as_deref());
    let given = |name: &str| {
        query
            .get(name)
            .filter(|value| !value.is_empty())
            .map(str::to_string)
    };
    let filter = StepLogFilter {
        step: given("step"),
        owner: given("owner"),
        workflow_id: given("workflow"),
    };
    Ok(Json(workflows::step_logs(&server, &key, &filter).await?))
}
