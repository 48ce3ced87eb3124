//! One module per group of subcommands.

pub mod apply;
pub mod completion;
pub mod config;
pub mod console;
pub mod controllers;
pub mod datastore;
pub mod describe;
pub mod exec;
pub mod get;
mod get_watch;
pub mod history;
pub mod image;
pub mod lab;
pub mod lb;
pub mod node;
pub mod port_forward;
mod preview;
pub mod rollout;
pub mod security;
pub mod token;
pub mod up;
pub mod workflow;

use std::path::{Path, PathBuf};

use anyhow::Context;
use corral_client::{Client, ClientConfig};

/// The file name of the admin config `corral up` writes in its data dir.
pub use corral_server::control_plane::ADMIN_CONFIG;

/// Where `corral up` keeps its data when not told: `/var/lib/corral` for
/// root, `$XDG_DATA_HOME/corral` (or `~/.local/share/corral`) otherwise.
pub fn default_data_dir() -> PathBuf {
    if is_root() {
        return PathBuf::from("/var/lib/corral");
    }
    if let Some(data) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(data).join("corral");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".local/share/corral")
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// The client config to use: the one given (`--config`, `$CORRAL_CONFIG`),
/// else the named one in use (`corral config use`), else the admin config
/// `corral up` wrote.
pub fn config_path(given: Option<PathBuf>) -> PathBuf {
    given
        .or_else(config::current)
        .unwrap_or_else(|| default_data_dir().join(ADMIN_CONFIG))
}

/// A client for the configured cluster.
pub fn connect(config: Option<PathBuf>) -> anyhow::Result<Client> {
    let path = config_path(config);
    let config = load_config(&path)?;
    Ok(Client::new(&config)?)
}

fn load_config(path: &Path) -> anyhow::Result<ClientConfig> {
    ClientConfig::load(path).with_context(|| {
        format!(
            "no usable client config at {}: start a cluster with `corral up` and run the `export CORRAL_CONFIG=…` line it prints, or pass --config",
            path.display()
        )
    })
}
