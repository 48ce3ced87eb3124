//! An image from a directory (`corral image pack`): one gzip layer holding
//! the directory's files, directories and symbolic links (owned by root,
//! times zeroed, in name order: the same directory makes the same digest),
//! an OCI config for this host's platform, written as an OCI layout archive
//! that `corral image import` reads. It is how a first image is made from
//! the host's busybox without building anything.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::layout::host_architecture;
use super::reference::Reference;
use super::store::{ImageError, io_err};

/// The `PATH` a packed image's processes start with.
const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Directories every image gets when the packed directory lacks them.
const MOUNT_POINTS: [(&str, u32); 5] = [
    ("dev", 0o755),
    ("etc", 0o755),
    ("proc", 0o555),
    ("sys", 0o555),
    ("tmp", 0o1777),
];

/// What [`pack_dir`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    pub reference: String,
    /// `sha256:…` of the image manifest.
    pub manifest_digest: String,
    /// Entries in the layer (files, directories, links).
    pub entries: usize,
    /// The compressed layer's size in bytes.
    pub layer_bytes: u64,
}

/// Packs `dir` into an OCI layout archive at `out` naming the image
/// `reference`; `command` becomes its default command (`Cmd`) when given.
pub fn pack_dir(
    dir: &Path,
    reference: &str,
    command: &[String],
    out: &Path,
) -> Result<Packed, ImageError> {
    reference.parse::<Reference>()?;
    if !fs::metadata(dir).map_err(io_err("read", dir))?.is_dir() {
        return Err(ImageError::Io {
            op: "pack",
            path: dir.to_path_buf(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "not a directory"),
        });
    }
    let mut layer = tar::Builder::new(Vec::new());
    layer.follow_symlinks(false);
    let mut entries = add_tree(&mut layer, dir, Path::new(""))?;
    // The mount points a container needs at its root: inside the pod's user
    // namespace the runtime cannot create them in a root owned by the host.
    for (name, mode) in MOUNT_POINTS {
        if fs::symlink_metadata(dir.join(name)).is_err() {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(mode);
            header.set_uid(0);
            header.set_gid(0);
            header.set_size(0);
            header.set_mtime(0);
            layer
                .append_data(&mut header, name, io::empty())
                .map_err(io_err("write the layer of", dir))?;
            entries += 1;
        }
    }
    let tar = layer
        .into_inner()
        .map_err(io_err("write the layer of", dir))?;
    let diff_id = hex(&tar);
    let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
    gzip.write_all(&tar)
        .map_err(io_err("compress the layer of", dir))?;
    let blob = gzip
        .finish()
        .map_err(io_err("compress the layer of", dir))?;
    // Docker's default PATH, so commands are found without a full path.
    let mut config_section = json!({"Env": [DEFAULT_PATH]});
    if !command.is_empty() {
        config_section["Cmd"] = json!(command);
    }
    let config = to_vec(&json!({
        "architecture": host_architecture(),
        "os": "linux",
        "config": config_section,
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    }));
    let manifest = to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{}", hex(&config)),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{}", hex(&blob)),
            "size": blob.len(),
        }],
    }));
    let index = to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{}", hex(&manifest)),
            "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": reference},
        }],
    }));
    let file = File::create(out).map_err(io_err("create", out))?;
    let mut archive = tar::Builder::new(file);
    let mut add = |name: String, bytes: &[u8]| {
        let mut header = tar::Header::new_ustar();
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_size(bytes.len() as u64);
        header.set_mtime(0);
        header.set_cksum();
        archive
            .append_data(&mut header, name, bytes)
            .map_err(io_err("write", out))
    };
    add("oci-layout".into(), br#"{"imageLayoutVersion": "1.0.0"}"#)?;
    for bytes in [&blob, &config, &manifest] {
        add(format!("blobs/sha256/{}", hex(bytes)), bytes)?;
    }
    add("index.json".into(), &index)?;
    archive
        .into_inner()
        .and_then(|file| file.sync_all())
        .map_err(io_err("write", out))?;
    Ok(Packed {
        reference: reference.to_string(),
        manifest_digest: format!("sha256:{}", hex(&manifest)),
        entries,
        layer_bytes: blob.len() as u64,
    })
}

