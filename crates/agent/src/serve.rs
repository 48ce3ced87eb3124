//! The agent's endpoint for container I/O: the API server proxies
//! `corral logs` and `corral exec` here. Only the API server calls it: the
//! endpoint speaks TLS only, with the certificate the cluster CA issued to
//! this node, and refuses at the handshake every client without an API
//! server's client certificate ([`crate::node_tls`]). No secret is shared.
//!
//! - `GET /v1/pods/{namespace}/{name}/logs?container=C&follow=BOOL&tail=N`
//!   answers the container's log file as a byte stream (`text/plain`):
//!   everything, or its last `N` lines; with `follow`, then every byte
//!   appended, across rotations, until the client goes away or the agent
//!   stops.
//! - `POST /v1/pods/{namespace}/{name}/exec?container=C&tty=BOOL&cmd=ARG…`
//!   with `Connection: Upgrade` and `Upgrade: corral-exec` starts `runc
//!   exec` (the pod's runtime) in the container, answers `101 Switching
//!   Protocols`, and the connection then carries the frames of
//!   [`corral_client::exec_protocol`]: stdin one way; stdout, stderr and
//!   finally the exit code the other. A client that goes away ends the
//!   command (SIGTERM, SIGKILL after [`crate::exec::KILL_GRACE`]). With `tty=true`
//!   (`cols=`/`rows=` size it, default 80x24) runc gets the slave side of
//!   a raw pseudo-terminal as its stdin, which it needs as its console; the
//!   client's stdin goes to the master side, and the container terminal's
//!   output arrives on runc's stdout.
//!
//! - `GET /v1/vms/{namespace}/{name}/logs?follow=BOOL&tail=N` answers a
//!   VM's console log the same way, and `POST /v1/vms/{namespace}/{name}/console`
//!   attaches to its serial console over the same upgrade and frames
//!   ([`crate::vms::io`]).
//!
//! - `POST /v1/images/prune` collects unused images now (see
//!   [`crate::images`]) and answers what it removed.
//!
//! - `GET /v1/images` lists the node's images and `POST
//!   /v1/images/import?name=REF` imports the archive in the body (see
//!   [`crate::image_upload`]).
//!
//! Errors before the upgrade are JSON `{"code", "message"}` bodies, the
//! API's error shape, so the API server can pass them on unchanged.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::header::{CONNECTION, CONTENT_TYPE, UPGRADE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use corral_api::kinds::PodSpec;
use corral_api::{Kind, ObjectKey};
use corral_client::exec_protocol::UPGRADE_PROTOCOL;
use corral_runtime::oci::{ExecSpec, reap};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::AgentContext;
use crate::containers::log_path;
use crate::exec::{Input, open_terminal, run_session, terminate};
use crate::logs::LogReader;
use crate::node_tls::NodeTls;
use crate::state::PodRecord;
use crate::tls_listener::TlsListener;

/// Where the endpoint listens and the node's TLS identity it serves with.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// `127.0.0.1:0` picks a free loopback port.
    pub listen: String,
    pub tls: Arc<NodeTls>,
}

/// What the handlers share.
pub(crate) struct Endpoint {
    pub(crate) ctx: Arc<AgentContext>,
    pub(crate) shutdown: CancellationToken,
}

pub(crate) type Shared = Arc<Endpoint>;

/// Why a request failed; each variant is one HTTP status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EndpointError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Internal(String),
}

impl IntoResponse for EndpointError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            EndpointError::BadRequest(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            EndpointError::NotFound(_) => (StatusCode::NOT_FOUND, "NotFound"),
            EndpointError::Conflict(_) => (StatusCode::CONFLICT, "Conflict"),
            EndpointError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "Internal"),
        };
        let body = serde_json::json!({"code": code, "message": self.to_string()});
        (status, axum::Json(body)).into_response()
    }
}

