//! The JSON documents of OCI and Docker images, parsed leniently: only the
//! fields the store needs, unknown fields ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::digest::Digest;

pub const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// The annotation naming an image in an OCI layout's `index.json`.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    /// The CPU variant (`v8` for arm64, `v7` for arm), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// An image manifest: OCI, or Docker schema 2 (the same shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// An image index (OCI) or manifest list (Docker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

impl Index {
    /// The entry for linux on the host's architecture — the one of the
    /// host's variant first, then one naming no variant, then any — or the
    /// only entry when there is just one without a platform. Entries of
    /// other OSes and attestations (`unknown/unknown`) never match.
    pub fn pick_for_host(&self) -> Option<&Descriptor> {
        self.pick_for(host_architecture(), host_variant())
    }

    fn pick_for(&self, arch: &str, variant: Option<&str>) -> Option<&Descriptor> {
        let linux_arch: Vec<&Descriptor> = self
            .manifests
            .iter()
            .filter(|d| {
                d.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == arch)
            })
            .collect();
        let variant_of = |d: &Descriptor| d.platform.as_ref().and_then(|p| p.variant.clone());
        linux_arch
            .iter()
            .find(|d| variant.is_some() && variant_of(d).as_deref() == variant)
            .or_else(|| linux_arch.iter().find(|d| variant_of(d).is_none()))
            .or_else(|| linux_arch.first())
            .copied()
            .or_else(|| match self.manifests.as_slice() {
                [only] if only.platform.is_none() => Some(only),
                _ => None,
            })
    }
}

/// The variant images name for this host's CPU (`v8` on arm64, `v7` on
/// 32-bit arm, none elsewhere).
pub fn host_variant() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "aarch64" => Some("v8"),
        "arm" => Some("v7"),
        _ => None,
    }
}

/// The OCI architecture name of this host.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The image configuration blob.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfigBlob {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<ImageConfig>,
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<Digest>,
}

/// What an image says about how to run it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ImageConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
}

/// One entry of a docker-archive `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DockerArchiveEntry {
    pub config: String,
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    pub layers: Vec<String>,
}

/// Whether a manifest document is an index/list rather than an image manifest.
pub fn is_index_media_type(media_type: &str) -> bool {
    media_type == MEDIA_OCI_INDEX || media_type == MEDIA_DOCKER_LIST
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_podman_oci_index() {
        let text = r#"{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:6d83711b57af4ba8e94699b2d1b1d5dce3f9c6b98a37acc70d905d56eea99527","size":348,"annotations":{"org.opencontainers.image.ref.name":"localhost/probe:1"}}]}"#;
        let index: Index = serde_json::from_str(text).expect("index");
        let only = index.pick_for_host().expect("one entry");
        assert_eq!(only.size, 348);
        assert_eq!(
            only.annotations
                .get(ANNOTATION_REF_NAME)
                .map(String::as_str),
            Some("localhost/probe:1")
        );
    }

    #[test]
    fn picks_host_platform_from_list() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let text = format!(
            r#"{{"schemaVersion":2,"mediaType":"{MEDIA_DOCKER_LIST}","manifests":[
              {{"mediaType":"{MEDIA_DOCKER_MANIFEST}","digest":"{a}","size":1,"platform":{{"architecture":"s390x","os":"linux"}}}},
              {{"mediaType":"{MEDIA_DOCKER_MANIFEST}","digest":"{b}","size":1,"platform":{{"architecture":"{}","os":"linux"}}}}]}}"#,
            host_architecture()
        );
        let index: Index = serde_json::from_str(&text).expect("index");
        assert_eq!(index.pick_for_host().map(|d| &d.digest), Some(&b));
    }

    #[test]
    fn picks_the_variant_then_no_variant_and_skips_other_oses() {
        let digests: Vec<Digest> = (0..5u8).map(|i| Digest::of(&[i])).collect();
        let entry = |d: &Digest, os: &str, arch: &str, variant: Option<&str>| {
            let variant = variant.map_or(String::new(), |v| format!(r#","variant":"{v}""#));
            format!(
                r#"{{"mediaType":"{MEDIA_OCI_MANIFEST}","digest":"{d}","size":1,"platform":{{"architecture":"{arch}","os":"{os}"{variant}}}}}"#
            )
        };
        let text = format!(
            r#"{{"schemaVersion":2,"manifests":[{},{},{},{},{}]}}"#,
            entry(&digests[0], "windows", "arm64", Some("v8")),
            entry(&digests[1], "unknown", "unknown", None),
            entry(&digests[2], "linux", "arm", Some("v6")),
            entry(&digests[3], "linux", "arm", Some("v7")),
            entry(&digests[4], "linux", "arm64", None),
        );
        let index: Index = serde_json::from_str(&text).expect("index");
        let pick = |arch, variant| index.pick_for(arch, variant).map(|d| d.digest.clone());
        assert_eq!(pick("arm", Some("v7")), Some(digests[3].clone()));
        assert_eq!(
            pick("arm64", Some("v8")),
            Some(digests[4].clone()),
            "no variant named"
        );
        assert_eq!(
            pick("arm", Some("v5")),
            Some(digests[2].clone()),
            "any arm at last"
        );
        assert_eq!(pick("amd64", None), None, "no linux/amd64 entry");
    }

    #[test]
    fn parses_docker_archive_manifest() {
        let text =
            r#"[{"Config":"9b51.json","RepoTags":["localhost/probe:1"],"Layers":["960a.tar"]}]"#;
        let entries: Vec<DockerArchiveEntry> = serde_json::from_str(text).expect("manifest.json");
        assert_eq!(entries[0].config, "9b51.json");
        assert_eq!(entries[0].layers, vec!["960a.tar".to_string()]);
    }

    #[test]
    fn parses_image_config() {
        let d = Digest::of(b"layer");
        let text = format!(
            r#"{{"architecture":"amd64","os":"linux","config":{{"Env":["PATH=/bin"],"Cmd":["sh"],"WorkingDir":"/srv","User":"65534:65534"}},"rootfs":{{"type":"layers","diff_ids":["{d}"]}}}}"#
        );
        let blob: ImageConfigBlob = serde_json::from_str(&text).expect("config");
        let config = blob.config.expect("config section");
        assert_eq!(config.cmd, Some(vec!["sh".to_string()]));
        assert_eq!(config.working_dir.as_deref(), Some("/srv"));
        assert_eq!(config.user.as_deref(), Some("65534:65534"));
        assert_eq!(blob.rootfs.diff_ids, vec![d]);
    }
}
