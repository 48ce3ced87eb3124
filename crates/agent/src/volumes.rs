//! Pod volumes on this node: where each lives on the host, creating and
//! releasing them (`node/prepare-volumes`, and removal with the pod), and
//! the bind mounts a container gets for its `mounts`.
//!
//! - `emptyDir`: `DATA/pods/UID/volumes/NAME`, a directory, or a tmpfs with
//!   `medium: Memory`; removed with the pod.
//! - `local`: `DATA/volumes/NAME/data`, a named node-local volume that
//!   outlives every pod using it (a VM's `disk.volume` lives beside it as
//!   `DATA/volumes/NAME/disk.qcow2`).
//! - `plugin`: `DATA/pods/UID/volumes/NAME`, made and handed to the pod
//!   here like an emptyDir, then filled or mounted over by the volume
//!   plugin's own steps (`crate::plugins`); a plugin may answer another
//!   path, recorded in `DATA/pods/UID/plugin-volumes/NAME.path`.
//! - `secret` and `config`: `DATA/pods/UID/data/NAME` in the pod's data
//!   tmpfs, written by [`crate::pod_data`], always mounted read-only.
//!
//! Directories are created by root; [`VolumeOwner`] gives them to the pod:
//! [`PodRange`] hands a volume to the pod's user-namespace range (shifting
//! the owners of what an earlier pod left in a `local` volume into the new
//! pod's range) and makes its top directory writable by every user inside.

use std::path::{Path, PathBuf};

use corral_api::kinds::{Container, PodSpec, Volume};
use corral_runtime::bundle::BindMount;
use corral_runtime::mounts::{is_mount_point, mounts_below};

/// Why a volume could not be prepared or released.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("cannot prepare volume {volume} at {path}")]
    Io {
        volume: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot mount a tmpfs for volume {volume} at {path}")]
    Mount {
        volume: String,
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("volume {0} sets no source (emptyDir, local, plugin, secret or config)")]
    NoSource(String),
}

/// Gives a volume directory to whoever the pod's processes run as.
pub trait VolumeOwner: Send + Sync {
    fn adopt(&self, path: &Path) -> std::io::Result<()>;
}

/// Pods run as root on the host's uid map: nothing to change.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostRoot;

impl VolumeOwner for HostRoot {
    fn adopt(&self, _path: &Path) -> std::io::Result<()> {
        Ok(())
    }
}

/// Gives volumes to a pod's id range: `host_base` is the host id of the
/// pod's root (`None`: the pod shares the host's ids).
#[derive(Debug, Clone, Copy, Default)]
pub struct PodRange {
    pub host_base: Option<u32>,
}

impl VolumeOwner for PodRange {
    fn adopt(&self, path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if let Some(base) = self.host_base {
            let owner = std::fs::symlink_metadata(path)?.uid();
            let size = crate::sandbox::IDS_PER_POD;
            // Ids an earlier pod's range owned move into this pod's range
            // at the same offset; host ids (root's files) stay.
            let from = (owner >= crate::idranges::FIRST_HOST_ID && owner != base).then_some(owner);
            shift_owners(path, from, base, size)?;
        }
        // Every user inside may create files; each keeps its own (sticky).
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1777))
    }
}

/// Re-owns `path` (not following links): ids in `from..from+size` move to
/// `to..to+size`; the top directory becomes the range's root.
fn shift_owners(path: &Path, from: Option<u32>, to: u32, size: u32) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let shift = |id: u32| match from {
        Some(from) if (from..from.saturating_add(size)).contains(&id) => to + (id - from),
        _ => id,
    };
    let mut pending = vec![path.to_path_buf()];
    while let Some(current) = pending.pop() {
        let meta = std::fs::symlink_metadata(&current)?;
        let (uid, gid) = if current == path {
            (to, to)
        } else {
            (shift(meta.uid()), shift(meta.gid()))
        };
        if (uid, gid) != (meta.uid(), meta.gid()) {
            std::os::unix::fs::lchown(&current, Some(uid), Some(gid))?;
        }
        if meta.is_dir() && from.is_some() {
            for entry in std::fs::read_dir(&current)? {
                pending.push(entry?.path());
            }
        }
    }
    Ok(())
}

/// Where one volume is on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumePath {
    pub name: String,
    pub path: PathBuf,
    /// A tmpfs is mounted there.
    pub memory: bool,
}

/// `DATA/volumes`, from `DATA/pods`.
pub fn local_volumes_dir(pods_dir: &Path) -> PathBuf {
    pods_dir.with_file_name("volumes")
}

