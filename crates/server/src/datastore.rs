//! Which store the control plane runs on — SQLite in the data dir by
//! default, or an etcd cluster (`--datastore`) — opening it, controller
//! leadership on etcd, and copying a SQLite cluster into etcd (`corral
//! migrate`). The CLI only passes the operator's words in: it depends on
//! no store crate.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use corral_store::sqlite::SqliteStore;
use corral_store::{Store, StoreError};
use corral_store_etcd::leader::{self, FencePolicy};
use corral_store_etcd::{ConfigError, ConnectError, Datastore, EtcdConfig, EtcdStore, ImportError};
use tokio_util::sync::CancellationToken;

/// TLS files for etcd, beyond what an `etcds://…?ca=&cert=&key=` URL says.
#[derive(Debug, Clone, Default)]
pub struct EtcdTlsFiles {
    /// CA certificate (PEM) that signed the etcd members' certificates.
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's client-certificate auth.
    pub cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    pub key: Option<PathBuf>,
}

impl EtcdTlsFiles {
    fn apply(&self, config: EtcdConfig) -> EtcdConfig {
        config.with_tls_files(self.ca.clone(), self.cert.clone(), self.key.clone())
    }
}

/// Where the control plane keeps the cluster's state, as the operator said it.
#[derive(Debug, Clone, Default)]
pub struct DatastoreConfig {
    /// `sqlite:PATH`, `etcd://HOST:PORT[,…]` or `etcds://…`; `None` is
    /// SQLite in the data dir (`DATA/store.db`).
    pub url: Option<String>,
    pub etcd_tls: EtcdTlsFiles,
}

/// Why a store could not be opened or migrated.
#[derive(Debug, thiserror::Error)]
pub enum DatastoreError {
    #[error("{flag}")]
    Url {
        flag: &'static str,
        #[source]
        source: ConfigError,
    },
    #[error("cannot open the SQLite store {path}")]
    OpenSqlite {
        path: PathBuf,
        #[source]
        source: StoreError,
    },
    #[error("cannot reach etcd at {endpoints}")]
    Connect {
        endpoints: String,
        #[source]
        source: ConnectError,
    },
    #[error("--from {from}: only a sqlite:PATH store can be migrated from")]
    SourceNotSqlite { from: String },
    #[error("--from {from}: no SQLite store at {path}")]
    NoSqliteStore { from: String, path: PathBuf },
    #[error("--to {to}: the target must be etcd://… or etcds://…")]
    TargetNotEtcd { to: String },
    #[error("cannot read the SQLite store {path}")]
    Export {
        path: PathBuf,
        #[source]
        source: StoreError,
    },
    #[error("cannot write to etcd at {endpoints}")]
    Import {
        endpoints: String,
        #[source]
        source: ImportError,
    },
    #[error("the store task stopped")]
    Task(#[source] tokio::task::JoinError),
}

impl DatastoreConfig {
    /// The datastore named, SQLite in `data_dir` when none was given.
    pub fn resolve(&self, data_dir: &Path) -> Result<Datastore, DatastoreError> {
        let Some(url) = &self.url else {
            return Ok(Datastore::Sqlite(data_dir.join("store.db")));
        };
        let parsed = Datastore::parse(url).map_err(|source| DatastoreError::Url {
            flag: "--datastore",
            source,
        })?;
        Ok(match parsed {
            Datastore::Etcd(config) => Datastore::Etcd(self.etcd_tls.apply(config)),
            sqlite => sqlite,
        })
    }
}

/// An opened store, and the etcd handle when it is one (for leadership).
pub struct OpenedStore {
    pub store: Arc<dyn Store>,
    pub etcd: Option<EtcdStore>,
}

impl std::fmt::Debug for OpenedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedStore")
            .field("etcd", &self.etcd)
            .finish_non_exhaustive()
    }
}

/// Opens the store a datastore names.
pub async fn open(datastore: &Datastore) -> Result<OpenedStore, DatastoreError> {
    match datastore {
        Datastore::Sqlite(path) => {
            let store = open_sqlite(path).await?;
            Ok(OpenedStore {
                store: Arc::new(store),
                etcd: None,
            })
        }
        Datastore::Etcd(config) => {
            let store = connect(config).await?;
            Ok(OpenedStore {
                store: Arc::new(store.clone()),
                etcd: Some(store),
            })
        }
    }
}

async fn open_sqlite(path: &Path) -> Result<SqliteStore, DatastoreError> {
    let owned = path.to_path_buf();
    tokio::task::spawn_blocking(move || SqliteStore::open(&owned))
        .await
        .map_err(DatastoreError::Task)?
        .map_err(|source| DatastoreError::OpenSqlite {
            path: path.to_path_buf(),
            source,
        })
}

