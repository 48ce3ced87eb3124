//! Pulling images over the OCI distribution API (registry v2), anonymous,
//! plain HTTP. The network sits behind [`Registry`] so the pull logic is
//! tested with a fake.

use std::fs::File;
use std::io::{self, Write};
use std::time::Duration;

use super::digest::{Digest, HashingWriter};
use super::layout::{
    Index, MEDIA_DOCKER_MANIFEST, MEDIA_OCI_INDEX, MEDIA_OCI_MANIFEST, Manifest, host_architecture,
    is_index_media_type,
};
use super::reference::Reference;
use super::store::{Image, ImageError, ImageStore, io_err, parse_json};

/// Why talking to a registry failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("request to {url} failed")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("registry {host} answered {status} to {url}: {}", status_meaning(*status))]
    Status {
        host: String,
        url: String,
        status: u16,
    },
    #[error("failed to write body of {url}")]
    Body {
        url: String,
        #[source]
        source: io::Error,
    },
    #[error("failed to build HTTP client")]
    Client(#[source] reqwest::Error),
}

/// What a registry's refusal means for a pull, in words.
fn status_meaning(status: u16) -> &'static str {
    match status {
        401 => "401 Unauthorized: it wants credentials (this node pulls anonymously)",
        403 => "403 Forbidden: these credentials may not read this repository",
        404 => "404 Not Found: no such repository, tag or digest there",
        429 => "429 Too Many Requests: the registry's rate limit; the step retries",
        500..=599 => "the registry failed; the step retries",
        _ => "unexpected answer",
    }
}