/// Where `volume` of pod `uid` lives (pure).
pub fn volume_path(pods_dir: &Path, uid: &str, volume: &Volume) -> Result<VolumePath, VolumeError> {
    if let Some(empty) = &volume.empty_dir {
        return Ok(VolumePath {
            name: volume.name.clone(),
            path: crate::containers::pod_dir(pods_dir, uid)
                .join("volumes")
                .join(&volume.name),
            memory: empty.medium.as_deref() == Some("Memory"),
        });
    }
    if let Some(local) = &volume.local {
        return Ok(VolumePath {
            name: volume.name.clone(),
            path: local_volumes_dir(pods_dir).join(&local.name).join("data"),
            memory: false,
        });
    }
    if volume.data_ref().is_some() {
        return Ok(VolumePath {
            name: volume.name.clone(),
            path: crate::pod_data::files::volume_dir(pods_dir, uid, &volume.name),
            memory: false,
        });
    }
    if volume.plugin.is_some() {
        return Ok(VolumePath {
            name: volume.name.clone(),
            path: crate::containers::pod_dir(pods_dir, uid)
                .join("volumes")
                .join(&volume.name),
            memory: false,
        });
    }
    Err(VolumeError::NoSource(volume.name.clone()))
}

/// Creates every volume of the pod (idempotent); returns a note for the
/// step's log.
pub fn prepare(
    pods_dir: &Path,
    uid: &str,
    spec: &PodSpec,
    owner: &dyn VolumeOwner,
) -> Result<String, VolumeError> {
    let mut notes = Vec::new();
    for volume in &spec.volumes {
        // Written with their data by `crate::pod_data`.
        if volume.data_ref().is_some() {
            continue;
        }
        let place = volume_path(pods_dir, uid, volume)?;
        let io = |source| VolumeError::Io {
            volume: volume.name.clone(),
            path: place.path.clone(),
            source,
        };
        std::fs::create_dir_all(&place.path).map_err(io)?;
        if place.memory && !is_mount_point(&place.path) {
            nix::mount::mount(
                Some("tmpfs"),
                &place.path,
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                Some("mode=0777"),
            )
            .map_err(|source| VolumeError::Mount {
                volume: volume.name.clone(),
                path: place.path.clone(),
                source,
            })?;
        }
        owner.adopt(&place.path).map_err(io)?;
        match &volume.plugin {
            Some(plugin) => notes.push(format!(
                "{} at {} (filled by plugin {})",
                volume.name,
                place.path.display(),
                plugin.driver
            )),
            None => notes.push(format!("{} at {}", volume.name, place.path.display())),
        }
    }
    Ok(notes.join(", "))
}

