//! A VM's serial console in the browser: a WebSocket at
//! `/ui/console/{name}?namespace=NS` bridged to the same agent session as
//! `corral console` (`POST …/virtualmachines/{name}/console`). Keys typed
//! in the page arrive as WebSocket messages and go to the agent as stdin
//! frames; the console's output comes back as binary messages.
//!
//! A WebSocket handshake is a GET that a page on another site could start
//! with the cookie, so it must come from this origin (browsers always
//! send `Origin` on one), and the caller must be allowed the console
//! request it stands for.

use std::collections::HashMap;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::header::{HOST, ORIGIN};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use corral_client::exec_protocol::{self, Frame};
use futures::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;

use super::pages::NamespaceQuery;
use super::session::Session;
use crate::SharedServer;

/// `GET /ui/console/{name}?namespace=NS` (WebSocket).
pub async fn console(
    State(server): State<SharedServer>,
    session: Session,
    Path(name): Path<String>,
    Query(query): Query<NamespaceQuery>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let origin = headers.get(ORIGIN).and_then(|v| v.to_str().ok());
    let host = headers.get(HOST).and_then(|v| v.to_str().ok());
    let same = matches!((origin, host), (Some(origin), Some(host)) if origin.strip_prefix("https://") == Some(host));
    if !same {
        return (
            StatusCode::FORBIDDEN,
            "origin: the console's WebSocket must be opened by the dashboard",
        )
            .into_response();
    }
    let namespace = query.or_default(&session.caller);
    let path = format!("/v1/namespaces/{namespace}/virtualmachines/{name}/console");
    if let Err(error) = crate::scope::check(&session.caller, &Method::POST, &path, None) {
        return error.into_response();
    }
    let params = HashMap::from([
        ("plural".to_string(), "virtualmachines".to_string()),
        ("namespace".to_string(), namespace),
        ("name".to_string(), name),
    ]);
    let agent =
        match crate::handlers::pods_io::open_console(&server, &session.caller, &params).await {
            Ok(agent) => agent,
            Err(error) => return error.into_response(),
        };
    tracing::info!(caller = %session.caller.name, "dashboard console session");
    upgrade.on_upgrade(move |socket| bridge(socket, agent))
}

/// Relays between the browser and the agent until either side ends (the
/// other direction is dropped then, which ends the agent's session).
async fn bridge(socket: WebSocket, agent: reqwest::Upgraded) {
    let (mut to_browser_sink, mut from_browser) = socket.split();
    let (mut from_agent, mut to_agent) = tokio::io::split(agent);
    let output = async move {
        while let Ok(Some(frame)) = exec_protocol::read_frame(&mut from_agent).await {
            let Some(message) = to_browser(frame) else {
                continue;
            };
            let last = matches!(message, Message::Text(_));
            if to_browser_sink.send(message).await.is_err() || last {
                break;
            }
        }
        let _ = to_browser_sink.send(Message::Close(None)).await;
    };
    let input = async move {
        while let Some(Ok(message)) = from_browser.next().await {
            let bytes = match message {
                Message::Text(text) => text.as_str().as_bytes().to_vec(),
                Message::Binary(bytes) => bytes.to_vec(),
                Message::Ping(_) | Message::Pong(_) => continue,
                Message::Close(_) => break,
            };
            let frame = Frame::new(exec_protocol::STDIN, bytes).encode();
            if to_agent.write_all(&frame).await.is_err() || to_agent.flush().await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = output => {}
        () = input => {}
    }
}

/// Output as binary messages; the session's end as one text message.
fn to_browser(frame: Frame) -> Option<Message> {
    match frame.kind {
        exec_protocol::STDOUT | exec_protocol::STDERR => {
            Some(Message::Binary(frame.payload.into()))
        }
        exec_protocol::EXIT => Some(Message::Text(
            format!("[console closed: {}]", frame.exit_code().unwrap_or(-1)).into(),
        )),
        exec_protocol::ERROR => Some(Message::Text(
            format!(
                "[console failed: {}]",
                String::from_utf8_lossy(&frame.payload)
            )
            .into(),
        )),
        _ => None,
    }
}