/// The `host[:port]` of a registry URL, for errors.
fn host_of(url: &str) -> String {
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

/// The two distribution API reads a pull needs.
pub trait Registry: Send + Sync {
    /// `GET /v2/<repository>/manifests/<reference>` (a tag or digest).
    fn manifest(
        &self,
        registry: &str,
        repository: &str,
        reference: &str,
    ) -> Result<FetchedManifest, RegistryError>;

    /// `GET /v2/<repository>/blobs/<digest>`, streamed into `sink`.
    fn blob(
        &self,
        registry: &str,
        repository: &str,
        digest: &Digest,
        sink: &mut dyn Write,
    ) -> Result<(), RegistryError>;
}

/// The Accept header for manifests: OCI and Docker, images and indexes.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.v2+json, \
application/vnd.docker.distribution.manifest.list.v2+json";

/// A registry client over plain HTTP (blocking; call from a blocking thread).
#[derive(Debug, Clone)]
pub struct HttpRegistry {
    client: reqwest::blocking::Client,
}

impl HttpRegistry {
    /// `timeout` bounds each whole request, body included.
    pub fn new(timeout: Duration) -> Result<Self, RegistryError> {
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(timeout)
            .build()
            .map_err(RegistryError::Client)?;
        Ok(Self { client })
    }

    fn get(
        &self,
        url: &str,
        accept: Option<&str>,
    ) -> Result<reqwest::blocking::Response, RegistryError> {
        let mut request = self.client.get(url);
        if let Some(accept) = accept {
            request = request.header(reqwest::header::ACCEPT, accept);
        }
        let response = request.send().map_err(|source| RegistryError::Http {
            url: url.to_string(),
            source,
        })?;
        if !response.status().is_success() {
            return Err(RegistryError::Status {
                host: host_of(url),
                url: url.to_string(),
                status: response.status().as_u16(),
            });
        }
        Ok(response)
    }
}

impl Registry for HttpRegistry {
    fn manifest(
        &self,
        registry: &str,
        repository: &str,
        reference: &str,
    ) -> Result<FetchedManifest, RegistryError> {
        let url = format!("http://{registry}/v2/{repository}/manifests/{reference}");
        let response = self.get(&url, Some(MANIFEST_ACCEPT))?;
        let media_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
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
        sink: &mut dyn Write,
    ) -> Result<(), RegistryError> {
        let url = format!("http://{registry}/v2/{repository}/blobs/{digest}");
        let mut response = self.get(&url, None)?;
        response
            .copy_to(sink)
            .map_err(|source| RegistryError::Http { url, source })?;
        Ok(())
    }
}

/// The media type a manifest document declares, or the one it was served as.
fn manifest_media_type(fetched: &FetchedManifest) -> String {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Probe>(&fetched.bytes) {
        Ok(Probe {
            media_type: Some(m),
            ..
        }) => m,
        Ok(Probe {
            manifests: Some(_), ..
        }) => MEDIA_OCI_INDEX.to_string(),
        _ if !fetched.media_type.is_empty() => fetched.media_type.clone(),
        _ => MEDIA_OCI_MANIFEST.to_string(),
    }
}

fn check_digest(what: &str, bytes: &[u8], expected: &Digest) -> Result<(), ImageError> {
    let actual = Digest::of(bytes);
    if &actual == expected {
        Ok(())
    } else {
        Err(ImageError::DigestMismatch {
            what: what.to_string(),
            expected: expected.clone(),
            actual,
        })
    }
}

impl ImageStore {
    /// Pulls `HOST:PORT/name:tag` (or `@sha256:…`) and stores it under that
    /// reference, layers unpacked. Blobs already stored are not fetched.
    pub fn pull(&self, registry: &dyn Registry, reference: &str) -> Result<Image, ImageError> {
        let parsed: Reference = reference.parse()?;
        let Some(host) = parsed.registry.clone() else {
            return Err(ImageError::NoRegistryHost(reference.to_string()));
        };
        let repository = parsed.repository.as_str();
        let mut fetched = registry.manifest(&host, repository, &parsed.registry_reference())?;
        if let Some(expected) = &parsed.digest {
            check_digest("manifest", &fetched.bytes, expected)?;
        }
        for _ in 0..4 {
            if !is_index_media_type(&manifest_media_type(&fetched)) {
                break;
            }
            let index: Index = parse_json(&fetched.bytes, "image index")?;
            let chosen = index
                .pick_for_host()
                .cloned()
                .ok_or(ImageError::NoPlatform(host_architecture()))?;
            fetched = registry.manifest(&host, repository, &chosen.digest.to_string())?;
            check_digest("manifest", &fetched.bytes, &chosen.digest)?;
        }
        let media_type = manifest_media_type(&fetched);
        if media_type != MEDIA_OCI_MANIFEST && media_type != MEDIA_DOCKER_MANIFEST {
            return Err(ImageError::UnsupportedMediaType(media_type));
        }
        let manifest: Manifest = parse_json(&fetched.bytes, "manifest")?;
        for descriptor in std::iter::once(&manifest.config).chain(&manifest.layers) {
            if !self.has_blob(&descriptor.digest) {
                self.fetch_blob(registry, &host, repository, &descriptor.digest)?;
            }
        }
        let manifest_digest = {
            let _guard = self.lock();
            self.put_blob_bytes(&fetched.bytes)?
        };
        let image = self.load_image(parsed.clone(), manifest_digest.clone())?;
        self.ensure_layers(&image)?;
        self.tag(&parsed, &manifest_digest)?;
        Ok(image)
    }

    fn fetch_blob(
        &self,
        registry: &dyn Registry,
        host: &str,
        repository: &str,
        digest: &Digest,
    ) -> Result<(), ImageError> {
        let staged = self.staging_path("pull");
        let file = File::create(&staged).map_err(io_err("create", &staged))?;
        let mut writer = HashingWriter::new(io::BufWriter::new(file));
        let fetched = registry.blob(host, repository, digest, &mut writer);
        let (actual, _, buffered) = writer.finish();
        let finished = fetched.map_err(ImageError::from).and_then(|()| {
            let file = buffered
                .into_inner()
                .map_err(|e| io_err("write", &staged)(e.into_error()))?;
            file.sync_all().map_err(io_err("sync", &staged))
        });
        let verified = finished.and_then(|()| {
            if &actual == digest {
                Ok(())
            } else {
                Err(ImageError::DigestMismatch {
                    what: format!("blob {digest}"),
                    expected: digest.clone(),
                    actual,
                })
            }
        });
        if let Err(e) = verified {
            let _ = std::fs::remove_file(&staged);
            return Err(e);
        }
        let _guard = self.lock();
        self.commit_blob(&staged, digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::layout::MEDIA_DOCKER_LIST;

    #[test]
    fn media_type_prefers_the_document() {
        let fetched = FetchedManifest {
            media_type: "application/json".into(),
            bytes: format!(r#"{{"mediaType":"{MEDIA_DOCKER_LIST}","manifests":[]}}"#).into_bytes(),
        };
        assert_eq!(manifest_media_type(&fetched), MEDIA_DOCKER_LIST);
        let fetched = FetchedManifest {
            media_type: MEDIA_OCI_INDEX.into(),
            bytes: br#"{"schemaVersion":2,"manifests":[]}"#.to_vec(),
        };
        assert_eq!(manifest_media_type(&fetched), MEDIA_OCI_INDEX);
        let fetched = FetchedManifest {
            media_type: MEDIA_DOCKER_MANIFEST.into(),
            bytes: br#"{"schemaVersion":2,"config":{}}"#.to_vec(),
        };
        assert_eq!(manifest_media_type(&fetched), MEDIA_DOCKER_MANIFEST);
    }

    #[test]
    fn refusals_name_the_registry_and_what_the_status_means() {
        let url = "http://registry.example.com:5000/v2/app/manifests/1";
        let error = RegistryError::Status {
            host: host_of(url),
            url: url.to_string(),
            status: 401,
        };
        assert_eq!(
            error.to_string(),
            "registry registry.example.com:5000 answered 401 to http://registry.example.com:5000/v2/app/manifests/1: 401 Unauthorized: it wants credentials (this node pulls anonymously)"
        );
        assert!(status_meaning(404).starts_with("404 Not Found"));
        assert!(status_meaning(403).starts_with("403 Forbidden"));
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
