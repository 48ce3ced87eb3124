//! The node's identity on the agent channel: the TLS certificate its
//! endpoint ([`crate::serve`]) serves with, and the rule for who may call.
//!
//! The node makes its own key and sends a certificate signing request with
//! its node token (`POST /v1/nodes/{name}/certificate`); the cluster CA
//! signs a certificate naming only [`node_tls_name`] of the node. Key and
//! certificate are kept, readable by root only, in `DATA/tls/node-NAME.json`
//! (fsynced before use), so a restart serves the same certificate even
//! while the control plane is away. [`NodeTls::keep_renewed`] asks for a
//! new one — a new key too — after two thirds of its validity, at start
//! when there is none (a node that joined before the agent channel had
//! certificates gets one this way) or when the cluster CA changed, and
//! retries with backoff while the server cannot be reached. Until a
//! certificate arrives, handshakes fail.
//!
//! Callers must present a client certificate of the cluster CA for
//! [`SERVER_TLS_NAME`], for client authentication: only API servers have
//! one. Anything else — plain HTTP, no certificate, another CA's, a node's
//! — is refused at the handshake.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use corral_api::kinds::{NodeCertificate, SERVER_TLS_NAME, node_tls_name};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// The longest wait between two attempts to get a certificate.
const MAX_RETRY: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum NodeTlsError {
    #[error("the agent channel needs the cluster CA (the client config's `ca`, or --ca)")]
    NoCa,
    #[error("the cluster CA is not a PEM certificate")]
    CaPem(#[source] rustls::pki_types::pem::Error),
    #[error("the kept node certificate {path} is unreadable")]
    Kept {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make the node's key or certificate request")]
    Key(#[from] rcgen::Error),
    #[error("the node certificate or its key is unusable")]
    Pem(#[source] rustls::pki_types::pem::Error),
    #[error("the TLS configuration is invalid")]
    Rustls(#[from] rustls::Error),
    #[error("the client certificate verifier is invalid")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("the cluster CA did not sign the node's certificate: {0}")]
    Signing(String),
    #[error("the signed certificate is for another cluster CA than this node trusts")]
    OtherCa,
}

/// Who signs the node's certificate requests: the API server (the node's
/// client), or a fake in tests.
#[async_trait]
pub trait CertificateSigner: Send + Sync {
    /// The certificate the cluster CA issues to `node` for the key of
    /// `csr_pem`, or why not.
    async fn sign(&self, node: &str, csr_pem: &str) -> Result<NodeCertificate, String>;
}

#[async_trait]
impl CertificateSigner for corral_client::Client {
    async fn sign(&self, node: &str, csr_pem: &str) -> Result<NodeCertificate, String> {
        self.node_certificate(node, csr_pem)
            .await
            .map_err(|error| crate::chain(&error))
    }
}

/// What `DATA/tls/node-NAME.json` holds.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Kept {
    /// The node's private key, PKCS#8 PEM.
    key: String,
    #[serde(flatten)]
    signed: NodeCertificate,
}

/// The certificate in use and when it was signed for.
struct Current {
    certified: Arc<CertifiedKey>,
    signed: NodeCertificate,
}

/// The node's certificate (swapped on renewal) and its TLS configuration.
pub struct NodeTls {
    node: String,
    path: PathBuf,
    ca_pem: String,
    current: RwLock<Option<Current>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls")
            .field("node", &self.node)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Where node `node` keeps its certificate in `data_dir`.
pub fn kept_path(data_dir: &Path, node: &str) -> PathBuf {
    data_dir.join("tls").join(format!("node-{node}.json"))
}

impl NodeTls {
    /// Node `node`'s TLS identity, trusting `ca_pem` (the cluster CA), with
    /// the certificate kept in `data_dir` if there is one.
    pub fn load(
        node: &str,
        data_dir: &Path,
        ca_pem: Option<&str>,
    ) -> Result<NodeTls, NodeTlsError> {
        let ca_pem = ca_pem.ok_or(NodeTlsError::NoCa)?.to_string();
        CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(NodeTlsError::CaPem)?;
        let tls = NodeTls {
            node: node.to_string(),
            path: kept_path(data_dir, node),
            ca_pem,
            current: RwLock::new(None),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        };
        match std::fs::read(&tls.path) {
            Ok(bytes) => {
                let kept: Kept =
                    serde_json::from_slice(&bytes).map_err(|source| NodeTlsError::Kept {
                        path: tls.path.clone(),
                        source,
                    })?;
                tls.install(&kept)?;
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(NodeTlsError::Io {
                    action: "read",
                    path: tls.path.clone(),
                    source,
                });
            }
        }
        Ok(tls)
    }

    /// The endpoint's TLS configuration: this node's current certificate,
    /// and client certificates of API servers only.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, NodeTlsError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(
            CertificateDer::from_pem_slice(self.ca_pem.as_bytes()).map_err(NodeTlsError::CaPem)?,
        )?;
        let chain =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                .build()?;
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(Arc::new(ServersOnly { chain }))
            .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The certificate served now (PEM) and its validity; `None` before
    /// the first one arrived.
    pub fn certificate(&self) -> Option<NodeCertificate> {
        self.read().as_ref().map(|current| current.signed.clone())
    }

    /// When to ask for a new certificate: two thirds into the current
    /// one's validity; now when there is none or the CA changed.
    pub fn renewal_due(&self) -> DateTime<Utc> {
        match self.read().as_ref() {
            Some(current) if current.signed.ca.trim() == self.ca_pem.trim() => {
                let signed = &current.signed;
                signed.not_before + (signed.not_after - signed.not_before) * 2 / 3
            }
            _ => DateTime::<Utc>::MIN_UTC,
        }
    }

    /// Gets a new certificate for a new key from `signer`, keeps both
    /// (fsynced) and serves it from now on.
    pub async fn renew(
        &self,
        signer: &dyn CertificateSigner,
    ) -> Result<NodeCertificate, NodeTlsError> {
        let key = rcgen::KeyPair::generate()?;
        let csr = rcgen::CertificateParams::new(vec![node_tls_name(&self.node)])?
            .serialize_request(&key)?
            .pem()?;
        let signed = signer
            .sign(&self.node, &csr)
            .await
            .map_err(NodeTlsError::Signing)?;
        if signed.ca.trim() != self.ca_pem.trim() {
            return Err(NodeTlsError::OtherCa);
        }
        let kept = Kept {
            key: key.serialize_pem(),
            signed,
        };
        self.install(&kept)?;
        let path = self.path.clone();
        let bytes = serde_json::to_vec_pretty(&kept).map_err(|source| NodeTlsError::Kept {
            path: path.clone(),
            source,
        })?;
        tokio::task::spawn_blocking(move || write_private(&path, &bytes))
            .await
            .map_err(|error| NodeTlsError::Io {
                action: "write",
                path: self.path.clone(),
                source: std::io::Error::other(error),
            })??;
        Ok(kept.signed)
    }

    /// Renews the certificate whenever [`NodeTls::renewal_due`] says so,
    /// retrying failures with backoff, until `shutdown`.
    pub async fn keep_renewed(
        self: Arc<Self>,
        signer: Arc<dyn CertificateSigner>,
        shutdown: CancellationToken,
    ) {
        let mut retry = Duration::from_secs(1);
        loop {
            let wait = (self.renewal_due() - Utc::now())
                .to_std()
                .unwrap_or(Duration::ZERO);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match self.renew(&*signer).await {
                Ok(signed) => {
                    retry = Duration::from_secs(1);
                    tracing::info!(node = %self.node, not_after = %signed.not_after, "the agent channel's certificate is renewed");
                }
                Err(error) => {
                    tracing::warn!(node = %self.node, error = %crate::chain(&error), ?retry, "cannot renew the agent channel's certificate yet");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(MAX_RETRY);
                }
            }
        }
    }

    fn install(&self, kept: &Kept) -> Result<(), NodeTlsError> {
        let chain = vec![
            CertificateDer::from_pem_slice(kept.signed.certificate.as_bytes())
                .map_err(NodeTlsError::Pem)?,
        ];
        let key = PrivateKeyDer::from_pem_slice(kept.key.as_bytes()).map_err(NodeTlsError::Pem)?;
        let key = self.provider.key_provider.load_private_key(key)?;
        let current = Current {
            certified: Arc::new(CertifiedKey::new(chain, key)),
            signed: kept.signed.clone(),
        };
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(current);
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Option<Current>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Writes `bytes` to `path` (its directory made if needed) readable by
/// root only, durably, replacing the old file in one step.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), NodeTlsError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let failed = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| NodeTlsError::Io {
            action,
            path,
            source,
        }
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(failed("create", dir))?;
    }
    let temporary = path.with_extension("json.new");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(failed("write", &temporary))?;
    file.write_all(bytes).map_err(failed("write", &temporary))?;
    file.sync_all().map_err(failed("fsync", &temporary))?;
    std::fs::rename(&temporary, path).map_err(failed("rename", path))
}

/// Serves the node's current certificate (none before the first arrived).
#[derive(Debug)]
struct Resolver(Arc<NodeTls>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0
            .read()
            .as_ref()
            .map(|current| current.certified.clone())
    }
}

/// Accepts a client certificate only when the cluster CA issued it for
/// client authentication ([`WebPkiClientVerifier`]) and for
/// [`SERVER_TLS_NAME`]: an API server's, never a node's.
#[derive(Debug)]
struct ServersOnly {
    chain: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for ServersOnly {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.chain
            .verify_client_cert(end_entity, intermediates, now)?;
        let certificate = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        let server = ServerName::try_from(SERVER_TLS_NAME)
            .map_err(|_| rustls::Error::General("the server's TLS name is invalid".into()))?;
        certificate
            .verify_is_valid_for_subject_name(&server)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests;
