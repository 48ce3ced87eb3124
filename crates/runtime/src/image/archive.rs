//! `ImageStore::import`: OCI layout tars (`podman save --format
//! oci-archive`) and docker-archive tars (`manifest.json` + layer tars).
//! Every file is staged and hashed while the tar streams past; nothing
//! reaches the blob store before its digest is checked.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use super::digest::Digest;
use super::layout::{
    ANNOTATION_REF_NAME, Descriptor, DockerArchiveEntry, ImageConfigBlob, Index, MEDIA_OCI_CONFIG,
    MEDIA_OCI_LAYER_TAR, MEDIA_OCI_MANIFEST, Manifest, host_architecture, is_index_media_type,
};
use super::reference::Reference;
use super::store::{Image, ImageError, ImageStore, io_err, parse_json};

/// One regular file of the archive, staged under the store's `tmp/`.
#[derive(Debug)]
struct Staged {
    path: PathBuf,
    digest: Digest,
    size: u64,
}

/// The archive's files by normalised path, plus its symlinks.
#[derive(Debug, Default)]
struct StagedArchive {
    files: BTreeMap<String, Staged>,
    links: BTreeMap<String, String>,
}

impl StagedArchive {
    fn get(&self, name: &str) -> Result<&Staged, ImageError> {
        let mut name = normalise(Path::new(name)).unwrap_or_default();
        // Follow symlinks a few hops (docker archives link `<id>/layer.tar`).
        for _ in 0..8 {
            if let Some(staged) = self.files.get(&name) {
                return Ok(staged);
            }
            match self.links.get(&name) {
                Some(target) => name = target.clone(),
                None => break,
            }
        }
        Err(ImageError::MissingFile(name))
    }

    fn read(&self, name: &str) -> Result<Vec<u8>, ImageError> {
        let staged = self.get(name)?;
        fs::read(&staged.path).map_err(io_err("read", &staged.path))
    }

    /// The staged blob for `descriptor`, checked against its digest and size.
    fn blob(&self, descriptor: &Descriptor) -> Result<&Staged, ImageError> {
        let staged = self.get(&format!("blobs/sha256/{}", descriptor.digest.hex()))?;
        verify(staged, &descriptor.digest, &descriptor.digest.to_string())?;
        if staged.size != descriptor.size {
            return Err(ImageError::SizeMismatch {
                what: descriptor.digest.to_string(),
                expected: descriptor.size,
                actual: staged.size,
            });
        }
        Ok(staged)
    }
}

fn verify(staged: &Staged, expected: &Digest, what: &str) -> Result<(), ImageError> {
    if &staged.digest == expected {
        Ok(())
    } else {
        Err(ImageError::DigestMismatch {
            what: what.to_string(),
            expected: expected.clone(),
            actual: staged.digest.clone(),
        })
    }
}

/// `a/./b/../c` → `a/c`; `None` when it climbs above the root.
fn normalise(path: &Path) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(p) => parts.push(p.to_str()?),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Some(parts.join("/"))
}

/// A reader that remembers whether reading failed, so that a copy's error
/// is told from the archive (reading) or the disk (writing).
struct ReadTracker<R> {
    inner: R,
    failed: bool,
}

impl<R: Read> Read for ReadTracker<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf);
        self.failed |= read.is_err();
        read
    }
}

/// An image found in an archive, before it is named.
struct Found {
    name: Option<String>,
    manifest_digest: Digest,
}

impl ImageStore {
    /// Imports every image of an OCI layout tar or docker-archive tar.
    /// `name_override` names the image when the archive holds exactly one.
    /// Layers are unpacked before this returns.
    pub fn import(
        &self,
        tar_path: &Path,
        name_override: Option<&str>,
    ) -> Result<Vec<Image>, ImageError> {
        let file = File::open(tar_path).map_err(io_err("open", tar_path))?;
        self.import_reader(file, tar_path, name_override)
    }

    /// [`ImageStore::import`] of an archive read from a stream (an upload):
    /// `source` names it in errors. Reads until the archive ends, not
    /// necessarily to the stream's end.
    pub fn import_reader(
        &self,
        reader: impl Read,
        source: &Path,
        name_override: Option<&str>,
    ) -> Result<Vec<Image>, ImageError> {
        let override_ref = name_override.map(str::parse::<Reference>).transpose()?;
        let staged = self.stage_archive(reader, source)?;
        let result = self.import_staged(source, &staged, override_ref);
        for file in staged.files.values() {
            let _ = fs::remove_file(&file.path);
        }
        result
    }

