//! History, diff and rollback of one object, and the cluster-wide
//! "what changed?" query.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use corral_api::{AuthorClass, HistoryQuery, Kind, Object, RevisionRecord};
use serde::Deserialize;

use super::{Target, change};
use crate::SharedServer;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::query::Params;
use crate::render::{RevisionDiff, diff_specs};

/// `GET …/history[?limit=N]`: every revision kept, or the newest `N`;
/// oldest first either way.
pub async fn object_history(
    State(server): State<SharedServer>,
    Caller(_caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
) -> Result<Json<Vec<RevisionRecord>>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    let records = match Params::parse(query.as_deref()).number("limit")? {
        None => server.store.history(&key).await?,
        Some(0) => {
            return Err(ApiError::BadRequest(
                "query parameter limit: must be at least 1 (leave it out for every revision)"
                    .into(),
            ));
        }
        Some(limit) => {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            server.store.recent_history(&key, limit).await?
        }
    };
    if records.is_empty() {
        return Err(ApiError::NotFound(format!("{key} has no history")));
    }
    Ok(Json(records))
}

pub async fn one_revision(
    State(server): State<SharedServer>,
    Caller(_caller): Caller,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Json<RevisionRecord>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    let revision = parse_revision(params.get("revision").map(String::as_str))?;
    Ok(Json(server.store.revision(&key, revision).await?))
}

fn parse_revision(text: Option<&str>) -> Result<u64, ApiError> {
    let text = text.unwrap_or_default();
    text.parse().map_err(|_| {
        ApiError::BadRequest(format!(
            "revision: expected a revision number, got {text:?}"
        ))
    })
}

/// `GET …/diff?from=A&to=B`; `to` defaults to the current revision.
pub async fn diff(
    State(server): State<SharedServer>,
    Caller(_caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
) -> Result<Json<RevisionDiff>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    let query = Params::parse(query.as_deref());
    let from = query
        .number("from")?
        .ok_or_else(|| ApiError::BadRequest("from: a revision number is required".into()))?;
    let to = match query.number("to")? {
        Some(to) => to,
        None => {
            server
                .store
                .get(&key)
                .await?
                .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))?
                .metadata
                .revision
        }
    };
    let old = server.store.revision(&key, from).await?;
    let new = server.store.revision(&key, to).await?;
    let null = serde_json::Value::Null;
    Ok(Json(diff_specs(
        from,
        old.spec.as_ref().unwrap_or(&null),
        to,
        new.spec.as_ref().unwrap_or(&null),
    )))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    pub to: u64,
    #[serde(default)]
    pub message: Option<String>,
}

/// `POST …/rollback {"to": N}`: a new revision whose spec is revision N's,
/// authored by the caller.
pub async fn rollback(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    Json(request): Json<RollbackRequest>,
) -> Result<Json<Object>, ApiError> {
    let key = Target::from_params(&params)?.key()?;
    // The node and the controllers write an object's status at any moment;
    // a rollback is a spec change, so a write that lost the race to a status
    // write is made again on the newer object. A newer *spec* is someone
    // else's change: refused, not overwritten.
    let target = server.store.revision(&key, request.to).await?;
    let mut revision_read = None;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current = server
            .store
            .get(&key)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))?;
        if let Some(read) = revision_read
            && read != current.metadata.revision
        {
            return Err(ApiError::Conflict(format!(
                "{key} changed meanwhile (revision {read} → {}); run the rollback again",
                current.metadata.revision
            )));
        }
        revision_read = Some(current.metadata.revision);
        let (next, message) = rolled_back(&server, &key, &current, &target, &request).await?;
        let change = change(&server, &caller, Some(&message));
        let expected = current.metadata.resource_version;
        match crate::ownership::update(&server, &caller, &current, next, expected, &change).await {
            Ok(updated) => return Ok(Json(updated)),
            Err(crate::workflows::WriteError::Store(corral_store::StoreError::Conflict {
                ..
            })) if attempt < super::objects::APPLY_ATTEMPTS => continue,
            Err(error) => return Err(error.into()),
        }
    }
}

