//! Node leases: `PUT /v1/nodes/{name}/lease` is a node's heartbeat, and
//! `GET` reads it (node-lifecycle does, when a node's silence is due).
//!
//! Each renewal grants the node a fencing period (`fenceAfterSeconds`,
//! `corral server --fence-after`): the lease records it, so node-lifecycle
//! knows what the node promised even if the setting changes meanwhile.
//!
//! A renewal is no object write: no revision, no watch event, nothing for
//! every watcher of nodes to receive every few seconds. The one exception
//! is a node coming back: when its Node is not Ready (Silent or Lost, it
//! was gone), the renewal also writes `status.heartbeat`, so node-lifecycle
//! hears about it at once.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, State};
use corral_api::kinds::{NodePhase, NodeStatus};
use corral_api::{Identity, Kind, ObjectKey, Role};
use corral_store::LeaseRecord;
use serde::Serialize;

use crate::SharedServer;
use crate::auth::Caller;
use crate::error::ApiError;

/// A lease as the API shows it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub node: String,
    pub holder: String,
    pub renewed_at: chrono::DateTime<chrono::Utc>,
    /// The fencing period granted with the renewal (seconds): the node
    /// stops its `availability: ha` pods if it cannot renew for that long,
    /// timed on its monotonic clock from when it sent this renewal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence_after_seconds: Option<u64>,
}

impl From<LeaseRecord> for Lease {
    fn from(record: LeaseRecord) -> Self {
        Lease {
            node: record.name,
            holder: record.holder,
            renewed_at: record.renewed_at,
            fence_after_seconds: record.fence_after_seconds,
        }
    }
}

fn node_name(params: &HashMap<String, String>) -> Result<String, ApiError> {
    let name = params.get("name").cloned().unwrap_or_default();
    crate::validate_name("node", &name)?;
    Ok(name)
}

/// Only the node itself renews its lease (or an operator, by hand).
fn may_renew(caller: &Identity, node: &str) -> Result<(), ApiError> {
    match caller.role {
        Role::Operator => Ok(()),
        Role::Node if caller.name == node => Ok(()),
        _ => Err(ApiError::Forbidden(format!(
            "{} may not renew the lease of node {node}: only the node itself renews its lease",
            caller.name
        ))),
    }
}

/// `PUT /v1/nodes/{name}/lease`: the node is alive now.
pub async fn renew(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Json<Lease>, ApiError> {
    let node = node_name(&params)?;
    may_renew(&caller, &node)?;
    let key = ObjectKey::new(Kind::Node, None, &node);
    let stored =
        server.store.get(&key).await?.ok_or_else(|| {
            ApiError::NotFound(format!("{key} not found: register the node first"))
        })?;
    let now = server.clock.now();
    let lease = LeaseRecord {
        name: node.clone(),
        holder: caller.name.clone(),
        renewed_at: now,
        fence_after_seconds: Some(
            *server
                .fence_after_seconds
                .get()
                .unwrap_or(&corral_api::fencing::DEFAULT_FENCE_AFTER_SECONDS),
        ),
    };
    server.store.renew_lease(lease.clone()).await?;
    let status: NodeStatus = stored.typed_status().unwrap_or_default();
    if matches!(status.phase, NodePhase::Silent | NodePhase::Lost) {
        let mut next = stored.clone();
        if !next.status.is_object() {
            next.status = serde_json::json!({});
        }
        next.status["heartbeat"] = serde_json::to_value(now).unwrap_or_default();
        let change = super::change(&server, &caller, Some("the node is back"));
        let expected = stored.metadata.resource_version;
        // A concurrent write wins; the next renewal tries again.
        if let Err(error) =
            crate::ownership::update(&server, &caller, &stored, next, expected, &change).await
        {
            tracing::debug!(node = %node, error = %crate::error::error_chain(&error), "heartbeat of a returning node not written");
        }
    }
    Ok(Json(lease.into()))
}

/// `GET /v1/nodes/{name}/lease`: when the node last renewed its lease; 404
/// if it has not since the server's store started.
pub async fn read(
    State(server): State<SharedServer>,
    Caller(_caller): Caller,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Json<Lease>, ApiError> {
    let node = node_name(&params)?;
    server
        .store
        .find_lease(&node)
        .await?
        .map(|lease| Json(lease.into()))
        .ok_or_else(|| ApiError::NotFound(format!("node {node} has renewed no lease yet")))
}
