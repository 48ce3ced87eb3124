//! `ImageStore`: the blob store, the name index, layer unpacking and GC.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::digest::{Digest, HashingWriter};
use super::layer::{self, LayerError};
use super::layout::{Descriptor, ImageConfig, ImageConfigBlob, Manifest};
use super::reference::{InvalidReference, Reference};
use super::registry::RegistryError;
use super::rootfs::{self, MountError, MountedRootfs, Mounter, SyscallMounter};

const INDEX_FILE: &str = "images.json";

/// Why an image operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("failed to {op} {path:?}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The archive could not be read: cut short, corrupt, or its stream
    /// broke off.
    #[error("failed to read archive {path:?}")]
    ReadArchive {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("image {0} not found")]
    NotFound(String),
    #[error(transparent)]
    Reference(#[from] InvalidReference),
    #[error(
        "image {0} is not on this node, and names in the local/ namespace are never pulled: \
         import it (`corral image import FILE`) or use a registry reference \
         (registry.example.com/app:1, or a Docker Hub name such as busybox:1.37)"
    )]
    LocalOnly(String),
    #[error("archive {0:?} is neither an OCI layout nor a docker archive")]
    UnknownArchive(PathBuf),
    #[error("archive has no file {0:?}")]
    MissingFile(String),
    #[error("{what} has digest {actual}, expected {expected}")]
    DigestMismatch {
        what: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("{what} has {actual} bytes, expected {expected}")]
    SizeMismatch {
        what: String,
        expected: u64,
        actual: u64,
    },
    #[error("failed to parse {what}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("manifest media type {0:?} is not an OCI or Docker v2 image manifest")]
    UnsupportedMediaType(String),
    #[error("archive image has no name: pass a name override")]
    Unnamed,
    #[error("archive holds {0} images: a name override needs exactly one")]
    AmbiguousName(usize),
    #[error("image index has no manifest for linux/{0}")]
    NoPlatform(&'static str),
    #[error("image has {layers} layers but its config lists {diff_ids} diff ids")]
    LayerCount { layers: usize, diff_ids: usize },
    #[error("failed to unpack layer {diff_id}")]
    Layer {
        diff_id: Digest,
        #[source]
        source: LayerError,
    },
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Mount(#[from] MountError),
}

pub(crate) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ImageError {
    let path = path.to_path_buf();
    move |source| ImageError::Io { op, path, source }
}

/// An image in the store, with its parsed manifest and config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The name the image is stored under.
    pub reference: Reference,
    pub manifest_digest: Digest,
    pub config_digest: Digest,
    /// Entrypoint, Cmd, Env, WorkingDir, User (all optional).
    pub config: ImageConfig,
    /// Layer blobs, bottom first.
    pub layers: Vec<Descriptor>,
    /// Uncompressed layer digests, bottom first (names of `layers/` dirs).
    pub diff_ids: Vec<Digest>,
}

/// One line of `list()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSummary {
    pub reference: String,
    pub manifest_digest: Digest,
}

/// What `retain` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub removed_images: Vec<String>,
    pub removed_blobs: usize,
    pub removed_layers: usize,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct NameIndex {
    images: BTreeMap<String, Digest>,
}

/// The local image store. Safe to share between threads; one store root
/// must be used by one process at a time.
pub struct ImageStore {
    root: PathBuf,
    mounter: Box<dyn Mounter>,
    write_lock: Mutex<()>,
}

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageStore")
            .field("root", &self.root)
            .finish()
    }
}

static STAGING_COUNTER: AtomicU64 = AtomicU64::new(0);

