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
pub mod secrets;
pub mod security;
pub mod token;
pub mod up;
pub mod vm;
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

/// Reads `key`'s spec as `S`, changes it with `change` and writes it back
/// carrying the resourceVersion read, so a concurrent edit of the spec is
/// refused rather than overwritten. A conflict caused only by status writes
/// (a controller or node reporting; the spec revision did not move) is not
/// an edit: the change is made again on the fresh object, a few times.
/// Returns the written object, the spec written and what `change` returned.
pub async fn update_spec<S, T>(
    client: &Client,
    key: &corral_api::ObjectKey,
    message: impl Fn(&S) -> String,
    change: impl Fn(&mut S) -> anyhow::Result<T>,
) -> anyhow::Result<(corral_api::Object, S, T)>
where
    S: serde::Serialize + serde::de::DeserializeOwned + Clone,
{
    const ATTEMPTS: usize = 5;
    let read = |object: &corral_api::Object| -> anyhow::Result<S> {
        let spec = if object.spec.is_null() {
            serde_json::json!({})
        } else {
            object.spec.clone()
        };
        serde_json::from_value(spec).with_context(|| format!("{key} has an unreadable spec"))
    };
    let mut object = client.get(key).await?;
    let mut spec = read(&object)?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut changed = spec.clone();
        let outcome = change(&mut changed)?;
        let mut request = object.clone();
        request.spec = serde_json::to_value(&changed)?;
        match client.apply(&request, Some(&message(&spec))).await {
            Ok(written) => return Ok((written, changed, outcome)),
            Err(error) if error.status() == Some(409) && attempt < ATTEMPTS => {
                let fresh = client.get(key).await?;
                if fresh.metadata.revision != object.metadata.revision {
                    anyhow::bail!(
                        "{key} changed meanwhile (revision {} → {}); run the command again",
                        object.metadata.revision,
                        fresh.metadata.revision
                    );
                }
                spec = read(&fresh)?;
                object = fresh;
            }
            Err(error) => return Err(error.into()),
        }
    }
}
