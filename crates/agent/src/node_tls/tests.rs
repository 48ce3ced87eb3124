use std::sync::Mutex;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// A cluster CA as the API server's: signs node requests for `lifetime`.
struct FakeCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
    lifetime: Duration,
    signed: Mutex<Vec<DateTime<Utc>>>,
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "test cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

impl FakeCa {
    fn new(lifetime: Duration) -> FakeCa {
        let key = KeyPair::generate().expect("key");
        let pem = ca_params().self_signed(&key).expect("ca").pem();
        FakeCa {
            issuer: Issuer::new(ca_params(), key),
            pem,
            lifetime,
            signed: Mutex::new(Vec::new()),
        }
    }

    fn leaf(&self, name: &str, usage: ExtendedKeyUsagePurpose) -> CertificateParams {
        let mut params = CertificateParams::new(vec![name.to_string()]).expect("params");
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::minutes(1);
        params.not_after = now + self.lifetime;
        params
    }

    /// A client configuration with a certificate of this CA for `name`,
    /// used for `usage` (`None`: no client certificate at all).
    fn client(&self, certificate: Option<(&str, ExtendedKeyUsagePurpose)>) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.pem.as_bytes()).expect("ca"))
            .expect("root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots);
        match certificate {
            None => builder.with_no_client_auth(),
            Some((name, usage)) => {
                let key = KeyPair::generate().expect("key");
                let cert = self
                    .leaf(name, usage)
                    .signed_by(&key, &self.issuer)
                    .expect("cert");
                builder
                    .with_client_auth_cert(
                        vec![CertificateDer::from(cert.der().to_vec())],
                        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key"),
                    )
                    .expect("client auth")
            }
        }
    }
}

#[async_trait]
impl CertificateSigner for FakeCa {
    async fn sign(&self, node: &str, csr_pem: &str) -> Result<NodeCertificate, String> {
        let mut csr =
            CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| e.to_string())?;
        csr.params = self.leaf(&node_tls_name(node), ExtendedKeyUsagePurpose::ServerAuth);
        let not_before = Utc::now();
        let not_after = not_before + chrono::TimeDelta::from_std(self.lifetime).expect("delta");
        let certificate = csr.signed_by(&self.issuer).map_err(|e| e.to_string())?;
        self.signed.lock().expect("lock").push(not_before);
        Ok(NodeCertificate {
            certificate: certificate.pem(),
            ca: self.pem.clone(),
            not_before,
            not_after,
        })
    }
}

#[tokio::test]
async fn the_certificate_is_renewed_before_it_expires_and_kept() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = Arc::new(FakeCa::new(Duration::from_secs(3)));
    let tls = Arc::new(NodeTls::load("node-a", dir.path(), Some(&ca.pem)).expect("load"));
    assert!(
        tls.certificate().is_none(),
        "no certificate before the first request"
    );
    assert!(tls.renewal_due() <= Utc::now(), "due at once without one");

    let shutdown = CancellationToken::new();
    let renewing = tokio::spawn(tls.clone().keep_renewed(ca.clone(), shutdown.clone()));
    let first = wait_for(|| tls.certificate()).await;
    let renewed = wait_for(|| {
        tls.certificate()
            .filter(|c| c.certificate != first.certificate)
    })
    .await;
    assert!(renewed.not_after > first.not_after);
    let replaced_at = Utc::now();
    shutdown.cancel();
    // A renewal under way when it is cancelled still finishes (a loaded
    // machine reaches the next one): compare what is kept after it.
    renewing.await.expect("the renewal loop ends");
    assert!(
        replaced_at < first.not_after,
        "renewed at {replaced_at}, after the first expired at {}",
        first.not_after
    );
    let asked = ca.signed.lock().expect("lock").clone();
    let renewal_asked = asked[1] - first.not_before;
    assert!(
        renewal_asked >= chrono::TimeDelta::milliseconds(1900),
        "renewed {renewal_asked} after issue: two thirds of 3 s is 2 s"
    );

    // A restart serves the kept certificate (readable by root only).
    use std::os::unix::fs::PermissionsExt;
    let path = kept_path(dir.path(), "node-a");
    let mode = std::fs::metadata(&path).expect("kept").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let restarted = NodeTls::load("node-a", dir.path(), Some(&ca.pem)).expect("reload");
    let kept = restarted.certificate().expect("kept certificate");
    let latest = tls.certificate().expect("latest");
    assert_eq!(kept.certificate, latest.certificate);

    // A kept certificate of another CA is renewed at once.
    let other = FakeCa::new(Duration::from_secs(60));
    let moved = NodeTls::load("node-a", dir.path(), Some(&other.pem)).expect("reload");
    assert!(moved.renewal_due() <= Utc::now());
    let error = moved
        .renew(&*ca)
        .await
        .expect_err("signed by a CA the node does not trust");
    assert!(matches!(error, NodeTlsError::OtherCa), "{error}");
}

