//! `corral up`: a whole single-node cluster in one process.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use corral_api::{Identity, Role};
use corral_client::ClientConfig;
use corral_server::{Server, SharedServer, TokenIssuer};
use corral_store::sqlite::SqliteStore;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::{ADMIN_CONFIG, default_data_dir};

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where the store, the admin config and (later) node state live.
    /// Default: /var/lib/corral as root, ~/.local/share/corral otherwise.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Address the API listens on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7443")]
    listen: String,
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    init_logging();
    let data_dir = args.data_dir.unwrap_or_else(default_data_dir);
    create_private_dir(&data_dir)?;
    let store_path = data_dir.join("store.db");
    let store = tokio::task::spawn_blocking(move || SqliteStore::open(&store_path))
        .await?
        .with_context(|| format!("cannot open the store in {}", data_dir.display()))?;
    let server = Server::new(Arc::new(store));
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    super::controllers::register_builtins(&server, &data_dir).await?;

    let config_path = data_dir.join(ADMIN_CONFIG);
    let config = ClientConfig {
        server: format!("http://{address}"),
        token: admin_token(&server, &config_path).await?,
    };
    config.save(&config_path)?;
    println!("export CORRAL_CONFIG={}", config_path.display());
    tracing::info!(api = %config.server, data_dir = %data_dir.display(), "corral is up");

    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let driver = tokio::spawn(corral_server::workflows::drive(
        server.clone(),
        shutdown.clone(),
    ));
    corral_server::serve(listener, server, shutdown.clone())
        .await
        .context("the API server failed")?;
    shutdown.cancel();
    driver.await.context("the workflow driver failed")?;
    tracing::info!("corral stopped");
    Ok(())
}

/// The operator token of the admin config, kept across restarts; a new one
/// if the config is missing or its token is unknown to this store.
async fn admin_token(server: &SharedServer, config_path: &Path) -> anyhow::Result<String> {
    if let Ok(existing) = ClientConfig::load(config_path)
        && server.tokens.resolve(&existing.token).await?.is_some()
    {
        return Ok(existing.token);
    }
    let identity = Identity::new("admin", Role::Operator);
    Ok(TokenIssuer::issue(&*server.store, &*server.clock, identity).await?)
}

fn create_private_dir(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .with_context(|| format!("cannot create data dir {}", path.display()))
}

async fn stop_on_signal(shutdown: CancellationToken) {
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::error!("cannot install signal handlers; stop corral with SIGKILL");
        return;
    };
    tokio::select! {
        _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
    }
    shutdown.cancel();
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CORRAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
