//! `--datastore` for `corral up` and `corral server`: which store the
//! control plane runs on (SQLite in the data dir by default, or an etcd
//! cluster), and `corral migrate` between them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use corral_store::Store;
use corral_store::sqlite::SqliteStore;
use corral_store_etcd::leader::{self, FencePolicy};
use corral_store_etcd::{Datastore, EtcdConfig, EtcdStore};
use tokio_util::sync::CancellationToken;

/// Where the control plane keeps the cluster's state.
#[derive(Debug, Clone, Args)]
pub struct DatastoreArgs {
    /// The store: sqlite:PATH (default: DATA/store.db),
    /// etcd://HOST:PORT[,HOST:PORT…] or etcds://HOST:PORT[,…] (TLS to etcd).
    /// Several corral servers on one etcd serve the same cluster.
    #[arg(long, value_name = "URL", env = "CORRAL_DATASTORE")]
    pub datastore: Option<String>,
    #[command(flatten)]
    pub etcd_tls: EtcdTlsArgs,
}

/// TLS to etcd, beyond what an `etcds://…?ca=&cert=&key=` URL says.
#[derive(Debug, Clone, Args)]
pub struct EtcdTlsArgs {
    /// CA certificate (PEM) that signed the etcd members' certificates.
    #[arg(long, value_name = "PATH")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's client-certificate auth.
    #[arg(long, value_name = "PATH", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, value_name = "PATH", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdTlsArgs {
    /// `config` with these files applied.
    fn apply(&self, config: EtcdConfig) -> EtcdConfig {
        config.with_tls_files(
            self.etcd_ca.clone(),
            self.etcd_cert.clone(),
            self.etcd_key.clone(),
        )
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

impl DatastoreArgs {
    /// The parsed datastore, SQLite in `data_dir` when none was given.
    pub fn datastore(&self, data_dir: &Path) -> anyhow::Result<Datastore> {
        let Some(url) = &self.datastore else {
            return Ok(Datastore::Sqlite(data_dir.join("store.db")));
        };
        Ok(match Datastore::parse(url).context("--datastore")? {
            Datastore::Etcd(config) => Datastore::Etcd(self.etcd_tls.apply(config)),
            sqlite => sqlite,
        })
    }
}

/// Opens the store a datastore names.
pub async fn open(datastore: &Datastore) -> anyhow::Result<OpenedStore> {
    match datastore {
        Datastore::Sqlite(path) => {
            let path = path.clone();
            let store = tokio::task::spawn_blocking(move || SqliteStore::open(&path))
                .await?
                .with_context(|| format!("cannot open the SQLite store {}", display(datastore)))?;
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

async fn connect(config: &EtcdConfig) -> anyhow::Result<EtcdStore> {
    EtcdStore::connect(config)
        .await
        .with_context(|| format!("cannot reach etcd at {}", config.endpoints.join(",")))
}

fn display(datastore: &Datastore) -> String {
    match datastore {
        Datastore::Sqlite(path) => path.display().to_string(),
        Datastore::Etcd(config) => config.endpoints.join(","),
    }
}

/// Controller leadership of a server on etcd: the fencing policy its store
/// enforces and the campaign loop.
#[derive(Clone)]
pub struct Leadership {
    etcd: EtcdStore,
    policy: Arc<FencePolicy>,
    candidate: String,
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

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("candidate", &self.candidate)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Leadership {
    /// Writes by these authors need leadership.
    pub fn fence_authors(&self, authors: impl IntoIterator<Item = String>) {
        self.policy.add_authors(authors);
    }

    /// Campaigns until `shutdown`; each time this server wins, `start`
    /// runs the leader-only work under a token cancelled when leadership
    /// is lost.
    pub async fn lead(
        self,
        shutdown: CancellationToken,
        start: impl Fn(CancellationToken) -> anyhow::Result<()>,
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
                    error = format!("{error:#}"),
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

/// `corral migrate`: copy a cluster's store to another backend.
#[derive(Debug, Args)]
#[command(after_help = "\
Stop the server before migrating: writes made after the copy are not moved.
Then start every server on the new store with the same CA, so existing
client configs and tokens keep working:

  corral migrate --from sqlite:/var/lib/corral/store.db --to etcd://10.0.0.1:2379,10.0.0.2:2379
  corral server --datastore etcd://10.0.0.1:2379,10.0.0.2:2379 \\
      --tls-dir /var/lib/corral/tls --cluster-prefix <the cluster's prefix>")]
pub struct MigrateArgs {
    /// The store to copy: sqlite:PATH (a corral data dir's store.db).
    #[arg(long, value_name = "URL")]
    pub from: String,
    /// Where to: etcd://HOST:PORT[,…] or etcds://… (`?prefix=/NAME` for a
    /// prefix other than /corral). The prefix must be empty.
    #[arg(long, value_name = "URL")]
    pub to: String,
    #[command(flatten)]
    pub etcd_tls: EtcdTlsArgs,
}

pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let Datastore::Sqlite(path) = Datastore::parse(&args.from).context("--from")? else {
        anyhow::bail!(
            "--from {}: only a sqlite:PATH store can be migrated from",
            args.from
        );
    };
    // Opening a missing file would create an empty store: refuse instead.
    anyhow::ensure!(
        path.is_file(),
        "--from {}: no SQLite store at {}",
        args.from,
        path.display()
    );
    let Datastore::Etcd(config) = Datastore::parse(&args.to).context("--to")? else {
        anyhow::bail!("--to {}: the target must be etcd://… or etcds://…", args.to);
    };
    let config = args.etcd_tls.apply(config);
    let source = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || SqliteStore::open(&path))
            .await?
            .with_context(|| format!("cannot open the SQLite store {}", args.from))?
    };
    let dump = source
        .export()
        .await
        .with_context(|| format!("cannot read the SQLite store {}", path.display()))?;
    let target = connect(&config).await?;
    target
        .import(&dump)
        .await
        .with_context(|| format!("cannot write to etcd at {}", config.endpoints.join(",")))?;
    println!(
        "migrated {} from {} to {}{}",
        dump.summary(),
        path.display(),
        config.endpoints.join(","),
        config.prefix
    );
    Ok(())
}
