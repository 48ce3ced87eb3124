//! A container's root filesystem: an overlayfs of the image layers (shared,
//! read-only) under a per-container upper and work dir.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

/// Why a rootfs could not be mounted or unmounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("image has no layers")]
    NoLayers,
    #[error("layer path {0:?} cannot be used in overlay options (contains ':' or ',')")]
    UnsafeLayerPath(PathBuf),
    #[error("failed to create {path:?}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to mount overlay at {target:?}")]
    Mount {
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to unmount {target:?}")]
    Unmount {
        target: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The mount syscalls the store needs, behind a trait so option building
/// is tested without root.
pub trait Mounter: Send + Sync {
    /// `mount -t overlay overlay -o <options> <target>`.
    fn mount_overlay(&self, target: &Path, options: &str) -> io::Result<()>;
    /// Lazily unmounts `target`; `Ok(false)` when nothing was mounted there.
    fn unmount(&self, target: &Path) -> io::Result<bool>;
}

/// The real `mount(2)` / `umount2(2)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SyscallMounter;

impl Mounter for SyscallMounter {
    fn mount_overlay(&self, target: &Path, options: &str) -> io::Result<()> {
        nix::mount::mount(
            Some("overlay"),
            target,
            Some("overlay"),
            MsFlags::empty(),
            Some(options),
        )
        .map_err(io::Error::from)
    }

    fn unmount(&self, target: &Path) -> io::Result<bool> {
        match nix::mount::umount2(target, MntFlags::MNT_DETACH) {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// A mounted container rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedRootfs {
    /// The merged view: the OCI bundle's `root.path`.
    pub rootfs: PathBuf,
    /// The container's writable layer.
    pub upper: PathBuf,
    pub work: PathBuf,
}

/// Overlay mount options for `layers` (bottom first).
pub fn overlay_options(
    layers: &[PathBuf],
    upper: &Path,
    work: &Path,
) -> Result<String, MountError> {
    if layers.is_empty() {
        return Err(MountError::NoLayers);
    }
    for path in layers.iter().map(PathBuf::as_path).chain([upper, work]) {
        let text = path.to_string_lossy();
        if text.contains(':') || text.contains(',') {
            return Err(MountError::UnsafeLayerPath(path.to_path_buf()));
        }
    }
    // overlayfs lists lower dirs top first.
    let lower: Vec<String> = layers
        .iter()
        .rev()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    Ok(format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.join(":"),
        upper.display(),
        work.display()
    ))
}

pub(crate) fn mount_overlay(
    mounter: &dyn Mounter,
    layers: &[PathBuf],
    container_dir: &Path,
) -> Result<MountedRootfs, MountError> {
    let mounted = MountedRootfs {
        rootfs: container_dir.join("rootfs"),
        upper: container_dir.join("upper"),
        work: container_dir.join("work"),
    };
    for dir in [&mounted.rootfs, &mounted.upper, &mounted.work] {
        fs::create_dir_all(dir).map_err(|source| MountError::CreateDir {
            path: dir.clone(),
            source,
        })?;
    }
    let options = overlay_options(layers, &mounted.upper, &mounted.work)?;
    mounter
        .mount_overlay(&mounted.rootfs, &options)
        .map_err(|source| MountError::Mount {
            target: mounted.rootfs.clone(),
            source,
        })?;
    Ok(mounted)
}

pub(crate) fn unmount(mounter: &dyn Mounter, target: &Path) -> Result<(), MountError> {
    mounter
        .unmount(target)
        .map(|_| ())
        .map_err(|source| MountError::Unmount {
            target: target.to_path_buf(),
            source,
        })
}

/// Unmounts `container_dir/rootfs` if mounted (for an agent cleaning up
/// after a restart, when it no longer holds a `MountedRootfs`).
pub fn unmount_rootfs(container_dir: &Path) -> Result<(), MountError> {
    unmount(&SyscallMounter, &container_dir.join("rootfs"))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct RecordingMounter {
        calls: Mutex<Vec<(PathBuf, String)>>,
    }

    impl Mounter for RecordingMounter {
        fn mount_overlay(&self, target: &Path, options: &str) -> io::Result<()> {
            self.calls
                .lock()
                .expect("lock")
                .push((target.to_path_buf(), options.to_string()));
            Ok(())
        }

        fn unmount(&self, _target: &Path) -> io::Result<bool> {
            Ok(true)
        }
    }

    #[test]
    fn lower_dirs_are_listed_top_first() {
        let options = overlay_options(
            &[PathBuf::from("/s/layers/a"), PathBuf::from("/s/layers/b")],
            Path::new("/c/upper"),
            Path::new("/c/work"),
        )
        .expect("options");
        assert_eq!(
            options,
            "lowerdir=/s/layers/b:/s/layers/a,upperdir=/c/upper,workdir=/c/work"
        );
    }

    #[test]
    fn refuses_paths_that_break_the_option_string() {
        assert!(matches!(
            overlay_options(&[PathBuf::from("/a:b")], Path::new("/u"), Path::new("/w")),
            Err(MountError::UnsafeLayerPath(_))
        ));
        assert!(matches!(
            overlay_options(&[], Path::new("/u"), Path::new("/w")),
            Err(MountError::NoLayers)
        ));
    }

    #[test]
    fn mount_creates_dirs_and_mounts_rootfs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mounter = RecordingMounter::default();
        let mounted = mount_overlay(&mounter, &[PathBuf::from("/l/1")], dir.path()).expect("mount");
        assert!(mounted.upper.is_dir() && mounted.work.is_dir() && mounted.rootfs.is_dir());
        let calls = mounter.calls.lock().expect("lock");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].0, dir.path().join("rootfs"));
        assert!(calls[0].1.starts_with("lowerdir=/l/1,upperdir="));
    }
}
