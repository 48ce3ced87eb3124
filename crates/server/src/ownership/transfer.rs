//! `POST /v1/controllers/{name}/transfer {"path": "Pod:status.node", "to":
//! "other"}`: an operator hands a field from one controller to another.
//! Both `Controller` objects get a new revision authored by the operator,
//! with a message naming the transfer; nothing else ever moves a field
//! between owners.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, State};
use corral_api::kinds::ControllerSpec;
use corral_api::{Kind, Object, ObjectKey, Role};
use corral_ownership::{FieldRef, TransferError};
use serde::{Deserialize, Serialize};

use crate::SharedServer;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::handlers::change;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferRequest {
    /// `Kind:path`, e.g. `Pod:status.node`.
    pub path: String,
    /// The controller that owns the field afterwards.
    pub to: String,
}

/// The `Controller` objects as written: `from` is absent when the field
/// was the old owner's by default only (its registration did not list it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TransferResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Object>,
    pub to: Object,
}

pub async fn transfer(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    Json(request): Json<TransferRequest>,
) -> Result<Json<TransferResponse>, ApiError> {
    if caller.role != Role::Operator {
        return Err(ApiError::Forbidden(format!(
            "only operators hand fields over; {} may not",
            corral_ownership::Writer(&caller)
        )));
    }
    let from = params.get("name").cloned().unwrap_or_default();
    let field: FieldRef = request
        .path
        .parse()
        .map_err(|e: corral_ownership::BadFieldRef| ApiError::BadRequest(format!("path: {e}")))?;
    crate::validate_name("to", &request.to)?;

    let _serial = server.ownership.registrations.lock().await;
    super::invalidate(&server);
    let registry = super::registry(&server).await?;
    let plan = registry
        .plan_transfer(&field, &from, &request.to)
        .map_err(|error| match error {
            TransferError::NotOwnable(_) => ApiError::BadRequest(error.to_string()),
            TransferError::NotOwner { .. } | TransferError::SameOwner { .. } => {
                ApiError::Conflict(error.to_string())
            }
        })?;
    let message = format!("transfer {field} from {from} to {}", request.to);
    let change = change(&server, &caller, Some(&message));
    let written_from = match plan.from {
        Some(spec) => Some(write_spec(&server, &from, spec, &change).await?),
        None => None,
    };
    let written_to = write_spec(&server, &request.to, plan.to, &change).await;
    super::invalidate(&server);
    Ok(Json(TransferResponse {
        from: written_from,
        to: written_to?,
    }))
}

/// Writes a controller's spec: an update of its object, or its creation.
async fn write_spec(
    server: &crate::Server,
    name: &str,
    spec: ControllerSpec,
    change: &corral_store::ChangeMeta,
) -> Result<Object, ApiError> {
    let value = serde_json::to_value(&spec).map_err(|e| ApiError::Internal(e.to_string()))?;
    let key = ObjectKey::new(Kind::Controller, None, name);
    match server.store.get(&key).await? {
        Some(current) => {
            let mut next = current.clone();
            next.spec = value;
            let expected = current.metadata.resource_version;
            Ok(crate::workflows::update(server, &current, next, expected, change).await?)
        }
        None => {
            let mut object = Object::new(Kind::Controller, None, name, value);
            object.metadata.uid = server.ids.uid();
            object.metadata.created_at = Some(server.clock.now());
            Ok(crate::workflows::create(server, object, change).await?)
        }
    }
}
