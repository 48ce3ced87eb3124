//! Signing in to the dashboard: the browser posts a corral token once and
//! gets it back as an `HttpOnly; Secure; SameSite=Strict` cookie, never in
//! a URL. [`cookie_to_bearer`] turns that cookie into the same
//! `Authorization: Bearer` header the CLI sends, so every request — the
//! dashboard's own routes and the `/v1` API the page calls — is
//! authenticated and scoped by [`crate::auth`] and [`crate::scope`] with
//! the token's own rights.
//!
//! Writes made with the cookie must carry the session's CSRF token in the
//! [`CSRF_HEADER`] header; a page from another site can neither read it
//! nor set the header. The CSRF token is derived from the session token
//! (a SHA-256 with a fixed label), so it needs no server-side state and
//! works on every API server of a cluster; knowing it does not reveal the
//! session token.

use axum::extract::{Form, FromRequestParts, Request, State};
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, LOCATION, ORIGIN, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::SharedServer;
use crate::auth::Caller;
use crate::error::ApiError;

/// The cookie that holds the session's token.
pub const COOKIE_NAME: &str = "corral_session";

/// The header a cookie-authenticated write must carry.
pub const CSRF_HEADER: &str = "x-corral-csrf";

/// The CSRF token of the session whose token is `token`.
pub fn csrf_token(token: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"corral-dashboard-csrf\0");
    hasher.update(token.as_bytes());
    hex::encode(hasher.finalize())
}

/// The session token the request's cookie carries, if any.
pub fn session_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.to_string())
        .filter(|value| !value.is_empty())
}

/// Whether the request's `Origin`, when it sends one, is this server.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(ORIGIN).and_then(|o| o.to_str().ok()) else {
        return true;
    };
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    origin
        .strip_prefix("https://")
        .is_some_and(|rest| !host.is_empty() && rest == host)
}

/// Middleware: a request with the session cookie and no `Authorization`
/// header is authenticated as the cookie's token; a write so made must
/// come from this origin and carry the CSRF token, or it is refused.
pub async fn cookie_to_bearer(mut request: Request, next: Next) -> Response {
    // Signing in again (over a stale cookie) uses the posted token, not
    // the cookie, and checks its origin itself.
    if request.headers().contains_key(AUTHORIZATION) || request.uri().path() == "/ui/login" {
        return next.run(request).await;
    }
    let Some(token) = session_token(request.headers()) else {
        return next.run(request).await;
    };
    let reading = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if !reading {
        let sent = request
            .headers()
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !same_origin(request.headers()) {
            return ApiError::Forbidden(
                "origin: a write with the dashboard's cookie must come from the dashboard".into(),
            )
            .into_response();
        }
        if sent.is_empty() || sent != csrf_token(&token) {
            return ApiError::Forbidden(format!(
                "{CSRF_HEADER}: a write with the dashboard's cookie needs the session's CSRF token"
            ))
            .into_response();
        }
    }
    match HeaderValue::from_str(&format!("Bearer {token}")) {
        Ok(value) => {
            request.headers_mut().insert(AUTHORIZATION, value);
            next.run(request).await
        }
        Err(_) => {
            ApiError::Unauthenticated("the session cookie is not a token".into()).into_response()
        }
    }
}

/// A signed-in person on a dashboard page: the caller, the token (to
/// derive the CSRF token) — or a redirect to the sign-in page.
#[derive(Debug, Clone)]
pub struct Session {
    pub caller: corral_api::Identity,
    pub csrf: String,
}

impl FromRequestParts<SharedServer> for Session {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        server: &SharedServer,
    ) -> Result<Self, Self::Rejection> {
        let Some(token) = session_token(&parts.headers) else {
            return Err(to_sign_in(None));
        };
        match Caller::from_request_parts(parts, server).await {
            Ok(Caller(caller))
                if !matches!(
                    caller.role,
                    corral_api::Role::Operator | corral_api::Role::User
                ) =>
            {
                Err((
                    StatusCode::FORBIDDEN,
                    format!(
                        "the dashboard is for people (operators and users); {} is a {:?} identity",
                        caller.name, caller.role
                    ),
                )
                    .into_response())
            }
            Ok(Caller(caller)) => Ok(Session {
                caller,
                csrf: csrf_token(&token),
            }),
            Err(ApiError::Forbidden(message)) => {
                Err((StatusCode::FORBIDDEN, message).into_response())
            }
            Err(error) => Err(to_sign_in(Some(&error.to_string()))),
        }
    }
}

/// A redirect to the sign-in page; the reason is shown there.
fn to_sign_in(reason: Option<&str>) -> Response {
    let location = match reason {
        Some(_) => "/ui/login?expired=1",
        None => "/ui/login",
    };
    redirect(location, None)
}

fn redirect(location: &str, cookie: Option<String>) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(LOCATION, value);
    }
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert(SET_COOKIE, cookie);
    }
    response
}

#[derive(Debug, Deserialize)]
pub struct SignIn {
    token: String,
}

/// `POST /ui/login` (form `token=…`): checks the token and sets the
/// session cookie; a wrong token shows the form again with the reason.
pub async fn sign_in(
    State(server): State<SharedServer>,
    headers: HeaderMap,
    Form(form): Form<SignIn>,
) -> Response {
    if !same_origin(&headers) {
        return (
            StatusCode::FORBIDDEN,
            "origin: sign in from the dashboard's own page",
        )
            .into_response();
    }
    let token = form.token.trim();
    let valid = token
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let identity = if valid && !token.is_empty() {
        server
            .tokens
            .resolve(token, server.clock.now())
            .await
            .ok()
            .flatten()
    } else {
        None
    };
    match identity {
        Some(identity) if identity.expires_at.is_none_or(|at| at > server.clock.now()) => {
            let cookie =
                format!("{COOKIE_NAME}={token}; Path=/; HttpOnly; Secure; SameSite=Strict");
            redirect("/ui/", Some(cookie))
        }
        _ => super::pages::sign_in_page(Some("unknown, revoked or expired token")),
    }
}

/// `POST /ui/logout`: clears the cookie (a write: the CSRF check applies).
pub async fn sign_out(_session: Session) -> Response {
    let cookie = format!("{COOKIE_NAME}=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0");
    redirect("/ui/login", Some(cookie))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            COOKIE,
            HeaderValue::from_static("a=1; corral_session=corral_ab; b=2"),
        );
        assert_eq!(session_token(&headers).as_deref(), Some("corral_ab"));
        headers.insert(COOKIE, HeaderValue::from_static("corral_session="));
        assert_eq!(session_token(&headers), None);
    }

    #[test]
    fn csrf_tokens_differ_per_session_and_hide_the_token() {
        let one = csrf_token("corral_1");
        assert_eq!(one, csrf_token("corral_1"));
        assert_ne!(one, csrf_token("corral_2"));
        assert!(!one.contains("corral_1"));
    }

    #[test]
    fn a_foreign_origin_is_not_this_server() {
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("127.0.0.1:7000"));
        assert!(same_origin(&headers));
        headers.insert(ORIGIN, HeaderValue::from_static("https://127.0.0.1:7000"));
        assert!(same_origin(&headers));
        headers.insert(ORIGIN, HeaderValue::from_static("https://evil.example"));
        assert!(!same_origin(&headers));
    }
}
