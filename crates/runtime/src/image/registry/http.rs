//! [`HttpRegistry`]: the distribution API over HTTPS (or plain HTTP where
//! allowed), answering 401 challenges with the token or basic flow.
//!
//! Transport rules, per registry `HOST[:PORT]` as written in the reference:
//! - HTTPS, trusting the system's roots plus every `*.crt` in
//!   `<certs dir>/<HOST[:PORT]>/` (containerd's and Docker's layout).
//! - Plain HTTP for registries the operator lists as insecure.
//! - A loopback registry (`localhost`, `127.0.0.0/8`, `::1`) is tried over
//!   HTTPS first and falls back to HTTP only when the server does not speak
//!   TLS at all; a certificate it serves but the node does not trust is an
//!   error there too, never a silent downgrade.

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::{ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::auth::{AuthFile, Challenge, Credentials, TokenCache, TokenResponse, parse_challenge};
use super::{FetchedManifest, MANIFEST_ACCEPT, Registry, RegistryError, host_of};
use crate::image::digest::Digest;
use crate::image::reference::DOCKER_HUB;

/// Where per-registry CA files live unless the node says otherwise.
pub const DEFAULT_CERTS_DIR: &str = "/etc/corral/certs.d";

/// The node's registry credentials file, read when present.
pub const DEFAULT_AUTH_FILE: &str = "/etc/corral/registry-auth.json";

/// The host that serves Docker Hub's distribution API.
const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// How a node reaches registries.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Bounds each whole request, body included.
    pub timeout: Duration,
    /// `<certs dir>/<HOST[:PORT]>/*.crt` are CAs trusted for that registry.
    pub certs_dir: PathBuf,
    /// `HOST[:PORT]` of registries spoken to over plain HTTP.
    pub insecure: Vec<String>,
    /// The node's credentials.
    pub auth: AuthFile,
    /// Bearer tokens, shared by the pulls of a node.
    pub tokens: Arc<TokenCache>,
}

impl RegistryConfig {
    /// HTTPS everywhere, no CA files, no credentials.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            certs_dir: PathBuf::from(DEFAULT_CERTS_DIR),
            insecure: Vec::new(),
            auth: AuthFile::default(),
            tokens: Arc::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Https,
    Http,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Scheme::Https => "https",
            Scheme::Http => "http",
        }
    }
}

/// A registry client (blocking: make, use and drop it on a blocking thread).
#[derive(Debug)]
pub struct HttpRegistry {
    config: RegistryConfig,
    clients: Mutex<HashMap<String, Client>>,
    schemes: Mutex<HashMap<String, Scheme>>,
    basic: Mutex<HashSet<String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only whole values are written under these locks.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The system's trusted roots, read once per process.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let loaded = rustls_native_certs::load_native_certs();
        for error in &loaded.errors {
            tracing::warn!(%error, "cannot read some of the system's CA certificates");
        }
        loaded.certs
    })
}

/// Whether a registry `HOST[:PORT]` is on loopback.
fn is_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => match registry.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
            _ => registry,
        },
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The host serving a registry's API.
fn api_host(registry: &str) -> &str {
    if registry == DOCKER_HUB {
        DOCKER_HUB_API
    } else {
        registry
    }
}

/// What a failed request says about TLS.
#[derive(Debug, PartialEq, Eq)]
enum TlsFailure {
    /// The peer answered with something that is not TLS (a plain HTTP server).
    NotTls,
    /// A TLS problem proper (certificate, protocol), in words.
    Failed(String),
}

fn tls_failure(error: &reqwest::Error) -> Option<TlsFailure> {
    // The connector wraps rustls' error in `io::Error`s (nested), whose
    // `source()` skips the wrapped error itself: they are opened with
    // `get_ref` instead.
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(found) = current.downcast_ref::<rustls::Error>() {
            return Some(match found {
                rustls::Error::InvalidMessage(_) => TlsFailure::NotTls,
                other => TlsFailure::Failed(other.to_string()),
            });
        }
        source = match current.downcast_ref::<io::Error>() {
            Some(io_error) => io_error
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => current.source(),
        };
    }
    None
}

