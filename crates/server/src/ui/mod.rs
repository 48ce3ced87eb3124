//! The web dashboard, served by the API server itself under `/ui/` (same
//! port, same TLS). Pages are rendered here ([`pages`], [`parts`]) and
//! kept live by one small hand-written JavaScript module
//! (`assets/app.js`, embedded with `include_str!`: no build step, nothing
//! fetched at run time). The browser signs in with a corral token, kept in
//! an HttpOnly cookie ([`session`]) that stands for the same identity as
//! the CLI's bearer token, so every read and write is scoped and checked
//! as the CLI's would be. The page calls the `/v1` API for writes
//! (rollback) with a CSRF header.
//!
//! It must not hold state of its own, nor reach anything the API does not.

pub mod apply;
pub mod console;
pub mod overview;
pub mod pages;
pub mod parts;
pub mod session;

use axum::Router;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use crate::SharedServer;

/// The Content-Security-Policy of every dashboard response: scripts,
/// styles and connections only from this server, no inline script or
/// style, no framing.
pub const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
    base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The dashboard's routes (the `/v1` API is not among them).
pub fn router() -> Router<SharedServer> {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(pages::overview))
        .route("/ui/login", get(pages::sign_in_form).post(session::sign_in))
        .route("/ui/logout", post(session::sign_out))
        .route("/ui/live", get(overview::live))
        .route("/ui/objects/{plural}/{name}", get(pages::object))
        .route("/ui/part/{part}/{plural}/{name}", get(parts::part))
        .route("/ui/apply", get(pages::apply).post(apply::apply))
        .route("/ui/console/{name}", get(console::console))
        .route(
            "/ui/assets/app.js",
            get(|| asset(APP_JS, "text/javascript")),
        )
        .route("/ui/assets/app.css", get(|| asset(APP_CSS, "text/css")))
        .layer(middleware::from_fn(headers))
}

async fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [(CONTENT_TYPE, content_type), (CACHE_CONTROL, "no-cache")],
        body,
    )
        .into_response()
}

/// Adds the security headers to every dashboard response.
async fn headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    if !headers.contains_key(CACHE_CONTROL) {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
