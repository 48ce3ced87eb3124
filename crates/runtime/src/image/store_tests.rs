//! Store tests on small images built by the testkit. Unpacking keeps
//! ownership and makes whiteout device nodes, so these need root.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use corral_testkit::{ImageBuilder, ImageFormat, LayerBuilder, require_root};
use serde_json::json;

use super::*;
use crate::image::layout;

fn two_layer_image(name: &str) -> ImageBuilder {
    let bottom = LayerBuilder::new()
        .dir("etc", 0o755)
        .file("etc/motd", b"hello\n", 0o644)
        .dir("cache", 0o755)
        .file("cache/old", b"stale", 0o644)
        .file_owned("srv-data", b"nobody's", 0o600, 65534, 65534)
        .file("bin-tool", b"#!/bin/sh\n", 0o755)
        .hardlink("bin-tool-link", "bin-tool")
        .symlink("tool", "bin-tool");
    let top = LayerBuilder::new()
        .whiteout("etc", "motd")
        .dir("cache", 0o755)
        .opaque("cache")
        .file("cache/new", b"fresh", 0o644);
    ImageBuilder::new(name)
        .layer(bottom)
        .layer(top)
        .config("Cmd", json!(["/tool"]))
        .config("Env", json!(["PATH=/bin", "A=1"]))
        .config("WorkingDir", json!("/srv"))
        .config("User", json!("65534:65534"))
}

fn store(dir: &Path) -> ImageStore {
    ImageStore::open(dir.join("store")).expect("open store")
}

#[test]
fn imports_oci_layout_and_unpacks_layers() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = two_layer_image("local/t:1")
        .write_tar(dir.path(), ImageFormat::OciLayout)
        .expect("tar");
    let store = store(dir.path());
    let imported = store.import(&tar, None).expect("import");
    assert_eq!(imported.len(), 1);
    let image = store.resolve("local/t:1").expect("resolve");
    assert_eq!(image, imported[0]);
    assert_eq!(image.config.cmd, Some(vec!["/tool".to_string()]));
    assert_eq!(image.config.working_dir.as_deref(), Some("/srv"));
    assert_eq!(image.config.user.as_deref(), Some("65534:65534"));
    assert_eq!(image.diff_ids.len(), 2);
    assert_eq!(
        store.list().expect("list"),
        vec![ImageSummary {
            reference: "local/t:1".into(),
            manifest_digest: image.manifest_digest.clone()
        }]
    );

    let bottom = store.layer_path(&image.diff_ids[0]);
    let top = store.layer_path(&image.diff_ids[1]);
    let data = fs::metadata(bottom.join("srv-data")).expect("srv-data");
    assert_eq!((data.uid(), data.gid()), (65534, 65534));
    assert_eq!(data.permissions().mode() & 0o7777, 0o600);
    let tool = fs::metadata(bottom.join("bin-tool")).expect("bin-tool");
    assert_eq!(tool.nlink(), 2, "hard link kept");
    assert_eq!(
        fs::read_link(bottom.join("tool")).expect("symlink"),
        Path::new("bin-tool")
    );
    let whiteout = fs::symlink_metadata(top.join("etc/motd")).expect("whiteout");
    assert!(whiteout.file_type().is_char_device());
    assert_eq!(whiteout.rdev(), 0);
    assert!(!top.join("etc/.wh.motd").exists());
    assert_eq!(
        xattr::get(top.join("cache"), "trusted.overlay.opaque").expect("xattr"),
        Some(b"y".to_vec())
    );
    assert!(!top.join("cache/.wh..wh..opq").exists());
}

