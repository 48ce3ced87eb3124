//! Where a pod's Secret and Config data lives on the node: a tmpfs at
//! `DATA/pods/UID/data` (never the node's disk), mode 0710, owned by root
//! and the group of the pod's root user — so on the host only root and the
//! pod's root may pass through it (to bind-mount a volume) — holding
//!
//! - `NAME/` for each secret or config volume: one file per key, mode 0444,
//!   in a directory of mode 0555, both owned by the pod's root user; the
//!   directory is bind-mounted read-only into the containers that mount
//!   the volume, where every user of the pod may read it (containers run as
//!   `nobody` unless the pod may run as root);
//! - `values.json`: every value the pod reads ([`PodData`]), mode 0600,
//!   root's — env values are resolved from it when a container (re)starts,
//!   so a restarted agent needs no API to restart a container;
//! - `bundles/ID/`: the runtime bundle of a container whose env holds such
//!   values (its `config.json` carries them), root's.
//!
//! Files are replaced atomically (a temporary file in the same directory,
//! renamed over the old one): a running container reads the old content or
//! the new, never half of one, and sees a change without restarting.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use corral_api::kinds::{DataRef, PodSpec};
use corral_runtime::mounts::is_mount_point;

use super::PodData;

/// The snapshot of values in the pod's data directory.
pub const VALUES_FILE: &str = "values.json";

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("cannot write the pod's data at {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot mount a tmpfs for the pod's data at {path}")]
    Mount {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("the pod's data snapshot {path} is corrupt")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{data} has no value for key {key} in the snapshot")]
    Value { data: String, key: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FilesError + '_ {
    move |source| FilesError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Who owns the files the pod reads: the pod's root user on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileOwner {
    pub uid: u32,
    pub gid: u32,
}

impl FileOwner {
    /// The pod's root: `host_base` of its user namespace, or host root.
    pub fn pod_root(host_base: Option<u32>) -> Self {
        let id = host_base.unwrap_or(0);
        FileOwner { uid: id, gid: id }
    }
}

/// `DATA/pods/UID/data`.
pub fn data_dir(pods_dir: &Path, uid: &str) -> PathBuf {
    crate::containers::pod_dir(pods_dir, uid).join("data")
}

/// The directory of secret or config volume `volume`.
pub fn volume_dir(pods_dir: &Path, uid: &str, volume: &str) -> PathBuf {
    data_dir(pods_dir, uid).join(volume)
}

/// Where the runtime bundle of container `runtime_id` goes when its env
/// holds values of Secrets or Configs (root-only, in the tmpfs).
pub fn bundle_dir(pods_dir: &Path, uid: &str, runtime_id: &str) -> PathBuf {
    data_dir(pods_dir, uid).join("bundles").join(runtime_id)
}

/// Mounts the pod's data tmpfs at `dir` unless it is there (idempotent),
/// passable only by root and `owner`'s group.
pub fn mount(dir: &Path, owner: FileOwner) -> Result<(), FilesError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    if !is_mount_point(dir) {
        use nix::mount::MsFlags;
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            // Not noexec: a flag locked on the tmpfs that the runtime's
            // read-only bind remount in the pod's user namespace does not
            // repeat makes that remount fail (EPERM).
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0700"),
        )
        .map_err(|source| FilesError::Mount {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    std::os::unix::fs::chown(dir, Some(0), Some(owner.gid)).map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710)).map_err(io(dir))
}

/// Unmounts the pod's data tmpfs (the values are gone with it).
pub fn unmount(dir: &Path) {
    if is_mount_point(dir) {
        let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Writes `content` to `path` atomically: a temporary file beside it
/// (a name no key can have: `~` is not allowed in keys), then a rename.
fn replace(path: &Path, content: &[u8], mode: u32, owner: FileOwner) -> Result<(), FilesError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".~{name}"));
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)
        .map_err(io(&temporary))?;
    file.write_all(content).map_err(io(&temporary))?;
    std::os::unix::fs::fchown(&file, Some(owner.uid), Some(owner.gid)).map_err(io(&temporary))?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(io(path))
}

