use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use rcgen::{CertificateParams, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn cluster_ca() -> AgentTls {
    let key = KeyPair::generate().expect("key");
    let pem = crate::tls::cluster_ca_params()
        .self_signed(&key)
        .expect("self-signed")
        .pem();
    AgentTls::new(crate::tls::cluster_ca_params(), key, pem).expect("agent tls")
}

/// A node's key and the certificate the CA signs for it, as an agent
/// would get them.
fn node_identity(ca: &AgentTls, node: &str) -> (KeyPair, NodeCertificate) {
    let key = KeyPair::generate().expect("key");
    let csr = CertificateParams::new(vec!["anything.example".to_string()])
        .expect("params")
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let signed = ca.sign_node(node, &csr, Utc::now()).expect("signed");
    (key, signed)
}

/// A TLS server on loopback presenting `node`'s certificate; answers one
/// HTTP request per connection with `200 ok`.
async fn fake_agent(ca: &AgentTls, node: &str) -> String {
    let (key, signed) = node_identity(ca, node);
    let chain = vec![CertificateDer::from_pem_slice(signed.certificate.as_bytes()).expect("der")];
    let private = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .expect("config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("https://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(stream).await {
                    let mut buffer = [0u8; 1024];
                    let _ = tls.read(&mut buffer).await;
                    let _ = tls
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                        )
                        .await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    url
}

#[test]
fn a_node_certificate_lives_as_long_as_the_ca_says() {
    let ca = cluster_ca().with_node_lifetime(Duration::from_secs(3600));
    let before = Utc::now();
    let (_, signed) = node_identity(&ca, "node-a");
    assert_eq!(signed.ca, ca.ca_pem());
    assert!(signed.not_after > before + chrono::TimeDelta::minutes(59));
    assert!(signed.not_after < before + chrono::TimeDelta::minutes(61));
    assert!(signed.not_before <= before);
    assert!(
        signed
            .certificate
            .starts_with("-----BEGIN CERTIFICATE-----")
    );
    // Its name and usage are checked where they matter: the server's
    // connection below, and the agent's handshake (a node's certificate is
    // refused as a client's, end to end in corral-cli's agent_tls).
}

#[test]
fn a_request_not_signed_by_its_key_is_refused() {
    let ca = cluster_ca();
    let error = ca
        .sign_node(
            "node-a",
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            Utc::now(),
        )
        .expect_err("garbage");
    assert!(matches!(error, AgentTlsError::Csr(_)), "{error}");
}

#[tokio::test]
async fn the_server_reaches_the_bound_nodes_agent_and_refuses_another() {
    let ca = cluster_ca();
    let agent_of_b = fake_agent(&ca, "node-b").await;

    let (client, base) = ca
        .connect("node-b", &agent_of_b, Duration::from_secs(5))
        .await
        .expect("client");
    assert!(base.starts_with("https://node-b.node.corral:"), "{base}");
    let answer = client
        .get(format!("{base}/"))
        .send()
        .await
        .expect("node-b answers");
    assert_eq!(answer.text().await.expect("body"), "ok");

    // node-b's agent, where node-a's should be: refused at the handshake.
    let (client, base) = ca
        .connect("node-a", &agent_of_b, Duration::from_secs(5))
        .await
        .expect("client");
    let error = client
        .get(format!("{base}/"))
        .send()
        .await
        .expect_err("another node's certificate");
    let why = refused_certificate(&error).expect("a certificate refusal");
    assert!(why.contains("another name"), "{why}");

    // An agent with a certificate from another CA: refused too.
    let other = cluster_ca();
    let impostor = fake_agent(&other, "node-a").await;
    let (client, base) = ca
        .connect("node-a", &impostor, Duration::from_secs(5))
        .await
        .expect("client");
    let error = client
        .get(format!("{base}/"))
        .send()
        .await
        .expect_err("another CA");
    let why = refused_certificate(&error).expect("a certificate refusal");
    assert!(why.contains("not issued by the cluster CA"), "{why}");
}

#[test]
fn the_client_certificate_is_kept_until_it_ages() {
    let ca = cluster_ca();
    let first = ca.client_config().expect("config");
    let second = ca.client_config().expect("config");
    assert!(Arc::ptr_eq(&first, &second));
}