/// One request's answer, or why there is none yet.
enum Attempt {
    Answer(Response),
    Again,
}

impl HttpRegistry {
    pub fn new(config: RegistryConfig) -> Self {
        Self {
            config,
            clients: Mutex::default(),
            schemes: Mutex::default(),
            basic: Mutex::default(),
        }
    }

    /// The CA file a registry's certificate is checked against.
    pub fn ca_path(&self, registry: &str) -> PathBuf {
        self.config.certs_dir.join(registry).join("ca.crt")
    }

    fn scheme(&self, registry: &str) -> Scheme {
        *lock(&self.schemes)
            .entry(registry.to_string())
            .or_insert_with(|| {
                if self.config.insecure.iter().any(|i| i == registry) {
                    Scheme::Http
                } else {
                    Scheme::Https
                }
            })
    }

    /// The client for `host`: system roots plus the host's CA files.
    fn client(&self, host: &str) -> Result<Client, RegistryError> {
        if let Some(client) = lock(&self.clients).get(host) {
            return Ok(client.clone());
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(system_roots().iter().cloned());
        for path in ca_files(&self.config.certs_dir.join(host)) {
            let ca_error = |source| RegistryError::CaFile {
                host: host.to_string(),
                path: path.clone(),
                source,
            };
            let certs = CertificateDer::pem_file_iter(&path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| ca_error(io::Error::new(io::ErrorKind::InvalidData, e)))?;
            if certs.is_empty() {
                return Err(ca_error(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "no PEM certificate in it",
                )));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| ca_error(io::Error::new(io::ErrorKind::InvalidData, e)))?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| RegistryError::CaFile {
                host: host.to_string(),
                path: self.config.certs_dir.join(host),
                source: io::Error::other(e),
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let client = Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(self.config.timeout)
            .use_preconfigured_tls(tls)
            .build()
            .map_err(|source| RegistryError::Client {
                host: host.to_string(),
                source,
            })?;
        lock(&self.clients).insert(host.to_string(), client.clone());
        Ok(client)
    }

    /// `GET <path>` on `registry`, authenticating as its 401 asks.
    fn get(
        &self,
        registry: &str,
        path: &str,
        accept: Option<&str>,
        credentials: Option<&Credentials>,
    ) -> Result<Response, RegistryError> {
        let credentials = credentials.or_else(|| self.config.auth.lookup(registry));
        let scope = pull_scope(path);
        let mut challenged = false;
        let mut downgraded = false;
        loop {
            let scheme = self.scheme(registry);
            let url = format!("{}://{}{path}", scheme.as_str(), api_host(registry));
            let mut request = self.client(registry)?.get(&url);
            if let Some(accept) = accept {
                request = request.header(ACCEPT, accept);
            }
            request = self.authorize(request, registry, &scope, credentials);
            let response = match self.send(request, registry, &url, scheme, &mut downgraded)? {
                Attempt::Answer(response) => response,
                Attempt::Again => continue,
            };
            let status = response.status().as_u16();
            if status == 401 && !challenged {
                challenged = true;
                if self.answer_challenge(registry, &scope, &response, credentials)? {
                    continue;
                }
            }
            if !response.status().is_success() {
                if status == 401 {
                    self.config.tokens.forget(registry, &scope);
                }
                return Err(RegistryError::Status {
                    host: registry.to_string(),
                    url,
                    status,
                    sent_credentials: credentials.is_some(),
                });
            }
            return Ok(response);
        }
    }

    fn authorize(
        &self,
        request: RequestBuilder,
        registry: &str,
        scope: &str,
        credentials: Option<&Credentials>,
    ) -> RequestBuilder {
        if let Some(token) = self.config.tokens.get(registry, scope, Instant::now()) {
            return request.bearer_auth(token);
        }
        match credentials {
            Some(c) if lock(&self.basic).contains(registry) => {
                request.basic_auth(&c.username, Some(&c.password))
            }
            _ => request,
        }
    }

    /// Sends a request; a loopback registry that does not speak TLS is
    /// tried again over HTTP (once).
    fn send(
        &self,
        request: RequestBuilder,
        registry: &str,
        url: &str,
        scheme: Scheme,
        downgraded: &mut bool,
    ) -> Result<Attempt, RegistryError> {
        let error = match request.send() {
            Ok(response) => return Ok(Attempt::Answer(response)),
            Err(error) => error,
        };
        match (scheme, tls_failure(&error)) {
            (Scheme::Https, Some(TlsFailure::NotTls)) if is_loopback(registry) && !*downgraded => {
                tracing::debug!(registry, "loopback registry does not speak TLS; using HTTP");
                *downgraded = true;
                lock(&self.schemes).insert(registry.to_string(), Scheme::Http);
                Ok(Attempt::Again)
            }
            (Scheme::Https, Some(failure)) => Err(RegistryError::Tls {
                host: registry.to_string(),
                detail: match failure {
                    TlsFailure::NotTls => "the server does not speak TLS".to_string(),
                    TlsFailure::Failed(detail) => detail,
                },
                ca_path: self.ca_path(registry),
            }),
            _ => Err(RegistryError::Http {
                url: url.to_string(),
                source: error,
            }),
        }
    }

    /// Acts on a 401's challenge; `true` when the request is worth retrying.
    fn answer_challenge(
        &self,
        registry: &str,
        scope: &str,
        response: &Response,
        credentials: Option<&Credentials>,
    ) -> Result<bool, RegistryError> {
        let header = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        match parse_challenge(header) {
            Some(Challenge::Bearer {
                realm,
                service,
                scope: asked,
            }) => {
                let asked = asked.unwrap_or_else(|| scope.to_string());
                self.fetch_token(
                    registry,
                    &realm,
                    service.as_deref(),
                    &asked,
                    scope,
                    credentials,
                )?;
                Ok(true)
            }
            Some(Challenge::Basic) if credentials.is_some() => {
                lock(&self.basic).insert(registry.to_string());
                Ok(true)
            }
            Some(Challenge::Basic) => Ok(false),
            None if header.is_empty() => Ok(false),
            None => Err(RegistryError::Challenge {
                host: registry.to_string(),
                header: header.split(' ').next().unwrap_or_default().to_string(),
            }),
        }
    }

    /// Gets a token for `asked` from `realm` (with basic credentials when
    /// the node has them) and caches it under `scope`.
    fn fetch_token(
        &self,
        registry: &str,
        realm: &str,
        service: Option<&str>,
        asked: &str,
        scope: &str,
        credentials: Option<&Credentials>,
    ) -> Result<(), RegistryError> {
        let realm_host = host_of(realm);
        let mut query: Vec<(&str, &str)> = vec![("scope", asked)];
        if let Some(service) = service {
            query.push(("service", service));
        }
        let mut request = self.client(&realm_host)?.get(realm).query(&query);
        if let Some(c) = credentials {
            request = request.basic_auth(&c.username, Some(&c.password));
        }
        let bad_token = |source| RegistryError::BadToken {
            host: registry.to_string(),
            realm_host: realm_host.clone(),
            source,
        };
        let response = request.send().map_err(|error| match tls_failure(&error) {
            Some(failure) => RegistryError::Tls {
                host: realm_host.clone(),
                detail: match failure {
                    TlsFailure::NotTls => "the server does not speak TLS".to_string(),
                    TlsFailure::Failed(detail) => detail,
                },
                ca_path: self.ca_path(&realm_host),
            },
            None => bad_token(Some(error)),
        })?;
        if !response.status().is_success() {
            return Err(RegistryError::Token {
                host: registry.to_string(),
                realm_host,
                status: response.status().as_u16(),
                sent_credentials: credentials.is_some(),
            });
        }
        let answer: TokenResponse = response.json().map_err(|e| bad_token(Some(e)))?;
        let (token, lifetime) = answer.into_token().ok_or_else(|| bad_token(None))?;
        self.config
            .tokens
            .put(registry, scope, token, Instant::now(), lifetime);
        Ok(())
    }
}

/// The token scope a pull request needs: `repository:<name>:pull`.
fn pull_scope(path: &str) -> String {
    let repository = path
        .strip_prefix("/v2/")
        .and_then(|rest| {
            rest.rfind("/manifests/")
                .or_else(|| rest.rfind("/blobs/"))
                .map(|end| &rest[..end])
        })
        .unwrap_or_default();
    format!("repository:{repository}:pull")
}

/// The `*.crt` files of a registry's certs dir, sorted; none when it has
/// no dir.
fn ca_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "crt"))
        .collect();
    files.sort();
    files
}