/// The endpoint's routes (tests call it without a socket; callers are
/// authenticated by the TLS listener of [`start`]).
pub fn app(ctx: Arc<AgentContext>, shutdown: CancellationToken) -> Router {
    let endpoint = Arc::new(Endpoint { ctx, shutdown });
    Router::new()
        .route("/v1/pods/{namespace}/{name}/logs", get(logs))
        .route("/v1/pods/{namespace}/{name}/exec", post(exec))
        .route(
            "/v1/pods/{namespace}/{name}/portforward",
            post(crate::port_forward::port_forward),
        )
        .route("/v1/vms/{namespace}/{name}/logs", get(crate::vms::io::logs))
        .route(
            "/v1/vms/{namespace}/{name}/console",
            post(crate::vms::io::console),
        )
        .route("/v1/images", get(crate::image_upload::list))
        .route("/v1/images/import", post(crate::image_upload::import))
        .route("/v1/images/prune", post(crate::images::prune))
        .with_state(endpoint)
}

/// Binds the endpoint and serves it over TLS in the background until
/// `shutdown`, keeping the node's certificate renewed through the agent's
/// client; returns the URL to advertise (`address` replaces an
/// unspecified listen IP such as `0.0.0.0`).
pub async fn start(
    config: &EndpointConfig,
    address: Option<&str>,
    ctx: Arc<AgentContext>,
    shutdown: CancellationToken,
) -> std::io::Result<String> {
    let tcp = TcpListener::bind(&config.listen).await?;
    let url = advertised_url(tcp.local_addr()?, address);
    let tls = config.tls.server_config().map_err(std::io::Error::other)?;
    let listener = TlsListener::new(tcp, tls);
    match ctx.client.clone() {
        Some(client) => {
            tokio::spawn(
                config
                    .tls
                    .clone()
                    .keep_renewed(Arc::new(client), shutdown.clone()),
            );
        }
        None => tracing::warn!("no API client: the agent channel's certificate is not renewed"),
    }
    let router = app(ctx, shutdown.clone());
    tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "the agent's logs and exec endpoint failed");
        }
    });
    Ok(url)
}

/// `https://IP:PORT` of the listener, with `address` for an unspecified IP.
pub fn advertised_url(local: SocketAddr, address: Option<&str>) -> String {
    match address {
        Some(address) if local.ip().is_unspecified() => {
            if address.contains(':') && !address.starts_with('[') {
                format!("https://[{address}]:{}", local.port())
            } else {
                format!("https://{address}:{}", local.port())
            }
        }
        _ => format!("https://{local}"),
    }
}

/// Query parameters, repeated ones in order.
/// Refuses a request for `what` that does not ask to upgrade to the exec
/// protocol.
pub(crate) fn require_upgrade(headers: &HeaderMap, what: &str) -> Result<(), EndpointError> {
    let asked = headers
        .get(UPGRADE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.eq_ignore_ascii_case(UPGRADE_PROTOCOL));
    if asked {
        Ok(())
    } else {
        Err(EndpointError::BadRequest(format!(
            "{what} needs Connection: Upgrade and Upgrade: {UPGRADE_PROTOCOL}"
        )))
    }
}

/// The `101 Switching Protocols` answer of an upgraded session.
pub(crate) fn switching_protocols() -> Response {
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, UPGRADE_PROTOCOL)
        .body(Body::empty())
        .unwrap_or_default()
}

pub(crate) fn parse_query(query: Option<&str>) -> BTreeMap<String, Vec<String>> {
    let mut params: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        params
            .entry(name.into_owned())
            .or_default()
            .push(value.into_owned());
    }
    params
}

pub(crate) fn single<'a>(params: &'a BTreeMap<String, Vec<String>>, name: &str) -> Option<&'a str> {
    params
        .get(name)
        .and_then(|values| values.last())
        .map(String::as_str)
}