async fn wait_for<T>(mut found: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Serves `tls` on loopback: every connection that completes its handshake
/// gets `ok`. Returns the port.
async fn serve(tls: &Arc<NodeTls>) -> u16 {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config().expect("config"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut stream) = acceptor.accept(stream).await {
                    let _ = stream.write_all(b"ok").await;
                    let _ = stream.shutdown().await;
                }
            });
        }
    });
    port
}

/// What a client with `config` reads from the endpoint: `Ok("ok")` when
/// it was let in.
async fn call(port: u16, node: &str, config: rustls::ClientConfig) -> Result<String, String> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(node_tls_name(node)).expect("name");
    let mut tls = connector
        .connect(name, stream)
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    // TLS 1.3: the server judges the client's certificate after the client
    // finished its handshake; a refusal arrives as an alert on the read.
    tls.read_to_string(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    Ok(answer)
}

#[tokio::test]
async fn only_an_api_servers_client_certificate_is_let_in() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = FakeCa::new(Duration::from_secs(3600));
    let tls = Arc::new(NodeTls::load("node-a", dir.path(), Some(&ca.pem)).expect("load"));
    tls.renew(&ca).await.expect("certificate");
    let port = serve(&tls).await;

    let server = ca.client(Some((SERVER_TLS_NAME, ExtendedKeyUsagePurpose::ClientAuth)));
    assert_eq!(call(port, "node-a", server).await, Ok("ok".to_string()));

    let anonymous = ca.client(None);
    let refused = call(port, "node-a", anonymous)
        .await
        .expect_err("no client certificate");
    assert!(
        refused.contains("CertificateRequired") || refused.contains("certificate"),
        "{refused}"
    );

    // Another node's certificate, as a node would present it.
    let node = ca.client(Some((
        &node_tls_name("node-b"),
        ExtendedKeyUsagePurpose::ServerAuth,
    )));
    call(port, "node-a", node)
        .await
        .expect_err("a node's certificate");
    // Even one for client authentication, when it names anything but a server.
    let named = ca.client(Some((
        &node_tls_name("node-b"),
        ExtendedKeyUsagePurpose::ClientAuth,
    )));
    call(port, "node-a", named)
        .await
        .expect_err("not the server's name");
    // The server's name from another CA.
    let other = FakeCa::new(Duration::from_secs(3600));
    let mut foreign = other.client(Some((SERVER_TLS_NAME, ExtendedKeyUsagePurpose::ClientAuth)));
    // It must still trust node-a's CA to get as far as presenting it.
    foreign.dangerous().set_certificate_verifier(
        rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new({
                let mut roots = rustls::RootCertStore::empty();
                roots
                    .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).expect("ca"))
                    .expect("root");
                roots
            }),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .expect("verifier"),
    );
    call(port, "node-a", foreign)
        .await
        .expect_err("another CA's server certificate");

    // Plain HTTP gets no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    plain
        .write_all(b"GET /v1/images HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer).await;
    assert!(
        !answer.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
}
