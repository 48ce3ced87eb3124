//! Where a container's files live on the node: its bundle, the overlay's
//! mount point, `upper` and `work` (docs/design/0055).
//!
//! A container with a read-only root (the default sandbox) has them in
//! `DATA/pods/UID/run/`, a tmpfs of the pod's: nothing there outlives a
//! reboot any more than the container does, and the `upper` of a
//! read-only root only ever holds the mount points the node made. A
//! container start creates about fifteen files and directories there; on
//! the disk every creation is a metadata write, and on an ext4 without a
//! journal each also scans past the inodes deleted in the last minutes.
//! A container whose root is writable has them on the disk, in
//! `DATA/pods/UID/containers/`, since its `upper` holds what it writes.

use std::path::{Path, PathBuf};

use crate::containers::{ContainerError, pod_dir};

/// Below a pod's directory, on the node's disk: the files of its
/// containers whose root is writable.
const DISK_CONTAINERS: &str = "containers";

/// Below a pod's directory, a tmpfs ([`mount_run_dir`]): the files of its
/// containers whose root is read-only.
const RUN_CONTAINERS: &str = "run";

/// The pod's [`RUN_CONTAINERS`] tmpfs: passable by everyone (a
/// container's init runs as the pod's unprivileged host uid), at most
/// 64 MiB (bundles and runtime logs of a few containers take kilobytes).
const RUN_TMPFS_OPTIONS: &str = "mode=0711,size=64m";

/// The directory of container `runtime_id` of pod `uid`: on the pod's
/// tmpfs unless its root file system is `writable`.
pub(crate) fn container_dir(
    pods_dir: &Path,
    uid: &str,
    runtime_id: &str,
    writable: bool,
) -> PathBuf {
    let place = if writable {
        DISK_CONTAINERS
    } else {
        RUN_CONTAINERS
    };
    pod_dir(pods_dir, uid).join(place).join(runtime_id)
}

/// Both places a container's directory may be: a record does not say
/// whether the pod's root was writable when the container started (a
/// pod's relaxations change in place, and an agent before this layout
/// made every one on the disk).
pub(crate) fn container_dirs(pods_dir: &Path, uid: &str, runtime_id: &str) -> [PathBuf; 2] {
    [false, true].map(|writable| container_dir(pods_dir, uid, runtime_id, writable))
}

/// Every container directory of pod `uid`, in both places.
pub(crate) fn every_container_dir(pods_dir: &Path, uid: &str) -> Vec<PathBuf> {
    let pod = pod_dir(pods_dir, uid);
    [RUN_CONTAINERS, DISK_CONTAINERS]
        .into_iter()
        .filter_map(|place| std::fs::read_dir(pod.join(place)).ok())
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .collect()
}

/// Mounts the pod's tmpfs for the files of its read-only containers at
/// `dir` unless it is there (idempotent); no device files, no set-uid.
/// It goes with every other mount below the pod's directory when the
/// pod's sandbox is removed ([`crate::volumes::release`]).
pub(crate) fn mount_run_dir(dir: &Path) -> Result<(), ContainerError> {
    let io = |source| ContainerError::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    if corral_runtime::mounts::is_mount_point(dir) {
        return Ok(());
    }
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(RUN_TMPFS_OPTIONS),
    )
    .map_err(|errno| io(errno.into()))
}

/// Unmounts a container's rootfs and removes its directory (one that is
/// not there is removed).
pub(crate) fn remove_container_dir(dir: &Path) -> Result<(), ContainerError> {
    let _ = corral_runtime::image::unmount_rootfs(dir);
    match std::fs::remove_dir_all(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(ContainerError::Io {
            path: dir.to_path_buf(),
            source: error,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_roots_go_to_the_tmpfs_and_both_places_are_swept() {
        let pods = tempfile::tempdir().expect("temp dir");
        let read_only = container_dir(pods.path(), "u1", "c-1", false);
        let writable = container_dir(pods.path(), "u1", "c-2", true);
        assert_eq!(read_only, pods.path().join("u1/run/c-1"));
        assert_eq!(writable, pods.path().join("u1/containers/c-2"));
        assert_eq!(
            container_dirs(pods.path(), "u1", "c-1"),
            [read_only.clone(), pods.path().join("u1/containers/c-1")]
        );
        for dir in [&read_only, &writable] {
            std::fs::create_dir_all(dir.join("upper")).expect("made");
        }
        let mut found = every_container_dir(pods.path(), "u1");
        found.sort();
        assert_eq!(found, [writable.clone(), read_only.clone()]);
        for dir in container_dirs(pods.path(), "u1", "c-1") {
            remove_container_dir(&dir).expect("removed, or not there");
        }
        assert_eq!(every_container_dir(pods.path(), "u1"), [writable]);
        assert!(every_container_dir(pods.path(), "nobody").is_empty());
    }
}
