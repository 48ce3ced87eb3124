//! The control plane assembled: what `corral up` and `corral server` run.
//!
//! [`ControlPlane::start`] opens the store (SQLite or etcd, see
//! [`crate::datastore`]), binds the API's TLS listener with a certificate
//! signed by the cluster CA, registers the built-in controllers (their
//! tokens kept in the data dir), fixes the cluster prefix at first start,
//! makes the server's client certificate for node agents
//! ([`crate::agent_tls`]), and writes the admin client config.
//! [`ControlPlane::run`] then starts the built-in controllers, the
//! workflow driver and history compaction — at once on SQLite, and on etcd
//! whenever this server wins the controller leadership — and serves the
//! API until shut down.
//!
//! The files it keeps in the data dir are [`files`]'s.

pub mod files;
mod leader;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use corral_api::history::CompactionPolicy;
use corral_api::{Identity, Role};
use corral_client::ClientConfig;
use corral_controllers::lifecycle::Timing;
use corral_ipam::ClusterPrefix;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::datastore::{self, DatastoreConfig, DatastoreError, Leadership};
use crate::ownership::BuiltinTokens;
use crate::tls::{self, TlsError, TlsListener};
use crate::{ApiError, Server, SharedServer};

pub use files::{ADMIN_CONFIG, BUILTIN_TOKENS, CLUSTER_FILE, NODE_CONFIG};

/// How to start a control plane (the flags of `corral server`).
#[derive(Debug, Clone)]
pub struct ControlPlaneConfig {
    /// Where the store (SQLite), the configs, the TLS files and the
    /// cluster's settings live.
    pub data_dir: PathBuf,
    /// Address the API listens on (`127.0.0.1:7443`).
    pub listen: String,
    /// The cluster's IPv6 prefix, fixed at the first start; `None` picks a
    /// random ULA /48 then.
    pub cluster_prefix: Option<String>,
    /// More names for the server's certificate.
    pub tls_sans: Vec<String>,
    /// Where the cluster CA lives; `None`: `DATA/tls`.
    pub tls_dir: Option<PathBuf>,
    /// The keyring of Secrets' values; `None`: `DATA/secrets-keyring`.
    pub secrets_keyring: Option<PathBuf>,
    /// Node-lifecycle's and the scheduler's silences and graces.
    pub timing: Timing,
    /// Which spec revisions history keeps (compacted at start and hourly).
    pub history_keep: CompactionPolicy,
    pub datastore: DatastoreConfig,
}