#[test]
fn docker_archive_gives_the_same_layers_and_config() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let oci = two_layer_image("local/t:1")
        .write_tar(dir.path(), ImageFormat::OciLayout)
        .expect("oci tar");
    let docker = two_layer_image("local/t:2")
        .write_tar(dir.path(), ImageFormat::DockerArchive)
        .expect("docker tar");
    let store = store(dir.path());
    let from_oci = store.import(&oci, None).expect("import oci").remove(0);
    let from_docker = store
        .import(&docker, None)
        .expect("import docker")
        .remove(0);
    assert_eq!(from_docker.reference.to_string(), "local/t:2");
    assert_eq!(from_docker.diff_ids, from_oci.diff_ids);
    assert_eq!(from_docker.config_digest, from_oci.config_digest);
    assert_eq!(from_docker.config, from_oci.config);
    // Docker layers are stored uncompressed: blob digest == diff id.
    assert_eq!(from_docker.layers[0].digest, from_docker.diff_ids[0]);
    assert_eq!(store.resolve("local/t:2").expect("resolve"), from_docker);
}

#[test]
fn name_override_renames_and_unnamed_archives_need_one() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = two_layer_image("local/t:1")
        .write_tar(dir.path(), ImageFormat::DockerArchive)
        .expect("tar");
    let store = store(dir.path());
    let image = store
        .import(&tar, Some("example/renamed:7"))
        .expect("import")
        .remove(0);
    assert_eq!(image.reference.to_string(), "example/renamed:7");
    assert!(matches!(
        store.resolve("local/t:1"),
        Err(ImageError::NotFound(_))
    ));
    assert!(matches!(
        store.import(&tar, Some("Bad Name")),
        Err(ImageError::Reference(_))
    ));
}

/// Copies a tar, replacing the contents of entries whose path ends with `suffix`.
fn tamper(src: &Path, dst: &Path, suffix: &str) {
    let mut input = tar::Archive::new(fs::File::open(src).expect("open"));
    let mut output = tar::Builder::new(fs::File::create(dst).expect("create"));
    for entry in input.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let path = entry.path().expect("path").into_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).expect("read");
        if path.to_string_lossy().ends_with(suffix) {
            data = b"tampered".to_vec();
        }
        let mut header = entry.header().clone();
        header.set_size(data.len() as u64);
        output
            .append_data(&mut header, &path, &data[..])
            .expect("append");
    }
    output.finish().expect("finish");
}

#[test]
fn tampered_oci_blob_fails_digest_check_and_stores_nothing() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = two_layer_image("local/t:1")
        .write_tar(dir.path(), ImageFormat::OciLayout)
        .expect("tar");
    // Tamper with the first blob (whichever it is, its name is its digest).
    let first_blob = {
        let mut archive = tar::Archive::new(fs::File::open(&tar).expect("open"));
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
            .find(|p| p.starts_with("blobs/sha256/"))
            .expect("a blob")
    };
    let bad = dir.path().join("bad.tar");
    tamper(&tar, &bad, &first_blob);
    let store = store(dir.path());
    let err = store.import(&bad, None).expect_err("tampered import");
    assert!(
        matches!(err, ImageError::DigestMismatch { .. }),
        "unexpected error: {err}"
    );
    assert!(store.list().expect("list").is_empty());
    assert_eq!(
        fs::read_dir(store.root().join("blobs/sha256"))
            .expect("ls")
            .count(),
        0
    );
    assert_eq!(
        fs::read_dir(store.root().join("tmp")).expect("ls").count(),
        0
    );
}

#[test]
fn tampered_docker_layer_fails_digest_check() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = two_layer_image("local/t:1")
        .write_tar(dir.path(), ImageFormat::DockerArchive)
        .expect("tar");
    let bad = dir.path().join("bad.tar");
    tamper(&tar, &bad, "layer.tar");
    let err = store(dir.path()).import(&bad, None).expect_err("tampered");
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
}