/// `current` with the spec of `target` (the revision asked for), and the
/// history message saying so; refused when that changes nothing.
async fn rolled_back(
    server: &crate::Server,
    key: &corral_api::ObjectKey,
    current: &Object,
    target: &RevisionRecord,
    request: &RollbackRequest,
) -> Result<(Object, String), ApiError> {
    if target.uid != current.metadata.uid {
        return Err(ApiError::Conflict(format!(
            "revision {} belongs to an earlier {key} that was deleted",
            request.to
        )));
    }
    let spec = target.spec.clone().ok_or_else(|| {
        ApiError::Internal(format!("revision {} of {key} has no spec", request.to))
    })?;
    if spec == current.spec {
        return Err(ApiError::Conflict(format!(
            "{key} revision {} already has the spec of revision {}: nothing to roll back",
            current.metadata.revision, request.to
        )));
    }
    crate::secrets::check_restorable(server, key, &spec).await?;
    let (spec, kept) = keep_grown_disks(key.kind, &current.spec, spec);
    if spec == current.spec {
        return Err(ApiError::Conflict(format!(
            "{key} revision {} differs from revision {} only in disk sizes, which a rollback keeps (a disk only grows): nothing to roll back",
            current.metadata.revision, request.to
        )));
    }
    let mut message = match request.message.as_deref().filter(|m| !m.is_empty()) {
        Some(message) => format!("rollback to revision {}: {message}", request.to),
        None => format!("rollback to revision {}", request.to),
    };
    if !kept.is_empty() {
        message = format!("{message} (kept {}: a disk only grows)", kept.join(", "));
    }
    let mut next = current.clone();
    next.spec = spec;
    Ok((next, message))
}

/// A VM's rollback target with its disks at least as large as they are
/// now (a disk only grows); returns the spec and the fields raised.
fn keep_grown_disks(
    kind: corral_api::Kind,
    current: &serde_json::Value,
    target: serde_json::Value,
) -> (serde_json::Value, Vec<String>) {
    use corral_api::kinds::VirtualMachineSpec;
    if kind != corral_api::Kind::VirtualMachine {
        return (target, Vec::new());
    }
    let now = serde_json::from_value::<VirtualMachineSpec>(current.clone());
    let then = serde_json::from_value::<VirtualMachineSpec>(target.clone());
    let (Ok(now), Ok(mut then)) = (now, then) else {
        return (target, Vec::new());
    };
    let kept = corral_api::keep_grown_disks(&now, &mut then);
    if kept.is_empty() {
        return (target, Vec::new());
    }
    match serde_json::to_value(&then) {
        Ok(spec) => (spec, kept),
        Err(_) => (target, Vec::new()),
    }
}

/// `GET /v1/history?since=1h&author=a&excludeAuthor=b&class=external&kind=Pod&limit=N`.
pub async fn cluster_history(
    State(server): State<SharedServer>,
    Caller(_caller): Caller,
    RawQuery(query): RawQuery,
) -> Result<Json<Vec<RevisionRecord>>, ApiError> {
    let params = Params::parse(query.as_deref());
    let class = match params.get("class") {
        None | Some("") => None,
        Some("external") => Some(AuthorClass::External),
        Some("system") => Some(AuthorClass::System),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "class: expected external or system, got {other:?}"
            )));
        }
    };
    let kind = params
        .get("kind")
        .filter(|k| !k.is_empty())
        .map(|k| k.parse::<Kind>())
        .transpose()
        .map_err(|e| ApiError::BadRequest(format!("kind: {e}")))?;
    let query = HistoryQuery {
        since: params.since("since", server.clock.now())?,
        authors: params.all("author"),
        exclude_authors: params.all("excludeAuthor"),
        class,
        kind,
        limit: params
            .number("limit")?
            .map(|l| usize::try_from(l).unwrap_or(usize::MAX)),
    };
    Ok(Json(server.store.query_history(&query).await?))
}
