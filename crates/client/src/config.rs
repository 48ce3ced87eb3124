//! The client config file: where the API is and which token to present.
//!
//! Looked up in this order: `--config PATH`, `$CORRAL_CONFIG`, then the
//! config `corral up` writes in its default data dir.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// Base URL of the API server, e.g. `https://127.0.0.1:7443`.
    pub server: String,
    /// Bearer token.
    pub token: String,
    /// The cluster CA certificate (PEM) the server's certificate must
    /// chain to; the only root trusted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path} is not valid: expected JSON with server and token")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot write config {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ClientConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Writes the config readable by its owner only, atomically (write to a
    /// temporary file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let error = |source| ConfigError::Write {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(error)?;
        }
        let temporary = path.with_extension("tmp");
        let mut options = fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(&temporary).map_err(error)?;
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        file.write_all(text.as_bytes()).map_err(error)?;
        file.sync_all().map_err(error)?;
        fs::rename(&temporary, path).map_err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/config.json");
        let config = ClientConfig {
            ca: None,
            server: "http://127.0.0.1:1".into(),
            token: "t".into(),
        };
        config.save(&path).unwrap();
        assert_eq!(ClientConfig::load(&path).unwrap(), config);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        fs::write(&path, "{").unwrap();
        assert!(matches!(
            ClientConfig::load(&path),
            Err(ConfigError::Parse { .. })
        ));
    }
}