pub(crate) fn flag(
    params: &BTreeMap<String, Vec<String>>,
    name: &str,
) -> Result<bool, EndpointError> {
    match single(params, name) {
        None | Some("false") | Some("0") | Some("") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(EndpointError::BadRequest(format!(
            "{name}: expected true or false, got {other:?}"
        ))),
    }
}

/// `tail=N`: only the last N lines.
pub(crate) fn tail(params: &BTreeMap<String, Vec<String>>) -> Result<Option<u64>, EndpointError> {
    single(params, "tail")
        .filter(|tail| !tail.is_empty())
        .map(|tail| {
            tail.parse::<u64>().map_err(|_| {
                EndpointError::BadRequest(format!("tail: expected a number of lines, got {tail:?}"))
            })
        })
        .transpose()
}

/// The pod's record on this node and the named container, checked to be
/// one of its spec's containers.
async fn find_container(
    endpoint: &Endpoint,
    namespace: &str,
    name: &str,
    params: &BTreeMap<String, Vec<String>>,
) -> Result<(PodRecord, PodSpec, String), EndpointError> {
    let (record, spec) = find_pod(endpoint, namespace, name).await?;
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    let container = single(params, "container").ok_or_else(|| {
        EndpointError::BadRequest(format!(
            "container: name one of pod/{name}'s containers: {}",
            names.join(", ")
        ))
    })?;
    if !names.contains(&container) {
        return Err(EndpointError::NotFound(format!(
            "pod/{name} has no container {container:?}; its containers: {}",
            names.join(", ")
        )));
    }
    let container = container.to_string();
    Ok((record, spec, container))
}

/// The local record of a pod this node runs, and its spec.
pub(crate) async fn find_pod(
    endpoint: &Endpoint,
    namespace: &str,
    name: &str,
) -> Result<(PodRecord, PodSpec), EndpointError> {
    let key = ObjectKey::new(Kind::Pod, Some(namespace), name);
    let state = endpoint.ctx.state.clone();
    let records = tokio::task::spawn_blocking(move || state.load_all())
        .await
        .map_err(|error| EndpointError::Internal(error.to_string()))?
        .map_err(|error| EndpointError::Internal(crate::chain(&error)))?;
    let record = records
        .into_iter()
        .find(|record| record.pod.key() == key)
        .ok_or_else(|| {
            EndpointError::NotFound(format!(
                "pod {namespace}/{name} does not run on node {}",
                endpoint.ctx.node
            ))
        })?;
    let spec: PodSpec = record.pod.typed_spec().map_err(|error| {
        EndpointError::Internal(format!(
            "the local record of pod {key} is unreadable: {error}"
        ))
    })?;
    Ok((record, spec))
}

