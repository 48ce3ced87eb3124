//! Keeping the kernel's cgroup migration lock fast for the next `runc`.
//!
//! Every container start moves `runc init` into the container's cgroup by
//! writing its pid to `cgroup.procs`. The kernel takes a global lock for
//! that write (`cgroup_threadgroup_rwsem`, a per-CPU rwsem), and taking it
//! for writing after a quiet spell waits out a whole RCU grace period,
//! idle: about 11 ms on a 250 Hz kernel. Writes that follow within about
//! one more grace period do not wait. Kernels built with
//! `CONFIG_CGROUP_FAVOR_DYNMODS`, or with cgroup v2 mounted
//! `favordynmods`, never wait; by default (and on this project's machines)
//! they do.
//!
//! So `runc run` started on an idle node spends a third of its time on
//! nothing (measured: 35 ms against 23 ms when the lock is kept warm, the
//! pod's own bundle, docs/BENCHMARKS.md), while one started right after
//! another does not. A [`MigrationPrimer`] takes that wait off the start's
//! path: nudged when a start begins, its thread writes `0` to the
//! `cgroup.procs` of the cgroup this process is already in (a migration of
//! the process to where it is, which changes nothing), so the grace period
//! runs while the runtime starts up and its own write finds the lock warm.
//!
//! Best effort: a nudge never blocks, and a write that fails (no cgroup
//! file system, no permission) turns the primer off for good with one
//! warning; starts are then as slow as without it, never wrong.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use crate::mounts::Mount;

/// The cgroup file systems of a mount table.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    crate::mounts::mounts(mountinfo)
        .into_iter()
        .filter_map(CgroupMount::of)
        .collect()
}

/// Where this process's own `cgroup.procs` is, from `/proc/self/cgroup`
/// (`proc_cgroup`) and the cgroup file systems mounted: in the cgroup v2
/// hierarchy if it is mounted, else in the first mounted v1 hierarchy.
/// `None` when no hierarchy this process is in is mounted here.
fn procs_file_among(proc_cgroup: &str, mounts: &[CgroupMount]) -> Option<PathBuf> {
    let memberships = proc_cgroup.lines().filter_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        Some((id == "0" && controllers.is_empty(), controllers, path))
    });
    // cgroup v2 first: the one hierarchy every process is in.
    let mut first_v1 = None;
    for (unified, controllers, path) in memberships {
        let Some(mount) = mounts
            .iter()
            .find(|mount| mount.holds(unified, controllers))
        else {
            continue;
        };
        let Some(file) = mount.procs_file(path) else {
            continue;
        };
        if unified {
            return Some(file);
        }
        first_v1.get_or_insert(file);
    }
    first_v1
}

/// A cgroup file system among the mounts.
#[derive(Debug)]
struct CgroupMount {
    mount: Mount,
    unified: bool,
}

impl CgroupMount {
    fn of(mount: Mount) -> Option<Self> {
        let unified = match mount.fs_type.as_str() {
            "cgroup2" => true,
            "cgroup" => false,
            _ => return None,
        };
        Some(CgroupMount { mount, unified })
    }

    /// Whether this mount is the hierarchy of a `/proc/self/cgroup` line
    /// (a v1 hierarchy lists its controllers among its options).
    fn holds(&self, unified: bool, controllers: &str) -> bool {
        if unified || self.unified {
            return unified && self.unified;
        }
        let options: Vec<&str> = self.mount.super_options.split(',').collect();
        controllers.split(',').all(|c| options.contains(&c))
    }

    /// `cgroup.procs` of cgroup `path` (as `/proc/self/cgroup` names it)
    /// under this mount; `None` when the mount does not show that cgroup.
    fn procs_file(&self, path: &str) -> Option<PathBuf> {
        let root = self.mount.root.as_str();
        let relative = if root == "/" {
            path
        } else {
            path.strip_prefix(root)
                .filter(|rest| rest.is_empty() || rest.starts_with('/'))?
        };
        let relative = relative.trim_start_matches('/');
        Some(self.mount.mount_point.join(relative).join("cgroup.procs"))
    }
}

