//! A typed client of the corral API, used by the CLI, the node agent and
//! controllers, and the client config file (`server`, `token`).
//!
//! It knows URLs and wire types; it makes no decisions. Every call has a
//! timeout except watches, which stream until dropped.

mod config;
pub mod exec_protocol;
mod pod_io;
pub mod runtime;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use corral_api::history::RevisionDiff;
use corral_api::watch::{ObjectList, WatchEvent};
use corral_api::workflow::{
    LogLevel, StepActionKind, StepActionRequest, StepBatchRequest, StepLogEntry, WorkflowInstance,
    WorkflowStatus,
};
use corral_api::{
    FieldError, HistoryQuery, Identity, Kind, Object, ObjectKey, RevisionRecord, Role,
};
use futures::{Stream, StreamExt};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;

pub use config::{ClientConfig, ConfigError};
pub use pod_io::{ExecEvent, ExecInput, ExecOutput, ExecRequest, LogsQuery};

/// How long one request may take before it fails.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Objects per request when [`Client::list`] reads a whole list.
pub const LIST_PAGE: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error; `message` is its explanation.
    #[error("{message}")]
    Api {
        status: u16,
        code: String,
        message: String,
        fields: Vec<FieldError>,
    },
    #[error("cannot reach the corral API at {server}")]
    Transport {
        server: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the server's answer could not be decoded")]
    Decode(#[source] serde_json::Error),
    #[error("watch stream failed: {0}")]
    Watch(String),
    /// An exec session failed after it started.
    #[error("exec failed: {0}")]
    Exec(String),
}

impl ClientError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    code: String,
    message: String,
    #[serde(default)]
    fields: Vec<FieldError>,
}

/// A node's lease: when it last said it is alive.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub node: String,
    pub holder: String,
    pub renewed_at: chrono::DateTime<chrono::Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TokenResponse {
    pub token: String,
    pub identity: Identity,
}

/// Which step log entries of one object to read; `None` means any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepLogQuery {
    /// Only this step's entries (`acme/slow-mount`).
    pub step: Option<String>,
    /// Only entries about steps of this owner (`acme-storage`).
    pub owner: Option<String>,
    /// Only this workflow instance's entries (`start-1`).
    pub workflow: Option<String>,
}

/// A connection to a corral API: one server, or several serving the same
/// cluster (`server` in the config is then a comma-separated list), in
/// which case a request that cannot connect to one is sent to the next.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    servers: Arc<Vec<String>>,
    /// Index of the server requests go to; moves on when it is unreachable.
    current: Arc<AtomicUsize>,
    token: String,
}

/// The URL path of a collection: `/v1/namespaces/NS/pods` or `/v1/nodes`
/// (`/v1/pods` lists across namespaces).
pub fn collection_path(kind: Kind, namespace: Option<&str>) -> String {
    match namespace.filter(|_| kind.is_namespaced()) {
        Some(namespace) => format!("/v1/namespaces/{namespace}/{}", kind.plural()),
        None => format!("/v1/{}", kind.plural()),
    }
}

/// The URL path of one object.
pub fn object_path(key: &ObjectKey) -> String {
    let namespace = (!key.namespace.is_empty()).then_some(key.namespace.as_str());
    format!("{}/{}", collection_path(key.kind, namespace), key.name)
}

impl Client {
    /// A client for the server in `config`, trusting only the cluster CA
    /// it carries.
    pub fn new(config: &ClientConfig) -> Result<Self, ClientError> {
        let transport = |source| ClientError::Transport {
            server: config.server.clone(),
            source,
        };
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .tls_built_in_root_certs(false);
        if let Some(ca) = &config.ca {
            let root = reqwest::Certificate::from_pem(ca.as_bytes()).map_err(transport)?;
            builder = builder.add_root_certificate(root);
        }
        let http = builder.build().map_err(transport)?;
        let servers: Vec<String> = config
            .server
            .split(',')
            .map(|server| server.trim().trim_end_matches('/').to_string())
            .filter(|server| !server.is_empty())
            .collect();
        Ok(Client {
            http,
            servers: Arc::new(if servers.is_empty() {
                vec![String::new()]
            } else {
                servers
            }),
            current: Arc::new(AtomicUsize::new(0)),
            token: config.token.clone(),
        })
    }

    /// The server requests go to now.
    pub fn server(&self) -> &str {
        let index = self.current.load(Ordering::Relaxed) % self.servers.len();
        &self.servers[index]
    }

