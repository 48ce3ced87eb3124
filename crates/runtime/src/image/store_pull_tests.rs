//! Pulls from a fake registry: indexes, digests, short names, failures
//! that store nothing, and every layer compression.

use std::collections::BTreeMap;
use std::sync::Mutex;

use corral_testkit::{ImageBuilder, ImageFormat, LayerBuilder, LayerCompression};
use serde_json::json;

use super::*;
use crate::image::layout::{MEDIA_OCI_INDEX, MEDIA_OCI_MANIFEST};
use crate::image::registry::{Credentials, FetchedManifest, Registry, RegistryError};
use crate::image::{BlobProgress, Digest, PullOptions};

/// A registry serving one OCI layout from memory, counting blob fetches.
struct FakeRegistry {
    manifests: BTreeMap<String, FetchedManifest>,
    blobs: BTreeMap<Digest, Vec<u8>>,
    blob_fetches: Mutex<usize>,
    /// The registry and repository the fake answers for.
    serves: (&'static str, &'static str),
}

impl FakeRegistry {
    fn from_layout(tar_path: &Path, tag: &str) -> Self {
        let mut files = BTreeMap::new();
        let mut archive = tar::Archive::new(fs::File::open(tar_path).expect("open"));
        for entry in archive.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let name = entry.path().expect("path").display().to_string();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).expect("read");
            files.insert(name, data);
        }
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).expect("index");
        let manifest_digest: Digest = index["manifests"][0]["digest"]
            .as_str()
            .expect("digest")
            .parse()
            .expect("valid digest");
        let mut blobs = BTreeMap::new();
        for (name, data) in &files {
            if let Some(hex) = name.strip_prefix("blobs/sha256/") {
                blobs.insert(Digest::from_hex(hex).expect("hex"), data.clone());
            }
        }
        let manifest = FetchedManifest {
            media_type: MEDIA_OCI_MANIFEST.to_string(),
            bytes: blobs[&manifest_digest].clone(),
        };
        // The tag serves an index pointing at the manifest, as multi-arch
        // images do; the digest serves the manifest itself.
        let index_doc = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_OCI_INDEX,
            "manifests": [{
                "mediaType": MEDIA_OCI_MANIFEST,
                "digest": manifest_digest.to_string(),
                "size": manifest.bytes.len(),
                "platform": {"architecture": layout::host_architecture(), "os": "linux"},
            }],
        });
        let manifests = BTreeMap::from([
            (
                tag.to_string(),
                FetchedManifest {
                    media_type: MEDIA_OCI_INDEX.to_string(),
                    bytes: serde_json::to_vec(&index_doc).expect("json"),
                },
            ),
            (manifest_digest.to_string(), manifest),
        ]);
        Self {
            manifests,
            blobs,
            blob_fetches: Mutex::new(0),
            serves: ("reg.test:5000", "corral/t"),
        }
    }
}

impl Registry for FakeRegistry {
    fn manifest(
        &self,
        registry: &str,
        repository: &str,
        reference: &str,
        _credentials: Option<&Credentials>,
    ) -> Result<FetchedManifest, RegistryError> {
        assert_eq!((registry, repository), self.serves);
        self.manifests
            .get(reference)
            .cloned()
            .ok_or_else(|| RegistryError::Status {
                host: registry.to_string(),
                url: reference.to_string(),
                status: 404,
                sent_credentials: false,
            })
    }

    fn blob(
        &self,
        _registry: &str,
        _repository: &str,
        digest: &Digest,
        _credentials: Option<&Credentials>,
        sink: &mut dyn Write,
    ) -> Result<(), RegistryError> {
        *self.blob_fetches.lock().expect("lock") += 1;
        let data = self
            .blobs
            .get(digest)
            .ok_or_else(|| RegistryError::Status {
                host: "reg.test:5000".to_string(),
                url: digest.to_string(),
                status: 404,
                sent_credentials: false,
            })?;
        sink.write_all(data).map_err(|source| RegistryError::Body {
            url: digest.to_string(),
            source,
        })
    }
}

#[test]
fn pull_follows_index_verifies_and_skips_known_blobs() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = two_layer_image("local/t:1")
        .write_tar(dir.path(), ImageFormat::OciLayout)
        .expect("tar");
    let registry = FakeRegistry::from_layout(&tar, "1");
    let store = store(dir.path());
    let image = store
        .pull(
            &registry,
            "reg.test:5000/corral/t:1",
            PullOptions::default(),
        )
        .expect("pull");
    assert_eq!(image.reference.to_string(), "reg.test:5000/corral/t:1");
    assert_eq!(image.config.cmd, Some(vec!["/tool".to_string()]));
    assert_eq!(*registry.blob_fetches.lock().expect("lock"), 3);
    assert!(store.layer_path(&image.diff_ids[1]).is_dir());
    let again = store
        .pull(
            &registry,
            "reg.test:5000/corral/t:1",
            PullOptions::default(),
        )
        .expect("pull again");
    assert_eq!(again, image);
    assert_eq!(
        *registry.blob_fetches.lock().expect("lock"),
        3,
        "no refetch"
    );
    assert!(matches!(
        store.pull(
            &registry,
            "reg.test:5000/corral/t:404",
            PullOptions::default()
        ),
        Err(ImageError::Registry(RegistryError::Status {
            status: 404,
            ..
        }))
    ));
    assert!(matches!(
        store.pull(&registry, "local/t:1", PullOptions::default()),
        Err(ImageError::LocalOnly(_))
    ));
}

