//! `--datastore` for `corral up` and `corral server` (which store the
//! control plane runs on: SQLite in the data dir by default, or an etcd
//! cluster) and `corral migrate` between them. The flags only; opening and
//! copying stores is `corral_server::datastore`'s.

use std::path::PathBuf;

use clap::Args;
use corral_server::datastore::{DatastoreConfig, EtcdTlsFiles};

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
    fn files(&self) -> EtcdTlsFiles {
        EtcdTlsFiles {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        }
    }
}

impl DatastoreArgs {
    /// The datastore as the server takes it.
    pub fn config(&self) -> DatastoreConfig {
        DatastoreConfig {
            url: self.datastore.clone(),
            etcd_tls: self.etcd_tls.files(),
        }
    }
}

/// `corral migrate`: copy a cluster's store to another backend.
#[derive(Debug, Args)]
#[command(after_help = "\
Stop the server before migrating: writes made after the copy are not moved.
Then start every server on the new store with the same CA, so existing
client configs and tokens keep working.

Examples:
  corral migrate --from sqlite:/var/lib/corral/store.db --to etcd://10.0.0.1:2379,10.0.0.2:2379
                                      copy the SQLite store into etcd, under /corral
  corral migrate --from sqlite:/var/lib/corral/store.db --to 'etcd://10.0.0.1:2379?prefix=/staging'
                                      under the prefix /staging instead
  corral server --datastore etcd://10.0.0.1:2379,10.0.0.2:2379 --tls-dir /var/lib/corral/tls \\
      --cluster-prefix \"$(jq -r .prefix /var/lib/corral/cluster.json)\"
                                      then serve the same cluster from etcd")]
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
    let migration =
        corral_server::datastore::migrate(&args.from, &args.to, &args.etcd_tls.files()).await?;
    println!(
        "migrated {} from {} to {}",
        migration.summary,
        migration.from.display(),
        migration.to
    );
    Ok(())
}