/// The write a nudge makes, on the calling thread: `0` to this process's
/// own `cgroup.procs`; returns the file. Which cgroup this process is in
/// is read at each write (so it is never moved back to where it was
/// moved away from); the cgroup file systems are read from the mount
/// table once per process (a node's table grows with its pods). Blocks
/// for up to a grace period when the lock is cold.
pub fn prime_now() -> std::io::Result<PathBuf> {
    static MOUNTS: OnceLock<Vec<CgroupMount>> = OnceLock::new();
    let mounts = match MOUNTS.get() {
        Some(mounts) => mounts,
        None => {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
            MOUNTS.get_or_init(|| cgroup_mounts(&mountinfo))
        }
    };
    let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup")?;
    let file = procs_file_among(&proc_cgroup, mounts).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no cgroup hierarchy of this process is mounted",
        )
    })?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .and_then(|mut procs| procs.write_all(b"0"))
        .map_err(|error| {
            std::io::Error::new(error.kind(), format!("{}: {error}", file.display()))
        })?;
    Ok(file)
}

/// Takes the wait for the cgroup migration lock off container starts (see
/// the module docs). One thread, made on the first nudge, does the
/// writes; it ends with the process.
#[derive(Debug)]
pub struct MigrationPrimer {
    /// The thread's queue; `None` before the first nudge, or once the
    /// primer is off.
    queue: Mutex<Option<SyncSender<()>>>,
    off: AtomicBool,
    /// The write ([`prime_now`]; a fake in tests).
    write: fn() -> std::io::Result<PathBuf>,
}

impl Default for MigrationPrimer {
    fn default() -> Self {
        Self::with_write(prime_now)
    }
}

impl MigrationPrimer {
    pub fn new() -> Self {
        Self::default()
    }

    fn with_write(write: fn() -> std::io::Result<PathBuf>) -> Self {
        MigrationPrimer {
            queue: Mutex::new(None),
            off: AtomicBool::new(false),
            write,
        }
    }

    /// Whether a write failed, which turned the primer off for good.
    pub fn is_off(&self) -> bool {
        self.off.load(Ordering::Relaxed)
    }

