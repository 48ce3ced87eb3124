//! Pulling images over the OCI distribution API (registry v2): HTTPS with
//! the system's roots and per-registry CA files, plain HTTP only where the
//! operator allows it, and the token and basic auth flows. The network
//! sits behind [`Registry`] so the pull logic is tested with a fake.

mod auth;
mod http;

use std::io::{self, Write};
use std::path::PathBuf;

pub use auth::{
    AuthFile, AuthFileError, Challenge, Credentials, TokenCache, parse_challenge, registry_key,
};
pub use http::{DEFAULT_AUTH_FILE, DEFAULT_CERTS_DIR, HttpRegistry, RegistryConfig};

use super::digest::Digest;

/// Why talking to a registry failed. Messages name the registry host and
/// never carry a secret.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("request to {url} failed")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("registry {host} answered {status} to {url}: {}", status_meaning(*status, *sent_credentials))]
    Status {
        host: String,
        url: String,
        status: u16,
        /// Whether the request carried credentials (basic or a token got
        /// with them).
        sent_credentials: bool,
    },
    #[error(
        "registry {host}: the TLS handshake failed ({detail}); this is a certificate/TLS problem. \
         If its certificate is signed by a private CA, put that CA at {ca_path:?}; if it serves \
         plain HTTP, list it with --insecure-registry {host}"
    )]
    Tls {
        host: String,
        detail: String,
        ca_path: PathBuf,
    },
    #[error(
        "registry {host} sent its token server {realm_host} for auth, which answered {status}: {}",
        status_meaning(*status, *sent_credentials)
    )]
    Token {
        host: String,
        realm_host: String,
        status: u16,
        sent_credentials: bool,
    },
    #[error(
        "registry {host} answered 401 with a challenge this client does not speak ({header:?})"
    )]
    Challenge { host: String, header: String },
    #[error("the token server {realm_host} of registry {host} sent no usable token")]
    BadToken {
        host: String,
        realm_host: String,
        #[source]
        source: Option<reqwest::Error>,
    },
    #[error("failed to write body of {url}")]
    Body {
        url: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the CA file {path:?} for registry {host}")]
    CaFile {
        host: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to build the HTTP client for registry {host}")]
    Client {
        host: String,
        #[source]
        source: reqwest::Error,
    },
    #[error(transparent)]
    AuthFile(#[from] AuthFileError),
}

/// What a registry's refusal means for a pull, in words.
fn status_meaning(status: u16, sent_credentials: bool) -> &'static str {
    match (status, sent_credentials) {
        (401, false) => {
            "401 Unauthorized: it wants credentials and this node has none for it (add them to \
             the node's --registry-auth file)"
        }
        (401, true) => "401 Unauthorized: it refused the credentials this node has for it",
        (403, _) => "403 Forbidden: these credentials may not read this repository",
        (404, _) => "404 Not Found: no such repository, tag or digest there",
        (429, _) => "429 Too Many Requests: the registry's rate limit; the step retries",
        (500..=599, _) => "the registry failed; the step retries",
        _ => "unexpected answer",
    }
}

/// The `host[:port]` of a URL, for errors.
pub(crate) fn host_of(url: &str) -> String {
    url.split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or(url)
        .to_string()
}

/// A manifest as a registry served it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedManifest {
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// The two distribution API reads a pull needs. `credentials`, when given,
/// are used for this request instead of the node's (the seam for a pod's
/// own pull secret).
pub trait Registry: Send + Sync {
    /// `GET /v2/<repository>/manifests/<reference>` (a tag or digest).
    fn manifest(
        &self,
        registry: &str,
        repository: &str,
        reference: &str,
        credentials: Option<&Credentials>,
    ) -> Result<FetchedManifest, RegistryError>;

    /// `GET /v2/<repository>/blobs/<digest>`, streamed into `sink`.
    fn blob(
        &self,
        registry: &str,
        repository: &str,
        digest: &Digest,
        credentials: Option<&Credentials>,
        sink: &mut dyn Write,
    ) -> Result<(), RegistryError>;
}

/// The Accept header for manifests: OCI and Docker, images and indexes.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.v2+json, \
application/vnd.docker.distribution.manifest.list.v2+json";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::layout::{
        MEDIA_DOCKER_LIST, MEDIA_DOCKER_MANIFEST, MEDIA_OCI_INDEX, MEDIA_OCI_MANIFEST,
    };

    #[test]
    fn refusals_name_the_registry_and_what_the_status_means() {
        let url = "https://registry.example.com:5000/v2/app/manifests/1";
        let error = RegistryError::Status {
            host: host_of(url),
            url: url.to_string(),
            status: 401,
            sent_credentials: false,
        };
        assert_eq!(
            error.to_string(),
            "registry registry.example.com:5000 answered 401 to https://registry.example.com:5000/v2/app/manifests/1: 401 Unauthorized: it wants credentials and this node has none for it (add them to the node's --registry-auth file)"
        );
        assert!(status_meaning(401, true).contains("refused the credentials"));
        assert!(status_meaning(404, false).starts_with("404 Not Found"));
        assert!(status_meaning(403, true).starts_with("403 Forbidden"));
    }

    #[test]
    fn a_tls_failure_names_the_host_and_both_fixes() {
        let error = RegistryError::Tls {
            host: "reg.example:5000".into(),
            detail: "invalid peer certificate: UnknownIssuer".into(),
            ca_path: PathBuf::from("/etc/corral/certs.d/reg.example:5000/ca.crt"),
        };
        let message = error.to_string();
        for part in [
            "registry reg.example:5000",
            "certificate/TLS problem",
            "UnknownIssuer",
            "/etc/corral/certs.d/reg.example:5000/ca.crt",
            "--insecure-registry reg.example:5000",
        ] {
            assert!(message.contains(part), "{part} in {message}");
        }
    }

    #[test]
    fn accept_header_names_all_four_types() {
        for media in [
            MEDIA_OCI_MANIFEST,
            MEDIA_OCI_INDEX,
            MEDIA_DOCKER_MANIFEST,
            MEDIA_DOCKER_LIST,
        ] {
            assert!(MANIFEST_ACCEPT.contains(media), "{media}");
        }
    }
}