    fn stage_archive(&self, reader: impl Read, source: &Path) -> Result<StagedArchive, ImageError> {
        let mut archive = tar::Archive::new(io::BufReader::new(reader));
        let mut staged = StagedArchive::default();
        let read_err = |e: io::Error| ImageError::ReadArchive {
            path: source.to_path_buf(),
            source: e,
        };
        let result = (|| {
            for entry in archive.entries().map_err(read_err)? {
                let mut entry = entry.map_err(read_err)?;
                let path = entry.path().map_err(read_err)?.into_owned();
                let Some(name) = normalise(&path) else {
                    continue;
                };
                let kind = entry.header().entry_type();
                if kind.is_file() {
                    let mut tracked = ReadTracker {
                        inner: &mut entry,
                        failed: false,
                    };
                    let (path, digest, size) = match self.stage(&mut tracked) {
                        Ok(staged) => staged,
                        // A cut or corrupt archive, not a failing disk.
                        Err(ImageError::Io { source, .. }) if tracked.failed => {
                            return Err(read_err(source));
                        }
                        Err(error) => return Err(error),
                    };
                    staged.files.insert(name, Staged { path, digest, size });
                } else if (kind.is_symlink() || kind.is_hard_link())
                    && let Some(target) = entry.link_name().map_err(read_err)?
                {
                    let base = if kind.is_symlink() {
                        Path::new(&name)
                            .parent()
                            .unwrap_or(Path::new(""))
                            .join(target)
                    } else {
                        target.into_owned()
                    };
                    if let Some(target) = normalise(&base) {
                        staged.links.insert(name, target);
                    }
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            for file in staged.files.values() {
                let _ = fs::remove_file(&file.path);
            }
            return Err(e);
        }
        Ok(staged)
    }

    fn import_staged(
        &self,
        tar_path: &Path,
        staged: &StagedArchive,
        name_override: Option<Reference>,
    ) -> Result<Vec<Image>, ImageError> {
        let found =
            if staged.files.contains_key("index.json") && staged.files.contains_key("oci-layout") {
                self.import_oci_layout(staged)?
            } else if staged.files.contains_key("manifest.json") {
                self.import_docker_archive(staged)?
            } else {
                return Err(ImageError::UnknownArchive(tar_path.to_path_buf()));
            };
        if name_override.is_some() && found.len() != 1 {
            return Err(ImageError::AmbiguousName(found.len()));
        }
        let mut images = Vec::with_capacity(found.len());
        for image in found {
            let reference = match (&name_override, image.name) {
                (Some(r), _) => r.clone(),
                (None, Some(name)) => name.parse()?,
                (None, None) => return Err(ImageError::Unnamed),
            };
            let loaded = self.load_image(reference.clone(), image.manifest_digest.clone())?;
            self.ensure_layers(&loaded)?;
            self.tag(&reference, &image.manifest_digest)?;
            images.push(loaded);
        }
        Ok(images)
    }

    fn import_oci_layout(&self, staged: &StagedArchive) -> Result<Vec<Found>, ImageError> {
        let index: Index = parse_json(&staged.read("index.json")?, "index.json")?;
        let mut found = Vec::new();
        for entry in &index.manifests {
            let name = entry.annotations.get(ANNOTATION_REF_NAME).cloned();
            let mut descriptor = entry.clone();
            // Follow nested indexes down to this host's image manifest.
            for _ in 0..4 {
                if !is_index_media_type(&descriptor.media_type) {
                    break;
                }
                let blob = staged.blob(&descriptor)?;
                let bytes = fs::read(&blob.path).map_err(io_err("read", &blob.path))?;
                let nested: Index = parse_json(&bytes, &format!("index {}", descriptor.digest))?;
                descriptor = nested
                    .pick_for_host()
                    .cloned()
                    .ok_or(ImageError::NoPlatform(host_architecture()))?;
            }
            let manifest_blob = staged.blob(&descriptor)?;
            let manifest_bytes =
                fs::read(&manifest_blob.path).map_err(io_err("read", &manifest_blob.path))?;
            let manifest: Manifest =
                parse_json(&manifest_bytes, &format!("manifest {}", descriptor.digest))?;
            let config = staged.blob(&manifest.config)?;
            let layers = manifest
                .layers
                .iter()
                .map(|l| staged.blob(l).map(|s| (s, l.digest.clone())))
                .collect::<Result<Vec<_>, _>>()?;
            let _guard = self.lock();
            for (blob, digest) in layers {
                self.copy_staged(blob, &digest)?;
            }
            self.copy_staged(config, &manifest.config.digest)?;
            self.copy_staged(manifest_blob, &descriptor.digest)?;
            found.push(Found {
                name,
                manifest_digest: descriptor.digest,
            });
        }
        Ok(found)
    }

    fn import_docker_archive(&self, staged: &StagedArchive) -> Result<Vec<Found>, ImageError> {
        let entries: Vec<DockerArchiveEntry> =
            parse_json(&staged.read("manifest.json")?, "manifest.json")?;
        let mut found = Vec::new();
        for entry in entries {
            let config_file = staged.get(&entry.config)?;
            if let Some(expected) = digest_in_name(&entry.config) {
                verify(config_file, &expected, &entry.config)?;
            }
            let config_bytes =
                fs::read(&config_file.path).map_err(io_err("read", &config_file.path))?;
            let config: ImageConfigBlob = parse_json(&config_bytes, &entry.config)?;
            if config.rootfs.diff_ids.len() != entry.layers.len() {
                return Err(ImageError::LayerCount {
                    layers: entry.layers.len(),
                    diff_ids: config.rootfs.diff_ids.len(),
                });
            }
            let mut layer_descriptors = Vec::new();
            let mut layer_files = Vec::new();
            for (layer_name, diff_id) in entry.layers.iter().zip(&config.rootfs.diff_ids) {
                let layer_file = staged.get(layer_name)?;
                // Docker archives hold layers uncompressed, so their digest
                // is the diff id; a compressed one is checked on unpack.
                let compressed = is_compressed(&layer_file.path)?;
                if !compressed {
                    verify(layer_file, diff_id, layer_name)?;
                }
                layer_descriptors.push(Descriptor {
                    media_type: if compressed {
                        format!("{MEDIA_OCI_LAYER_TAR}+gzip")
                    } else {
                        MEDIA_OCI_LAYER_TAR.to_string()
                    },
                    digest: layer_file.digest.clone(),
                    size: layer_file.size,
                    platform: None,
                    annotations: BTreeMap::new(),
                });
                layer_files.push(layer_file);
            }
            let manifest = Manifest {
                schema_version: 2,
                media_type: Some(MEDIA_OCI_MANIFEST.to_string()),
                config: Descriptor {
                    media_type: MEDIA_OCI_CONFIG.to_string(),
                    digest: config_file.digest.clone(),
                    size: config_file.size,
                    platform: None,
                    annotations: BTreeMap::new(),
                },
                layers: layer_descriptors,
            };
            let manifest_bytes =
                serde_json::to_vec(&manifest).map_err(|source| ImageError::Json {
                    what: "generated manifest".to_string(),
                    source,
                })?;
            let _guard = self.lock();
            for file in layer_files {
                self.copy_staged(file, &file.digest)?;
            }
            self.copy_staged(config_file, &config_file.digest)?;
            let manifest_digest = self.put_blob_bytes(&manifest_bytes)?;
            found.push(Found {
                name: entry.repo_tags.and_then(|tags| tags.into_iter().next()),
                manifest_digest,
            });
        }
        Ok(found)
    }

    /// Copies (hard-links when possible) a staged file into the blob store;
    /// a staged file may back several descriptors, so it is not moved.
    fn copy_staged(&self, staged: &Staged, digest: &Digest) -> Result<(), ImageError> {
        if self.has_blob(digest) {
            return Ok(());
        }
        let tmp = self.staging_path("blob");
        if fs::hard_link(&staged.path, &tmp).is_err() {
            fs::copy(&staged.path, &tmp).map_err(io_err("copy", &staged.path))?;
        }
        self.commit_blob(&tmp, digest)
    }
}

/// `<hex>.json`, `<hex>.tar`, `blobs/sha256/<hex>` → the digest the name claims.
fn digest_in_name(name: &str) -> Option<Digest> {
    let file = Path::new(name).file_name()?.to_str()?;
    let stem = file.split('.').next()?;
    Digest::from_hex(stem).ok()
}

fn is_compressed(path: &Path) -> Result<bool, ImageError> {
    let mut magic = [0u8; 2];
    let mut file = File::open(path).map_err(io_err("open", path))?;
    let n = file.read(&mut magic).map_err(io_err("read", path))?;
    Ok(n == 2 && magic == [0x1f, 0x8b])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_archive_paths() {
        assert_eq!(
            normalise(Path::new("./index.json")).as_deref(),
            Some("index.json")
        );
        assert_eq!(
            normalise(Path::new("abc/../960a.tar")).as_deref(),
            Some("960a.tar")
        );
        assert_eq!(normalise(Path::new("../x")), None);
    }

    #[test]
    fn reads_digests_from_file_names() {
        let d = Digest::of(b"x");
        assert_eq!(
            digest_in_name(&format!("{}.json", d.hex())),
            Some(d.clone())
        );
        assert_eq!(
            digest_in_name(&format!("blobs/sha256/{}", d.hex())),
            Some(d)
        );
        assert_eq!(digest_in_name("abc/layer.tar"), None);
    }
}
