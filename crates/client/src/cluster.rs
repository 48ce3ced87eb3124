//! Calls about the cluster rather than one object: who the caller is,
//! tokens and joins, node leases and images, field transfers.

use std::path::Path;
use std::time::Duration;

use corral_api::kinds::{ImagePruneReport, NodeImagesReport};
use corral_api::{Identity, Role};
use reqwest::Method;

use crate::{Client, ClientError, Lease, TokenResponse};

impl Client {
    pub async fn whoami(&self) -> Result<Identity, ClientError> {
        self.call(self.request(Method::GET, "/v1/whoami")).await
    }

    /// Mints a token for `name` as `role`; a user's names the namespaces
    /// it may act in (`*` for all). It expires after `ttl_seconds` when
    /// given (join tokens: after a day by default).
    pub async fn create_token(
        &self,
        name: &str,
        role: Role,
        namespaces: &[String],
        ttl_seconds: Option<u64>,
        read_secrets: bool,
    ) -> Result<TokenResponse, ClientError> {
        let mut body = serde_json::json!({"name": name, "role": role, "namespaces": namespaces});
        if let Some(ttl) = ttl_seconds {
            body["ttlSeconds"] = ttl.into();
        }
        if read_secrets {
            body["readSecrets"] = true.into();
        }
        self.call(self.request(Method::POST, "/v1/tokens").json(&body))
            .await
    }

    /// Every token (operators): id, identity, creation, last use.
    pub async fn list_tokens(&self) -> Result<Vec<corral_api::identity::TokenInfo>, ClientError> {
        self.call(self.request(Method::GET, "/v1/tokens")).await
    }

    /// Revokes the token with id `token` (8+ leading hex digits) or every
    /// token named `token` (operators).
    pub async fn revoke_token(
        &self,
        token: &str,
    ) -> Result<corral_api::identity::Revoked, ClientError> {
        let path = format!("/v1/tokens/{token}");
        self.call(self.request(Method::DELETE, &path)).await
    }

    /// Renews node `node`'s lease: its heartbeat, as only the node itself
    /// (or an operator) may send it. Returns when the server recorded it.
    pub async fn renew_lease(&self, node: &str) -> Result<Lease, ClientError> {
        let path = format!("/v1/nodes/{node}/lease");
        self.call(self.request(Method::PUT, &path)).await
    }

    /// Node `node`'s lease; `None` if it renewed none since the server's
    /// store started.
    pub async fn lease(&self, node: &str) -> Result<Option<Lease>, ClientError> {
        let path = format!("/v1/nodes/{node}/lease");
        match self.call(self.request(Method::GET, &path)).await {
            Ok(lease) => Ok(Some(lease)),
            Err(error) if error.status() == Some(404) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Exchanges this client's join token for node `node`'s own token.
    pub async fn join(&self, node: &str) -> Result<TokenResponse, ClientError> {
        let body = serde_json::json!({"node": node});
        self.call(self.request(Method::POST, "/v1/join").json(&body))
            .await
    }

    /// Asks the cluster CA to sign node `node`'s agent certificate for the
    /// key of `csr_pem` (a PKCS#10 request, PEM); only the node itself may.
    pub async fn node_certificate(
        &self,
        node: &str,
        csr_pem: &str,
    ) -> Result<corral_api::kinds::NodeCertificate, ClientError> {
        let path = format!("/v1/nodes/{node}/certificate");
        let body = corral_api::kinds::NodeCertificateRequest {
            csr: csr_pem.to_string(),
        };
        self.call(self.request(Method::POST, &path).json(&body))
            .await
    }

    /// Hands `field` (`Pod:status.node`) from controller `from` to
    /// controller `to` (operators only). Returns the written `Controller`
    /// objects as JSON (`from`, absent when it owned the field by default
    /// only, and `to`).
    pub async fn transfer_field(
        &self,
        from: &str,
        field: &str,
        to: &str,
    ) -> Result<serde_json::Value, ClientError> {
        let path = format!("/v1/controllers/{from}/transfer");
        let body = serde_json::json!({"path": field, "to": to});
        self.call(self.request(Method::POST, &path).json(&body))
            .await
    }

    /// Asks node `node`'s agent, through the API server, to collect its
    /// unused images now (operators only); the agent also does so every
    /// 10 minutes.
    pub async fn prune_images(&self, node: &str) -> Result<ImagePruneReport, ClientError> {
        let path = format!("/v1/nodes/{node}/images/prune");
        self.call(self.request(Method::POST, &path)).await
    }

    /// Every image on `nodes` (each asked, whatever its phase), or on
    /// every Ready node when `nodes` is empty; node by node, through the
    /// API server, which asks each node's agent.
    pub async fn list_images(&self, nodes: &[String]) -> Result<NodeImagesReport, ClientError> {
        let request = self
            .request(Method::GET, "/v1/images")
            .query(&nodes_query(nodes, None));
        self.call(request).await
    }

    /// Uploads the image archive `file` (an OCI layout or docker-archive
    /// tar) to the API server, which has the agent of each of `nodes` (of
    /// every Ready node when empty) import it (operators only). The file
    /// is streamed, not read into memory; the request may take 60 s plus a
    /// second per MiB. `name` stores the archive's only image under that
    /// name. The answer says per node what it imported, or its error.
    pub async fn import_image(
        &self,
        file: &Path,
        name: Option<&str>,
        nodes: &[String],
    ) -> Result<NodeImagesReport, ClientError> {
        let opened = tokio::fs::File::open(file)
            .await
            .map_err(|source| ClientError::Upload {
                file: file.to_path_buf(),
                source,
            })?;
        let size = opened
            .metadata()
            .await
            .map_err(|source| ClientError::Upload {
                file: file.to_path_buf(),
                source,
            })?
            .len();
        let timeout = Duration::from_secs(60 + size / (1024 * 1024));
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(opened));
        let request = self
            .request(Method::POST, "/v1/images/import")
            .query(&nodes_query(nodes, name))
            .header(reqwest::header::CONTENT_TYPE, "application/x-tar")
            .header(reqwest::header::CONTENT_LENGTH, size)
            .body(body)
            .timeout(timeout);
        let response = self.execute(request).await?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|source| self.transport(source))?;
        if !status.is_success() {
            return Err(crate::api_error(status, &body));
        }
        serde_json::from_slice(&body).map_err(ClientError::Decode)
    }
}

/// `node=A&node=B&name=REF` as query pairs.
fn nodes_query<'a>(nodes: &'a [String], name: Option<&'a str>) -> Vec<(&'static str, &'a str)> {
    let mut pairs: Vec<(&str, &str)> = nodes.iter().map(|node| ("node", node.as_str())).collect();
    pairs.extend(name.map(|name| ("name", name)));
    pairs
}
