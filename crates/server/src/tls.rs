//! TLS for the API: the API speaks HTTPS only. At first start the server
//! makes a cluster CA (kept in `DATA/tls/`, the key readable by root only);
//! at every start it issues itself a certificate for its names and
//! addresses signed by that CA. Clients trust the CA (its PEM is in their
//! config), never the system roots. The same CA signs the agent channel's
//! certificates ([`crate::agent_tls`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

const CA_NAME: &str = "corral cluster CA";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot make a certificate")]
    Certificate(#[from] rcgen::Error),
    #[error("the TLS configuration is invalid")]
    Rustls(#[from] rustls::Error),
    #[error("cannot set up the agent channel's certificates")]
    AgentTls(#[from] crate::agent_tls::AgentTlsError),
}

/// What the API server needs to serve TLS, and what clients need to trust it.
#[derive(Clone)]
pub struct TlsMaterial {
    /// The cluster CA certificate (PEM), for client configs.
    pub ca_pem: String,
    pub server_config: Arc<rustls::ServerConfig>,
    /// The CA's signing side for node agents' and this server's
    /// certificates.
    pub agent: Arc<crate::agent_tls::AgentTls>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial").finish_non_exhaustive()
    }
}

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> TlsError + 'a {
    move |source| TlsError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// The parameters the cluster CA certificate is made with (and its issuer
/// rebuilt from, to sign).
pub fn cluster_ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// Writes `bytes` to `path` readable by root only, durably.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_error("write", path))?;
    file.write_all(bytes).map_err(io_error("write", path))?;
    file.sync_all().map_err(io_error("fsync", path))
}

/// The CA key and certificate in `dir`, made now if absent.
fn cluster_ca(dir: &Path) -> Result<(KeyPair, String), TlsError> {
    let key_path = dir.join("ca-key.pem");
    let cert_path = dir.join("ca.pem");
    if let (Ok(key), Ok(cert)) = (
        std::fs::read_to_string(&key_path),
        std::fs::read_to_string(&cert_path),
    ) {
        return Ok((KeyPair::from_pem(&key)?, cert));
    }
    std::fs::create_dir_all(dir).map_err(io_error("create", dir))?;
    let key = KeyPair::generate()?;
    let cert = cluster_ca_params().self_signed(&key)?.pem();
    write_private(&key_path, key.serialize_pem().as_bytes())?;
    write_private(&cert_path, cert.as_bytes())?;
    Ok((key, cert))
}

/// The names a server certificate covers: `localhost`, the loopback
/// addresses, the host name, the listen address, and with an unspecified
/// listen address every address of this host's interfaces; plus `extra`.
pub fn server_names(listen: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if let Ok(host) = nix::unistd::gethostname()
        && let Some(host) = host.to_str()
    {
        names.push(host.to_string());
    }
    if listen.ip().is_unspecified() {
        if let Ok(addresses) = nix::ifaddrs::getifaddrs() {
            for address in addresses {
                let ip = address.address.and_then(|a| {
                    a.as_sockaddr_in()
                        .map(|v4| IpAddr::V4(v4.ip()))
                        .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
                });
                if let Some(ip) = ip.filter(|ip| !ip.is_unspecified()) {
                    names.push(ip.to_string());
                }
            }
        }
    } else {
        names.push(listen.ip().to_string());
    }
    names.extend(extra.iter().cloned());
    names.sort();
    names.dedup();
    names
}

/// The CA in `dir` (made on first use) and a fresh server certificate for
/// `names` signed by it.
pub fn load_or_create(dir: &Path, names: &[String]) -> Result<TlsMaterial, TlsError> {
    let (ca_key, ca_pem) = cluster_ca(dir)?;
    // The issuer is rebuilt from the same parameters and key as the stored
    // CA certificate: same subject, same key identifier, so what it signs
    // chains to that certificate.
    let agent = crate::agent_tls::AgentTls::new(
        cluster_ca_params(),
        KeyPair::from_pem(&ca_key.serialize_pem())?,
        ca_pem.clone(),
    )?;
    let issuer = Issuer::new(cluster_ca_params(), ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "corral API server");
    params.distinguished_name = name;
    let cert = params.signed_by(&key, &issuer)?;
    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, private)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsMaterial {
        ca_pem,
        server_config: Arc::new(config),
        agent: Arc::new(agent),
    })
}

/// A TCP listener whose connections are TLS. Handshakes run concurrently
/// (a slow or plain-HTTP client never holds up others) and a failed one
/// closes only its connection.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("tcp", &self.tcp)
            .field("handshakes", &self.handshakes.len())
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    pub fn new(tcp: TcpListener, material: &TlsMaterial) -> Self {
        TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(material.server_config.clone()),
            handshakes: JoinSet::new(),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                accepted = self.tcp.accept() => match accepted {
                    Ok((stream, address)) => {
                        // Answers go out as soon as they are written: with
                        // Nagle's algorithm a response written in two parts
                        // waited for the client's delayed ACK (40 ms).
                        if let Err(error) = stream.set_nodelay(true) {
                            tracing::debug!(%address, %error, "cannot set TCP_NODELAY");
                        }
                        let acceptor = self.acceptor.clone();
                        self.handshakes.spawn(async move {
                            let handshake = acceptor.accept(stream);
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                                Ok(Ok(tls)) => Some((tls, address)),
                                Ok(Err(error)) => {
                                    tracing::debug!(%address, %error, "TLS handshake failed");
                                    None
                                }
                                Err(_) => None,
                            }
                        });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_made_once_and_kept_private() {
        let dir = tempfile::tempdir().expect("temp dir");
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let first = load_or_create(dir.path(), &names).expect("first start");
        let second = load_or_create(dir.path(), &names).expect("second start");
        assert_eq!(first.ca_pem, second.ca_pem, "the CA survives restarts");
        assert!(first.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("ca-key.pem"))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn server_names_cover_loopback_and_the_listen_address() {
        let names = server_names(
            "10.1.2.3:7443".parse().expect("addr"),
            &["api.example".into()],
        );
        for name in ["localhost", "127.0.0.1", "::1", "10.1.2.3", "api.example"] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
    }
}
