//! A pod's container I/O and a VM's console, proxied to the agent of the
//! object's node: `GET …/pods/{name}/logs?container=&follow=&tail=` streams
//! the container's log; `POST …/pods/{name}/exec?container=&tty=&cmd=…` (an
//! HTTP/1.1 upgrade to `corral-exec`) relays the exec session's bytes both
//! ways. `GET …/virtualmachines/{name}/logs?follow=&tail=` streams the VM's
//! console log and `POST …/virtualmachines/{name}/console` relays its serial
//! console over the same upgrade and frames. The agent's endpoint is the
//! node's `status.agentEndpoint`, reached over TLS: the server presents its
//! client certificate and accepts only the cluster CA's certificate for the
//! bound node ([`crate::agent_tls`]). Only people may call these.
//!
//! The server picks the container when the pod has one and the request
//! names none, and explains every refusal (not bound yet, no endpoint,
//! unknown container) before it contacts the agent. The agent's own
//! refusals are passed on as they are.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::header::{CONNECTION, CONTENT_TYPE, UPGRADE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use corral_api::kinds::{NodeStatus, PodSpec, PodStatus};
use corral_api::{Kind, ObjectKey, Role};
use hyper_util::rt::TokioIo;

use super::Target;
use crate::SharedServer;
use crate::auth::Caller;
use crate::error::{ApiError, error_chain};

/// The `Upgrade` protocol of exec sessions (the agent speaks it).
const EXEC_PROTOCOL: &str = "corral-exec";
/// How long connecting to an agent may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where to reach the container: the agent's URL for this pod and the
/// query to send it (with the container filled in).
#[derive(Debug)]
pub(super) struct Route {
    /// The node's `status.agentEndpoint` (`https://IP:PORT`).
    pub(super) endpoint: String,
    /// The agent's path (`/v1/pods/NS/NAME/logs`).
    pub(super) path: String,
    pub(super) node: String,
    pub(super) query: String,
}

impl Route {
    /// Where the request goes, for messages.
    pub(super) fn agent_url(&self) -> String {
        format!("{}{}", self.endpoint.trim_end_matches('/'), self.path)
    }
}

fn object_name(key: &ObjectKey) -> String {
    match key.kind {
        Kind::VirtualMachine => format!("vm/{}", key.name),
        _ => format!("pod/{}", key.name),
    }
}

/// Checks the caller and the object, and finds the agent to ask: a pod's
/// container `logs` and `exec`, a VM's console `logs` and `console`.
async fn route(
    server: &SharedServer,
    caller: &corral_api::Identity,
    params: &HashMap<String, String>,
    query: Option<&str>,
    action: &str,
) -> Result<Route, ApiError> {
    let target = Target::from_params(params)?;
    let (agent_kind, what) = match (target.kind, action) {
        (Kind::Pod, "logs" | "exec") => ("pods", "container"),
        (Kind::Pod, "portforward") => ("pods", "port"),
        (Kind::VirtualMachine, "logs" | "console") => ("vms", "console"),
        (Kind::Pod, _) => {
            return Err(ApiError::NotFound(format!(
                "pods have no {action}; `corral exec` runs a command in a container"
            )));
        }
        (Kind::VirtualMachine, _) => {
            return Err(ApiError::NotFound(format!(
                "VMs have no {action}; `corral console vm/NAME` attaches to the serial console"
            )));
        }
        (kind, _) => {
            return Err(ApiError::NotFound(format!(
                "only pods (container logs, exec) and VMs (console logs, console) have {action}; \
                 {kind} objects have none"
            )));
        }
    };
    if !matches!(caller.role, Role::Operator | Role::User) {
        return Err(ApiError::Forbidden(format!(
            "{what} {action} is for people (operators and users); {} is a {:?} identity",
            caller.name, caller.role
        )));
    }
    let key = target.key()?;
    let object = server.store.get(&key).await?.ok_or_else(|| {
        ApiError::NotFound(format!(
            "{} does not exist in namespace {}",
            object_name(&key),
            key.namespace
        ))
    })?;
    let (node, pairs) = if action == "portforward" {
        let status: PodStatus = object.typed_status().unwrap_or_default();
        (status.node, port_query(query)?)
    } else if key.kind == Kind::Pod {
        let status: PodStatus = object.typed_status().unwrap_or_default();
        (status.node, container_query(&object, &key, query)?)
    } else {
        let node = object
            .status
            .get("node")
            .and_then(|node| node.as_str())
            .map(str::to_string);
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        (node, pairs)
    };
    let node = node.ok_or_else(|| {
        ApiError::Conflict(format!(
            "{} is not placed on a node yet, so it has no {what} (see `corral why {}`)",
            object_name(&key),
            object_name(&key)
        ))
    })?;
    let node_status = node_status(server, &node).await?.ok_or_else(|| {
        ApiError::Unavailable(format!(
            "{} is bound to node {node}, which does not exist",
            object_name(&key)
        ))
    })?;
    let endpoint = node_status.agent_endpoint.ok_or_else(|| {
        ApiError::Unavailable(format!(
            "node {node} reports no agent endpoint, so its {what}s cannot be reached \
             (is its agent running?)"
        ))
    })?;
    let path = format!("/v1/{agent_kind}/{}/{}/{action}", key.namespace, key.name);
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&pairs)
        .finish();
    Ok(Route {
        endpoint,
        path,
        node,
        query,
    })
}

