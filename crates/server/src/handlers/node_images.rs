//! `POST /v1/nodes/{name}/images/prune` (operators only): the node's agent
//! collects its unused images now and answers what it removed. Images live
//! on nodes and the agent owns its image store, so the server only passes
//! the request on to the node's `status.agentEndpoint`, as it does for
//! logs and exec.

use std::collections::HashMap;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use corral_api::Role;
use corral_api::kinds::ImagePruneReport;

use super::pods_io::{Route, agent_request, node_status, passed_on, unreachable};
use crate::SharedServer;
use crate::auth::Caller;
use crate::error::ApiError;

/// How long a collection may take (it deletes files; usually well under a second).
const PRUNE_TIMEOUT: Duration = Duration::from_secs(300);

pub async fn prune(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    if caller.role != Role::Operator {
        return Err(ApiError::Forbidden(format!(
            "only operators collect a node's images; {} is a {:?} identity",
            caller.name, caller.role
        )));
    }
    let node = params.get("name").cloned().unwrap_or_default();
    let status = node_status(&server, &node)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("node {node} does not exist")))?;
    let endpoint = status.agent_endpoint.ok_or_else(|| {
        ApiError::Unavailable(format!(
            "node {node} reports no agent endpoint, so its images cannot be collected from here \
             (is its agent running? it also collects on its own every 10 minutes)"
        ))
    })?;
    let route = Route {
        endpoint,
        path: "/v1/images/prune".to_string(),
        node,
        query: String::new(),
    };
    let response = agent_request(&server, &route, reqwest::Method::POST)
        .await?
        .timeout(PRUNE_TIMEOUT)
        .send()
        .await
        .map_err(|error| unreachable(&route, &error))?;
    if !response.status().is_success() {
        return Ok(passed_on(response).await);
    }
    let report: ImagePruneReport = response
        .json()
        .await
        .map_err(|error| unreachable(&route, &error))?;
    tracing::info!(caller = %caller.name, node = %route.node, removed = report.removed_images.len(), "images collected");
    Ok(Json(report).into_response())
}
