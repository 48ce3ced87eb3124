//! Where the etcd cluster is and how to talk to it: `etcd://` and
//! `etcds://` datastore URLs, TLS files, the key prefix, timeouts.

use std::path::PathBuf;
use std::time::Duration;

/// The key prefix every corral key lives under unless configured.
pub const DEFAULT_PREFIX: &str = "/corral";

/// How long one etcd request may take before it fails (and the caller
/// sees the store as unavailable).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to one endpoint may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// TLS to etcd: the CA that signed the members' certificates and, for
/// client-certificate authentication, this client's certificate and key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// How to reach an etcd cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `http://host:port` or `https://host:port`, one per member.
    pub endpoints: Vec<String>,
    /// Set for `etcds://` URLs (or when TLS files are given).
    pub tls: Option<EtcdTls>,
    /// Every key corral writes starts with this (no trailing slash).
    pub prefix: String,
}

/// Why a datastore URL or TLS setting was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "datastore URL {url:?} is neither sqlite:PATH, etcd://HOST:PORT[,…] nor etcds://HOST:PORT[,…]"
    )]
    UnknownScheme { url: String },
    #[error("datastore URL {url:?} names no etcd endpoint")]
    NoEndpoints { url: String },
    #[error("etcd endpoint {endpoint:?} in {url:?} is not HOST:PORT")]
    BadEndpoint { url: String, endpoint: String },
    #[error("unknown etcd URL option {option:?} (known: prefix, ca, cert, key)")]
    UnknownOption { option: String },
    #[error("an etcd client certificate needs both cert and key")]
    HalfIdentity,
    #[error("reading etcd TLS file {path}")]
    ReadTls {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A parsed `--datastore` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datastore {
    /// `sqlite:PATH` (or a bare path).
    Sqlite(PathBuf),
    Etcd(EtcdConfig),
}

impl Datastore {
    /// Parses `sqlite:PATH`, `etcd://H:P[,H:P…][/?opts]` or
    /// `etcds://H:P[,…][?ca=…&cert=…&key=…&prefix=…]`.
    pub fn parse(url: &str) -> Result<Datastore, ConfigError> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            return Ok(Datastore::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("etcd://") || url.starts_with("etcds://") {
            return EtcdConfig::parse_url(url).map(Datastore::Etcd);
        }
        Err(ConfigError::UnknownScheme {
            url: url.to_string(),
        })
    }
}

impl EtcdConfig {
    /// Plain-HTTP endpoints with the default prefix.
    pub fn new(endpoints: impl IntoIterator<Item = impl Into<String>>) -> EtcdConfig {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            tls: None,
            prefix: DEFAULT_PREFIX.to_string(),
        }
    }

    /// Parses an `etcd://` or `etcds://` URL (see [`Datastore::parse`]).
    pub fn parse_url(url: &str) -> Result<EtcdConfig, ConfigError> {
        let (secure, rest) = if let Some(rest) = url.strip_prefix("etcds://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("etcd://") {
            (false, rest)
        } else {
            return Err(ConfigError::UnknownScheme {
                url: url.to_string(),
            });
        };
        let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
        let hosts = hosts.trim_end_matches('/');
        let scheme = if secure { "https" } else { "http" };
        let mut endpoints = Vec::new();
        for endpoint in hosts.split(',').filter(|host| !host.is_empty()) {
            let valid = endpoint
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !valid || endpoint.contains('/') {
                return Err(ConfigError::BadEndpoint {
                    url: url.to_string(),
                    endpoint: endpoint.to_string(),
                });
            }
            endpoints.push(format!("{scheme}://{endpoint}"));
        }
        if endpoints.is_empty() {
            return Err(ConfigError::NoEndpoints {
                url: url.to_string(),
            });
        }
        let mut config = EtcdConfig {
            endpoints,
            tls: secure.then(EtcdTls::default),
            prefix: DEFAULT_PREFIX.to_string(),
        };
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let tls = || EtcdTls::default();
            match name {
                "prefix" => config.prefix = format!("/{}", value.trim_matches('/')),
                "ca" => config.tls.get_or_insert_with(tls).ca = Some(value.into()),
                "cert" => config.tls.get_or_insert_with(tls).cert = Some(value.into()),
                "key" => config.tls.get_or_insert_with(tls).key = Some(value.into()),
                other => {
                    return Err(ConfigError::UnknownOption {
                        option: other.to_string(),
                    });
                }
            }
        }
        if config.tls.is_some() {
            config.endpoints = config
                .endpoints
                .iter()
                .map(|endpoint| endpoint.replacen("http://", "https://", 1))
                .collect();
        }
        Ok(config)
    }

    /// Adds TLS files given as flags (`--etcd-ca` and friends); any of
    /// them switches the endpoints to https.
    pub fn with_tls_files(
        mut self,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> EtcdConfig {
        if ca.is_none() && cert.is_none() && key.is_none() {
            return self;
        }
        let tls = self.tls.get_or_insert_with(EtcdTls::default);
        tls.ca = ca.or(tls.ca.take());
        tls.cert = cert.or(tls.cert.take());
        tls.key = key.or(tls.key.take());
        self.endpoints = self
            .endpoints
            .iter()
            .map(|endpoint| endpoint.replacen("http://", "https://", 1))
            .collect();
        self
    }

    /// The client options: timeouts, keep-alive and TLS.
    pub(crate) fn connect_options(&self) -> Result<etcd_client::ConnectOptions, ConfigError> {
        let mut options = etcd_client::ConnectOptions::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
            .with_require_leader(true);
        if let Some(tls) = &self.tls {
            let read = |path: &PathBuf| {
                std::fs::read(path).map_err(|source| ConfigError::ReadTls {
                    path: path.clone(),
                    source,
                })
            };
            let mut tls_options = etcd_client::TlsOptions::new();
            if let Some(ca) = &tls.ca {
                tls_options =
                    tls_options.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
            }
            match (&tls.cert, &tls.key) {
                (Some(cert), Some(key)) => {
                    tls_options = tls_options
                        .identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
                }
                (None, None) => {}
                _ => return Err(ConfigError::HalfIdentity),
            }
            options = options.with_tls(tls_options);
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_urls_list_every_member() {
        let config = EtcdConfig::parse_url("etcd://127.0.0.1:2379,127.0.0.1:22379/").unwrap();
        assert_eq!(
            config.endpoints,
            vec!["http://127.0.0.1:2379", "http://127.0.0.1:22379"]
        );
        assert_eq!(config.tls, None);
        assert_eq!(config.prefix, DEFAULT_PREFIX);
    }

    #[test]
    fn etcds_urls_use_https_and_tls_files() {
        let config = EtcdConfig::parse_url(
            "etcds://etcd-1:2379,etcd-2:2379?ca=/pki/ca.pem&cert=/pki/c.pem&key=/pki/c.key&prefix=/team-a/",
        )
        .unwrap();
        assert_eq!(
            config.endpoints,
            vec!["https://etcd-1:2379", "https://etcd-2:2379"]
        );
        let tls = config.tls.unwrap();
        assert_eq!(tls.ca, Some(PathBuf::from("/pki/ca.pem")));
        assert_eq!(tls.cert, Some(PathBuf::from("/pki/c.pem")));
        assert_eq!(tls.key, Some(PathBuf::from("/pki/c.key")));
        assert_eq!(config.prefix, "/team-a");
    }

    #[test]
    fn tls_flags_switch_a_plain_url_to_https() {
        let config = EtcdConfig::parse_url("etcd://127.0.0.1:2379")
            .unwrap()
            .with_tls_files(Some("/ca.pem".into()), None, None);
        assert_eq!(config.endpoints, vec!["https://127.0.0.1:2379"]);
        assert_eq!(
            config.tls.and_then(|tls| tls.ca),
            Some(PathBuf::from("/ca.pem"))
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        assert!(matches!(
            EtcdConfig::parse_url("etcd://"),
            Err(ConfigError::NoEndpoints { .. })
        ));
        assert!(matches!(
            EtcdConfig::parse_url("etcd://host"),
            Err(ConfigError::BadEndpoint { endpoint, .. }) if endpoint == "host"
        ));
        assert!(matches!(
            EtcdConfig::parse_url("etcd://h:1?colour=red"),
            Err(ConfigError::UnknownOption { option }) if option == "colour"
        ));
        assert!(matches!(
            Datastore::parse("mysql://x"),
            Err(ConfigError::UnknownScheme { .. })
        ));
        let half = EtcdConfig::parse_url("etcds://h:1?cert=/c.pem").unwrap();
        assert!(matches!(
            half.connect_options(),
            Err(ConfigError::HalfIdentity)
        ));
    }

    #[test]
    fn datastore_urls_pick_the_backend() {
        assert_eq!(
            Datastore::parse("sqlite:/var/lib/corral/store.db").unwrap(),
            Datastore::Sqlite("/var/lib/corral/store.db".into())
        );
        assert!(matches!(
            Datastore::parse("etcd://127.0.0.1:2379").unwrap(),
            Datastore::Etcd(_)
        ));
    }
}
