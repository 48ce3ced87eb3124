//! `ImageStore::pull`: an image from its registry into the store, a few
//! blobs at a time, each verified against its digest before it becomes a
//! stored blob (a pull killed half way leaves only staging, which the next
//! open clears).

use std::fs::File;
use std::io::{self, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::digest::{Digest, HashingWriter};
use super::layout::{
    Descriptor, Index, MEDIA_DOCKER_MANIFEST, MEDIA_OCI_INDEX, MEDIA_OCI_MANIFEST, Manifest,
    host_architecture, is_index_media_type,
};
use super::reference::Reference;
use super::registry::{Credentials, FetchedManifest, Registry};
use super::store::{Image, ImageError, ImageStore, io_err, parse_json};

/// Blobs downloaded at once by one pull.
pub const PARALLEL_BLOBS: usize = 3;

/// Progress is reported at least this many bytes apart (and at the end).
const PROGRESS_STEP: u64 = 1 << 20;

/// How far one blob's download has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobProgress<'a> {
    pub digest: &'a Digest,
    pub done: u64,
    /// The size its descriptor declares.
    pub total: u64,
}

/// How to pull: credentials for this pull only (instead of the node's),
/// and a callback told of each blob's progress (from download threads, at
/// most once per MiB and once at the end of each blob).
#[derive(Default, Clone, Copy)]
pub struct PullOptions<'a> {
    pub credentials: Option<&'a Credentials>,
    pub progress: Option<&'a (dyn Fn(BlobProgress<'_>) + Sync)>,
}

impl std::fmt::Debug for PullOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullOptions")
            .field("credentials", &self.credentials)
            .field("progress", &self.progress.is_some())
            .finish()
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

/// Counts what passes, tells `progress`, and refuses more bytes than the
/// descriptor declared (a registry cannot fill the disk).
struct ProgressWriter<'a, W> {
    inner: W,
    digest: &'a Digest,
    total: u64,
    done: u64,
    reported: u64,
    progress: Option<&'a (dyn Fn(BlobProgress<'_>) + Sync)>,
}

impl<W> ProgressWriter<'_, W> {
    fn report(&mut self) {
        if let Some(progress) = self.progress {
            self.reported = self.done;
            progress(BlobProgress {
                digest: self.digest,
                done: self.done,
                total: self.total,
            });
        }
    }
}

