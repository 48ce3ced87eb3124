//! Tiny OCI images written in pure Rust: a layer builder, an image builder
//! that writes OCI-layout or docker-archive tars, and a busybox image made
//! from `/bin/busybox` (Debian's `busybox-static`).

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The name `busybox_image_tar` gives its image.
pub const BUSYBOX_IMAGE: &str = "local/busybox:1";

/// Applets linked to `/bin/busybox` in the busybox image.
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh", "ash", "cat", "dmesg", "echo", "env", "false", "grep", "head", "hostname", "httpd", "id",
    "ip", "kill", "ls", "mkdir", "mount", "nc", "nslookup", "ps", "rm", "sleep", "tail", "touch",
    "true", "uname", "unshare", "wget", "whoami",
];

/// Which archive format to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// `oci-layout` + `index.json` + `blobs/sha256/*`, layers gzipped
    /// (as `podman save --format oci-archive`).
    OciLayout,
    /// `manifest.json` + `<hex>.json` config + uncompressed layer tars
    /// (as `podman save --format docker-archive`).
    DockerArchive,
}

/// How a layer blob of an OCI layout is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerCompression {
    Gzip,
    Zstd,
    None,
}

impl LayerCompression {
    fn apply(self, tar: &[u8]) -> (Vec<u8>, &'static str) {
        match self {
            LayerCompression::Gzip => (gzip(tar), "application/vnd.oci.image.layer.v1.tar+gzip"),
            LayerCompression::Zstd => (
                zstd::encode_all(tar, 3).expect("zstd in memory"),
                "application/vnd.oci.image.layer.v1.tar+zstd",
            ),
            LayerCompression::None => (tar.to_vec(), "application/vnd.oci.image.layer.v1.tar"),
        }
    }
}

/// One layer, as an uncompressed tar built in memory. Everything is owned
/// by root unless said otherwise, with mtime 0 (reproducible digests).
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl std::fmt::Debug for LayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerBuilder").finish_non_exhaustive()
    }
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64, uid: u64, gid: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_mtime(0);
    header
}

impl LayerBuilder {
    pub fn new() -> Self {
        Self {
            tar: tar::Builder::new(Vec::new()),
        }
    }

    pub fn dir(self, path: &str, mode: u32) -> Self {
        self.entry(path, header(tar::EntryType::Directory, mode, 0, 0, 0), &[])
    }

    pub fn file(self, path: &str, contents: &[u8], mode: u32) -> Self {
        self.file_owned(path, contents, mode, 0, 0)
    }

    pub fn file_owned(self, path: &str, contents: &[u8], mode: u32, uid: u64, gid: u64) -> Self {
        let h = header(
            tar::EntryType::Regular,
            mode,
            contents.len() as u64,
            uid,
            gid,
        );
        self.entry(path, h, contents)
    }

    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0, 0, 0);
        self.tar
            .append_link(&mut h, path, target)
            .expect("append symlink to in-memory tar");
        self
    }

    /// A hard link at `path` to `target` (a path earlier in this layer).
    pub fn hardlink(mut self, path: &str, target: &str) -> Self {
        let mut h = header(tar::EntryType::Link, 0o644, 0, 0, 0);
        self.tar
            .append_link(&mut h, path, target)
            .expect("append hard link to in-memory tar");
        self
    }

    /// An OCI whiteout deleting `dir/name` of lower layers.
    pub fn whiteout(self, dir: &str, name: &str) -> Self {
        let path = format!("{}/.wh.{name}", dir.trim_end_matches('/'));
        self.file(path.trim_start_matches('/'), b"", 0o644)
    }

    /// An OCI opaque marker hiding everything lower layers have in `dir`.
    pub fn opaque(self, dir: &str) -> Self {
        let path = format!("{}/.wh..wh..opq", dir.trim_end_matches('/'));
        self.file(path.trim_start_matches('/'), b"", 0o644)
    }

    fn entry(mut self, path: &str, mut header: tar::Header, data: &[u8]) -> Self {
        self.tar
            .append_data(&mut header, path, data)
            .expect("append to in-memory tar");
        self
    }

    /// The finished uncompressed layer tar.
    pub fn into_bytes(self) -> Vec<u8> {
        self.tar.into_inner().expect("finish in-memory tar")
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(bytes).expect("gzip in memory");
    encoder.finish().expect("gzip in memory")
}

/// An image: layers (bottom first) and the runtime config.
#[derive(Debug)]
pub struct ImageBuilder {
    name: String,
    /// Uncompressed tars and how each is compressed in an OCI layout.
    layers: Vec<(Vec<u8>, LayerCompression)>,
    config: Value,
}