/// Adds the entries below `root/relative`, in name order; returns how many.
fn add_tree(
    layer: &mut tar::Builder<Vec<u8>>,
    root: &Path,
    relative: &Path,
) -> Result<usize, ImageError> {
    let dir = root.join(relative);
    let mut names: Vec<PathBuf> = fs::read_dir(&dir)
        .map_err(io_err("read", &dir))?
        .map(|entry| entry.map(|e| e.file_name().into()))
        .collect::<Result<_, _>>()
        .map_err(io_err("read", &dir))?;
    names.sort();
    let mut count = 0;
    for name in names {
        let inside = relative.join(&name);
        let path = root.join(&inside);
        let metadata = fs::symlink_metadata(&path).map_err(io_err("read", &path))?;
        let kind = metadata.file_type();
        let mut header = tar::Header::new_gnu();
        header.set_mode(metadata.permissions().mode() & 0o7777);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        let written = if kind.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            layer.append_data(&mut header, &inside, io::empty())
        } else if kind.is_symlink() {
            let target = fs::read_link(&path).map_err(io_err("read the link", &path))?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            layer.append_link(&mut header, &inside, target)
        } else if kind.is_file() {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(metadata.size());
            let file = File::open(&path).map_err(io_err("read", &path))?;
            layer.append_data(&mut header, &inside, file)
        } else {
            return Err(ImageError::Io {
                op: "pack",
                path,
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "an image holds files, directories and symbolic links, not devices, sockets or pipes",
                ),
            });
        };
        written.map_err(io_err("pack", &path))?;
        count += 1;
        if kind.is_dir() {
            count += add_tree(layer, root, &inside)?;
        }
    }
    Ok(count)
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn to_vec(value: &serde_json::Value) -> Vec<u8> {
    // INVARIANT: a serde_json::Value always serialises.
    serde_json::to_vec(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::ImageStore;

    #[test]
    fn a_packed_directory_imports_as_an_image_with_its_files_links_and_command() {
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("root");
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("bin/tool"), b"#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(root.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join("etc/motd"), b"hello").unwrap();
        std::os::unix::fs::symlink("tool", root.join("bin/alias")).unwrap();
        let archive = work.path().join("image.tar");
        let packed = pack_dir(&root, "local/tool:1", &["/bin/tool".to_string()], &archive).unwrap();
        // bin, bin/alias, bin/tool, etc, etc/motd, then dev, proc, sys, tmp.
        assert_eq!(packed.entries, 9);
        // The same directory packs to the same image.
        let again = pack_dir(
            &root,
            "local/tool:1",
            &["/bin/tool".to_string()],
            &work.path().join("again.tar"),
        )
        .unwrap();
        assert_eq!(again.manifest_digest, packed.manifest_digest);

        let store = ImageStore::open(work.path().join("store")).unwrap();
        let images = store.import(&archive, None).unwrap();
        assert_eq!(images.len(), 1);
        let image = store.resolve("local/tool:1").unwrap();
        assert_eq!(image.manifest_digest.to_string(), packed.manifest_digest);
        assert_eq!(image.config.cmd, Some(vec!["/bin/tool".to_string()]));
        assert_eq!(image.config.env, Some(vec![DEFAULT_PATH.to_string()]));
        let layer = store.layer_path(&image.diff_ids[0]);
        assert_eq!(fs::read(layer.join("etc/motd")).unwrap(), b"hello");
        assert_eq!(
            fs::read_link(layer.join("bin/alias")).unwrap(),
            Path::new("tool")
        );
        let mode = fs::metadata(layer.join("bin/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
    }

    #[test]
    fn bad_names_and_missing_directories_are_refused() {
        let work = tempfile::tempdir().unwrap();
        let out = work.path().join("x.tar");
        assert!(matches!(
            pack_dir(work.path(), "Not A Name", &[], &out),
            Err(ImageError::Reference(_))
        ));
        let missing = pack_dir(&work.path().join("nope"), "local/x:1", &[], &out).unwrap_err();
        assert!(missing.to_string().contains("nope"), "{missing}");
        assert!(!out.exists(), "nothing written");
    }
}
