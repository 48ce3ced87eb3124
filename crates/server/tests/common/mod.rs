//! The in-process harness the server's integration tests share: the app on
//! an in-memory store with sequential uids, tokens for any identity, and one
//! request helper. No socket: requests go through `app()` directly.

#![allow(dead_code)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use chrono::Utc;
use corral_api::{AuthorClass, Identity, Kind, Object, Role};
use corral_server::clock::SequentialIds;
use corral_server::{Server, SharedServer, SystemClock, TokenIssuer, app};
use corral_store::ChangeMeta;
use corral_store::sqlite::SqliteStore;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// A server on a fresh in-memory store (uids `uid-1`, `uid-2`, …).
pub fn new_server() -> SharedServer {
    let store = SqliteStore::open_in_memory().expect("in-memory store");
    Server::with(
        Arc::new(store),
        Arc::new(SystemClock),
        Arc::new(SequentialIds::default()),
    )
}

/// A token for `name` with `role`.
/// A token for `name` as `role`; users may act in every namespace.
pub async fn token(server: &SharedServer, name: &str, role: Role) -> String {
    let identity = Identity::new(name, role);
    let identity = if role == Role::User {
        identity.with_namespaces(vec!["*".into()])
    } else {
        identity
    };
    TokenIssuer::issue(&*server.store, &*server.clock, identity)
        .await
        .expect("issue a token")
}

/// Sends one request; the body comes back as JSON, or as a JSON string when
/// it is not JSON (metrics, healthz).
pub async fn call(
    server: &SharedServer,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let response = app(server.clone())
        .oneshot(request.body(body).expect("a valid request"))
        .await
        .expect("infallible service");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("a readable body")
        .to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

/// Stores `kind/name` (in namespace `default` when namespaced) with `spec`
/// and `status`, uid `uid-NAME`, straight into the store.
pub async fn put(server: &SharedServer, kind: Kind, name: &str, spec: Value, status: Value) {
    let namespace = kind.is_namespaced().then_some("default");
    let mut object = Object::new(kind, namespace, name, spec);
    object.metadata.uid = format!("uid-{name}");
    object.metadata.created_at = Some(Utc::now());
    object.status = status;
    let change = ChangeMeta {
        author: "test".into(),
        class: AuthorClass::External,
        message: String::new(),
        time: Utc::now(),
        always_record: false,
    };
    server
        .store
        .create(object, &change)
        .await
        .expect("the test object is stored");
}

/// The cluster CA of `server`'s agent channel, made on first use.
pub fn agent_ca(server: &SharedServer) -> Arc<corral_server::agent_tls::AgentTls> {
    server
        .agent_tls
        .get_or_init(|| {
            let key = rcgen::KeyPair::generate().expect("key");
            let pem = corral_server::tls::cluster_ca_params()
                .self_signed(&key)
                .expect("ca")
                .pem();
            Arc::new(
                corral_server::agent_tls::AgentTls::new(
                    corral_server::tls::cluster_ca_params(),
                    key,
                    pem,
                )
                .expect("agent tls"),
            )
        })
        .clone()
}

/// Serves `app` on loopback as node `node`'s agent does: over TLS with
/// the certificate `server`'s cluster CA issues to that node. Returns the
/// endpoint (`https://127.0.0.1:PORT`).
pub async fn serve_agent(server: &SharedServer, node: &str, app: axum::Router) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let ca = agent_ca(server);
    let key = rcgen::KeyPair::generate().expect("key");
    let csr = rcgen::CertificateParams::new(Vec::<String>::new())
        .expect("params")
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let signed = ca.sign_node(node, &csr, Utc::now()).expect("signed");
    let chain = vec![CertificateDer::from_pem_slice(signed.certificate.as_bytes()).expect("der")];
    let private = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(chain, private)
    .expect("config");
    let material = corral_server::tls::TlsMaterial {
        ca_pem: ca.ca_pem().to_string(),
        server_config: Arc::new(config),
        agent: ca.clone(),
    };
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("https://{}", tcp.local_addr().expect("addr"));
    let listener = corral_server::tls::TlsListener::new(tcp, &material);
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}