/// The status of node `node`; `None` when there is no such node.
pub(super) async fn node_status(
    server: &SharedServer,
    node: &str,
) -> Result<Option<NodeStatus>, ApiError> {
    let key = ObjectKey::new(Kind::Node, None, node);
    Ok(server
        .store
        .get(&key)
        .await?
        .map(|object| object.typed_status().unwrap_or_default()))
}

/// The query for a pod's agent, with the container filled in when the pod
/// has only one and the request names none.
/// `port=P`, a TCP port (1–65535).
fn port_query(query: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    let port = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == "port")
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| ApiError::BadRequest("port: required (the pod's TCP port)".into()))?;
    match port.parse::<u16>() {
        Ok(number) if number > 0 => Ok(vec![("port".into(), number.to_string())]),
        _ => Err(ApiError::BadRequest(format!(
            "port: {port:?} is not a TCP port (1–65535)"
        ))),
    }
}

fn container_query(
    pod: &corral_api::Object,
    key: &ObjectKey,
    query: Option<&str>,
) -> Result<Vec<(String, String)>, ApiError> {
    let spec: PodSpec = pod.typed_spec().map_err(|error| {
        ApiError::Internal(format!("{key}: stored spec is unreadable: {error}"))
    })?;
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .filter(|(k, v)| k != "container" || !v.is_empty())
        .collect();
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    let asked = pairs
        .iter()
        .rev()
        .find(|(k, _)| k == "container")
        .map(|(_, v)| v.clone());
    match (asked, names.as_slice()) {
        (Some(container), _) if !names.contains(&container.as_str()) => {
            return Err(ApiError::NotFound(format!(
                "{} has no container {container:?}; its containers: {}",
                object_name(key),
                names.join(", ")
            )));
        }
        (Some(_), _) => {}
        (None, [only]) => pairs.push(("container".into(), (*only).to_string())),
        (None, _) => {
            return Err(ApiError::BadRequest(format!(
                "container: {} has {} containers ({}): name one (`-c NAME`)",
                object_name(key),
                names.len(),
                names.join(", ")
            )));
        }
    }
    Ok(pairs)
}

/// A request to the route's agent over the agent channel: TLS with this
/// server's client certificate, the agent's certificate checked to be the
/// cluster CA's for the route's node.
pub(super) async fn agent_request(
    server: &SharedServer,
    route: &Route,
    method: reqwest::Method,
) -> Result<reqwest::RequestBuilder, ApiError> {
    let tls = server.agent_tls.get().ok_or_else(|| {
        ApiError::Unavailable(
            "this API server has no cluster CA for the agent channel, so it cannot reach node agents"
                .into(),
        )
    })?;
    let (client, base) = tls
        .connect(&route.node, &route.endpoint, CONNECT_TIMEOUT)
        .await
        .map_err(|error| {
            ApiError::Unavailable(format!(
                "cannot reach the agent of node {}: {}",
                route.node,
                error_chain(&error)
            ))
        })?;
    let url = if route.query.is_empty() {
        format!("{base}{}", route.path)
    } else {
        format!("{base}{}?{}", route.path, route.query)
    };
    Ok(client.request(method, url))
}

pub(super) fn unreachable(route: &Route, error: &reqwest::Error) -> ApiError {
    if let Some(why) = crate::agent_tls::refused_certificate(error) {
        return ApiError::Unavailable(format!(
            "refused the agent at {} as node {}: {why}; nothing was sent to it",
            route.agent_url(),
            route.node
        ));
    }
    ApiError::Unavailable(format!(
        "cannot reach the agent of node {} at {}: {}",
        route.node,
        route.agent_url(),
        error_chain(error)
    ))
}

