//! `GET …/secrets/{name}/reveal?revision=N&pod=NAME` and
//! `POST /v1/secrets/rotate-key`. Parsing only; the rules are in
//! [`crate::secrets`].

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use corral_api::kinds::RevealedSecret;

use super::Target;
use crate::SharedServer;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::query::Params;
use crate::secrets::{self, RotationReport};

pub async fn reveal(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
) -> Result<Json<RevealedSecret>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    let params = Params::parse(query.as_deref());
    let revision = params.number("revision")?;
    let pod = params.get("pod");
    Ok(Json(
        secrets::reveal(&server, &caller, &key, revision, pod).await?,
    ))
}

pub async fn rotate_key(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
) -> Result<Json<RotationReport>, ApiError> {
    Ok(Json(secrets::rotate(&server, &caller).await?))
}
