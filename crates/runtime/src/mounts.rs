//! The mount table (`/proc/self/mountinfo`): which paths are mount points,
//! what is mounted there, and unmounting everything a directory holds. The
//! one reader of it in corral (the agent's volumes, `corral lab down`, the
//! cgroup migration primer, the benchmarks' and tests' clean-ups use it).

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, umount2};

/// Every mount point of this process's mount namespace, in table order
/// (empty when the table cannot be read).
pub fn mount_points() -> Vec<PathBuf> {
    parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// The mount points of a mountinfo text, in table order.
fn parse(table: &str) -> Vec<PathBuf> {
    mounts(table)
        .into_iter()
        .map(|mount| mount.mount_point)
        .collect()
}

/// One mount of the table: the fields corral reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// What of the mounted file system shows at the mount point (`/`, or
    /// a directory of it for a bind mount or a cgroup namespace's view).
    pub root: String,
    pub mount_point: PathBuf,
    pub fs_type: String,
    /// The file system's own options (`rw,cpu,cpuacct` for a cgroup v1
    /// hierarchy).
    pub super_options: String,
}

/// The mounts of a mountinfo text (fields 4 and 5, then the file system
/// type and its options after the ` - ` separator), with the kernel's
/// octal escapes undone; lines that are not mounts are skipped.
pub fn mounts(table: &str) -> Vec<Mount> {
    table
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mut fields = before.split_whitespace();
            let (root, mount_point) = (fields.nth(3)?, fields.next()?);
            let mut after = after.split_whitespace();
            let (fs_type, super_options) = (after.next()?, after.nth(1).unwrap_or(""));
            Some(Mount {
                root: unescape(root),
                mount_point: PathBuf::from(unescape(mount_point)),
                fs_type: fs_type.to_string(),
                super_options: super_options.to_string(),
            })
        })
        .collect()
}

/// True when something is mounted on `path`. The kernel says so for the
/// path itself (`statx`, Linux 5.8 on): no read of the mount table, which
/// on a node grows with its pods. The table is read only when the kernel
/// does not tell.
pub fn is_mount_point(path: &Path) -> bool {
    mount_root(path).unwrap_or_else(|| mount_points().iter().any(|mounted| mounted == path))
}

/// Whether `path` (not following a last symlink) is the root of a mount,
/// from `statx`'s `STATX_ATTR_MOUNT_ROOT`; `Some(false)` when it does not
/// exist, `None` when the kernel cannot tell.
fn mount_root(path: &Path) -> Option<bool> {
    use std::os::unix::ffi::OsStrExt;

    use nix::libc;

    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `path` is NUL-terminated and lives across the call; `stat`
    // is a writable `statx` the call fills.
    let result = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT,
            0,
            stat.as_mut_ptr(),
        )
    };
    if result != 0 {
        let missing = std::io::Error::last_os_error().kind() == std::io::ErrorKind::NotFound;
        return missing.then_some(false);
    }
    // SAFETY: statx succeeded, so it filled `stat` (and it started zeroed).
    let stat = unsafe { stat.assume_init() };
    let flag = libc::STATX_ATTR_MOUNT_ROOT as u64;
    (stat.stx_attributes_mask & flag != 0).then_some(stat.stx_attributes & flag != 0)
}

/// Mount points strictly below `dir`, deepest first.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    deepest_first(
        mount_points()
            .into_iter()
            .filter(|mounted| mounted != dir && mounted.starts_with(dir))
            .collect(),
    )
}

/// Lazily unmounts everything mounted on `dir` or below it, deepest first
/// (`umount -l`); failures are ignored, for clean-ups that carry on.
pub fn unmount_all_under(dir: &Path) {
    let mounted = deepest_first(
        mount_points()
            .into_iter()
            .filter(|mounted| mounted.starts_with(dir))
            .collect(),
    );
    for target in mounted {
        let _ = umount2(&target, MntFlags::MNT_DETACH);
    }
}

fn deepest_first(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths.sort_by_key(|path| std::cmp::Reverse(path.components().count()));
    paths.dedup();
    paths
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let octal = bytes.get(index + 1..index + 4).and_then(|digits| {
            let digits = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(digits, 8).ok()
        });
        match (bytes[index], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                index += 4;
            }
            (byte, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_undone() {
        assert_eq!(unescape("/a\\040b\\011c"), "/a b\tc");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\"), "/end\\");
    }

    #[test]
    fn the_fifth_field_is_the_mount_point() {
        let table = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
35 22 0:30 / /var/lib/corral/pods/a\\040b/x rw - tmpfs tmpfs rw
36 22 0:31 / /var/lib/corral/pods/a\\040b/x/y rw - tmpfs tmpfs rw
";
        assert_eq!(
            parse(table),
            [
                PathBuf::from("/"),
                PathBuf::from("/var/lib/corral/pods/a b/x"),
                PathBuf::from("/var/lib/corral/pods/a b/x/y"),
            ]
        );
    }

    #[test]
    fn a_mount_names_its_root_type_and_options() {
        let table = "\
25 24 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw,nsdelegate
27 24 0:25 /a\\040b /mnt/cpu rw,nosuid shared:7 - cgroup cgroup rw,cpu,cpuacct
not a mount line
";
        assert_eq!(
            mounts(table),
            [
                Mount {
                    root: "/".into(),
                    mount_point: PathBuf::from("/sys/fs/cgroup/unified"),
                    fs_type: "cgroup2".into(),
                    super_options: "rw,nsdelegate".into(),
                },
                Mount {
                    root: "/a b".into(),
                    mount_point: PathBuf::from("/mnt/cpu"),
                    fs_type: "cgroup".into(),
                    super_options: "rw,cpu,cpuacct".into(),
                },
            ]
        );
    }

    #[test]
    fn deepest_mounts_come_first() {
        let sorted = deepest_first(vec![
            PathBuf::from("/d/a"),
            PathBuf::from("/d/a/b/c"),
            PathBuf::from("/d/a/b"),
            PathBuf::from("/d/a/b"),
        ]);
        assert_eq!(
            sorted,
            [
                PathBuf::from("/d/a/b/c"),
                PathBuf::from("/d/a/b"),
                PathBuf::from("/d/a"),
            ]
        );
    }

    #[test]
    fn this_process_sees_the_root_mount() {
        assert!(is_mount_point(Path::new("/")));
        assert!(!mounts_below(Path::new("/")).contains(&PathBuf::from("/")));
    }

    #[test]
    fn the_kernel_tells_mount_points_without_the_table() {
        // /proc and /sys are mounts wherever corral runs; the kernel's
        // answer agrees with the table for them.
        for mounted in ["/", "/proc", "/sys"] {
            let path = Path::new(mounted);
            assert_eq!(mount_root(path), Some(true), "{mounted}");
            assert!(mount_points().iter().any(|m| m == path), "{mounted}");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(mount_root(dir.path()), Some(false));
        assert!(!is_mount_point(dir.path()));
        let missing = dir.path().join("missing");
        assert_eq!(mount_root(&missing), Some(false));
        assert!(!is_mount_point(&missing));
    }
}
