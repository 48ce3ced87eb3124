//! Unpacking one layer tar into a directory usable as an overlayfs lower
//! layer: OCI whiteouts (`.wh.<name>`, `.wh..wh..opq`) become overlay
//! whiteouts (a 0/0 character device, the `trusted.overlay.opaque` xattr);
//! ownership, permissions, symlinks and hard links are kept.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use super::digest::{Digest, HashingReader};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// Why a layer could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("layer entry {0:?} escapes the layer root")]
    UnsafePath(PathBuf),
    #[error("failed to read layer entry")]
    Read(#[source] io::Error),
    #[error("failed to unpack layer entry {path:?}")]
    Unpack {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to create whiteout {path:?}")]
    Whiteout {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("uncompressed layer has digest {actual}, the image config says {expected}")]
    DiffIdMismatch { expected: Digest, actual: Digest },
}

/// What to do with one layer entry, decided from its path alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryAction {
    /// `dir/.wh..wh..opq`: hide everything lower layers have in `dir`.
    Opaque { dir: PathBuf },
    /// `dir/.wh.name`: delete `dir/name` from lower layers.
    Whiteout { dir: PathBuf, name: OsString },
    /// An ordinary entry at this (normalised, relative) path.
    Unpack { path: PathBuf },
}

/// Normalises an entry path (drops `./` and a leading `/`) and says what
/// the entry means. Paths with `..` are refused.
pub fn classify(path: &Path) -> Result<EntryAction, LayerError> {
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(LayerError::UnsafePath(path.to_path_buf()));
            }
        }
    }
    let dir = clean.parent().map(Path::to_path_buf).unwrap_or_default();
    let Some(file_name) = clean.file_name().and_then(|n| n.to_str()) else {
        return Ok(EntryAction::Unpack { path: clean });
    };
    if file_name == OPAQUE_MARKER {
        return Ok(EntryAction::Opaque { dir });
    }
    if let Some(hidden) = file_name.strip_prefix(WHITEOUT_PREFIX) {
        if hidden.is_empty() || hidden == "." || hidden == ".." {
            return Err(LayerError::UnsafePath(path.to_path_buf()));
        }
        return Ok(EntryAction::Whiteout {
            dir,
            name: OsString::from(hidden),
        });
    }
    Ok(EntryAction::Unpack { path: clean })
}

/// Wraps a blob reader in the decompressor its first bytes call for
/// (gzip `1f 8b`, zstd `28 b5 2f fd`, or none).
pub fn decompressed(mut blob: impl Read + 'static) -> io::Result<Box<dyn Read>> {
    let mut magic = [0u8; 4];
    let mut filled = 0;
    while filled < magic.len() {
        let n = blob.read(&mut magic[filled..])?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    let head = io::Cursor::new(magic[..filled].to_vec());
    let whole = head.chain(blob);
    Ok(if magic[..filled].starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(whole))
    } else if magic[..filled] == [0x28, 0xb5, 0x2f, 0xfd] {
        Box::new(zstd::stream::read::Decoder::new(whole)?)
    } else {
        Box::new(whole)
    })
}

/// Unpacks the (possibly compressed) layer `blob` into `dest`, which must
/// exist and be empty, and checks the uncompressed digest against `diff_id`.
pub fn unpack_layer(
    blob: impl Read + 'static,
    dest: &Path,
    diff_id: &Digest,
) -> Result<(), LayerError> {
    let reader = HashingReader::new(decompressed(blob).map_err(LayerError::Read)?);
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_unpack_xattrs(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    let root = dest.canonicalize().map_err(|source| LayerError::Unpack {
        path: dest.to_path_buf(),
        source,
    })?;
    for entry in archive.entries().map_err(LayerError::Read)? {
        let mut entry = entry.map_err(LayerError::Read)?;
        let raw_path = entry.path().map_err(LayerError::Read)?.into_owned();
        match classify(&raw_path)? {
            EntryAction::Opaque { dir } => {
                let dir = safe_dir(&root, &dir)?;
                xattr::set(&dir, OPAQUE_XATTR, b"y").map_err(|source| LayerError::Whiteout {
                    path: dir.clone(),
                    source,
                })?;
            }
            EntryAction::Whiteout { dir, name } => {
                let target = safe_dir(&root, &dir)?.join(name);
                make_whiteout(&target).map_err(|source| LayerError::Whiteout {
                    path: target,
                    source,
                })?;
            }
            EntryAction::Unpack { path } => {
                let kind = entry.header().entry_type();
                if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
                    make_device(&root, &path, entry.header())?;
                } else {
                    entry
                        .unpack_in(&root)
                        .map_err(|source| LayerError::Unpack { path, source })?;
                }
            }
        }
    }
    let actual = archive.into_inner().finish().map_err(LayerError::Read)?;
    if &actual != diff_id {
        return Err(LayerError::DiffIdMismatch {
            expected: diff_id.clone(),
            actual,
        });
    }
    Ok(())
}