    /// A container start begins: the lock is made warm in the background.
    /// Never blocks; nudges while a write is pending are one.
    pub fn nudge(&self) {
        if self.is_off() {
            return;
        }
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.is_none() {
            let (sender, receiver) = mpsc::sync_channel::<()>(1);
            let write = self.write;
            let spawned = std::thread::Builder::new()
                .name("cgroup-primer".into())
                .spawn(move || prime(&receiver, write));
            match spawned {
                Ok(_) => *queue = Some(sender),
                Err(error) => {
                    tracing::warn!(%error, "no cgroup migration primer: cannot start its thread");
                    self.off.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
        let sent = queue.as_ref().map(|sender| sender.try_send(()));
        if let Some(Err(TrySendError::Disconnected(()))) = sent {
            // The thread stopped after a failed write.
            *queue = None;
            self.off.store(true, Ordering::Relaxed);
        }
    }
}

/// The primer's thread: one write per nudge, until a write fails.
fn prime(nudges: &mpsc::Receiver<()>, write: fn() -> std::io::Result<PathBuf>) {
    while nudges.recv().is_ok() {
        let began = Instant::now();
        match write() {
            Ok(file) => {
                tracing::trace!(file = %file.display(), took = ?began.elapsed(), "cgroup migration lock primed");
            }
            Err(error) => {
                tracing::warn!(%error, "cgroup migration primer off: container starts may wait for the kernel's cgroup lock");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`procs_file_among`] the cgroup mounts of a mount table's text.
    fn own_procs_file(proc_cgroup: &str, mountinfo: &str) -> Option<PathBuf> {
        procs_file_among(proc_cgroup, &cgroup_mounts(mountinfo))
    }

    /// This development machine: v1 controllers beside a v2 hierarchy at
    /// `/sys/fs/cgroup/unified`.
    const HYBRID_MOUNTINFO: &str = "\
24 29 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
25 24 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 cgroup2 rw
26 24 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:6 - cgroup cgroup rw,xattr,name=systemd
27 24 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:7 - cgroup cgroup rw,cpu,cpuacct
28 24 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:8 - cgroup cgroup rw,memory
30 29 0:5 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw";

    #[test]
    fn cgroup_v2_is_preferred_where_it_is_mounted() {
        let cgroup = "3:memory:/process_api/5f86\n2:cpu,cpuacct:/\n1:name=systemd:/\n0::/\n";
        assert_eq!(
            own_procs_file(cgroup, HYBRID_MOUNTINFO),
            Some(PathBuf::from("/sys/fs/cgroup/unified/cgroup.procs"))
        );
    }

    #[test]
    fn a_v1_hierarchy_is_found_by_its_controllers() {
        // No v2 line: the first v1 hierarchy that is mounted.
        let cgroup = "4:pids:/x\n3:memory:/process_api/5f86\n2:cpu,cpuacct:/\n";
        assert_eq!(
            own_procs_file(cgroup, HYBRID_MOUNTINFO),
            Some(PathBuf::from(
                "/sys/fs/cgroup/memory/process_api/5f86/cgroup.procs"
            ))
        );
        // A controller is bound to one hierarchy: the mount listing it.
        assert_eq!(
            own_procs_file("2:cpu,cpuacct:/a\n", HYBRID_MOUNTINFO),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/a/cgroup.procs"))
        );
        assert_eq!(own_procs_file("7:blkio:/a\n", HYBRID_MOUNTINFO), None);
        assert_eq!(
            own_procs_file("1:name=systemd:/user.slice\n", HYBRID_MOUNTINFO),
            Some(PathBuf::from(
                "/sys/fs/cgroup/systemd/user.slice/cgroup.procs"
            ))
        );
    }

    #[test]
    fn a_mount_of_a_subtree_shows_paths_below_its_root() {
        // A container's view: its own cgroup mounted as the root.
        let mountinfo = "90 80 0:30 /kubepods/pod1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw";
        assert_eq!(
            own_procs_file("0::/kubepods/pod1/app\n", mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/app/cgroup.procs"))
        );
        assert_eq!(
            own_procs_file("0::/kubepods/pod1\n", mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/cgroup.procs"))
        );
        // Outside the mounted subtree (or only sharing a name prefix): not shown.
        assert_eq!(own_procs_file("0::/kubepods/pod10\n", mountinfo), None);
        assert_eq!(own_procs_file("0::/system.slice\n", mountinfo), None);
    }

    #[test]
    fn nothing_without_a_mounted_cgroup_file_system() {
        let mountinfo = "30 29 0:5 / /proc rw,nosuid - proc proc rw";
        assert_eq!(own_procs_file("0::/\n", mountinfo), None);
        assert_eq!(own_procs_file("", HYBRID_MOUNTINFO), None);
    }

    static FAILED_WRITES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn failing_write() -> std::io::Result<PathBuf> {
        FAILED_WRITES.fetch_add(1, Ordering::SeqCst);
        Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
    }

    #[test]
    fn a_failed_write_turns_the_primer_off_for_good() {
        let primer = MigrationPrimer::with_write(failing_write);
        assert!(!primer.is_off());
        primer.nudge();
        // The thread makes the one write and stops; a later nudge finds it
        // gone and turns the primer off.
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while !primer.is_off() {
            assert!(Instant::now() < deadline, "the primer is still on");
            std::thread::sleep(std::time::Duration::from_millis(5));
            primer.nudge();
        }
        primer.nudge();
        assert_eq!(FAILED_WRITES.load(Ordering::SeqCst), 1);
    }
}