/// Why the control plane could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("cannot create data dir {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Datastore(#[from] DatastoreError),
    #[error("cannot listen on {address}")]
    Listen {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up TLS for the API")]
    Tls(#[source] TlsError),
    #[error("cannot register the built-in controllers")]
    Builtins(#[source] ApiError),
    #[error("cannot mint a token for {identity}")]
    Token {
        identity: String,
        #[source]
        source: ApiError,
    },
    #[error(transparent)]
    Files(#[from] files::FilesError),
    #[error(transparent)]
    Keyring(#[from] crate::secrets::KeyringError),
    #[error("the built-in controller {0} has no token")]
    MissingToken(String),
    #[error("cannot make a client for the built-in controller {name}")]
    Client {
        name: String,
        #[source]
        source: corral_client::ClientError,
    },
    #[error("the API server failed")]
    Serve(#[source] std::io::Error),
    #[error("a start-up task stopped")]
    Task(#[source] tokio::task::JoinError),
}

/// A control plane ready to serve.
pub struct ControlPlane {
    server: SharedServer,
    listener: TlsListener,
    url: String,
    ca: String,
    data_dir: PathBuf,
    controller_tokens: BuiltinTokens,
    prefix: ClusterPrefix,
    timing: Timing,
    history_keep: CompactionPolicy,
    /// On etcd: the controllers run only while this server leads.
    leadership: Option<Leadership>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Assembles the control plane (see the module docs); nothing is served
    /// until [`ControlPlane::run`].
    pub async fn start(config: ControlPlaneConfig) -> Result<ControlPlane, ControlPlaneError> {
        let data_dir = config.data_dir.clone();
        files::create_private_dir(&data_dir).map_err(|source| ControlPlaneError::DataDir {
            path: data_dir.clone(),
            source,
        })?;
        let opened = datastore::open(&config.datastore.resolve(&data_dir)?).await?;
        let tcp = TcpListener::bind(&config.listen).await.map_err(|source| {
            ControlPlaneError::Listen {
                address: config.listen.clone(),
                source,
            }
        })?;
        let address = tcp
            .local_addr()
            .map_err(|source| ControlPlaneError::Listen {
                address: config.listen.clone(),
                source,
            })?;
        let tls_dir = config
            .tls_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("tls"));
        let names = tls::server_names(address, &config.tls_sans);
        let tls = tokio::task::spawn_blocking(move || tls::load_or_create(&tls_dir, &names))
            .await
            .map_err(ControlPlaneError::Task)?
            .map_err(ControlPlaneError::Tls)?;
        let listener = TlsListener::new(tcp, &tls);
        let url = client_url(address);
        let (store, leadership) = datastore::with_leadership(opened, &url);
        let server = Server::new(store);
        let controller_tokens = files::register_builtins(&server, &data_dir).await?;
        if let Some(leadership) = &leadership {
            leadership.fence_authors(controller_tokens.keys().cloned());
        }
        let prefix = files::cluster_prefix(&data_dir, config.cluster_prefix.as_deref())?;
        let _ = server.agent_tls.set(tls.agent.clone());
        let fence_after = config.timing.fence_after.num_seconds();
        let _ = server
            .fence_after_seconds
            .set(u64::try_from(fence_after).unwrap_or(0).max(1));
        files::remove_agent_secret(&data_dir);
        let keyring = config
            .secrets_keyring
            .clone()
            .unwrap_or_else(|| data_dir.join(crate::secrets::KEYRING_FILE));
        server
            .secrets
            .install(crate::secrets::Keyring::open_or_create(&keyring)?);
        let plane = ControlPlane {
            server,
            listener,
            url,
            ca: tls.ca_pem,
            data_dir,
            controller_tokens,
            prefix,
            timing: config.timing,
            history_keep: config.history_keep,
            leadership,
        };
        plane
            .client_config(
                &plane.data_dir.join(ADMIN_CONFIG),
                Identity::new("admin", Role::Operator),
            )
            .await?;
        Ok(plane)
    }

    /// The URL clients reach the API at (`https://…`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster CA (PEM) every client config carries.
    pub fn ca_pem(&self) -> &str {
        &self.ca
    }

    /// The cluster's IPv6 prefix.
    pub fn prefix(&self) -> ClusterPrefix {
        self.prefix
    }

    /// The API server's shared state.
    pub fn server(&self) -> &SharedServer {
        &self.server
    }

    /// The admin client config written at start.
    pub fn admin_config_path(&self) -> PathBuf {
        self.data_dir.join(ADMIN_CONFIG)
    }

    /// A client config for `identity` saved at `path`: the token kept there
    /// if it still names `identity` in this store, else a new one.
    pub async fn client_config(
        &self,
        path: &Path,
        identity: Identity,
    ) -> Result<ClientConfig, ControlPlaneError> {
        let config = ClientConfig {
            server: self.url.clone(),
            token: files::identity_token(&self.server, path, identity).await?,
            ca: Some(self.ca.clone()),
        };
        config.save(path).map_err(files::FilesError::ClientConfig)?;
        Ok(config)
    }

    /// Starts the built-in controllers, the workflow driver and history
    /// compaction (on etcd: whenever this server leads) and serves the API
    /// until `shutdown` is cancelled; cancels `shutdown` when serving ends.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ControlPlaneError> {
        let builtins = leader::Builtins {
            url: self.url.clone(),
            ca: self.ca.clone(),
            tokens: self.controller_tokens.clone(),
            prefix: self.prefix,
            timing: self.timing,
            server: self.server.clone(),
            history_keep: self.history_keep,
        };
        match &self.leadership {
            None => builtins.spawn(&shutdown)?,
            Some(leadership) => {
                tokio::spawn(
                    leadership
                        .clone()
                        .lead(shutdown.clone(), move |term| builtins.spawn(&term)),
                );
            }
        }
        let served = crate::serve(self.listener, self.server, shutdown.clone()).await;
        shutdown.cancel();
        served.map_err(ControlPlaneError::Serve)
    }
}

/// The URL a client config carries: an address to connect to, not "any".
fn client_url(address: SocketAddr) -> String {
    let host = if address.ip().is_unspecified() {
        IpAddr::from([127, 0, 0, 1])
    } else {
        address.ip()
    };
    format!("https://{}", SocketAddr::new(host, address.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_urls_name_a_reachable_address() {
        let any: SocketAddr = "0.0.0.0:7443".parse().unwrap();
        assert_eq!(client_url(any), "https://127.0.0.1:7443");
        let v6: SocketAddr = "[fd00::1]:7443".parse().unwrap();
        assert_eq!(client_url(v6), "https://[fd00::1]:7443");
    }
}
