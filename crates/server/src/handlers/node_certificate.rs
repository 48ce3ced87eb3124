//! `POST /v1/nodes/{name}/certificate {"csr": PEM}`: the cluster CA signs
//! node `name`'s agent serving certificate (see [`crate::agent_tls`]).
//! Only the node itself may ask, with its own token: a certificate names
//! the node the token belongs to, so no node can get one for another. The
//! agent asks once it has joined and again before the certificate expires.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, State};
use bytes::Bytes;
use corral_api::Role;
use corral_api::kinds::{NodeCertificate, NodeCertificateRequest};

use crate::SharedServer;
use crate::auth::Caller;
use crate::error::{ApiError, error_chain};

pub async fn issue(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    body: Bytes,
) -> Result<Json<NodeCertificate>, ApiError> {
    let node = params.get("name").cloned().unwrap_or_default();
    if caller.role != Role::Node || caller.name != node {
        return Err(ApiError::Forbidden(format!(
            "only node {node} itself (with its own node token) gets node {node}'s certificate; {} is a {:?} identity",
            caller.name, caller.role
        )));
    }
    let request: NodeCertificateRequest = serde_json::from_slice(&body)
        .map_err(|error| ApiError::BadRequest(format!("request body: {error}")))?;
    let tls = server.agent_tls.get().ok_or_else(|| {
        ApiError::Unavailable("this API server has no cluster CA to sign with".into())
    })?;
    let now = server.clock.now();
    let certificate = tls
        .sign_node(&node, &request.csr, now)
        .map_err(|error| match error {
            crate::agent_tls::AgentTlsError::Csr(_) => ApiError::BadRequest(error_chain(&error)),
            other => ApiError::Internal(error_chain(&other)),
        })?;
    tracing::info!(node = %node, not_after = %certificate.not_after, "issued the node's agent certificate");
    Ok(Json(certificate))
}