/// The agent's refusal, passed on with its status and JSON body.
pub(super) async fn passed_on(response: reqwest::Response) -> Response {
    let status = StatusCode::from_u16(response.status().as_u16())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = response.bytes().await.unwrap_or_default();
    let mut answer = Response::new(Body::from(body));
    *answer.status_mut() = status;
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    answer
}

/// `GET …/pods/{name}/logs`: the container's log, streamed from its agent.
pub async fn logs(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let route = route(&server, &caller, &params, query.as_deref(), "logs").await?;
    let response = agent_request(&server, &route, reqwest::Method::GET)
        .await?
        .send()
        .await
        .map_err(|error| unreachable(&route, &error))?;
    if !response.status().is_success() {
        return Ok(passed_on(response).await);
    }
    let mut answer = Response::new(Body::from_stream(response.bytes_stream()));
    answer.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Ok(answer)
}

/// `POST …/pods/{name}/exec`: upgrades both connections and relays bytes.
pub async fn exec(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Result<Response, ApiError> {
    relay(server, caller, params, query, request, "exec").await
}

/// `POST …/pods/{name}/portforward?port=P`: a TCP connection to the pod's
/// port, the same upgrade and relay as exec (the bytes are the
/// connection's, unframed).
pub async fn port_forward(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Result<Response, ApiError> {
    relay(server, caller, params, query, request, "portforward").await
}

/// `POST …/virtualmachines/{name}/console`: the VM's serial console, the
/// same upgrade and relay as exec.
pub async fn console(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    Path(params): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Result<Response, ApiError> {
    relay(server, caller, params, query, request, "console").await
}

/// Opens a VM's serial console on its node's agent for `caller`: the
/// upgraded connection speaks [`corral_client::exec_protocol`]. The
/// dashboard bridges it to a WebSocket ([`crate::ui::console`]).
pub(crate) async fn open_console(
    server: &SharedServer,
    caller: &corral_api::Identity,
    params: &HashMap<String, String>,
) -> Result<reqwest::Upgraded, ApiError> {
    let route = route(server, caller, params, None, "console").await?;
    let response = agent_request(server, &route, reqwest::Method::POST)
        .await?
        .header(reqwest::header::CONNECTION, "Upgrade")
        .header(reqwest::header::UPGRADE, EXEC_PROTOCOL)
        .send()
        .await
        .map_err(|error| unreachable(&route, &error))?;
    if response.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        return Err(ApiError::Unavailable(format!(
            "the agent of node {} refused the console ({status}): {text}",
            route.node
        )));
    }
    response
        .upgrade()
        .await
        .map_err(|error| unreachable(&route, &error))
}

async fn relay(
    server: SharedServer,
    caller: corral_api::Identity,
    params: HashMap<String, String>,
    query: Option<String>,
    mut request: Request,
    action: &str,
) -> Result<Response, ApiError> {
    let upgrade_asked = request
        .headers()
        .get(UPGRADE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.eq_ignore_ascii_case(EXEC_PROTOCOL));
    if !upgrade_asked {
        return Err(ApiError::BadRequest(format!(
            "{action} needs Connection: Upgrade and Upgrade: {EXEC_PROTOCOL}"
        )));
    }
    let route = route(&server, &caller, &params, query.as_deref(), action).await?;
    let response = agent_request(&server, &route, reqwest::Method::POST)
        .await?
        .header(reqwest::header::CONNECTION, "Upgrade")
        .header(reqwest::header::UPGRADE, EXEC_PROTOCOL)
        .send()
        .await
        .map_err(|error| unreachable(&route, &error))?;
    if response.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        return Ok(passed_on(response).await);
    }
    let mut agent = response
        .upgrade()
        .await
        .map_err(|error| unreachable(&route, &error))?;
    let client_upgrade = hyper::upgrade::on(&mut request);
    tracing::info!(caller = %caller.name, agent = %route.agent_url(), "{action} session");
    tokio::spawn(async move {
        match client_upgrade.await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut agent).await {
                    tracing::debug!(%error, "relay ended");
                }
            }
            Err(error) => tracing::warn!(%error, "the client's connection was not upgraded"),
        }
    });
    Ok(Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, EXEC_PROTOCOL)
        .body(Body::empty())
        .unwrap_or_default())
}
