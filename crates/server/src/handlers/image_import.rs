//! Images on nodes, through the API: `GET /v1/images?node=…` lists each
//! node's images and `POST /v1/images/import?node=…&name=REF` imports the
//! archive in the request body on each node. Images are not API objects:
//! every node's agent owns its store, so the server asks the agents (at
//! `status.agentEndpoint`, over the agent channel's TLS, as for logs and exec)
//! and answers node by node, an error for the nodes that failed.
//!
//! Without `node=` the request goes to every Ready node; the others are
//! listed as skipped. A named node is always asked.
//!
//! The upload is streamed: each chunk of the request body is passed on to
//! every node's agent as it arrives (the slowest agent sets the pace), so
//! the server holds a few chunks, never the archive. No body limit applies
//! (the body is read as a stream, not through a size-limited extractor);
//! only operators may import.

use std::io;
use std::time::Duration;

use axum::Json;
use axum::extract::{RawQuery, Request, State};
use bytes::Bytes;
use corral_api::kinds::{NodeImage, NodeImages, NodeImagesReport, NodePhase, SkippedNode};
use corral_api::{Kind, Role};
use futures::StreamExt;
use tokio::sync::mpsc;

use super::pods_io::{Route, agent_request, node_status, unreachable};
use crate::SharedServer;
use crate::auth::Caller;
use crate::error::ApiError;

/// How long one node's import may take (unpacking a large image is slow).
const IMPORT_TIMEOUT: Duration = Duration::from_secs(2 * 60 * 60);
/// How long one node may take to list its images.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// Body chunks queued for each agent before the upload waits for it.
const CHUNKS_IN_FLIGHT: usize = 16;

/// A node the request goes to: its agent's URL, or why it cannot be asked.
#[derive(Debug)]
struct Target {
    node: String,
    endpoint: Result<String, String>,
}

/// The nodes named by `node=` (in order, once each), or every Ready node
/// and the others as skipped.
async fn targets(
    server: &SharedServer,
    named: &[String],
) -> Result<(Vec<Target>, Vec<SkippedNode>), ApiError> {
    if !named.is_empty() {
        let mut targets: Vec<Target> = Vec::new();
        for node in named {
            if targets.iter().any(|t| &t.node == node) {
                continue;
            }
            let endpoint = match node_status(server, node).await? {
                None => Err(format!("node {node} does not exist")),
                Some(status) => status.agent_endpoint.ok_or_else(|| {
                    format!(
                        "node {node} ({:?}) reports no agent endpoint: is its agent running?",
                        status.phase
                    )
                }),
            };
            targets.push(Target {
                node: node.clone(),
                endpoint,
            });
        }
        return Ok((targets, Vec::new()));
    }
    let mut nodes = server.store.list(Kind::Node, None).await?.objects;
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    if nodes.is_empty() {
        return Err(ApiError::Conflict("the cluster has no nodes".into()));
    }
    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    for node in nodes {
        let name = node.metadata.name.clone();
        let status: corral_api::kinds::NodeStatus = node.typed_status().unwrap_or_default();
        if status.phase != NodePhase::Ready {
            skipped.push(SkippedNode {
                node: name,
                reason: format!("{:?}, not Ready", status.phase),
            });
            continue;
        }
        let endpoint = status
            .agent_endpoint
            .ok_or_else(|| format!("node {name} reports no agent endpoint: is its agent running?"));
        targets.push(Target {
            node: name,
            endpoint,
        });
    }
    if targets.is_empty() {
        let phases: Vec<String> = skipped
            .iter()
            .map(|s| format!("{}: {}", s.node, s.reason))
            .collect();
        return Err(ApiError::Conflict(format!(
            "no node is Ready ({}): name one with node= (`--node NAME`) to try it anyway",
            phases.join(", ")
        )));
    }
    Ok((targets, skipped))
}

/// The repeated `node=` values of a query, and its `name=`.
fn query_params(query: Option<&str>) -> (Vec<String>, Option<String>) {
    let mut nodes = Vec::new();
    let mut name = None;
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "node" if !value.is_empty() => nodes.push(value.into_owned()),
            "name" if !value.is_empty() => name = Some(value.into_owned()),
            _ => {}
        }
    }
    (nodes, name)
}

/// What the agent said when it refused: its `message`, or the status.
async fn refusal(response: reqwest::Response) -> String {
    let status = response.status();
    let body = response.bytes().await.unwrap_or_default();
    serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|body| body["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| {
            format!(
                "the agent answered {status}: {}",
                String::from_utf8_lossy(&body).trim()
            )
        })
}

/// One node's answer to a request its agent answers with a list of images.
async fn answer(route: &Route, sent: Result<reqwest::Response, reqwest::Error>) -> NodeImages {
    let mut answer = NodeImages {
        node: route.node.clone(),
        ..NodeImages::default()
    };
    match sent {
        Err(error) => answer.error = Some(unreachable(route, &error).to_string()),
        Ok(response) if !response.status().is_success() => {
            answer.error = Some(refusal(response).await);
        }
        Ok(response) => match response.json::<Vec<NodeImage>>().await {
            Ok(images) => answer.images = images,
            Err(error) => answer.error = Some(unreachable(route, &error).to_string()),
        },
    }
    answer
}

fn failed(node: String, error: String) -> NodeImages {
    NodeImages {
        node,
        images: Vec::new(),
        error: Some(error),
    }
}

fn route_to(target: &Target, endpoint: &str, path: &str, query: String) -> Route {
    Route {
        endpoint: endpoint.to_string(),
        path: path.to_string(),
        node: target.node.clone(),
        query,
    }
}