    /// Every configured server.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.server()))
            .bearer_auth(&self.token)
    }

    /// Sends `request`; when the server cannot be connected to (so the
    /// request never arrived), tries the next configured server, each once.
    async fn execute(&self, request: RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let (http, built) = request.build_split();
        let mut request = built.map_err(|source| self.transport(source))?;
        let mut tries_left = self.servers.len();
        loop {
            let spare = request.try_clone();
            let from = self.server().to_string();
            match http.execute(request).await {
                Ok(response) => return Ok(response),
                Err(source) if source.is_connect() && tries_left > 1 => {
                    let Some(mut next) = spare else {
                        return Err(self.transport(source));
                    };
                    let index = self.current.load(Ordering::Relaxed);
                    // Only one caller moves on from a dead server.
                    let _ = self.current.compare_exchange(
                        index,
                        (index + 1) % self.servers.len(),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    let to = self.server();
                    tracing::warn!(from = %from, to = %to, "corral server unreachable; failing over");
                    let url = next.url().as_str().replacen(&from, to, 1);
                    match reqwest::Url::parse(&url) {
                        Ok(url) => *next.url_mut() = url,
                        Err(_) => return Err(self.transport(source)),
                    }
                    request = next;
                    tries_left -= 1;
                }
                Err(source) => return Err(self.transport(source)),
            }
        }
    }

    async fn send(&self, request: RequestBuilder) -> Result<Bytes, ClientError> {
        let response = self.execute(request.timeout(REQUEST_TIMEOUT)).await?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|source| self.transport(source))?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(api_error(status, &body))
        }
    }

    fn transport(&self, source: reqwest::Error) -> ClientError {
        ClientError::Transport {
            server: self.server().to_string(),
            source,
        }
    }

    async fn call<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T, ClientError> {
        let body = self.send(request).await?;
        serde_json::from_slice(&body).map_err(ClientError::Decode)
    }

    pub async fn get(&self, key: &ObjectKey) -> Result<Object, ClientError> {
        self.call(self.request(Method::GET, &object_path(key)))
            .await
    }

    /// Objects of a kind in one namespace or all, optionally by label
    /// selector, sorted by namespace then name, read [`LIST_PAGE`] at a
    /// time; the `resourceVersion` is the first page's, so a watch from it
    /// misses nothing.
    pub async fn list(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        selector: Option<&str>,
    ) -> Result<ObjectList, ClientError> {
        self.list_scope_all(&scope(kind, namespace, selector)).await
    }

    /// One page of a list: at most `limit` objects after the position
    /// `continue_token` (from the previous page's `continue_token`) names;
    /// the page's `continue_token` is `None` on the last page.
    pub async fn list_page(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        selector: Option<&str>,
        limit: usize,
        continue_token: Option<&str>,
    ) -> Result<ObjectList, ClientError> {
        let scope = scope(kind, namespace, selector);
        self.list_scope_page(&scope, limit, continue_token).await
    }

    /// Creates or updates an object (compare-and-swap when it carries a
    /// `resourceVersion`), recording `message` in history.
    pub async fn apply(
        &self,
        object: &Object,
        message: Option<&str>,
    ) -> Result<Object, ClientError> {
        let request = self
            .request(Method::PUT, &object_path(&object.key()))
            .query(&[("message", message.unwrap_or_default())])
            .json(object);
        self.call(request).await
    }

    /// Creates an object; fails if it exists.
    pub async fn create(
        &self,
        object: &Object,
        message: Option<&str>,
    ) -> Result<Object, ClientError> {
        let key = object.key();
        let namespace = (!key.namespace.is_empty()).then_some(key.namespace.as_str());
        let request = self
            .request(Method::POST, &collection_path(key.kind, namespace))
            .query(&[("message", message.unwrap_or_default())])
            .json(object);
        self.call(request).await
    }

    /// Replaces an object's status (compare-and-swap when it carries a
    /// `resourceVersion`).
    pub async fn put_status(&self, object: &Object) -> Result<Object, ClientError> {
        self.put_status_with_message(object, None).await
    }

    /// [`Client::put_status`] with a message for the history record a
    /// status change may make (a pod's move between nodes).
    pub async fn put_status_with_message(
        &self,
        object: &Object,
        message: Option<&str>,
    ) -> Result<Object, ClientError> {
        let path = format!("{}/status", object_path(&object.key()));
        let mut request = self.request(Method::PUT, &path).json(object);
        if let Some(message) = message {
            request = request.query(&[("message", message)]);
        }
        self.call(request).await
    }

    pub async fn delete(
        &self,
        key: &ObjectKey,
        message: Option<&str>,
    ) -> Result<Object, ClientError> {
        let request = self
            .request(Method::DELETE, &object_path(key))
            .query(&[("message", message.unwrap_or_default())]);
        self.call(request).await
    }

    pub async fn history(&self, key: &ObjectKey) -> Result<Vec<RevisionRecord>, ClientError> {
        let path = format!("{}/history", object_path(key));
        self.call(self.request(Method::GET, &path)).await
    }

    pub async fn revision(
        &self,
        key: &ObjectKey,
        revision: u64,
    ) -> Result<RevisionRecord, ClientError> {
        let path = format!("{}/history/{revision}", object_path(key));
        self.call(self.request(Method::GET, &path)).await
    }

    pub async fn diff(
        &self,
        key: &ObjectKey,
        from: u64,
        to: Option<u64>,
    ) -> Result<RevisionDiff, ClientError> {
        let path = format!("{}/diff", object_path(key));
        let mut query = vec![("from", from.to_string())];
        if let Some(to) = to {
            query.push(("to", to.to_string()));
        }
        self.call(self.request(Method::GET, &path).query(&query))
            .await
    }

    pub async fn rollback(
        &self,
        key: &ObjectKey,
        to: u64,
        message: Option<&str>,
    ) -> Result<Object, ClientError> {
        let path = format!("{}/rollback", object_path(key));
        let body = serde_json::json!({"to": to, "message": message});
        self.call(self.request(Method::POST, &path).json(&body))
            .await
    }

    /// Cluster-wide history, oldest first.
    pub async fn cluster_history(
        &self,
        query: &HistoryQuery,
    ) -> Result<Vec<RevisionRecord>, ClientError> {
        let mut params: Vec<(&str, String)> = Vec::new();
        if let Some(since) = query.since {
            params.push(("since", since.to_rfc3339()));
        }
        params.extend(query.authors.iter().map(|a| ("author", a.clone())));
        params.extend(
            query
                .exclude_authors
                .iter()
                .map(|a| ("excludeAuthor", a.clone())),
        );
        if let Some(class) = query.class {
            params.push(("class", class.as_str().to_string()));
        }
        if let Some(kind) = query.kind {
            params.push(("kind", kind.as_str().to_string()));
        }
        if let Some(limit) = query.limit {
            params.push(("limit", limit.to_string()));
        }
        self.call(self.request(Method::GET, "/v1/history").query(&params))
            .await
    }

    pub async fn whoami(&self) -> Result<Identity, ClientError> {
        self.call(self.request(Method::GET, "/v1/whoami")).await
    }

    /// Mints a token for `name` as `role`; a user's names the namespaces
    /// it may act in (`*` for all). It expires after `ttl_seconds` when
    /// given (join tokens: after a day by default).
    pub async fn create_token(
        &self,
        name: &str,
        role: Role,
        namespaces: &[String],
        ttl_seconds: Option<u64>,
    ) -> Result<TokenResponse, ClientError> {
        let mut body = serde_json::json!({"name": name, "role": role, "namespaces": namespaces});
        if let Some(ttl) = ttl_seconds {
            body["ttlSeconds"] = ttl.into();
        }
        self.call(self.request(Method::POST, "/v1/tokens").json(&body))
            .await
    }

    /// Renews node `node`'s lease: its heartbeat, as only the node itself
    /// (or an operator) may send it. Returns when the server recorded it.
    pub async fn renew_lease(&self, node: &str) -> Result<Lease, ClientError> {
        let path = format!("/v1/nodes/{node}/lease");
        self.call(self.request(Method::PUT, &path)).await
    }

    /// Node `node`'s lease; `None` if it renewed none since the server's
    /// store started.
    pub async fn lease(&self, node: &str) -> Result<Option<Lease>, ClientError> {
        let path = format!("/v1/nodes/{node}/lease");
        match self.call(self.request(Method::GET, &path)).await {
            Ok(lease) => Ok(Some(lease)),
            Err(error) if error.status() == Some(404) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Exchanges this client's join token for node `node`'s own token.
    pub async fn join(&self, node: &str) -> Result<TokenResponse, ClientError> {
        let body = serde_json::json!({"node": node});
        self.call(self.request(Method::POST, "/v1/join").json(&body))
            .await
    }

    /// Hands `field` (`Pod:status.node`) from controller `from` to
    /// controller `to` (operators only). Returns the written `Controller`
    /// objects as JSON (`from`, absent when it owned the field by default
    /// only, and `to`).
    pub async fn transfer_field(
        &self,
        from: &str,
        field: &str,
        to: &str,
    ) -> Result<serde_json::Value, ClientError> {
        let path = format!("/v1/controllers/{from}/transfer");
        let body = serde_json::json!({"path": field, "to": to});
        self.call(self.request(Method::POST, &path).json(&body))
            .await
    }

    /// A step owner's action on a step of the object's newest running
    /// workflow instance (or the one `request.workflow` names). Returns the
    /// instance afterwards. Refused with 403 when the token's identity does
    /// not own the step, 409 when the step's state does not allow it.
    pub async fn step_action(
        &self,
        key: &ObjectKey,
        request: &StepActionRequest,
    ) -> Result<WorkflowInstance, ClientError> {
        let path = format!("{}/steps", object_path(key));
        self.call(self.request(Method::POST, &path).json(request))
            .await
    }

    /// Several step actions, and status fields the caller owns, in one
    /// write of the object: all or none. Returns the instance the last
    /// action moved.
    pub async fn step_batch(
        &self,
        key: &ObjectKey,
        batch: &StepBatchRequest,
    ) -> Result<WorkflowInstance, ClientError> {
        let path = format!("{}/steps", object_path(key));
        self.call(self.request(Method::POST, &path).json(batch))
            .await
    }

    /// Claims a ready step: it runs against its timeout from now.
    pub async fn claim_step(
        &self,
        key: &ObjectKey,
        step: &str,
    ) -> Result<WorkflowInstance, ClientError> {
        let request = StepActionRequest::new(StepActionKind::Claim, step);
        self.step_action(key, &request).await
    }

    /// Reports the claimed step done, with an optional note for `why`.
    pub async fn complete_step(
        &self,
        key: &ObjectKey,
        step: &str,
        note: Option<&str>,
    ) -> Result<WorkflowInstance, ClientError> {
        let mut request = StepActionRequest::new(StepActionKind::Complete, step);
        request.note = note.map(str::to_string);
        self.step_action(key, &request).await
    }

    /// Reports the claimed step failed with `error`.
    pub async fn fail_step(
        &self,
        key: &ObjectKey,
        step: &str,
        error: &str,
    ) -> Result<WorkflowInstance, ClientError> {
        let mut request = StepActionRequest::new(StepActionKind::Fail, step);
        request.error = Some(error.to_string());
        self.step_action(key, &request).await
    }

    /// Appends a log line about a step the caller owns.
    pub async fn log_step(
        &self,
        key: &ObjectKey,
        step: &str,
        level: LogLevel,
        message: &str,
    ) -> Result<WorkflowInstance, ClientError> {
        let mut request = StepActionRequest::new(StepActionKind::Log, step);
        request.level = Some(level);
        request.message = Some(message.to_string());
        self.step_action(key, &request).await
    }

    /// The object's kept workflow instances whole (each joined with its
    /// definition; finished ones replayed from the step log), oldest
    /// first: what `why` and `analyze` render.
    pub async fn workflows(&self, key: &ObjectKey) -> Result<WorkflowStatus, ClientError> {
        let path = format!("{}/workflows", object_path(key));
        self.call(self.request(Method::GET, &path)).await
    }

    /// The object's step log (transitions and owners' lines), time order.
    pub async fn step_logs(
        &self,
        key: &ObjectKey,
        query: &StepLogQuery,
    ) -> Result<Vec<StepLogEntry>, ClientError> {
        let path = format!("{}/steplogs", object_path(key));
        let params: Vec<(&str, &String)> = [
            ("step", &query.step),
            ("owner", &query.owner),
            ("workflow", &query.workflow),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.as_ref().map(|value| (name, value)))
        .collect();
        self.call(self.request(Method::GET, &path).query(&params))
            .await
    }

    /// Changes to objects of `kind` after store revision `after`, as they
    /// happen. The stream ends when the server ends it or on error.
    pub async fn watch(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: Option<&str>,
        after: u64,
    ) -> Result<impl Stream<Item = Result<WatchEvent, ClientError>> + Send + use<>, ClientError>
    {
        let scope = runtime::Scope {
            namespace: namespace.map(str::to_string),
            ..runtime::Scope::all(kind)
        };
        let mut query = Vec::new();
        if let Some(name) = name {
            query.push(("name", name.to_string()));
        }
        self.open_watch(&scope, query, after).await
    }

    /// Changes to the objects in `scope` after store revision `after`. A
    /// node-scoped watch also delivers, as a deletion, each object that
    /// leaves the node. An expired `after` is a 410 error.
    pub async fn watch_scope(
        &self,
        scope: &runtime::Scope,
        after: u64,
    ) -> Result<impl Stream<Item = Result<WatchEvent, ClientError>> + Send + use<>, ClientError>
    {
        self.open_watch(scope, Vec::new(), after).await
    }

    async fn open_watch(
        &self,
        scope: &runtime::Scope,
        mut query: Vec<(&'static str, String)>,
        after: u64,
    ) -> Result<impl Stream<Item = Result<WatchEvent, ClientError>> + Send + use<>, ClientError>
    {
        query.push(("watch", "true".to_string()));
        query.push(("resourceVersion", after.to_string()));
        query.extend(scope.query());
        let path = collection_path(scope.kind, scope.namespace.as_deref());
        let response = self
            .execute(self.request(Method::GET, &path).query(&query))
            .await?;
        let status = response.status();
        if !status.is_success() {
            let body = response.bytes().await.unwrap_or_default();
            return Err(api_error(status, &body));
        }
        let mut bytes = response.bytes_stream();
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut buffer: Vec<u8> = Vec::new();
            loop {
                // Stop reading (and so close the connection) once the
                // stream's receiver is gone, even if no event comes.
                let chunk = tokio::select! {
                    chunk = bytes.next() => chunk,
                    () = sender.closed() => return,
                };
                let Some(chunk) = chunk else { break };
                let chunk = match chunk {
                    Ok(chunk) => chunk,
                    Err(error) => {
                        let _ = sender
                            .send(Err(ClientError::Watch(error.to_string())))
                            .await;
                        return;
                    }
                };
                buffer.extend_from_slice(&chunk);
                let mut start = 0;
                while let Some(end) = buffer[start..].iter().position(|b| *b == b'\n') {
                    let line = &buffer[start..start + end];
                    start += end + 1;
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    if sender.send(decode_watch_line(line)).await.is_err() {
                        return; // the stream was dropped
                    }
                }
                buffer.drain(..start);
            }
        });
        Ok(futures::stream::unfold(
            receiver,
            |mut receiver| async move { receiver.recv().await.map(|item| (item, receiver)) },
        ))
    }

    /// One page of the objects in `scope`: at most `limit`, after the
    /// position `continue_token` (from the previous page) names.
    pub async fn list_scope_page(
        &self,
        scope: &runtime::Scope,
        limit: usize,
        continue_token: Option<&str>,
    ) -> Result<ObjectList, ClientError> {
        let mut query = scope.query();
        query.push(("limit", limit.max(1).to_string()));
        if let Some(token) = continue_token {
            query.push(("continue", token.to_string()));
        }
        let path = collection_path(scope.kind, scope.namespace.as_deref());
        self.call(self.request(Method::GET, &path).query(&query))
            .await
    }

    /// Every object in `scope`, read [`LIST_PAGE`] at a time; the
    /// resourceVersion is the first page's, so a watch from it misses
    /// nothing.
    pub async fn list_scope_all(&self, scope: &runtime::Scope) -> Result<ObjectList, ClientError> {
        let mut list = self.list_scope_page(scope, LIST_PAGE, None).await?;
        let mut next = list.continue_token.take();
        while let Some(token) = next {
            let page = self.list_scope_page(scope, LIST_PAGE, Some(&token)).await?;
            list.items.extend(page.items);
            next = page.continue_token;
        }
        Ok(list)
    }
}