#[test]
fn pull_rejects_a_corrupt_blob() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = two_layer_image("local/t:1")
        .write_tar(dir.path(), ImageFormat::OciLayout)
        .expect("tar");
    let mut registry = FakeRegistry::from_layout(&tar, "1");
    // Same size, different bytes: only the digest tells.
    for data in registry.blobs.values_mut() {
        if let Some(last) = data.last_mut() {
            *last ^= 0xff;
        }
    }
    let store = store(dir.path());
    let err = store
        .pull(
            &registry,
            "reg.test:5000/corral/t:1",
            PullOptions::default(),
        )
        .expect_err("corrupt");
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(store.list().expect("list").is_empty());
    // A registry sending more than a descriptor's size is cut off.
    for data in registry.blobs.values_mut() {
        data.push(b'!');
    }
    let err = store
        .pull(
            &registry,
            "reg.test:5000/corral/t:1",
            PullOptions::default(),
        )
        .expect_err("overlong");
    assert!(
        matches!(err, ImageError::Registry(RegistryError::Body { .. })),
        "{err}"
    );
    assert_eq!(
        fs::read_dir(store.root().join("tmp")).expect("ls").count(),
        0
    );
}

#[test]
fn short_names_are_pulled_from_docker_hub_and_found_again() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = two_layer_image("local/t:1")
        .write_tar(dir.path(), ImageFormat::OciLayout)
        .expect("tar");
    let mut registry = FakeRegistry::from_layout(&tar, "1.37");
    registry.serves = ("docker.io", "library/busybox");
    let store = store(dir.path());
    assert!(store.find("busybox:1.37").expect("find").is_none());
    let progress = Mutex::new(BTreeMap::new());
    let report = |p: BlobProgress<'_>| {
        progress
            .lock()
            .expect("lock")
            .insert(p.digest.clone(), (p.done, p.total));
    };
    let options = PullOptions {
        credentials: None,
        progress: Some(&report),
    };
    let image = store
        .pull(&registry, "busybox:1.37", options)
        .expect("pull");
    assert_eq!(
        image.reference.to_string(),
        "docker.io/library/busybox:1.37"
    );
    // Every blob (config and both layers) reported its whole size.
    let progress = progress.into_inner().expect("lock");
    assert_eq!(progress.len(), 3);
    assert!(
        progress
            .values()
            .all(|(done, total)| done == total && *total > 0)
    );
    // The short name, the library/ name and the full name all find it.
    for name in [
        "busybox:1.37",
        "library/busybox:1.37",
        "docker.io/library/busybox:1.37",
    ] {
        assert_eq!(
            store.find(name).expect("find"),
            Some(image.clone()),
            "{name}"
        );
    }
    // An imported image under a short name is used as it is.
    let imported = store.import(&tar, None).expect("import").remove(0);
    assert_eq!(
        store.find("local/t:1").expect("find").map(|i| i.reference),
        Some(imported.reference)
    );
    assert!(store.find("local/other:1").expect("find").is_none());
}

#[test]
fn a_failed_blob_leaves_nothing_stored() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = two_layer_image("local/t:1")
        .write_tar(dir.path(), ImageFormat::OciLayout)
        .expect("tar");
    let mut registry = FakeRegistry::from_layout(&tar, "1");
    let image_store = store(dir.path());
    let imported = image_store.import(&tar, None).expect("import").remove(0);
    // One layer is gone from the registry: the pull fails as a whole.
    registry.blobs.remove(&imported.layers[1].digest);
    let fresh = tempfile::tempdir().expect("tempdir");
    let store = store(fresh.path());
    let error = store
        .pull(
            &registry,
            "reg.test:5000/corral/t:1",
            PullOptions::default(),
        )
        .expect_err("missing blob");
    assert!(
        matches!(
            error,
            ImageError::Registry(RegistryError::Status { status: 404, .. })
        ),
        "{error}"
    );
    assert!(store.list().expect("list").is_empty());
    assert!(!store.has_blob(&imported.layers[1].digest));
    assert_eq!(
        fs::read_dir(store.root().join("tmp")).expect("ls").count(),
        0,
        "no staging left"
    );
}

#[test]
fn pulls_gzip_zstd_and_uncompressed_layers() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = ImageBuilder::new("local/t:1")
        .layer_compressed(
            LayerBuilder::new().file("gzip", b"g", 0o644),
            LayerCompression::Gzip,
        )
        .layer_compressed(
            LayerBuilder::new().file("zstd", b"z", 0o644),
            LayerCompression::Zstd,
        )
        .layer_compressed(
            LayerBuilder::new().file("plain", b"p", 0o644),
            LayerCompression::None,
        )
        .write_tar(dir.path(), ImageFormat::OciLayout)
        .expect("tar");
    let registry = FakeRegistry::from_layout(&tar, "1");
    let store = store(dir.path());
    let image = store
        .pull(
            &registry,
            "reg.test:5000/corral/t:1",
            PullOptions::default(),
        )
        .expect("pull");
    let media: Vec<&str> = image.layers.iter().map(|l| l.media_type.as_str()).collect();
    assert_eq!(
        media,
        [
            "application/vnd.oci.image.layer.v1.tar+gzip",
            "application/vnd.oci.image.layer.v1.tar+zstd",
            "application/vnd.oci.image.layer.v1.tar"
        ]
    );
    for (diff_id, (file, contents)) in
        image
            .diff_ids
            .iter()
            .zip([("gzip", "g"), ("zstd", "z"), ("plain", "p")])
    {
        let path = store.layer_path(diff_id).join(file);
        assert_eq!(fs::read_to_string(&path).expect("read"), contents);
    }
}