/// `GET /v1/images?node=NAME…`: operators and users.
pub async fn list(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    RawQuery(query): RawQuery,
) -> Result<Json<NodeImagesReport>, ApiError> {
    if !matches!(caller.role, Role::Operator | Role::User) {
        return Err(ApiError::Forbidden(format!(
            "listing nodes' images is for people (operators and users); {} is a {:?} identity",
            caller.name, caller.role
        )));
    }
    let (named, _) = query_params(query.as_deref());
    let (targets, skipped) = targets(&server, &named).await?;
    let mut asked = Vec::new();
    for target in &targets {
        let endpoint = match &target.endpoint {
            Ok(endpoint) => endpoint,
            Err(error) => {
                asked.push(futures::future::Either::Left(std::future::ready(failed(
                    target.node.clone(),
                    error.clone(),
                ))));
                continue;
            }
        };
        let route = route_to(target, endpoint, "/v1/images", String::new());
        let request = match agent_request(&server, &route, reqwest::Method::GET).await {
            Ok(request) => request.timeout(LIST_TIMEOUT),
            Err(error) => {
                asked.push(futures::future::Either::Left(std::future::ready(failed(
                    target.node.clone(),
                    error.to_string(),
                ))));
                continue;
            }
        };
        asked.push(futures::future::Either::Right(async move {
            answer(&route, request.send().await).await
        }));
    }
    let nodes = futures::future::join_all(asked).await;
    Ok(Json(NodeImagesReport { nodes, skipped }))
}

/// `POST /v1/images/import?node=NAME…&name=REF`: operators only.
pub async fn import(
    State(server): State<SharedServer>,
    Caller(caller): Caller,
    RawQuery(query): RawQuery,
    request: Request,
) -> Result<Json<NodeImagesReport>, ApiError> {
    if caller.role != Role::Operator {
        return Err(ApiError::Forbidden(format!(
            "only operators import images into nodes; {} is a {:?} identity",
            caller.name, caller.role
        )));
    }
    let (named, name) = query_params(query.as_deref());
    let (targets, skipped) = targets(&server, &named).await?;
    let agent_query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(name.iter().map(|name| ("name", name.as_str())))
        .finish();
    let mut outcomes = Vec::new();
    let mut uploads: Vec<mpsc::Sender<io::Result<Bytes>>> = Vec::new();
    for target in &targets {
        let endpoint = match &target.endpoint {
            Ok(endpoint) => endpoint,
            Err(error) => {
                let answer = failed(target.node.clone(), error.clone());
                outcomes.push(tokio::spawn(async move { answer }));
                continue;
            }
        };
        let route = route_to(target, endpoint, "/v1/images/import", agent_query.clone());
        let (sender, chunks) = mpsc::channel::<io::Result<Bytes>>(CHUNKS_IN_FLIGHT);
        let body = futures::stream::unfold(chunks, |mut chunks| async move {
            chunks.recv().await.map(|chunk| (chunk, chunks))
        });
        let request = match agent_request(&server, &route, reqwest::Method::POST).await {
            Ok(request) => request,
            Err(error) => {
                let answer = failed(target.node.clone(), error.to_string());
                outcomes.push(tokio::spawn(async move { answer }));
                continue;
            }
        };
        let request = request
            .timeout(IMPORT_TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, "application/x-tar")
            .body(reqwest::Body::wrap_stream(body));
        uploads.push(sender);
        outcomes.push(tokio::spawn(async move {
            answer(&route, request.send().await).await
        }));
    }
    let broken = pass_on(request, &mut uploads).await;
    drop(uploads);
    let mut nodes = Vec::with_capacity(outcomes.len());
    for (outcome, target) in outcomes.into_iter().zip(&targets) {
        nodes.push(outcome.await.unwrap_or_else(|error| {
            failed(target.node.clone(), format!("the import was lost: {error}"))
        }));
    }
    if let Some(error) = broken {
        return Err(ApiError::BadRequest(format!(
            "the upload broke off, nothing was imported: {error}"
        )));
    }
    for node in &nodes {
        match &node.error {
            None => {
                let images: Vec<&str> = node.images.iter().map(|i| i.reference.as_str()).collect();
                tracing::info!(caller = %caller.name, node = %node.node, ?images, "images imported");
            }
            Some(error) => {
                tracing::warn!(caller = %caller.name, node = %node.node, %error, "image import failed");
            }
        }
    }
    Ok(Json(NodeImagesReport { nodes, skipped }))
}

/// Passes every chunk of the request body on to each agent's upload, in
/// step; an agent that stopped reading (it answered, or failed) is left
/// out. Reads the body to its end even when no agent reads any more, so
/// the client gets the answer rather than a broken connection. Returns the
/// error that broke the body off, which every upload also gets.
async fn pass_on(
    request: Request,
    uploads: &mut Vec<mpsc::Sender<io::Result<Bytes>>>,
) -> Option<String> {
    let mut body = request.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(chunk) => {
                let mut open = Vec::with_capacity(uploads.len());
                for upload in uploads.drain(..) {
                    if upload.send(Ok(chunk.clone())).await.is_ok() {
                        open.push(upload);
                    }
                }
                *uploads = open;
            }
            Err(error) => {
                let message = error.to_string();
                for upload in uploads.iter() {
                    let _ = upload.send(Err(io::Error::other(message.clone()))).await;
                }
                return Some(message);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_name_nodes_in_order_and_one_name() {
        let (nodes, name) = query_params(Some("node=b&node=a&name=local%2Fapp%3A1&node="));
        assert_eq!(nodes, vec!["b", "a"]);
        assert_eq!(name.as_deref(), Some("local/app:1"));
        assert_eq!(query_params(None), (Vec::new(), None));
    }
}