/// Unmounts the pod's memory-backed emptyDirs, and whatever a plugin left
/// mounted in the pod's directory (its `unmount` ran before), so removing
/// the pod's directory never reaches into a mounted filesystem; the
/// directories go with the pod's directory. `local` volumes are left
/// alone: they outlive the pod.
///
/// Returns whether nothing is mounted under the pod's directory any more
/// (a plugin may have mounted below its volume's directory): only then may
/// the directory be removed without reaching into a mounted filesystem.
pub fn release(pods_dir: &Path, uid: &str, spec: &PodSpec) -> bool {
    release_own(pods_dir, uid, spec);
    for volume in &spec.volumes {
        if let Ok(place) = volume_path(pods_dir, uid, volume)
            && volume.plugin.is_some()
            && is_mount_point(&place.path)
        {
            let _ = nix::mount::umount2(&place.path, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let pod_dir = crate::containers::pod_dir(pods_dir, uid);
    for mounted in mounts_below(&pod_dir) {
        let _ = nix::mount::umount2(&mounted, nix::mount::MntFlags::MNT_DETACH);
    }
    mounts_below(&pod_dir).is_empty()
}

/// Unmounts what the node itself mounted for the pod: memory emptyDirs and
/// the Secret/Config files. Plugin volumes are their plugin's to unmount.
pub fn release_own(pods_dir: &Path, uid: &str, spec: &PodSpec) {
    for volume in &spec.volumes {
        if let Ok(place) = volume_path(pods_dir, uid, volume)
            && place.memory
            && is_mount_point(&place.path)
        {
            let _ = nix::mount::umount2(&place.path, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    crate::pod_data::files::unmount(&crate::pod_data::files::data_dir(pods_dir, uid));
}

/// The bind mounts of `container`'s `mounts`.
pub fn container_mounts(
    pods_dir: &Path,
    uid: &str,
    spec: &PodSpec,
    container: &Container,
) -> Result<Vec<BindMount>, VolumeError> {
    container
        .mounts
        .iter()
        .filter_map(|mount| {
            let volume = spec.volumes.iter().find(|v| v.name == mount.volume)?;
            Some(volume_path(pods_dir, uid, volume).map(|place| BindMount {
                source: match volume.plugin {
                    Some(_) => {
                        recorded_plugin_path(pods_dir, uid, &volume.name).unwrap_or(place.path)
                    }
                    None => place.path,
                },
                destination: mount.path.clone(),
                read_only: mount.read_only || volume.data_ref().is_some(),
            }))
        })
        .collect()
}

/// The file recording where plugin volume `volume` of pod `uid` is.
fn plugin_path_file(pods_dir: &Path, uid: &str, volume: &str) -> PathBuf {
    crate::containers::pod_dir(pods_dir, uid)
        .join("plugin-volumes")
        .join(format!("{volume}.path"))
}

/// Records where a plugin put volume `volume` (its `prepare` or `mount`
/// answer, already accepted).
pub fn record_plugin_path(
    pods_dir: &Path,
    uid: &str,
    volume: &str,
    path: &Path,
) -> Result<(), VolumeError> {
    let file = plugin_path_file(pods_dir, uid, volume);
    let io = |source| VolumeError::Io {
        volume: volume.to_string(),
        path: file.clone(),
        source,
    };
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(&file, path.as_os_str().as_encoded_bytes()).map_err(io)
}

/// Where a plugin last said volume `volume` is, if it said.
pub fn recorded_plugin_path(pods_dir: &Path, uid: &str, volume: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(plugin_path_file(pods_dir, uid, volume)).ok()?;
    Some(PathBuf::from(text)).filter(|p| p.is_absolute())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PodSpec {
        serde_json::from_value(serde_json::json!({
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "fast", "emptyDir": {"medium": "Memory"}},
                {"name": "data", "local": {"name": "web-data"}},
                {"name": "nfs", "plugin": {"driver": "acme-nfs"}},
                {"name": "db", "secret": {"name": "db"}}
            ],
            "containers": [{
                "name": "web", "image": "local/busybox:1",
                "mounts": [
                    {"volume": "data", "path": "/data"},
                    {"volume": "scratch", "path": "/scratch", "readOnly": true}
                ]
            }]
        }))
        .unwrap()
    }

    #[test]
    fn paths_per_kind_of_volume() {
        let pods = Path::new("/d/pods");
        let spec = spec();
        let scratch = volume_path(pods, "u1", &spec.volumes[0]).unwrap();
        assert!(scratch.path.ends_with("volumes/scratch"));
        assert!(scratch.path.starts_with("/d/pods"));
        assert!(!scratch.memory);
        assert!(volume_path(pods, "u1", &spec.volumes[1]).unwrap().memory);
        assert_eq!(
            volume_path(pods, "u1", &spec.volumes[2]).unwrap().path,
            Path::new("/d/volumes/web-data/data")
        );
        assert_eq!(
            volume_path(pods, "u1", &spec.volumes[3]).unwrap().path,
            Path::new("/d/pods/u1/volumes/nfs")
        );
    }

    #[test]
    fn secret_volumes_live_in_the_pods_data_and_mount_read_only() {
        let pods = Path::new("/d/pods");
        let mut spec = spec();
        assert_eq!(
            volume_path(pods, "u1", &spec.volumes[4]).unwrap().path,
            Path::new("/d/pods/u1/data/db")
        );
        spec.containers[0].mounts[0].volume = "db".into();
        let mounts = container_mounts(pods, "u1", &spec, &spec.containers[0]).unwrap();
        assert_eq!(mounts[0].source, Path::new("/d/pods/u1/data/db"));
        assert!(
            mounts[0].read_only,
            "a secret is never written through a mount"
        );
    }

    #[test]
    fn local_volumes_do_not_depend_on_the_pod() {
        let spec = spec();
        let pods = Path::new("/d/pods");
        assert_eq!(
            volume_path(pods, "u1", &spec.volumes[2]).unwrap(),
            volume_path(pods, "u2", &spec.volumes[2]).unwrap()
        );
    }

    #[test]
    fn container_mounts_follow_the_mount_list() {
        let spec = spec();
        let mounts =
            container_mounts(Path::new("/d/pods"), "u1", &spec, &spec.containers[0]).unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].destination, "/data");
        assert_eq!(mounts[0].source, Path::new("/d/volumes/web-data/data"));
        assert!(mounts[1].read_only);
    }

    #[test]
    fn a_plugin_volume_is_bound_from_where_its_plugin_put_it() {
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path().join("pods");
        let mut spec = spec();
        spec.containers[0].mounts[0].volume = "nfs".into();
        let from = |spec: &PodSpec| {
            container_mounts(&pods, "u1", spec, &spec.containers[0]).unwrap()[0]
                .source
                .clone()
        };
        assert_eq!(from(&spec), pods.join("u1/volumes/nfs"));
        record_plugin_path(&pods, "u1", "nfs", Path::new("/srv/export")).unwrap();
        assert_eq!(from(&spec), Path::new("/srv/export"));
        assert_eq!(recorded_plugin_path(&pods, "u2", "nfs"), None);
    }

    #[test]
    fn prepare_creates_directories_and_adopts_them() {
        struct Count(std::sync::Mutex<Vec<PathBuf>>);
        impl VolumeOwner for Count {
            fn adopt(&self, path: &Path) -> std::io::Result<()> {
                self.0.lock().unwrap().push(path.to_path_buf());
                Ok(())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path().join("pods");
        let mut spec = spec();
        spec.volumes
            .retain(|v| v.name == "scratch" || v.name == "data");
        let owner = Count(Default::default());
        prepare(&pods, "u1", &spec, &owner).unwrap();
        prepare(&pods, "u1", &spec, &owner).unwrap();
        assert!(dir.path().join("volumes/web-data/data").is_dir());
        assert_eq!(owner.0.lock().unwrap().len(), 4);
    }
}
