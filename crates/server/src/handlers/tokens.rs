//! `GET /v1/tokens` and `DELETE /v1/tokens/{token}`: what tokens exist
//! (never a token, nor its hash) and revoking them, operators only. Also
//! the revocation of a node's tokens when it is forgotten or its name is
//! taken over.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, State};
use corral_api::identity::{Revoked, TokenInfo};
use corral_api::{Identity, Role};
use corral_store::TokenRecord;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::{Server, SharedServer};

/// Hex digits of a token's hash that name it (`corral token revoke ID`).
pub const ID_LEN: usize = 12;
/// The fewest hex digits an id given to `revoke` may have.
const MIN_ID_LEN: usize = 8;

/// A token as listed: who it authenticates and when, never the token.
fn info(record: &TokenRecord) -> TokenInfo {
    TokenInfo {
        id: record.hash.chars().take(ID_LEN).collect(),
        identity: record.identity.clone(),
        created_at: record.created_at,
        last_used_at: record.last_used_at,
    }
}

fn operators_only(caller: &Identity, what: &str) -> Result<(), ApiError> {
    if caller.role == Role::Operator {
        return Ok(());
    }
    Err(ApiError::Forbidden(format!(
        "{} is a {:?}; only operators {what}",
        caller.name, caller.role
    )))
}

pub async fn list(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
) -> Result<Json<Vec<TokenInfo>>, ApiError> {
    operators_only(&caller, "list tokens")?;
    let tokens = server.store.list_tokens().await?;
    Ok(Json(tokens.iter().map(info).collect()))
}

/// `DELETE /v1/tokens/{token}`: `token` is an id (8 or more leading hex
/// digits of the hash) or a name (every token of that identity). The
/// built-in controllers' tokens are the server's own and are refused.
pub async fn revoke(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Json<Revoked>, ApiError> {
    operators_only(&caller, "revoke tokens")?;
    let given = params.get("token").cloned().unwrap_or_default();
    let tokens = server.store.list_tokens().await?;
    let by_id = given.len() >= MIN_ID_LEN && given.bytes().all(|b| b.is_ascii_hexdigit());
    let chosen: Vec<&TokenRecord> = tokens
        .iter()
        .filter(|t| {
            if by_id {
                t.hash.starts_with(&given.to_ascii_lowercase())
            } else {
                t.identity.name == given
            }
        })
        .collect();
    if chosen.is_empty() {
        return Err(ApiError::NotFound(format!(
            "no token {} {given} (corral token list shows them)",
            if by_id { "with id" } else { "named" }
        )));
    }
    if by_id && chosen.len() > 1 {
        return Err(ApiError::Conflict(format!(
            "id {given} names {} tokens: give more of it",
            chosen.len()
        )));
    }
    let builtins: Vec<String> = corral_ownership::builtin_controllers()
        .into_iter()
        .map(|r| r.name)
        .collect();
    if let Some(builtin) = chosen
        .iter()
        .find(|t| t.identity.role == Role::Controller && builtins.contains(&t.identity.name))
    {
        return Err(ApiError::Forbidden(format!(
            "{} is a built-in controller: its token is the server's own (a server restart replaces a lost one)",
            builtin.identity.name
        )));
    }
    let revoked: Vec<TokenRecord> = chosen.into_iter().cloned().collect();
    remove(&server, &revoked).await?;
    tracing::info!(by = %caller.name, count = revoked.len(), %given, "tokens revoked");
    Ok(Json(Revoked {
        revoked: revoked.iter().map(info).collect(),
    }))
}

async fn remove(server: &Server, tokens: &[TokenRecord]) -> Result<(), ApiError> {
    let hashes: Vec<String> = tokens.iter().map(|t| t.hash.clone()).collect();
    server.store.delete_tokens(&hashes).await?;
    server.tokens.forget(&hashes);
    Ok(())
}

/// Revokes every token of node `node`: it was forgotten, or a new machine
/// joins under its name. Returns how many there were.
pub async fn revoke_node(server: &Server, node: &str) -> Result<usize, ApiError> {
    let tokens: Vec<TokenRecord> = server
        .store
        .list_tokens()
        .await?
        .into_iter()
        .filter(|t| t.identity.role == Role::Node && t.identity.name == node)
        .collect();
    remove(server, &tokens).await?;
    if !tokens.is_empty() {
        tracing::info!(%node, count = tokens.len(), "node tokens revoked");
    }
    Ok(tokens.len())
}