/// Writes the files of the pod's secret and config volumes from `data`
/// (only those showing `only`, when given), removing files of keys that
/// are gone, and the snapshot of values. Returns the volumes written.
pub fn write(
    dir: &Path,
    spec: &PodSpec,
    data: &PodData,
    owner: FileOwner,
    only: Option<&DataRef>,
) -> Result<Vec<String>, FilesError> {
    // Values first: a crash midway leaves the snapshot ahead of the files,
    // and the next write brings the files along.
    let values = dir.join(VALUES_FILE);
    // INVARIANT: maps of strings and integers always serialize.
    let json = serde_json::to_vec(data).expect("pod data serializes");
    replace(&values, &json, 0o600, FileOwner { uid: 0, gid: 0 })?;
    let mut written = Vec::new();
    for volume in &spec.volumes {
        let Some(source) = volume.data_ref() else {
            continue;
        };
        if only.is_some_and(|only| *only != source) {
            continue;
        }
        let Some(values) = data.get(&source) else {
            continue;
        };
        let target = dir.join(&volume.name);
        std::fs::create_dir_all(&target).map_err(io(&target))?;
        // Writable by its owner while written (root writes anyway).
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700))
            .map_err(io(&target))?;
        for key in values.values.keys() {
            let value = values.value(&source, key).map_err(|_| FilesError::Value {
                data: source.to_string(),
                key: key.clone(),
            })?;
            replace(&target.join(key), &value, 0o444, owner)?;
        }
        for entry in std::fs::read_dir(&target).map_err(io(&target))? {
            let entry = entry.map_err(io(&target))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !values.values.contains_key(&name) {
                let path = entry.path();
                std::fs::remove_file(&path).map_err(io(&path))?;
            }
        }
        std::os::unix::fs::chown(&target, Some(owner.uid), Some(owner.gid)).map_err(io(&target))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o555))
            .map_err(io(&target))?;
        written.push(volume.name.clone());
    }
    Ok(written)
}

/// The env container `runtime_id` was started with, from its bundle in
/// the tmpfs (`None`: it took no values of Secrets or Configs).
pub fn started_env(
    pods_dir: &Path,
    uid: &str,
    runtime_id: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    let config = bundle_dir(pods_dir, uid, runtime_id).join("config.json");
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(config).ok()?).ok()?;
    let env = config.get("process")?.get("env")?.as_array()?;
    Some(
        env.iter()
            .filter_map(|pair| pair.as_str()?.split_once('='))
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect(),
    )
}

/// The snapshot of values, if the pod's data was written (and the tmpfs
/// survived: not after a reboot).
pub fn read(dir: &Path) -> Result<Option<PodData>, FilesError> {
    let path = dir.join(VALUES_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| FilesError::Corrupt { path, source }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FilesError::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::MetadataExt;

    use super::super::tests::{source_data, spec};
    use super::*;

    fn me() -> FileOwner {
        let meta = std::fs::metadata("/proc/self").unwrap();
        FileOwner {
            uid: meta.uid(),
            gid: meta.gid(),
        }
    }

    fn data(password: &str) -> PodData {
        let mut data = PodData::default();
        data.insert(
            &DataRef::secret("db"),
            source_data(1, &[("password", password), ("user", "app")]),
        );
        data.insert(&DataRef::config("app"), source_data(1, &[("mode", "fast")]));
        data
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn each_volume_is_a_directory_of_read_only_files_beside_a_root_only_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec();
        let written = write(dir.path(), &spec, &data("s3cret"), me(), None).unwrap();
        assert_eq!(written, ["db", "app"]);
        let db = dir.path().join("db");
        assert_eq!(
            std::fs::read_to_string(db.join("password")).unwrap(),
            "s3cret"
        );
        assert_eq!(std::fs::read_to_string(db.join("user")).unwrap(), "app");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("app/mode")).unwrap(),
            "fast"
        );
        assert_eq!(mode(&db), 0o555);
        assert_eq!(mode(&db.join("password")), 0o444);
        assert_eq!(mode(&dir.path().join(VALUES_FILE)), 0o600);
        assert_eq!(read(dir.path()).unwrap(), Some(data("s3cret")));
        assert_eq!(read(&dir.path().join("none")).unwrap(), None);
    }

    #[test]
    fn a_new_revision_replaces_files_in_place_and_drops_removed_keys() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec();
        write(dir.path(), &spec, &data("old"), me(), None).unwrap();
        let password = dir.path().join("db/password");
        let before = std::fs::metadata(&password).unwrap().ino();
        let mut next = data("new");
        next.insert(
            &DataRef::secret("db"),
            source_data(2, &[("password", "new")]),
        );
        let written = write(dir.path(), &spec, &next, me(), Some(&DataRef::secret("db"))).unwrap();
        assert_eq!(written, ["db"]);
        assert_eq!(std::fs::read_to_string(&password).unwrap(), "new");
        // Renamed over: a new inode, no temporary file left.
        assert_ne!(std::fs::metadata(&password).unwrap().ino(), before);
        let names: Vec<String> = std::fs::read_dir(dir.path().join("db"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["password"]);
        assert_eq!(read(dir.path()).unwrap(), Some(next));
    }
}
