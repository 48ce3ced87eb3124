//! A typed client of the corral API, used by the CLI, the node agent and
//! controllers, and the client config file (`server`, `token`).
//!
//! It knows URLs and wire types; it makes no decisions. Every call has a
//! timeout except watches, which stream until dropped.

mod cluster;
mod config;
pub mod exec_protocol;
mod objects;
mod pod_io;
pub mod runtime;
mod steps;
mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use corral_api::{FieldError, Identity, Kind, ObjectKey};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;

pub use config::{ClientConfig, ConfigError};
pub use objects::DeleteOptions;
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
    /// A file to upload could not be read.
    #[error("cannot read {file:?} to upload it")]
    Upload {
        file: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
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
    /// The fencing period granted with this renewal, in seconds (absent
    /// from older servers).
    #[serde(default)]
    pub fence_after_seconds: Option<u64>,
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
    /// Answers the informers' lists and watches in-process, when the
    /// server installed it ([`runtime::LocalReads`]).
    local: Option<Arc<dyn runtime::LocalReads>>,
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
            local: None,
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
            // A copy to send elsewhere only when there is an elsewhere: with
            // one server (most clients) a request is not copied.
            let spare = (tries_left > 1)
                .then(|| {
                    request
                        .try_clone()
                        .map(|spare| (spare, self.server().to_string()))
                })
                .flatten();
            match http.execute(request).await {
                Ok(response) => return Ok(response),
                Err(source) if source.is_connect() && tries_left > 1 => {
                    let Some((mut next, from)) = spare else {
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
}

pub(crate) fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
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
