//! Mount points in a container's root before runc runs: in a user
//! namespace runc cannot create a missing one in the image's root-owned
//! tree, so the agent makes them, as the host's root, in the container's
//! own overlay layer (the image stays untouched).

use std::path::Path;

use corral_runtime::bundle::TmpfsMount;

/// Creates `destination` (a directory, or an empty file) inside `rootfs`
/// if it is missing. Refuses to follow a symbolic link on the way: the
/// image controls its tree, and this runs as the host's root.
pub fn prepare_mount_point(
    rootfs: &Path,
    destination: &str,
    directory: bool,
) -> Result<(), String> {
    let refuse = |what: &str| format!("mount point {destination}: {what}");
    let mut path = rootfs.to_path_buf();
    let parts: Vec<&str> = destination.split('/').filter(|p| !p.is_empty()).collect();
    for (index, part) in parts.iter().enumerate() {
        if *part == ".." || *part == "." {
            return Err(refuse("must not contain . or .."));
        }
        path.push(part);
        let last = index + 1 == parts.len();
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(refuse("the image has a symbolic link on the way"));
            }
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let created = if last && !directory {
                    std::fs::File::create(&path).map(|_| ())
                } else {
                    std::fs::create_dir(&path)
                };
                created.map_err(|e| refuse(&format!("cannot create it: {e}")))?;
            }
            Err(error) => return Err(refuse(&error.to_string())),
        }
    }
    Ok(())
}

/// Makes the mount point of each scratch tmpfs with the tmpfs's mode on
/// it (runc gives a tmpfs the mode of the directory it covers, so an
/// image's 755 `/run` would make it unwritable). One the image has as a
/// symbolic link (`/var/tmp -> /tmp`) is left out: what the link points to
/// serves.
pub fn prepare_scratch(rootfs: &Path, tmpfs: &mut Vec<TmpfsMount>) {
    use std::os::unix::fs::PermissionsExt;
    tmpfs.retain(|mount| {
        prepare_mount_point(rootfs, &mount.destination, true)
            .and_then(|()| {
                let path = rootfs.join(mount.destination.trim_start_matches('/'));
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mount.mode))
                    .map_err(|error| format!("mount point {}: {error}", mount.destination))
            })
            .inspect_err(|error| tracing::debug!(%error, "scratch tmpfs left out"))
            .is_ok()
    });
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn missing_mount_points_are_made_and_symlinks_refused() {
        let rootfs = tempfile::tempdir().expect("temp dir");
        prepare_mount_point(rootfs.path(), "/etc/resolv.conf", false).expect("file");
        assert!(rootfs.path().join("etc/resolv.conf").is_file());
        prepare_mount_point(rootfs.path(), "/data/inner", true).expect("dir");
        assert!(rootfs.path().join("data/inner").is_dir());
        prepare_mount_point(rootfs.path(), "/etc/resolv.conf", false).expect("again");
        std::os::unix::fs::symlink("/", rootfs.path().join("escape")).expect("symlink");
        let error = prepare_mount_point(rootfs.path(), "/escape/x", false).expect_err("refused");
        assert!(error.contains("symbolic link"), "{error}");
        assert!(prepare_mount_point(rootfs.path(), "/a/../b", true).is_err());
    }

    #[test]
    fn scratch_mount_points_get_their_mode_and_links_are_left_out() {
        let rootfs = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(rootfs.path().join("run")).expect("an image's /run");
        std::fs::create_dir(rootfs.path().join("var")).expect("/var");
        std::os::unix::fs::symlink("/tmp", rootfs.path().join("var/tmp")).expect("symlink");
        let scratch = |destination: &str| TmpfsMount {
            destination: destination.to_string(),
            size_bytes: 1 << 20,
            mode: 0o1777,
        };
        let mut tmpfs = vec![scratch("/run"), scratch("/var/tmp"), scratch("/scratch")];
        prepare_scratch(rootfs.path(), &mut tmpfs);
        let kept: Vec<&str> = tmpfs.iter().map(|t| t.destination.as_str()).collect();
        assert_eq!(kept, ["/run", "/scratch"]);
        for kept in ["run", "scratch"] {
            let mode = std::fs::metadata(rootfs.path().join(kept))
                .expect("made")
                .permissions()
                .mode();
            assert_eq!(mode & 0o7777, 0o1777, "{kept}");
        }
    }
}
