//! The API server's side of the agent channel (logs, exec, console,
//! port-forward, images). The cluster CA that signs the API's certificate
//! also signs:
//!
//! - each node agent's serving certificate, from the node's certificate
//!   signing request (`POST /v1/nodes/{name}/certificate`, with the node's
//!   own token; the key never leaves the node): its only name is
//!   [`node_tls_name`] of the node, its only use server authentication,
//!   valid for [`NODE_CERT_LIFETIME`];
//! - this server's client certificate, made at start with a key kept in
//!   memory only (every server of an HA cluster makes its own from the CA
//!   they share): its only name is [`SERVER_TLS_NAME`], its only use client
//!   authentication. Agents accept no other client.
//!
//! Connecting to an agent ([`AgentTls::connect`]) verifies its certificate
//! against the cluster CA only, for the name of the node the pod or VM is
//! bound to: an agent presenting another node's certificate is refused at
//! the handshake. No shared secret is involved.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use corral_api::kinds::{NodeCertificate, SERVER_TLS_NAME, node_tls_name};
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// How long a node's serving certificate is valid; the agent renews it
/// after two thirds of that.
pub const NODE_CERT_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long this server's client certificate is valid.
const CLIENT_CERT_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);
/// When this server makes itself a new client certificate.
const CLIENT_CERT_RENEW_AFTER: Duration = Duration::from_secs(10 * 24 * 3600);
/// Clocks of nodes and servers may disagree by this much.
const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, thiserror::Error)]
pub enum AgentTlsError {
    #[error("csr: not a valid, self-signed PKCS#10 certificate signing request (PEM)")]
    Csr(#[source] rcgen::Error),
    #[error("cannot make a certificate")]
    Certificate(#[from] rcgen::Error),
    #[error("the cluster CA certificate is not valid PEM")]
    CaPem(#[source] rustls::pki_types::pem::Error),
    #[error("the TLS configuration is invalid")]
    Rustls(#[from] rustls::Error),
    #[error("a validity of {0:?} is out of range")]
    Validity(Duration),
    #[error("agent endpoint {endpoint:?} is not an https://HOST:PORT URL")]
    Endpoint { endpoint: String },
    #[error("cannot resolve agent endpoint {endpoint:?}")]
    Resolve {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build an HTTP client")]
    Client(#[source] reqwest::Error),
}

/// This server's client identity towards agents, renewed as it ages.
struct ClientIdentity {
    config: Arc<rustls::ClientConfig>,
    made: Instant,
}

/// The cluster CA's signing key and what it makes for the agent channel.
pub struct AgentTls {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    roots: Arc<rustls::RootCertStore>,
    node_lifetime: Duration,
    client: Mutex<Option<ClientIdentity>>,
}

impl std::fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTls")
            .field("node_lifetime", &self.node_lifetime)
            .finish_non_exhaustive()
    }
}

fn offset(at: DateTime<Utc>) -> Result<time::OffsetDateTime, AgentTlsError> {
    time::OffsetDateTime::from_unix_timestamp(at.timestamp())
        .map_err(|_| AgentTlsError::Validity(Duration::ZERO))
}

fn later(now: DateTime<Utc>, by: Duration) -> Result<DateTime<Utc>, AgentTlsError> {
    chrono::TimeDelta::from_std(by)
        .ok()
        .and_then(|delta| now.checked_add_signed(delta))
        .ok_or(AgentTlsError::Validity(by))
}

fn earlier(now: DateTime<Utc>, by: Duration) -> Result<DateTime<Utc>, AgentTlsError> {
    chrono::TimeDelta::from_std(by)
        .ok()
        .and_then(|delta| now.checked_sub_signed(delta))
        .ok_or(AgentTlsError::Validity(by))
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
    // A positive DER integer.
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

/// Parameters of a leaf certificate for `name`, used for `usage`, valid
/// from a little before `now` for `lifetime`.
fn leaf_params(
    common_name: &str,
    name: &str,
    usage: ExtendedKeyUsagePurpose,
    now: DateTime<Utc>,
    lifetime: Duration,
) -> Result<(CertificateParams, DateTime<Utc>, DateTime<Utc>), AgentTlsError> {
    let mut params = CertificateParams::new(vec![name.to_string()])?;
    let mut distinguished = DistinguishedName::new();
    distinguished.push(DnType::CommonName, common_name);
    params.distinguished_name = distinguished;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial());
    let not_before = earlier(now, CLOCK_SKEW)?;
    let not_after = later(now, lifetime)?;
    params.not_before = offset(not_before)?;
    params.not_after = offset(not_after)?;
    Ok((params, not_before, not_after))
}

impl AgentTls {
    /// The agent channel's CA: `ca_key` signs, `ca_params` are the
    /// parameters the stored CA certificate `ca_pem` was made with.
    pub fn new(
        ca_params: CertificateParams,
        ca_key: KeyPair,
        ca_pem: String,
    ) -> Result<AgentTls, AgentTlsError> {
        let mut roots = rustls::RootCertStore::empty();
        let ca = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(AgentTlsError::CaPem)?;
        roots.add(ca)?;
        Ok(AgentTls {
            issuer: Issuer::new(ca_params, ca_key),
            ca_pem,
            roots: Arc::new(roots),
            node_lifetime: NODE_CERT_LIFETIME,
            client: Mutex::new(None),
        })
    }

    /// Node certificates valid for `lifetime` instead (tests).
    pub fn with_node_lifetime(mut self, lifetime: Duration) -> AgentTls {
        self.node_lifetime = lifetime;
        self
    }

    /// The cluster CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Signs node `node`'s serving certificate for the public key of
    /// `csr_pem` (whose signature proves the node holds the key). The
    /// request's names and extensions are ignored: the certificate names
    /// the node the caller's token belongs to, nothing else.
    pub fn sign_node(
        &self,
        node: &str,
        csr_pem: &str,
        now: DateTime<Utc>,
    ) -> Result<NodeCertificate, AgentTlsError> {
        let mut csr =
            CertificateSigningRequestParams::from_pem(csr_pem).map_err(AgentTlsError::Csr)?;
        let (params, not_before, not_after) = leaf_params(
            node,
            &node_tls_name(node),
            ExtendedKeyUsagePurpose::ServerAuth,
            now,
            self.node_lifetime,
        )?;
        csr.params = params;
        let certificate = csr.signed_by(&self.issuer)?;
        Ok(NodeCertificate {
            certificate: certificate.pem(),
            ca: self.ca_pem.clone(),
            not_before,
            not_after,
        })
    }

    /// The TLS client configuration this server reaches agents with: the
    /// cluster CA as the only root and this server's client certificate
    /// (made now when there is none or it has aged).
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, AgentTlsError> {
        let mut identity = self
            .client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(current) = identity.as_ref()
            && current.made.elapsed() < CLIENT_CERT_RENEW_AFTER
        {
            return Ok(current.config.clone());
        }
        let key = KeyPair::generate()?;
        let (params, _, _) = leaf_params(
            "corral API server",
            SERVER_TLS_NAME,
            ExtendedKeyUsagePurpose::ClientAuth,
            Utc::now(),
            CLIENT_CERT_LIFETIME,
        )?;
        let certificate = params.signed_by(&key, &self.issuer)?;
        let chain = vec![CertificateDer::from(certificate.der().to_vec())];
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(chain, private)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        *identity = Some(ClientIdentity {
            config: config.clone(),
            made: Instant::now(),
        });
        Ok(config)
    }

    /// A client for node `node`'s agent at `endpoint` (its advertised
    /// `https://IP:PORT`) and the base URL to use with it. The URL names
    /// the node ([`node_tls_name`]), resolved to the endpoint's address,
    /// so the agent must present the cluster CA's certificate for that
    /// node: any other is refused at the handshake.
    pub async fn connect(
        &self,
        node: &str,
        endpoint: &str,
        connect_timeout: Duration,
    ) -> Result<(reqwest::Client, String), AgentTlsError> {
        let invalid = || AgentTlsError::Endpoint {
            endpoint: endpoint.to_string(),
        };
        let url = reqwest::Url::parse(endpoint).map_err(|_| invalid())?;
        let host = url.host_str().ok_or_else(invalid)?;
        let port = url.port_or_known_default().ok_or_else(invalid)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let address: SocketAddr = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, port),
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|source| AgentTlsError::Resolve {
                    endpoint: endpoint.to_string(),
                    source,
                })?
                .next()
                .ok_or_else(invalid)?,
        };
        let name = node_tls_name(node);
        let client = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .use_preconfigured_tls((*self.client_config()?).clone())
            .resolve(&name, address)
            .build()
            .map_err(AgentTlsError::Client)?;
        Ok((client, format!("https://{name}:{port}")))
    }
}

/// Why a connection to an agent failed, when TLS refused the agent's
/// certificate: a sentence naming what was wrong with it.
pub fn refused_certificate(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rustls::CertificateError;
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(found) = current {
        if let Some(rustls::Error::InvalidCertificate(problem)) =
            found.downcast_ref::<rustls::Error>()
        {
            return Some(match problem {
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => {
                    "it presented a certificate for another name (another node's?)".to_string()
                }
                CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                    "its certificate was not issued by the cluster CA".to_string()
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "its certificate has expired (is the agent renewing it?)".to_string()
                }
                other => format!("its certificate is refused: {other:?}"),
            });
        }
        // The connector wraps rustls' error in `io::Error`s, whose
        // `source()` skips the wrapped error itself: open them instead.
        current = match found.downcast_ref::<std::io::Error>() {
            Some(io_error) => io_error
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => found.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests;
