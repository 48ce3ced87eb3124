//! Applying a pasted manifest from the browser: parsed with the CLI's
//! parser ([`corral_api::parse_manifests`]), then each object put through
//! the API itself (`PUT /v1/…`, in process, with the session's own token),
//! so admission, scoping and the field-path errors are exactly the CLI's.

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use corral_api::{Object, parse_manifests};
use serde::Deserialize;
use tower::ServiceExt;

use super::session::Session;
use crate::SharedServer;
use crate::error::ErrorBody;

#[derive(Debug, Deserialize)]
pub struct ApplyQuery {
    namespace: Option<String>,
    message: Option<String>,
}

/// `POST /ui/apply?namespace=NS&message=…` with the manifest as the body:
/// a line per object as `corral apply` prints, or the first error (with
/// its field paths) and status 422 / the API's status.
pub async fn apply(
    State(server): State<SharedServer>,
    session: Session,
    Query(query): Query<ApplyQuery>,
    request: Request,
) -> Response {
    let authorization = request.headers().get(AUTHORIZATION).cloned();
    let Ok(body) = axum::body::to_bytes(request.into_body(), crate::MAX_BODY_BYTES).await else {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the manifest is over 4 MiB".into(),
        );
    };
    let manifest = String::from_utf8_lossy(&body);
    let mut objects = match parse_manifests(&manifest) {
        Ok(objects) => objects,
        Err(error) => {
            return text(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("the manifest is not valid: {error}"),
            );
        }
    };
    let namespace = query
        .namespace
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| super::pages::default_namespace(&session.caller));
    let mut lines = Vec::new();
    for object in &mut objects {
        if object.kind.is_namespaced() && object.metadata.namespace.is_none() {
            object.metadata.namespace = Some(namespace.clone());
        }
        match put(
            &server,
            authorization.clone(),
            object,
            query.message.as_deref(),
        )
        .await
        {
            Ok(line) => lines.push(line),
            Err((status, error)) => {
                lines.push(format!("{} was not applied: {error}", object.key()));
                return text(status, lines.join("\n"));
            }
        }
    }
    text(StatusCode::OK, lines.join("\n"))
}

/// Puts one object through the API; the line `apply` prints, or the error.
async fn put(
    server: &SharedServer,
    authorization: Option<axum::http::HeaderValue>,
    object: &Object,
    message: Option<&str>,
) -> Result<String, (StatusCode, String)> {
    let key = object.key();
    let path = if key.kind.is_namespaced() {
        format!(
            "/v1/namespaces/{}/{}/{}",
            key.namespace,
            key.kind.plural(),
            key.name
        )
    } else {
        format!("/v1/{}/{}", key.kind.plural(), key.name)
    };
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("message", message.unwrap_or_default())
        .finish();
    let internal = |e: String| (StatusCode::INTERNAL_SERVER_ERROR, e);
    let before = call(server, &authorization, Method::GET, &path, Bytes::new())
        .await
        .map_err(internal)?;
    let existed = match before.0 {
        StatusCode::OK => serde_json::from_slice::<Object>(&before.1)
            .ok()
            .map(|o| o.metadata.revision),
        _ => None,
    };
    let body = serde_json::to_vec(object).map_err(|e| internal(e.to_string()))?;
    let (status, answer) = call(
        server,
        &authorization,
        Method::PUT,
        &format!("{path}?{query}"),
        body.into(),
    )
    .await
    .map_err(internal)?;
    if !status.is_success() {
        let message = serde_json::from_slice::<ErrorBody>(&answer)
            .map(|e| e.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&answer).into_owned());
        return Err((status, message));
    }
    let stored: Object = serde_json::from_slice(&answer).map_err(|e| internal(e.to_string()))?;
    let revision = stored.metadata.revision;
    Ok(match existed {
        None => format!("{key} created (revision {revision})"),
        Some(before) if before == revision => format!("{key} unchanged (revision {revision})"),
        Some(_) => format!("{key} configured (revision {revision})"),
    })
}

/// One request to the API in process, as the session's token.
async fn call(
    server: &SharedServer,
    authorization: &Option<axum::http::HeaderValue>,
    method: Method,
    uri: &str,
    body: Bytes,
) -> Result<(StatusCode, Bytes), String> {
    let mut request = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header(CONTENT_TYPE, "application/json");
    if let Some(value) = authorization {
        request = request.header(AUTHORIZATION, value.clone());
    }
    let request = request.body(Body::from(body)).map_err(|e| e.to_string())?;
    let response = crate::api_router(server.clone())
        .oneshot(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, body))
}

fn text(status: StatusCode, text: String) -> Response {
    (status, [(CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}
