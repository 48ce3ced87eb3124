//! Registration of the built-in controllers at start. No back door: each
//! one authenticates with its own controller token and applies its
//! `Controller` object through the same handler, admission and ownership
//! checks as any request.

use std::collections::{BTreeMap, HashMap};

use axum::extract::{Path, RawQuery, State};
use bytes::Bytes;
use corral_api::kinds::ControllerSpec;
use corral_api::{Identity, Kind, Object, ObjectKey, Role};
use corral_ownership::{RegistrationError, builtin_controllers};

use crate::SharedServer;
use crate::auth::{Caller, TokenIssuer};
use crate::error::ApiError;
use crate::handlers::objects;

/// Built-in controller name → its bearer token.
pub type BuiltinTokens = BTreeMap<String, String>;

/// Registers every built-in controller and returns their tokens: the
/// `known` ones that still authenticate as that controller, new ones for
/// the rest. A field an operator handed to another controller stays
/// handed over: it is left out of the built-in's registration.
pub async fn register_builtins(
    server: &SharedServer,
    known: &BuiltinTokens,
) -> Result<BuiltinTokens, ApiError> {
    let mut tokens = BuiltinTokens::new();
    for builtin in builtin_controllers() {
        let identity = Identity::new(builtin.name.clone(), Role::Controller);
        let token = match known.get(&builtin.name) {
            Some(token)
                if server
                    .tokens
                    .resolve(token, server.clock.now())
                    .await?
                    .as_ref()
                    == Some(&identity) =>
            {
                token.clone()
            }
            _ => TokenIssuer::issue(&*server.store, &*server.clock, identity).await?,
        };
        let caller = server
            .tokens
            .resolve(&token, server.clock.now())
            .await?
            .ok_or_else(|| {
                ApiError::Internal(format!("the token of {} does not resolve", builtin.name))
            })?;
        let spec = keep_handed_over(server, &builtin.name, builtin.spec).await?;
        register(server, caller, &builtin.name, spec).await?;
        tokens.insert(builtin.name, token);
    }
    Ok(tokens)
}

/// The built-in spec without the fields another controller owns now.
async fn keep_handed_over(
    server: &SharedServer,
    name: &str,
    mut spec: ControllerSpec,
) -> Result<ControllerSpec, ApiError> {
    let registry = super::registry(server).await?;
    let mut kept = Vec::new();
    for owned in spec.owns {
        let alone = ControllerSpec {
            owns: vec![owned.clone()],
            ..ControllerSpec::default()
        };
        match registry.check_registration(name, &alone) {
            Err(error @ RegistrationError::AlreadyOwned { .. }) => {
                tracing::warn!(controller = name, %error, "built-in field left to its new owner");
            }
            _ => kept.push(owned),
        }
    }
    spec.owns = kept;
    Ok(spec)
}

/// Applies the controller's registration as the controller itself, through
/// the `PUT /v1/controllers/{name}` handler; unchanged registrations are
/// left alone.
async fn register(
    server: &SharedServer,
    caller: Identity,
    name: &str,
    spec: ControllerSpec,
) -> Result<(), ApiError> {
    let value = serde_json::to_value(&spec).map_err(|e| ApiError::Internal(e.to_string()))?;
    let key = ObjectKey::new(Kind::Controller, None, name);
    if let Some(current) = server.store.get(&key).await?
        && current.spec == value
    {
        return Ok(());
    }
    let object = Object::new(Kind::Controller, None, name, value);
    let body = serde_json::to_vec(&object).map_err(|e| ApiError::Internal(e.to_string()))?;
    let params = HashMap::from([
        ("plural".to_string(), Kind::Controller.plural().to_string()),
        ("name".to_string(), name.to_string()),
    ]);
    let _registered = objects::apply(
        State(server.clone()),
        Caller(caller),
        Path(params),
        RawQuery(Some("message=built-in+controller+registration".into())),
        Bytes::from(body),
    )
    .await?;
    tracing::info!(controller = name, "built-in controller registered");
    Ok(())
}