async fn connect(config: &EtcdConfig) -> Result<EtcdStore, DatastoreError> {
    EtcdStore::connect(config)
        .await
        .map_err(|source| DatastoreError::Connect {
            endpoints: config.endpoints.join(","),
            source,
        })
}

/// Controller leadership of a server on etcd: the fencing policy its store
/// enforces and the campaign loop.
#[derive(Clone)]
pub struct Leadership {
    etcd: EtcdStore,
    policy: Arc<FencePolicy>,
    candidate: String,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("candidate", &self.candidate)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The store the server uses and, on etcd, its leadership. On etcd the
/// store is fenced: writes by the built-in controllers pass only while this
/// server leads (see `corral_store_etcd::leader`).
pub fn with_leadership(
    opened: OpenedStore,
    candidate: &str,
) -> (Arc<dyn Store>, Option<Leadership>) {
    let Some(etcd) = opened.etcd else {
        return (opened.store, None);
    };
    // The built-in controllers' names are added once they are registered
    // (registration itself writes as them). The workflow driver runs only
    // on the leader but is not fenced: rollbacks through the API write as
    // the engine too.
    let policy = FencePolicy::new(Vec::<String>::new());
    let fenced = etcd.with_fencing(policy.clone());
    let leadership = Leadership {
        etcd: fenced.clone(),
        policy,
        candidate: candidate.to_string(),
    };
    (Arc::new(fenced), Some(leadership))
}

impl Leadership {
    /// Writes by these authors need leadership.
    pub fn fence_authors(&self, authors: impl IntoIterator<Item = String>) {
        self.policy.add_authors(authors);
    }

    /// Campaigns until `shutdown`; each time this server wins, `start`
    /// runs the leader-only work under a token cancelled when leadership
    /// is lost.
    pub async fn lead<E: std::error::Error>(
        self,
        shutdown: CancellationToken,
        start: impl Fn(CancellationToken) -> Result<(), E>,
    ) {
        loop {
            let won = tokio::select! {
                () = shutdown.cancelled() => return,
                won = leader::campaign(&self.etcd, &self.candidate) => won,
            };
            let leadership = match won {
                Ok(leadership) => leadership,
                Err(error) => {
                    tracing::warn!(%error, "campaigning for controller leadership failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            self.policy.set(Some(leadership.fence()));
            tracing::info!(candidate = %self.candidate, "leading: starting the built-in controllers");
            let term = shutdown.child_token();
            if let Err(error) = start(term.clone()) {
                tracing::error!(
                    error = crate::error::error_chain(&error),
                    "cannot start the built-in controllers"
                );
            }
            let lost = leadership.lost();
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = lost.cancelled() => {}
            }
            term.cancel();
            self.policy.set(None);
            leadership.resign().await;
            if shutdown.is_cancelled() {
                return;
            }
            tracing::warn!(candidate = %self.candidate, "lost the controller leadership; campaigning again");
        }
    }
}

/// What `corral migrate` copied.
#[derive(Debug, Clone)]
pub struct Migration {
    /// Counts of objects, revisions, tokens and step log entries.
    pub summary: String,
    pub from: PathBuf,
    /// The etcd endpoints and prefix written to.
    pub to: String,
}

/// Copies a stopped SQLite cluster (`from`: `sqlite:PATH`) into an empty
/// etcd prefix (`to`: `etcd://…` or `etcds://…`).
pub async fn migrate(
    from: &str,
    to: &str,
    etcd_tls: &EtcdTlsFiles,
) -> Result<Migration, DatastoreError> {
    let parsed = Datastore::parse(from).map_err(|source| DatastoreError::Url {
        flag: "--from",
        source,
    })?;
    let Datastore::Sqlite(path) = parsed else {
        return Err(DatastoreError::SourceNotSqlite { from: from.into() });
    };
    // Opening a missing file would create an empty store: refuse instead.
    if !path.is_file() {
        return Err(DatastoreError::NoSqliteStore {
            from: from.into(),
            path,
        });
    }
    let parsed = Datastore::parse(to).map_err(|source| DatastoreError::Url {
        flag: "--to",
        source,
    })?;
    let Datastore::Etcd(config) = parsed else {
        return Err(DatastoreError::TargetNotEtcd { to: to.into() });
    };
    let config = etcd_tls.apply(config);
    let source = open_sqlite(&path).await?;
    let dump = source
        .export()
        .await
        .map_err(|source| DatastoreError::Export {
            path: path.clone(),
            source,
        })?;
    let endpoints = config.endpoints.join(",");
    connect(&config)
        .await?
        .import(&dump)
        .await
        .map_err(|source| DatastoreError::Import {
            endpoints: endpoints.clone(),
            source,
        })?;
    Ok(Migration {
        summary: dump.summary(),
        from: path,
        to: format!("{endpoints}{}", config.prefix),
    })
}
