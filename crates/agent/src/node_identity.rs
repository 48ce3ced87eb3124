//! Who this node is: its default name, and the node token it acts with.
//!
//! `corral agent --join-token T` exchanges the join token for the node's
//! own token once (`POST /v1/join`) and keeps that in
//! `DATA/node-NAME.json`, fsynced before it is used; later starts under the
//! same name use the kept one. Named after the node: a changed `--name`
//! joins again (and is refused if that name belongs to a live node)
//! instead of acting as the old one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_client::{Client, ClientConfig, ClientError, ConfigError};

/// How long to wait before asking an unreachable server again.
const JOIN_RETRY: Duration = Duration::from_secs(2);

/// Why the node has no identity.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("the node identity kept at {path} is unreadable")]
    Kept {
        path: PathBuf,
        #[source]
        source: ConfigError,
    },
    #[error("cannot keep the node identity")]
    Save(#[source] ConfigError),
    #[error("cannot make a client to join with")]
    Client(#[source] ClientError),
    #[error("joining the cluster as node {node}")]
    Refused {
        node: String,
        #[source]
        source: ClientError,
    },
}

/// The machine's hostname, lowercased, as a default node name (`node-1`
/// when it is not a DNS label).
pub fn default_node_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| corral_api::validate::is_dns_label(name))
        .unwrap_or_else(|| "node-1".to_string())
}

/// The node's own client config: the one kept from an earlier join, or a
/// new one for which `join_token` is exchanged now (kept, fsynced, before
/// it is used). A server that cannot be reached yet is retried; a refusal
/// (expired or unknown token, a name already taken) is an error.
pub async fn node_identity(
    join: ClientConfig,
    join_token: &str,
    node: &str,
    data_dir: &Path,
) -> Result<ClientConfig, IdentityError> {
    let path = data_dir.join(format!("node-{node}.json"));
    if path.exists() {
        let kept = ClientConfig::load(&path).map_err(|source| IdentityError::Kept {
            path: path.clone(),
            source,
        })?;
        tracing::info!(path = %path.display(), "using the node identity kept from an earlier join");
        return Ok(ClientConfig {
            server: join.server,
            ca: join.ca.or(kept.ca),
            token: kept.token,
        });
    }
    let client = Client::new(&ClientConfig {
        token: join_token.to_string(),
        ..join.clone()
    })
    .map_err(IdentityError::Client)?;
    let joined = loop {
        match client.join(node).await {
            Ok(joined) => break joined,
            Err(error) if error.status().is_none() => {
                tracing::warn!(%error, "cannot reach the server to join yet; retrying");
                tokio::time::sleep(JOIN_RETRY).await;
            }
            Err(source) => {
                return Err(IdentityError::Refused {
                    node: node.to_string(),
                    source,
                });
            }
        }
    };
    let config = ClientConfig {
        token: joined.token,
        ..join
    };
    config.save(&path).map_err(IdentityError::Save)?;
    tracing::info!(node, path = %path.display(), "joined the cluster; the node's identity is kept");
    Ok(config)
}
