//! Health, metrics, the OpenAPI document, `whoami`, token creation and
//! nodes joining with a join token (token listing and revocation are in
//! [`super::tokens`]).

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use bytes::Bytes;
use corral_api::kinds::{NodePhase, NodeStatus};
use corral_api::{Identity, Kind, Object, ObjectKey, Role};
use corral_store::StoreError;
use serde::{Deserialize, Serialize};

use crate::SharedServer;
use crate::auth::{Caller, TokenIssuer};
use crate::error::ApiError;
use crate::ownership;
use crate::validate_name;
use crate::workflows::WriteError;

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

/// A JSON request body, once the caller is known to be allowed.
fn parse_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|error| ApiError::BadRequest(format!("request body: {error}")))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    pub name: String,
    pub role: Role,
    /// For a user: the namespaces they may act in (`*`: every one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// The token stops working after this many seconds (default for join
    /// tokens: a day; never for the others).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "ttlSeconds")]
    pub ttl_seconds: Option<u64>,
    /// For a user: may read Secrets' values in their namespaces.
    #[serde(
        default,
        rename = "readSecrets",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub read_secrets: bool,
}

/// How long a join token works unless the request says otherwise.
pub const JOIN_TOKEN_TTL_SECONDS: u64 = 24 * 3600;

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
    body: Bytes,
) -> Result<Json<TokenResponse>, ApiError> {
    // Who may ask is decided before what they asked is read.
    if caller.role != Role::Operator {
        return Err(ApiError::Forbidden(format!(
            "{} is a {:?}; only operators create tokens",
            caller.name, caller.role
        )));
    }
    let request: TokenRequest = parse_body(&body)?;
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
    if request.read_secrets && request.role != Role::User {
        return Err(ApiError::BadRequest(format!(
            "readSecrets: a right of user tokens; {:?} tokens read Secrets by their role's rule (operators always, controllers by a read declaration, nodes for their pods)",
            request.role
        )));
    }
    let mut identity = Identity::new(request.name, request.role)
        .with_namespaces(request.namespaces)
        .reading_secrets(request.read_secrets);
    let ttl = match (request.role, request.ttl_seconds) {
        (_, Some(0)) => {
            return Err(ApiError::BadRequest(
                "ttlSeconds: must be at least 1".into(),
            ));
        }
        (_, Some(seconds)) => Some(seconds),
        (Role::Joiner, None) => Some(JOIN_TOKEN_TTL_SECONDS),
        (_, None) => None,
    };
    if let Some(seconds) = ttl {
        let seconds = i64::try_from(seconds)
            .ok()
            .and_then(chrono::TimeDelta::try_seconds)
            .ok_or_else(|| ApiError::BadRequest("ttlSeconds: too large".into()))?;
        identity = identity.expiring(server.clock.now() + seconds);
    }
    let token = TokenIssuer::issue(&*server.store, &*server.clock, identity.clone()).await?;
    Ok(Json(TokenResponse { token, identity }))
}

/// `POST /v1/join {"node": NAME}` with a join token: mints the node's own
/// token (shown once), which the agent keeps and uses from then on. A name
/// whose Node is alive is refused: a join token cannot take over a node.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    pub node: String,
}

pub async fn join(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    body: Bytes,
) -> Result<Json<TokenResponse>, ApiError> {
    if caller.role != Role::Joiner {
        return Err(ApiError::Forbidden(format!(
            "{} is a {:?}; only a join token joins a node (corral token create --join)",
            caller.name, caller.role
        )));
    }
    let request: JoinRequest = parse_body(&body)?;
    validate_name("node", &request.node)?;
    let taken = |phase: String| {
        ApiError::Conflict(format!(
            "node {} has already joined ({phase}); a join token cannot take over a node: pick another name, or `corral node forget {}` first",
            request.node, request.node
        ))
    };
    let key = ObjectKey::new(Kind::Node, None, &request.node);
    let identity = Identity::new(request.node.clone(), Role::Node);
    match server.store.get(&key).await? {
        Some(node) => {
            let phase = node.typed_status::<NodeStatus>().unwrap_or_default().phase;
            if phase != NodePhase::Lost {
                return Err(taken(format!("phase {phase:?}")));
            }
        }
        None => {
            // Claim the name now, atomically: a second join of the same
            // name, even before the agent first reports, finds it taken.
            let node = Object::new(Kind::Node, None, &request.node, serde_json::json!({}));
            let message = format!("joined with join token {}", caller.name);
            let change = super::change(&server, &identity, Some(&message));
            let node = super::objects::fresh(&server, node);
            match ownership::create(&server, &identity, node, &change).await {
                Ok(_) => {}
                Err(WriteError::Store(StoreError::AlreadyExists { .. })) => {
                    return Err(taken("just now".to_string()));
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
    // A machine taking over a lost node's name: the old machine's tokens
    // stop working now.
    super::tokens::revoke_node(&server, &request.node).await?;
    let token = TokenIssuer::issue(&*server.store, &*server.clock, identity.clone()).await?;
    tracing::info!(node = %identity.name, joiner = %caller.name, "a node joined with a join token");
    Ok(Json(TokenResponse { token, identity }))
}
