//! The mount table (`/proc/self/mountinfo`): which paths are mount points,
//! and unmounting everything a directory holds. The one reader of it in
//! corral (the agent's volumes, `corral lab down`, the benchmarks' and
//! tests' clean-ups use it).

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, umount2};

/// Every mount point of this process's mount namespace, in table order
/// (empty when the table cannot be read).
pub fn mount_points() -> Vec<PathBuf> {
    parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// The mount points of a mountinfo text: the fifth field of each line,
/// with the kernel's octal escapes undone.
fn parse(table: &str) -> Vec<PathBuf> {
    table
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .map(|escaped| PathBuf::from(unescape(escaped)))
        .collect()
}

/// True when something is mounted on `path`.
pub fn is_mount_point(path: &Path) -> bool {
    mount_points().iter().any(|mounted| mounted == path)
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
}