impl<W: Write> Write for ProgressWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.done + buf.len() as u64 > self.total {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("more than the {} bytes its descriptor declares", self.total),
            ));
        }
        let n = self.inner.write(buf)?;
        self.done += n as u64;
        if self.done - self.reported >= PROGRESS_STEP {
            self.report();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl ImageStore {
    /// The stored image `reference` names: the name as given or, for a
    /// name with no registry host, the Docker Hub name a pull stores it
    /// under (`busybox` is `docker.io/library/busybox:latest`). `None` when
    /// neither is on the node.
    pub fn find(&self, reference: &str) -> Result<Option<Image>, ImageError> {
        let found = |result: Result<Image, ImageError>| match result {
            Ok(image) => Ok(Some(image)),
            Err(ImageError::NotFound(_)) => Ok(None),
            Err(other) => Err(other),
        };
        if let Some(image) = found(self.resolve(reference))? {
            return Ok(Some(image));
        }
        let parsed: Reference = reference.parse()?;
        match parsed.pull_name() {
            Some(name) if name != parsed => found(self.resolve(&name.to_string())),
            _ => Ok(None),
        }
    }

    /// Pulls `HOST:PORT/name:tag` (or `@sha256:…`; a name with no host from
    /// Docker Hub) and stores it under its full name, layers unpacked.
    /// Blobs already stored are not fetched; the others are fetched
    /// [`PARALLEL_BLOBS`] at a time. A `local/` name is never pulled.
    pub fn pull(
        &self,
        registry: &dyn Registry,
        reference: &str,
        options: PullOptions<'_>,
    ) -> Result<Image, ImageError> {
        let given: Reference = reference.parse()?;
        let parsed = given
            .pull_name()
            .ok_or_else(|| ImageError::LocalOnly(reference.to_string()))?;
        let Some(host) = parsed.registry.clone() else {
            return Err(ImageError::LocalOnly(reference.to_string()));
        };
        let repository = parsed.repository.as_str();
        let credentials = options.credentials;
        let mut fetched =
            registry.manifest(&host, repository, &parsed.registry_reference(), credentials)?;
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
            fetched =
                registry.manifest(&host, repository, &chosen.digest.to_string(), credentials)?;
            check_digest("manifest", &fetched.bytes, &chosen.digest)?;
        }
        let media_type = manifest_media_type(&fetched);
        if media_type != MEDIA_OCI_MANIFEST && media_type != MEDIA_DOCKER_MANIFEST {
            return Err(ImageError::UnsupportedMediaType(media_type));
        }
        let manifest: Manifest = parse_json(&fetched.bytes, "manifest")?;
        let mut missing: Vec<&Descriptor> = Vec::new();
        for descriptor in std::iter::once(&manifest.config).chain(&manifest.layers) {
            if !self.has_blob(&descriptor.digest)
                && !missing.iter().any(|d| d.digest == descriptor.digest)
            {
                missing.push(descriptor);
            }
        }
        self.fetch_blobs(registry, &host, repository, &missing, options)?;
        let manifest_digest = {
            let _guard = self.lock();
            self.put_blob_bytes(&fetched.bytes)?
        };
        let image = self.load_image(parsed.clone(), manifest_digest.clone())?;
        self.ensure_layers(&image)?;
        self.tag(&parsed, &manifest_digest)?;
        Ok(image)
    }

    /// Fetches `blobs` on up to [`PARALLEL_BLOBS`] threads; the first
    /// failure stops the others taking more and is returned.
    fn fetch_blobs(
        &self,
        registry: &dyn Registry,
        host: &str,
        repository: &str,
        blobs: &[&Descriptor],
        options: PullOptions<'_>,
    ) -> Result<(), ImageError> {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<ImageError>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..PARALLEL_BLOBS.min(blobs.len()) {
                scope.spawn(|| {
                    while !failed.load(Ordering::Relaxed) {
                        let Some(descriptor) = blobs.get(next.fetch_add(1, Ordering::Relaxed))
                        else {
                            return;
                        };
                        if let Err(error) =
                            self.fetch_blob(registry, host, repository, descriptor, options)
                        {
                            failed.store(true, Ordering::Relaxed);
                            first_error
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .get_or_insert(error);
                            return;
                        }
                    }
                });
            }
        });
        match first_error
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn fetch_blob(
        &self,
        registry: &dyn Registry,
        host: &str,
        repository: &str,
        descriptor: &Descriptor,
        options: PullOptions<'_>,
    ) -> Result<(), ImageError> {
        let digest = &descriptor.digest;
        let staged = self.staging_path("pull");
        let file = File::create(&staged).map_err(io_err("create", &staged))?;
        let mut writer = ProgressWriter {
            inner: HashingWriter::new(io::BufWriter::new(file)),
            digest,
            total: descriptor.size,
            done: 0,
            reported: 0,
            progress: options.progress,
        };
        let fetched = registry.blob(host, repository, digest, options.credentials, &mut writer);
        if fetched.is_ok() {
            writer.report();
        }
        let (actual, _, buffered) = writer.inner.finish();
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
    fn progress_is_reported_per_mib_and_overlong_blobs_are_refused() {
        let digest = Digest::of(b"x");
        let seen = Mutex::new(Vec::new());
        let progress = |p: BlobProgress<'_>| seen.lock().expect("lock").push((p.done, p.total));
        let total = 3 * PROGRESS_STEP + 10;
        let mut writer = ProgressWriter {
            inner: Vec::new(),
            digest: &digest,
            total,
            done: 0,
            reported: 0,
            progress: Some(&progress),
        };
        let chunk = vec![0u8; 64 * 1024];
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            writer.write_all(&chunk[..n]).expect("write");
            left -= n as u64;
        }
        writer.report();
        assert_eq!(
            *seen.lock().expect("lock"),
            vec![
                (PROGRESS_STEP, total),
                (2 * PROGRESS_STEP, total),
                (3 * PROGRESS_STEP, total),
                (total, total)
            ]
        );
        assert!(writer.write_all(b"!").is_err(), "past the declared size");
    }
}