fn scope(kind: Kind, namespace: Option<&str>, selector: Option<&str>) -> runtime::Scope {
    runtime::Scope {
        namespace: namespace.map(str::to_string),
        selector: selector.map(str::to_string),
        ..runtime::Scope::all(kind)
    }
}

fn decode_watch_line(line: &[u8]) -> Result<WatchEvent, ClientError> {
    let value: serde_json::Value = serde_json::from_slice(line).map_err(ClientError::Decode)?;
    if value.get("type").and_then(|t| t.as_str()) == Some("ERROR") {
        let message = value
            .pointer("/error/message")
            .and_then(|m| m.as_str())
            .unwrap_or("the server ended the watch");
        // A window that moved on is told apart, so watchers list again.
        if value.pointer("/error/code").and_then(|c| c.as_str()) == Some("Gone") {
            return Err(ClientError::Api {
                status: StatusCode::GONE.as_u16(),
                code: "Gone".to_string(),
                message: message.to_string(),
                fields: Vec::new(),
            });
        }
        return Err(ClientError::Watch(message.to_string()));
    }
    serde_json::from_value(value).map_err(ClientError::Decode)
}

fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(error) => ClientError::Api {
            status: status.as_u16(),
            code: error.code,
            message: error.message,
            fields: error.fields,
        },
        Err(_) => ClientError::Api {
            status: status.as_u16(),
            code: status.canonical_reason().unwrap_or("Error").to_string(),
            message: format!(
                "the server answered {status}: {}",
                String::from_utf8_lossy(body).trim()
            ),
            fields: Vec::new(),
        },
    }
}