impl ImageBuilder {
    /// `name` is a full reference such as `local/busybox:1`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            layers: Vec::new(),
            config: json!({}),
        }
    }

    pub fn layer(self, layer: LayerBuilder) -> Self {
        self.layer_compressed(layer, LayerCompression::Gzip)
    }

    /// A layer stored with `compression` in an OCI layout (a docker
    /// archive's layers are always plain tars).
    pub fn layer_compressed(mut self, layer: LayerBuilder, compression: LayerCompression) -> Self {
        self.layers.push((layer.into_bytes(), compression));
        self
    }

    /// Sets an image config field (`Cmd`, `Entrypoint`, `Env`, `WorkingDir`, `User`).
    pub fn config(mut self, key: &str, value: Value) -> Self {
        self.config[key] = value;
        self
    }

    fn config_blob(&self) -> Vec<u8> {
        let diff_ids: Vec<String> = self
            .layers
            .iter()
            .map(|(l, _)| format!("sha256:{}", sha256_hex(l)))
            .collect();
        serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": self.config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .expect("serialise config")
    }

    /// Writes the image as a tar in `format` into `dir`; returns its path.
    pub fn write_tar(&self, dir: &Path, format: ImageFormat) -> io::Result<PathBuf> {
        let file_name = match format {
            ImageFormat::OciLayout => "image-oci.tar",
            ImageFormat::DockerArchive => "image-docker.tar",
        };
        let path = dir.join(file_name);
        let mut out = tar::Builder::new(File::create(&path)?);
        let mut add = |name: &str, bytes: &[u8]| -> io::Result<()> {
            let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64, 0, 0);
            out.append_data(&mut h, name, bytes)
        };
        let config = self.config_blob();
        let config_hex = sha256_hex(&config);
        match format {
            ImageFormat::OciLayout => {
                add("oci-layout", br#"{"imageLayoutVersion": "1.0.0"}"#)?;
                let mut layer_descriptors = Vec::new();
                for (layer, compression) in &self.layers {
                    let (blob, media_type) = compression.apply(layer);
                    let hex = sha256_hex(&blob);
                    add(&format!("blobs/sha256/{hex}"), &blob)?;
                    layer_descriptors.push(json!({
                        "mediaType": media_type,
                        "digest": format!("sha256:{hex}"),
                        "size": blob.len(),
                    }));
                }
                add(&format!("blobs/sha256/{config_hex}"), &config)?;
                let manifest = serde_json::to_vec(&json!({
                    "schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {
                        "mediaType": "application/vnd.oci.image.config.v1+json",
                        "digest": format!("sha256:{config_hex}"),
                        "size": config.len(),
                    },
                    "layers": layer_descriptors,
                }))
                .expect("serialise manifest");
                let manifest_hex = sha256_hex(&manifest);
                add(&format!("blobs/sha256/{manifest_hex}"), &manifest)?;
                let index = serde_json::to_vec(&json!({
                    "schemaVersion": 2,
                    "manifests": [{
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": format!("sha256:{manifest_hex}"),
                        "size": manifest.len(),
                        "annotations": {"org.opencontainers.image.ref.name": self.name},
                    }],
                }))
                .expect("serialise index");
                add("index.json", &index)?;
            }
            ImageFormat::DockerArchive => {
                let mut layer_names = Vec::new();
                for (layer, _) in &self.layers {
                    let name = format!("{}/layer.tar", sha256_hex(layer));
                    add(&name, layer)?;
                    layer_names.push(name);
                }
                add(&format!("{config_hex}.json"), &config)?;
                let manifest = serde_json::to_vec(&json!([{
                    "Config": format!("{config_hex}.json"),
                    "RepoTags": [self.name],
                    "Layers": layer_names,
                }]))
                .expect("serialise manifest.json");
                add("manifest.json", &manifest)?;
            }
        }
        out.into_inner()?.sync_all()?;
        Ok(path)
    }
}

/// The busybox image: `/bin/busybox` from the host (busybox-static), its
/// applets as symlinks, `/etc/passwd` and `/etc/group` with root and
/// nobody (65534), `Cmd ["sh"]`.
pub fn busybox_image() -> ImageBuilder {
    let busybox_path = crate::require_tool("/bin/busybox");
    let busybox = std::fs::read(&busybox_path).expect("read /bin/busybox (busybox-static)");
    let mut layer = LayerBuilder::new()
        .dir("bin", 0o755)
        .dir("etc", 0o755)
        .dir("dev", 0o755)
        .dir("proc", 0o555)
        .dir("sys", 0o555)
        .dir("root", 0o700)
        .dir("tmp", 0o1777)
        .dir("var", 0o755)
        .file("bin/busybox", &busybox, 0o755);
    for applet in BUSYBOX_APPLETS {
        layer = layer.symlink(&format!("bin/{applet}"), "busybox");
    }
    layer = layer
        .file(
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
            0o644,
        )
        .file("etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644);
    ImageBuilder::new(BUSYBOX_IMAGE)
        .layer(layer)
        .config("Cmd", json!(["sh"]))
        .config("Env", json!(["PATH=/bin"]))
}

/// Writes the busybox image ([`BUSYBOX_IMAGE`]) as a tar in `format` into
/// `dir` and returns the tar's path.
pub fn busybox_image_tar(dir: &Path, format: ImageFormat) -> PathBuf {
    busybox_image()
        .write_tar(dir, format)
        .expect("write busybox image tar")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(tar_path: &Path) -> Vec<String> {
        let mut archive = tar::Archive::new(File::open(tar_path).expect("open"));
        archive
            .entries()
            .expect("entries")
            .map(|e| {
                e.expect("entry")
                    .path()
                    .expect("path")
                    .display()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn writes_both_formats() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = ImageBuilder::new("local/t:1")
            .layer(LayerBuilder::new().file("a", b"x", 0o644))
            .config("Cmd", json!(["a"]));
        let oci = names(
            &image
                .write_tar(dir.path(), ImageFormat::OciLayout)
                .expect("oci"),
        );
        assert!(oci.contains(&"oci-layout".to_string()));
        assert!(oci.contains(&"index.json".to_string()));
        assert_eq!(
            oci.iter()
                .filter(|n| n.starts_with("blobs/sha256/"))
                .count(),
            3
        );
        let docker = names(
            &image
                .write_tar(dir.path(), ImageFormat::DockerArchive)
                .expect("docker"),
        );
        assert!(docker.contains(&"manifest.json".to_string()));
        assert!(docker.iter().any(|n| n.ends_with("/layer.tar")));
    }

    #[test]
    fn layers_are_reproducible() {
        let a = LayerBuilder::new().file("f", b"1", 0o644).into_bytes();
        let b = LayerBuilder::new().file("f", b"1", 0o644).into_bytes();
        assert_eq!(sha256_hex(&a), sha256_hex(&b));
    }
}
