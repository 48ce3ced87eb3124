//! Health, metrics, the OpenAPI document, `whoami` and token creation.

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use corral_api::{Identity, Role};
use serde::{Deserialize, Serialize};

use crate::SharedServer;
use crate::auth::{Caller, TokenIssuer};
use crate::error::ApiError;
use crate::validate_name;

pub async fn healthz(State(server): State<SharedServer>) -> Result<&'static str, ApiError> {
    server.store.current_revision().await?;
    Ok("ok\n")
}

pub async fn metrics(State(server): State<SharedServer>) -> Result<impl IntoResponse, ApiError> {
    let revision = server.store.current_revision().await?;
    let history = server.store.history_size().await?;
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        server.metrics.render(revision, history),
    ))
}

pub async fn openapi() -> Json<serde_json::Value> {
    Json(crate::openapi::document())
}

pub async fn whoami(Caller(caller): Caller) -> Json<Identity> {
    Json(caller)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    pub name: String,
    pub role: Role,
    /// For a user: the namespaces they may act in (`*`: every one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TokenResponse {
    pub token: String,
    pub identity: Identity,
}

/// `POST /v1/tokens {"name", "role"}`: operators mint tokens for people,
/// controllers and nodes. The token is shown once.
pub async fn create_token(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Json(request): Json<TokenRequest>,
) -> Result<Json<TokenResponse>, ApiError> {
    if caller.role != Role::Operator {
        return Err(ApiError::Forbidden(format!(
            "{} is a {:?}; only operators create tokens",
            caller.name, caller.role
        )));
    }
    validate_name("name", &request.name)?;
    match (request.role, request.namespaces.is_empty()) {
        (Role::User, true) => {
            return Err(ApiError::BadRequest(
                "namespaces: a user token names the namespaces its user may act in (`*` for every one)".into(),
            ));
        }
        (Role::User, false) => {
            for (index, namespace) in request.namespaces.iter().enumerate() {
                if namespace != "*" {
                    validate_name(&format!("namespaces[{index}]"), namespace)?;
                }
            }
        }
        (role, false) => {
            return Err(ApiError::BadRequest(format!(
                "namespaces: only user tokens are limited to namespaces, not {role:?} tokens"
            )));
        }
        (_, true) => {}
    }
    let identity = Identity::new(request.name, request.role).with_namespaces(request.namespaces);
    let token = TokenIssuer::issue(&*server.store, &*server.clock, identity.clone()).await?;
    Ok(Json(TokenResponse { token, identity }))
}