/// Creates `root/relative` (and parents) and checks that, symlinks
/// resolved, it is still inside `root`.
fn safe_dir(root: &Path, relative: &Path) -> Result<PathBuf, LayerError> {
    let dir = root.join(relative);
    let unsafe_path = || LayerError::UnsafePath(relative.to_path_buf());
    fs::create_dir_all(&dir).map_err(|source| LayerError::Unpack {
        path: relative.to_path_buf(),
        source,
    })?;
    let canonical = dir.canonicalize().map_err(|_| unsafe_path())?;
    if canonical.starts_with(root) {
        Ok(canonical)
    } else {
        Err(unsafe_path())
    }
}

fn make_whiteout(target: &Path) -> io::Result<()> {
    match fs::symlink_metadata(target) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(target)?,
        Ok(_) => fs::remove_file(target)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    mknod(target, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0)).map_err(io::Error::from)
}

fn make_device(root: &Path, path: &Path, header: &tar::Header) -> Result<(), LayerError> {
    let dir = safe_dir(root, path.parent().unwrap_or(Path::new("")))?;
    let Some(name) = path.file_name() else {
        return Err(LayerError::UnsafePath(path.to_path_buf()));
    };
    let target = dir.join(name);
    let io_err = |source: io::Error| LayerError::Unpack {
        path: path.to_path_buf(),
        source,
    };
    let kind = header.entry_type();
    let flag = if kind.is_character_special() {
        SFlag::S_IFCHR
    } else if kind.is_block_special() {
        SFlag::S_IFBLK
    } else {
        SFlag::S_IFIFO
    };
    let major = header.device_major().map_err(io_err)?.unwrap_or(0);
    let minor = header.device_minor().map_err(io_err)?.unwrap_or(0);
    let mode = header.mode().map_err(io_err)? & 0o7777;
    let _ = fs::remove_file(&target);
    mknod(
        &target,
        flag,
        Mode::from_bits_truncate(mode),
        makedev(major.into(), minor.into()),
    )
    .map_err(|e| io_err(e.into()))?;
    let uid = header.uid().map_err(io_err)?;
    let gid = header.gid().map_err(io_err)?;
    std::os::unix::fs::lchown(&target, Some(uid as u32), Some(gid as u32)).map_err(io_err)?;
    fs::set_permissions(&target, fs::Permissions::from_mode(mode)).map_err(io_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_entries_are_normalised() {
        assert_eq!(
            classify(Path::new("./bin/sh")).expect("ok"),
            EntryAction::Unpack {
                path: PathBuf::from("bin/sh")
            }
        );
        assert_eq!(
            classify(Path::new("/etc/passwd")).expect("ok"),
            EntryAction::Unpack {
                path: PathBuf::from("etc/passwd")
            }
        );
    }

    #[test]
    fn whiteouts_are_recognised() {
        assert_eq!(
            classify(Path::new("etc/.wh.motd")).expect("ok"),
            EntryAction::Whiteout {
                dir: PathBuf::from("etc"),
                name: OsString::from("motd")
            }
        );
        assert_eq!(
            classify(Path::new(".wh.tmp")).expect("ok"),
            EntryAction::Whiteout {
                dir: PathBuf::new(),
                name: OsString::from("tmp")
            }
        );
        assert_eq!(
            classify(Path::new("./var/cache/.wh..wh..opq")).expect("ok"),
            EntryAction::Opaque {
                dir: PathBuf::from("var/cache")
            }
        );
    }

    #[test]
    fn traversal_is_refused() {
        assert!(matches!(
            classify(Path::new("../etc/passwd")),
            Err(LayerError::UnsafePath(_))
        ));
        assert!(matches!(
            classify(Path::new("a/../../b")),
            Err(LayerError::UnsafePath(_))
        ));
        assert!(matches!(
            classify(Path::new("a/.wh.")),
            Err(LayerError::UnsafePath(_))
        ));
    }

    #[test]
    fn detects_gzip_and_plain() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"layer bytes").expect("gzip");
        let gz = gz.finish().expect("gzip");
        let mut out = String::new();
        decompressed(io::Cursor::new(gz))
            .expect("open")
            .read_to_string(&mut out)
            .expect("read");
        assert_eq!(out, "layer bytes");
        let mut out = String::new();
        decompressed(io::Cursor::new(b"ab".to_vec()))
            .expect("open")
            .read_to_string(&mut out)
            .expect("read");
        assert_eq!(out, "ab");
    }
}