impl ImageStore {
    /// Opens (creating if needed) a store at `root`, mounting with real syscalls.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ImageError> {
        Self::with_mounter(root, Box::new(SyscallMounter))
    }

    /// Opens a store that mounts rootfs through `mounter`.
    pub fn with_mounter(
        root: impl Into<PathBuf>,
        mounter: Box<dyn Mounter>,
    ) -> Result<Self, ImageError> {
        let root = root.into();
        for dir in ["blobs/sha256", "layers/sha256", "tmp"] {
            let path = root.join(dir);
            fs::create_dir_all(&path).map_err(io_err("create", &path))?;
        }
        // Staging left by a process that is gone is garbage; another
        // process's may be in use (the agent pulling while `corral image
        // import` opens the same store, or the other way round).
        let tmp = root.join("tmp");
        if let Ok(entries) = fs::read_dir(&tmp) {
            for entry in entries.flatten() {
                if !staged_by_a_live_process(&entry.file_name().to_string_lossy()) {
                    let _ = remove_any(&entry.path());
                }
            }
        }
        Ok(Self {
            root,
            mounter,
            write_lock: Mutex::new(()),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        // A panic while holding the lock leaves files, not memory, in doubt;
        // every write is atomic, so carrying on is safe.
        self.write_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    /// The directory a layer is (or will be) unpacked into.
    pub fn layer_path(&self, diff_id: &Digest) -> PathBuf {
        self.root.join("layers/sha256").join(diff_id.hex())
    }

    /// A fresh, unique path under `tmp/`: `WHAT-PID-N`, so that opening
    /// the store leaves a live process's staging alone.
    pub(crate) fn staging_path(&self, what: &str) -> PathBuf {
        let n = STAGING_COUNTER.fetch_add(1, Ordering::Relaxed);
        self.root
            .join("tmp")
            .join(format!("{what}-{}-{n}", std::process::id()))
    }

    pub(crate) fn has_blob(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    /// Moves a verified staged file into the blob store.
    pub(crate) fn commit_blob(&self, staged: &Path, digest: &Digest) -> Result<(), ImageError> {
        let target = self.blob_path(digest);
        if target.exists() {
            let _ = fs::remove_file(staged);
            return Ok(());
        }
        fs::rename(staged, &target).map_err(io_err("store blob", &target))
    }

    /// Stores bytes as a blob and returns their digest.
    pub(crate) fn put_blob_bytes(&self, bytes: &[u8]) -> Result<Digest, ImageError> {
        let digest = Digest::of(bytes);
        if !self.has_blob(&digest) {
            let staged = self.staging_path("blob");
            write_synced(&staged, bytes)?;
            self.commit_blob(&staged, &digest)?;
        }
        Ok(digest)
    }

    /// Streams `reader` into a staged file, returning its path, digest and size.
    pub(crate) fn stage(
        &self,
        reader: &mut dyn io::Read,
    ) -> Result<(PathBuf, Digest, u64), ImageError> {
        let staged = self.staging_path("stage");
        let file = File::create(&staged).map_err(io_err("create", &staged))?;
        let mut writer = HashingWriter::new(io::BufWriter::new(file));
        io::copy(reader, &mut writer).map_err(io_err("write", &staged))?;
        let (digest, size, buffered) = writer.finish();
        let file = buffered
            .into_inner()
            .map_err(|e| io_err("write", &staged)(e.into_error()))?;
        file.sync_all().map_err(io_err("sync", &staged))?;
        Ok((staged, digest, size))
    }

    pub(crate) fn read_blob(&self, digest: &Digest) -> Result<Vec<u8>, ImageError> {
        let path = self.blob_path(digest);
        fs::read(&path).map_err(io_err("read blob", &path))
    }

    fn read_index(&self) -> Result<NameIndex, ImageError> {
        let path = self.root.join(INDEX_FILE);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| ImageError::Json {
                what: INDEX_FILE.to_string(),
                source,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(NameIndex::default()),
            Err(e) => Err(io_err("read", &path)(e)),
        }
    }

    fn write_index(&self, index: &NameIndex) -> Result<(), ImageError> {
        let bytes = serde_json::to_vec_pretty(index).map_err(|source| ImageError::Json {
            what: INDEX_FILE.to_string(),
            source,
        })?;
        write_atomic(&self.root.join(INDEX_FILE), &bytes)
    }

    /// Names `manifest_digest` as `reference` (the manifest blob must be stored).
    pub(crate) fn tag(
        &self,
        reference: &Reference,
        manifest_digest: &Digest,
    ) -> Result<(), ImageError> {
        let _guard = self.lock();
        let mut index = self.read_index()?;
        index
            .images
            .insert(reference.to_string(), manifest_digest.clone());
        self.write_index(&index)
    }

    /// Every named image.
    pub fn list(&self) -> Result<Vec<ImageSummary>, ImageError> {
        Ok(self
            .read_index()?
            .images
            .into_iter()
            .map(|(reference, manifest_digest)| ImageSummary {
                reference,
                manifest_digest,
            })
            .collect())
    }

    /// Looks an image up by reference (`name:tag`, `host:port/name:tag`;
    /// `name` means `name:latest`).
    pub fn resolve(&self, reference: &str) -> Result<Image, ImageError> {
        let parsed: Reference = reference.parse()?;
        let index = self.read_index()?;
        let manifest_digest = index
            .images
            .get(&parsed.to_string())
            .cloned()
            .ok_or_else(|| ImageError::NotFound(reference.to_string()))?;
        self.load_image(parsed, manifest_digest)
    }

    pub(crate) fn load_image(
        &self,
        reference: Reference,
        manifest_digest: Digest,
    ) -> Result<Image, ImageError> {
        let manifest: Manifest = parse_json(
            &self.read_blob(&manifest_digest)?,
            &format!("manifest {manifest_digest}"),
        )?;
        let config_digest = manifest.config.digest.clone();
        let config_blob: ImageConfigBlob = parse_json(
            &self.read_blob(&config_digest)?,
            &format!("image config {config_digest}"),
        )?;
        if config_blob.rootfs.diff_ids.len() != manifest.layers.len() {
            return Err(ImageError::LayerCount {
                layers: manifest.layers.len(),
                diff_ids: config_blob.rootfs.diff_ids.len(),
            });
        }
        Ok(Image {
            reference,
            manifest_digest,
            config_digest,
            config: config_blob.config.unwrap_or_default(),
            layers: manifest.layers,
            diff_ids: config_blob.rootfs.diff_ids,
        })
    }

    /// Unpacks every layer of `image` not yet unpacked; returns the layer
    /// directories, bottom first.
    pub fn ensure_layers(&self, image: &Image) -> Result<Vec<PathBuf>, ImageError> {
        let mut dirs = Vec::with_capacity(image.layers.len());
        for (descriptor, diff_id) in image.layers.iter().zip(&image.diff_ids) {
            let dest = self.layer_path(diff_id);
            if !dest.is_dir() {
                self.unpack_one(&descriptor.digest, diff_id, &dest)?;
            }
            dirs.push(dest);
        }
        Ok(dirs)
    }

    fn unpack_one(&self, blob: &Digest, diff_id: &Digest, dest: &Path) -> Result<(), ImageError> {
        let staging = self.staging_path("layer");
        fs::create_dir(&staging).map_err(io_err("create", &staging))?;
        let blob_path = self.blob_path(blob);
        let file = File::open(&blob_path).map_err(io_err("open blob", &blob_path))?;
        let unpacked = layer::unpack_layer(io::BufReader::new(file), &staging, diff_id);
        if let Err(source) = unpacked {
            let _ = fs::remove_dir_all(&staging);
            return Err(ImageError::Layer {
                diff_id: diff_id.clone(),
                source,
            });
        }
        match fs::rename(&staging, dest) {
            Ok(()) => Ok(()),
            // Another thread unpacked the same layer first.
            Err(_) if dest.is_dir() => {
                let _ = fs::remove_dir_all(&staging);
                Ok(())
            }
            Err(e) => Err(io_err("rename layer to", dest)(e)),
        }
    }

    /// Mounts a fresh overlayfs rootfs for a container at
    /// `container_dir/rootfs` (upper and work dirs beside it). The image
    /// layers are shared read-only, never copied.
    pub fn mount_rootfs(
        &self,
        image: &Image,
        container_dir: &Path,
    ) -> Result<MountedRootfs, ImageError> {
        let layers = self.ensure_layers(image)?;
        Ok(rootfs::mount_overlay(
            self.mounter.as_ref(),
            &layers,
            container_dir,
        )?)
    }

    /// Unmounts a rootfs mounted by `mount_rootfs`.
    pub fn unmount_rootfs(&self, mounted: &MountedRootfs) -> Result<(), ImageError> {
        Ok(rootfs::unmount(self.mounter.as_ref(), &mounted.rootfs)?)
    }

    /// Keeps the images named in `keep` (and everything they reference) and
    /// deletes every other image, blob and unpacked layer. The caller must
    /// include the images of running containers: their layers are
    /// overlayfs lower dirs.
    pub fn retain(&self, keep: &[&str]) -> Result<GcReport, ImageError> {
        let keep: BTreeSet<String> = keep
            .iter()
            .map(|r| r.parse::<Reference>().map(|r| r.to_string()))
            .collect::<Result<_, _>>()?;
        let _guard = self.lock();
        let mut index = self.read_index()?;
        let mut report = GcReport::default();
        index.images.retain(|name, _| {
            let kept = keep.contains(name);
            if !kept {
                report.removed_images.push(name.clone());
            }
            kept
        });
        self.write_index(&index)?;

        let mut live_blobs = BTreeSet::new();
        let mut live_layers = BTreeSet::new();
        for (name, manifest_digest) in &index.images {
            let image = self.load_image(name.parse()?, manifest_digest.clone())?;
            live_blobs.insert(image.manifest_digest.hex().to_string());
            live_blobs.insert(image.config_digest.hex().to_string());
            live_blobs.extend(image.layers.iter().map(|l| l.digest.hex().to_string()));
            live_layers.extend(image.diff_ids.iter().map(|d| d.hex().to_string()));
        }
        report.removed_blobs = sweep(&self.root.join("blobs/sha256"), &live_blobs)?;
        report.removed_layers = sweep(&self.root.join("layers/sha256"), &live_layers)?;
        Ok(report)
    }
}

/// Removes every entry of `dir` whose name is not in `live`.
fn sweep(dir: &Path, live: &BTreeSet<String>) -> Result<usize, ImageError> {
    let mut removed = 0;
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = entry.map_err(io_err("list", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !live.contains(&name) {
            let path = entry.path();
            remove_any(&path).map_err(io_err("remove", &path))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Whether the staging entry `name` (`WHAT-PID-N`) belongs to a process
/// that is still running (this one included). A name without a pid is
/// nobody's. A pid reused by an unrelated process keeps the entry until that
/// one ends too.
fn staged_by_a_live_process(name: &str) -> bool {
    let mut parts = name.rsplitn(3, '-');
    let (Some(counter), Some(pid), Some(_what)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(_), Ok(pid)) = (counter.parse::<u64>(), pid.parse::<u32>()) else {
        return false;
    };
    pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists()
}

fn remove_any(path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> Result<T, ImageError> {
    serde_json::from_slice(bytes).map_err(|source| ImageError::Json {
        what: what.to_string(),
        source,
    })
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let mut file = File::create(path).map_err(io_err("create", path))?;
    file.write_all(bytes).map_err(io_err("write", path))?;
    file.sync_all().map_err(io_err("sync", path))
}

/// Writes `path` atomically: a synced temp file renamed over it, then the
/// directory synced.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    write_synced(&tmp, bytes)?;
    fs::rename(&tmp, path).map_err(io_err("rename", path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync", dir))
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