async fn logs(
    State(endpoint): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, EndpointError> {
    let params = parse_query(query.as_deref());
    let follow = flag(&params, "follow")?;
    let tail = tail(&params)?;
    let (record, _spec, container) = find_container(&endpoint, &namespace, &name, &params).await?;
    let uid = record.pod.metadata.uid.clone();
    let path = log_path(&endpoint.ctx.runner.pods_dir, &uid, &container);
    let reader = LogReader::new(path, tail, follow, endpoint.shutdown.clone());
    let stream = futures::stream::unfold(reader, |mut reader| async move {
        match reader.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(chunk), reader)),
            Ok(None) => None,
            Err(error) => Some((Err(error), reader)),
        }
    });
    Ok((
        [(CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(stream),
    )
        .into_response())
}

async fn exec(
    State(endpoint): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    mut request: Request,
) -> Result<Response, EndpointError> {
    require_upgrade(request.headers(), "exec")?;
    let params = parse_query(query.as_deref());
    let tty = flag(&params, "tty")?;
    let args = params.get("cmd").cloned().unwrap_or_default();
    if args.is_empty() {
        return Err(EndpointError::BadRequest(
            "cmd: name the command to run (cmd=ARG, repeated)".into(),
        ));
    }
    let (record, spec, container) = find_container(&endpoint, &namespace, &name, &params).await?;
    let runtime_id = record
        .containers
        .get(&container)
        .filter(|c| c.running)
        .map(|c| c.runtime_id.clone())
        .ok_or_else(|| {
            EndpointError::Conflict(format!(
                "container {container} of pod/{name} is not running (see `corral why pod/{name}`)"
            ))
        })?;
    let runtime = endpoint
        .ctx
        .runner
        .runtimes
        .for_class(spec.runtime)
        .map_err(|error| EndpointError::Conflict(error.to_string()))?
        .clone();
    // `runc exec` moves its process into the container's cgroup too.
    endpoint.ctx.runner.cgroup_primer.nudge();
    let exec_spec = ExecSpec {
        args,
        tty,
        ..ExecSpec::default()
    };
    let terminal = if tty {
        let size = |name: &str, default: u16| -> Result<u16, EndpointError> {
            single(&params, name)
                .filter(|value| !value.is_empty())
                .map_or(Ok(default), |value| {
                    value.parse().map_err(|_| {
                        EndpointError::BadRequest(format!(
                            "{name}: expected a terminal size, got {value:?}"
                        ))
                    })
                })
        };
        let (cols, rows) = (size("cols", 80)?, size("rows", 24)?);
        Some(open_terminal(cols, rows).map_err(|error| {
            EndpointError::Internal(format!("cannot allocate a terminal: {error}"))
        })?)
    } else {
        None
    };
    let (master, runtime_stdin) = match terminal {
        Some((master, slave)) => (Some(master), std::process::Stdio::from(slave)),
        None => (None, std::process::Stdio::piped()),
    };
    let child = tokio::task::spawn_blocking(move || {
        runtime.exec_with_stdin(&runtime_id, &exec_spec, runtime_stdin)
    })
    .await
    .map_err(|error| EndpointError::Internal(error.to_string()))?
    .map_err(|error| {
        EndpointError::Internal(format!(
            "cannot exec in container {container}: {}",
            crate::chain(&error)
        ))
    })?;
    let upgrade = hyper::upgrade::on(&mut request);
    let shutdown = endpoint.shutdown.clone();
    tokio::spawn(async move {
        let pid = child.id();
        match upgrade.await {
            Ok(upgraded) => {
                let stdin = master.map(|master| {
                    Box::pin(tokio::fs::File::from_std(std::fs::File::from(master))) as Input
                });
                run_session(TokioIo::new(upgraded), child, stdin, shutdown).await;
            }
            Err(error) => {
                tracing::warn!(%error, "exec: the connection was not upgraded");
                drop(child);
                let waiter = tokio::task::spawn_blocking(move || reap::wait_for_exit(pid));
                terminate(pid, waiter).await;
            }
        }
    });
    Ok(switching_protocols())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertises_the_listener_or_the_node_address() {
        let loopback: SocketAddr = "127.0.0.1:4100".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:4100".parse().unwrap();
        assert_eq!(
            advertised_url(loopback, Some("10.0.0.1")),
            "https://127.0.0.1:4100"
        );
        assert_eq!(
            advertised_url(any, Some("10.0.0.1")),
            "https://10.0.0.1:4100"
        );
        assert_eq!(
            advertised_url(any, Some("fd00::1")),
            "https://[fd00::1]:4100"
        );
        assert_eq!(advertised_url(any, None), "https://0.0.0.0:4100");
    }

    #[test]
    fn queries_keep_repeated_commands_in_order() {
        let params = parse_query(Some("container=web&cmd=sh&cmd=-c&cmd=echo+a%26b&tty=true"));
        assert_eq!(params["cmd"], vec!["sh", "-c", "echo a&b"]);
        assert_eq!(single(&params, "container"), Some("web"));
        assert!(flag(&params, "tty").unwrap());
        assert!(!flag(&params, "follow").unwrap());
        let bad = parse_query(Some("tty=maybe"));
        assert!(flag(&bad, "tty").is_err());
    }
}