#[test]
fn a_streamed_archive_imports_and_a_cut_one_stores_nothing() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = two_layer_image("local/t:1")
        .write_tar(dir.path(), ImageFormat::OciLayout)
        .expect("tar");
    let bytes = fs::read(&tar).expect("read tar");
    let store = store(dir.path());
    let upload = Path::new("the upload");
    // Not on a 512-byte block boundary: the archive is cut mid-block.
    let cut = &bytes[..bytes.len() / 2 + 100];
    let error = store
        .import_reader(cut, upload, None)
        .expect_err("half an archive");
    assert!(
        matches!(&error, ImageError::ReadArchive { path, .. } if path == upload),
        "a cut archive is a read error, not the disk's: {error:?}"
    );
    assert!(store.list().expect("list").is_empty());
    assert_eq!(
        fs::read_dir(store.root().join("tmp")).expect("ls").count(),
        0,
        "staging is cleaned up"
    );
    let imported = store
        .import_reader(&bytes[..], upload, Some("local/streamed:2"))
        .expect("whole archive");
    assert_eq!(imported.len(), 1);
    assert_eq!(imported[0].reference.to_string(), "local/streamed:2");
    assert!(store.resolve("local/streamed:2").is_ok());
}

#[test]
fn unknown_archive_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = dir.path().join("junk.tar");
    let mut builder = tar::Builder::new(fs::File::create(&tar).expect("create"));
    let mut header = tar::Header::new_gnu();
    header.set_size(3);
    builder
        .append_data(&mut header, "hello.txt", &b"hi\n"[..])
        .expect("append");
    builder.finish().expect("finish");
    assert!(matches!(
        store(dir.path()).import(&tar, None),
        Err(ImageError::UnknownArchive(_))
    ));
}

#[test]
fn retain_removes_unreferenced_images_blobs_and_layers() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path());
    let keep = ImageBuilder::new("local/keep:1")
        .layer(LayerBuilder::new().file("k", b"keep", 0o644))
        .config("Cmd", json!(["k"]))
        .write_tar(dir.path(), ImageFormat::OciLayout)
        .expect("tar");
    let keep = store.import(&keep, None).expect("import keep").remove(0);
    let drop_dir = dir.path().join("drop");
    fs::create_dir(&drop_dir).expect("mkdir");
    let gone = ImageBuilder::new("local/gone:1")
        .layer(LayerBuilder::new().file("g", b"gone", 0o644))
        .config("Cmd", json!(["g"]))
        .write_tar(&drop_dir, ImageFormat::OciLayout)
        .expect("tar");
    let gone = store.import(&gone, None).expect("import gone").remove(0);

    let report = store.retain(&["local/keep:1"]).expect("retain");
    assert_eq!(report.removed_images, vec!["local/gone:1".to_string()]);
    assert_eq!(report.removed_blobs, 3, "manifest, config and layer");
    assert_eq!(report.removed_layers, 1);
    assert!(store.resolve("local/keep:1").is_ok());
    assert!(store.layer_path(&keep.diff_ids[0]).is_dir());
    assert!(!store.layer_path(&gone.diff_ids[0]).exists());
    assert!(matches!(
        store.resolve("local/gone:1"),
        Err(ImageError::NotFound(_))
    ));
    // Idempotent.
    assert_eq!(
        store.retain(&["local/keep:1"]).expect("again"),
        GcReport::default()
    );
}

#[path = "store_pull_tests.rs"]
mod pull;

/// Opening a store removes staging left by processes that are gone, and
/// leaves alone what a live process is staging (the agent's pull while
/// `corral image import` opens the same store).
#[test]
fn opening_keeps_a_live_process_staging() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("store/tmp");
    fs::create_dir_all(&tmp).unwrap();
    // Processes that are certainly running (this one, and init) and ones
    // that certainly are not (pids above the kernel's largest, 4194304).
    let ours = format!("stage-{}-7", std::process::id());
    let init = "blob-1-3".to_string();
    let gone = "stage-4194305-1".to_string();
    let nameless = "leftover".to_string();
    for name in [&ours, &init, &gone, &nameless] {
        fs::write(tmp.join(name), b"partial").unwrap();
    }
    fs::create_dir(tmp.join("layer-4194306-2")).unwrap();
    fs::write(tmp.join("layer-4194306-2/file"), b"x").unwrap();

    let _store = store(dir.path());
    let mut left: Vec<String> = fs::read_dir(&tmp)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    let mut expected = vec![init, ours];
    expected.sort();
    assert_eq!(left, expected, "only the live processes' staging stays");
}
