//! corral's API server.
//!
//! It owns the HTTP surface under `/v1` (objects of every kind, status,
//! history, diff, rollback, cluster-wide history queries, watch streams),
//! authentication of every caller by bearer token, admission (validation
//! now; ownership and policy in their own modules as they land), `/healthz`
//! and `/metrics`, and the web dashboard under `/ui/` ([`ui`]). It owns
//! no state of its own beyond caches: everything durable goes through
//! [`corral_store::Store`].
//!
//! [`app`] builds the router without a socket so tests drive it directly;
//! [`serve`] runs it on a listener until cancelled.
//!
//! [`control_plane`] assembles a whole control plane around it (the store
//! named by [`datastore`], TLS, the built-in controllers with their own
//! tokens and clients, the workflow driver, history compaction, leadership
//! on etcd): `corral up` and `corral server` only call it.

pub mod agent_tls;
pub mod auth;
pub mod cascade;
pub mod clock;
pub mod control_plane;
pub mod datastore;
pub mod deletion;
pub mod error;
mod handlers;
pub mod local_reads;
pub mod metrics;
pub mod openapi;
pub mod ownership;
mod query;
pub mod render;
pub mod retention;
pub mod routes;
pub mod scope;
pub mod secrets;
pub mod security;
pub mod tls;
pub mod ui;
pub mod watchcache;
pub mod workflows;

use std::sync::Arc;

use axum::Router;
use axum::middleware;
use corral_store::Store;
use tokio_util::sync::CancellationToken;

pub use auth::{TokenIssuer, hash_token};
pub use clock::{Clock, IdGenerator, RandomIds, SystemClock};
pub use error::ApiError;

/// Everything a request handler needs, shared by all of them.
pub struct Server {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub ids: Arc<dyn IdGenerator>,
    pub tokens: auth::TokenCache,
    pub metrics: metrics::Metrics,
    pub ownership: ownership::Ownership,
    /// The cluster CA's side of the agent channel: it signs node agents'
    /// certificates and this server's client certificate, and verifies
    /// agents when this server proxies `logs`, `exec` and the rest to
    /// them ([`agent_tls`]); unset, those calls fail with an explanation.
    /// Set once at start.
    pub agent_tls: std::sync::OnceLock<Arc<agent_tls::AgentTls>>,
    /// Cancelled when the server stops: open watch streams end then, so a
    /// graceful shutdown never waits on a watcher.
    pub stopping: CancellationToken,
    /// Every object in memory, fed by the store's watch: lists and watches
    /// are served from it.
    pub cache: Arc<watchcache::WatchCache>,
    /// Workflow definitions: stored ones by name, and the current ones.
    pub definitions: workflows::definitions::Definitions,
    /// The keys that seal Secrets' values.
    pub secrets: secrets::Secrets,
    /// The fencing period every lease renewal grants (seconds; set once at
    /// start, [`corral_api::fencing::DEFAULT_FENCE_AFTER_SECONDS`] unset):
    /// a node that cannot renew for that long stops its ha pods itself.
    pub fence_after_seconds: std::sync::OnceLock<u64>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").finish_non_exhaustive()
    }
}

pub type SharedServer = Arc<Server>;

impl Server {
    /// A server over `store` with the real clock and random ids.
    pub fn new(store: Arc<dyn Store>) -> SharedServer {
        Self::with(store, Arc::new(SystemClock), Arc::new(RandomIds))
    }

    /// A server with an injected clock and id generator (tests). Must be
    /// called within a tokio runtime: the watch cache starts loading.
    pub fn with(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        ids: Arc<dyn IdGenerator>,
    ) -> SharedServer {
        let stopping = CancellationToken::new();
        let cache = Arc::new(watchcache::WatchCache::default());
        cache.start(store.clone(), stopping.clone());
        let store: Arc<dyn Store> = Arc::new(watchcache::Tracked::new(store, cache.written()));
        Arc::new(Server {
            tokens: auth::TokenCache::new(store.clone()),
            store,
            clock,
            ids,
            metrics: metrics::Metrics::default(),
            stopping,
            ownership: ownership::Ownership::default(),
            agent_tls: std::sync::OnceLock::new(),
            cache,
            definitions: workflows::definitions::Definitions::default(),
            secrets: secrets::Secrets::default(),
            fence_after_seconds: std::sync::OnceLock::new(),
        })
    }

    /// A server on an in-memory SQLite store, with sequential ids (unit
    /// tests; the integration tests have their own in `tests/common`).
    #[cfg(test)]
    pub(crate) fn in_memory() -> SharedServer {
        let store = corral_store::sqlite::SqliteStore::open_in_memory().expect("in-memory store");
        Self::with(
            Arc::new(store),
            Arc::new(SystemClock),
            Arc::new(clock::SequentialIds::default()),
        )
    }
}

/// The whole HTTP API, built from [`routes::table`]: object routes exist
/// in two shapes, namespaced kinds under `/v1/namespaces/{namespace}/{plural}`,
/// cluster-wide kinds (and lists across all namespaces) under `/v1/{plural}`.
/// The dashboard ([`ui`]) is served beside it under `/ui/`, and a request
/// with the dashboard's session cookie is authenticated as its token.
pub fn app(server: SharedServer) -> Router {
    routes::router(routes::table())
        .merge(ui::router())
        .layer(middleware::from_fn(ui::session::cookie_to_bearer))
        .layer(middleware::from_fn(name_the_body_limit))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(
            server.clone(),
            metrics::record_request,
        ))
        .with_state(server)
}

/// The `/v1` API alone, for the dashboard's in-process calls (already
/// authenticated: they carry the session's bearer token).
pub(crate) fn api_router(server: SharedServer) -> Router {
    routes::router(routes::table())
        .layer(middleware::from_fn(name_the_body_limit))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(server)
}

/// The largest request body a route that reads it whole accepts (image
/// uploads stream and have no limit).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Turns axum's plain-text refusal of an oversized body into the API's
/// JSON error, naming the limit.
async fn name_the_body_limit(
    request: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    let response = next.run(request).await;
    let json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
    if response.status() != axum::http::StatusCode::PAYLOAD_TOO_LARGE || json {
        return response;
    }
    axum::response::IntoResponse::into_response(error::ApiError::TooLarge(format!(
        "the request body is over the limit of {MAX_BODY_BYTES} bytes (4 MiB)"
    )))
}

/// Serves the API over TLS on `listener` (plain HTTP is never spoken)
/// until `shutdown` is cancelled, then lets
/// in-flight requests finish.
pub async fn serve(
    listener: tls::TlsListener,
    server: SharedServer,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let stopping = server.stopping.clone();
    axum::serve(listener, app(server))
        .with_graceful_shutdown(async move {
            shutdown.cancelled().await;
            stopping.cancel();
        })
        .await
}

/// Checks that an identity or object name is a DNS label.
pub(crate) fn validate_name(field: &str, name: &str) -> Result<(), ApiError> {
    if corral_api::validate::is_dns_label(name) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "{field}: {name:?} is not a valid name: expected lowercase letters, digits and '-'"
        )))
    }
}
