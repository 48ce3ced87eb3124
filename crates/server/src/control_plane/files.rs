//! What the control plane keeps in its data dir: client configs (the
//! admin's, and on `corral up` the node's), the built-in controllers'
//! tokens and the cluster's settings (its prefix, fixed at first start).
//! Secrets are written readable by root only.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use corral_api::Identity;
use corral_client::ClientConfig;
use corral_ipam::{ClusterPrefix, IpamError};
use serde::{Deserialize, Serialize};

use super::ControlPlaneError;
use crate::ownership::BuiltinTokens;
use crate::{SharedServer, TokenIssuer};

/// The admin's client config (operator role).
pub const ADMIN_CONFIG: &str = "admin.json";
/// The node agent's client config inside the data dir of `corral up`.
pub const NODE_CONFIG: &str = "node.json";
/// The cluster's settings chosen at first start.
pub const CLUSTER_FILE: &str = "cluster.json";
/// Where servers before the agent channel's certificates kept the secret
/// they presented to node agents; removed at start.
const OLD_AGENT_SECRET_FILE: &str = "agent-secret";
/// The built-in controllers' tokens.
pub const BUILTIN_TOKENS: &str = "controller-tokens.json";

/// Why a file of the data dir could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is corrupt")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} holds no valid cluster prefix")]
    StoredPrefix {
        path: PathBuf,
        #[source]
        source: IpamError,
    },
    #[error("--cluster-prefix {given}")]
    GivenPrefix {
        given: String,
        #[source]
        source: IpamError,
    },
    #[error(
        "--cluster-prefix {given}: this cluster was created with {stored}, which cannot change"
    )]
    PrefixChanged {
        given: String,
        stored: ClusterPrefix,
    },
    #[error("cannot save a client config")]
    ClientConfig(#[source] corral_client::ConfigError),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClusterSettings {
    prefix: String,
}

/// Creates `path` (and its parents) readable by root only.
pub fn create_private_dir(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

/// Writes `bytes` to `path`, readable by root only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), FilesError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(bytes))
        .map_err(|source| FilesError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// The cluster prefix: as stored at first start, or chosen now and stored.
pub fn cluster_prefix(data_dir: &Path, given: Option<&str>) -> Result<ClusterPrefix, FilesError> {
    let path = data_dir.join(CLUSTER_FILE);
    let parse_given = |given: &str| {
        given
            .parse::<ClusterPrefix>()
            .map_err(|source| FilesError::GivenPrefix {
                given: given.to_string(),
                source,
            })
    };
    if let Ok(text) = std::fs::read_to_string(&path) {
        let settings: ClusterSettings =
            serde_json::from_str(&text).map_err(|source| FilesError::Corrupt {
                path: path.clone(),
                source,
            })?;
        let stored: ClusterPrefix =
            settings
                .prefix
                .parse()
                .map_err(|source| FilesError::StoredPrefix {
                    path: path.clone(),
                    source,
                })?;
        if let Some(given) = given
            && parse_given(given)? != stored
        {
            return Err(FilesError::PrefixChanged {
                given: given.to_string(),
                stored,
            });
        }
        return Ok(stored);
    }
    let prefix = match given {
        Some(given) => parse_given(given)?,
        None => ClusterPrefix::generate_ula(&mut rand::rng()),
    };
    let settings = ClusterSettings {
        prefix: prefix.to_string(),
    };
    // INVARIANT: a struct of one string always serialises.
    #[allow(clippy::unwrap_used)]
    let bytes = serde_json::to_vec_pretty(&settings).unwrap();
    std::fs::write(&path, bytes).map_err(|source| FilesError::Write { path, source })?;
    Ok(prefix)
}

/// Removes the shared agent secret an older server kept: agents now
/// accept only this server's client certificate, so it opens nothing and
/// should not lie around.
pub fn remove_agent_secret(data_dir: &Path) {
    let path = data_dir.join(OLD_AGENT_SECRET_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "removed the old shared agent secret: agents authenticate this server by its client certificate now");
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot remove the old shared agent secret")
        }
    }
}

/// Registers the built-in controllers with the tokens kept in the data
/// dir (new ones for those that no longer authenticate), and keeps them.
pub async fn register_builtins(
    server: &SharedServer,
    data_dir: &Path,
) -> Result<BuiltinTokens, ControlPlaneError> {
    let path = data_dir.join(BUILTIN_TOKENS);
    let known: BuiltinTokens = std::fs::read(&path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default();
    let tokens = crate::ownership::register_builtins(server, &known)
        .await
        .map_err(ControlPlaneError::Builtins)?;
    if tokens != known {
        // INVARIANT: a map of strings always serialises.
        #[allow(clippy::unwrap_used)]
        let bytes = serde_json::to_vec_pretty(&tokens).unwrap();
        write_private(&path, &bytes)?;
    }
    Ok(tokens)
}

/// A token for `identity`, kept in the config at `path` across restarts; a
/// new one if the config is missing or its token is unknown to this store.
pub async fn identity_token(
    server: &SharedServer,
    path: &Path,
    identity: Identity,
) -> Result<String, ControlPlaneError> {
    let failed = |identity: &Identity| {
        let name = identity.name.clone();
        move |source| ControlPlaneError::Token {
            identity: name,
            source,
        }
    };
    if let Ok(existing) = ClientConfig::load(path)
        && server
            .tokens
            .resolve(&existing.token, server.clock.now())
            .await
            .map_err(failed(&identity))?
            .as_ref()
            == Some(&identity)
    {
        return Ok(existing.token);
    }
    let name = failed(&identity);
    TokenIssuer::issue(&*server.store, &*server.clock, identity)
        .await
        .map_err(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_prefix_is_fixed_at_first_start() {
        let dir = tempfile::tempdir().unwrap();
        let chosen = cluster_prefix(dir.path(), Some("fd12:3456:789a::/48")).unwrap();
        assert_eq!(chosen.to_string(), "fd12:3456:789a::/48");
        assert_eq!(cluster_prefix(dir.path(), None).unwrap(), chosen);
        assert_eq!(
            cluster_prefix(dir.path(), Some("fd12:3456:789a::/48")).unwrap(),
            chosen
        );
        let error = cluster_prefix(dir.path(), Some("fd00:1::/48")).unwrap_err();
        assert!(error.to_string().contains("which cannot change"), "{error}");
    }

    #[test]
    fn a_random_prefix_is_a_ula_48_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let chosen = cluster_prefix(dir.path(), None).unwrap();
        assert_eq!(chosen.net().prefix_len(), 48);
        assert_eq!(cluster_prefix(dir.path(), None).unwrap(), chosen);
    }

    #[test]
    fn the_old_agent_secret_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(OLD_AGENT_SECRET_FILE), "s3cret").unwrap();
        remove_agent_secret(dir.path());
        assert!(!dir.path().join(OLD_AGENT_SECRET_FILE).exists());
        remove_agent_secret(dir.path());
    }
}