impl Registry for HttpRegistry {
    fn manifest(
        &self,
        registry: &str,
        repository: &str,
        reference: &str,
        credentials: Option<&Credentials>,
    ) -> Result<FetchedManifest, RegistryError> {
        let path = format!("/v2/{repository}/manifests/{reference}");
        let response = self.get(registry, &path, Some(MANIFEST_ACCEPT), credentials)?;
        let url = response.url().to_string();
        let media_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        let bytes = response
            .bytes()
            .map_err(|source| RegistryError::Http { url, source })?;
        Ok(FetchedManifest {
            media_type,
            bytes: bytes.to_vec(),
        })
    }

    fn blob(
        &self,
        registry: &str,
        repository: &str,
        digest: &Digest,
        credentials: Option<&Credentials>,
        sink: &mut dyn Write,
    ) -> Result<(), RegistryError> {
        let path = format!("/v2/{repository}/blobs/{digest}");
        let mut response = self.get(registry, &path, None, credentials)?;
        let url = response.url().to_string();
        response
            .copy_to(sink)
            .map_err(|source| RegistryError::Http { url, source })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for host in [
            "127.0.0.1:5000",
            "127.1.2.3",
            "localhost:5000",
            "[::1]:5000",
            "::1",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "10.0.0.1:5000",
            "registry.example.com",
            "[fd00::1]:5000",
            "docker.io",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn docker_hub_is_served_by_registry_1() {
        assert_eq!(api_host("docker.io"), "registry-1.docker.io");
        assert_eq!(api_host("ghcr.io"), "ghcr.io");
    }

    #[test]
    fn scopes_name_the_repository() {
        assert_eq!(
            pull_scope("/v2/library/busybox/manifests/latest"),
            "repository:library/busybox:pull"
        );
        assert_eq!(
            pull_scope("/v2/a/blobs/b/blobs/sha256:00"),
            "repository:a/blobs/b:pull"
        );
    }

    #[test]
    fn insecure_registries_use_http_and_others_https() {
        let mut config = RegistryConfig::new(Duration::from_secs(1));
        config.insecure = vec!["reg.lan:5000".to_string()];
        config.certs_dir = PathBuf::from("/etc/corral/certs.d");
        let registry = HttpRegistry::new(config);
        assert_eq!(registry.scheme("reg.lan:5000"), Scheme::Http);
        assert_eq!(registry.scheme("reg.lan:5001"), Scheme::Https);
        assert_eq!(registry.scheme("127.0.0.1:5000"), Scheme::Https);
        assert_eq!(
            registry.ca_path("reg.lan:5001"),
            PathBuf::from("/etc/corral/certs.d/reg.lan:5001/ca.crt")
        );
    }

    #[test]
    fn a_ca_file_without_certificates_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let host_dir = dir.path().join("reg.lan:5000");
        std::fs::create_dir(&host_dir).expect("mkdir");
        std::fs::write(host_dir.join("ca.crt"), "not a certificate").expect("write");
        let mut config = RegistryConfig::new(Duration::from_secs(1));
        config.certs_dir = dir.path().to_path_buf();
        let error = HttpRegistry::new(config)
            .client("reg.lan:5000")
            .expect_err("bad CA file");
        assert!(
            matches!(&error, RegistryError::CaFile { host, path, .. } if host == "reg.lan:5000" && path.ends_with("reg.lan:5000/ca.crt")),
            "{error}"
        );
    }
}
