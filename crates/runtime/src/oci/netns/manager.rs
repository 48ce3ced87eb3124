//! [`NetnsManager`]: named network namespaces under one run directory
//! (a pod's is `<run_dir>/pod-<uid>`), created with `lo` up; the
//! privileged operations behind [`NetnsSyscalls`].

use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

use super::{NetnsError, failed, pin_new, unpin};

/// The privileged operations, so the bookkeeping is tested without root.
pub trait NetnsSyscalls: Send + Sync {
    /// Moves the calling thread into a new network namespace.
    fn unshare_network(&self) -> io::Result<()>;
    /// Sets `lo` up in the calling thread's network namespace.
    fn loopback_up(&self) -> io::Result<()>;
    /// Bind-mounts the calling thread's network namespace onto `target`.
    fn bind_current_netns(&self, target: &Path) -> io::Result<()>;
    /// Lazily unmounts `target`; `Ok(false)` if nothing was mounted.
    fn unmount(&self, target: &Path) -> io::Result<bool>;
}

/// The real syscalls.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxNetns;

impl NetnsSyscalls for LinuxNetns {
    fn unshare_network(&self) -> io::Result<()> {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
    }

    fn loopback_up(&self) -> io::Result<()> {
        super::link::set_up("lo")
    }

    fn bind_current_netns(&self, target: &Path) -> io::Result<()> {
        nix::mount::mount(
            Some("/proc/thread-self/ns/net"),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
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

/// Creates and removes named network namespaces under one run directory.
#[derive(Debug, Clone)]
pub struct NetnsManager<S = LinuxNetns> {
    run_dir: PathBuf,
    syscalls: S,
}

impl NetnsManager<LinuxNetns> {
    pub fn new(run_dir: impl Into<PathBuf>) -> Self {
        Self::with_syscalls(run_dir, LinuxNetns)
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl<S: NetnsSyscalls> NetnsManager<S> {
    pub fn with_syscalls(run_dir: impl Into<PathBuf>, syscalls: S) -> Self {
        Self {
            run_dir: run_dir.into(),
            syscalls,
        }
    }

    /// The directory the namespaces are pinned in.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Where namespace `name` is (or would be) mounted.
    pub fn path(&self, name: &str) -> Result<PathBuf, NetnsError> {
        if valid_name(name) {
            Ok(self.run_dir.join(name))
        } else {
            Err(NetnsError::InvalidName(name.to_string()))
        }
    }

    /// Creates namespace `name` with `lo` up and returns its path.
    pub fn create(&self, name: &str) -> Result<PathBuf, NetnsError> {
        let path = self.path(name)?;
        fs::create_dir_all(&self.run_dir).map_err(failed("create run dir", &self.run_dir))?;
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(NetnsError::Exists(path));
            }
            Err(e) => return Err(failed("create mount point", &path)(e)),
        }
        if let Err(e) = pin_new(&self.syscalls, &path, true) {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        Ok(path)
    }

    /// Unmounts and removes namespace `name` (and the user namespace
    /// pinned beside it, if any); succeeds if they are gone already.
    pub fn remove(&self, name: &str) -> Result<(), NetnsError> {
        let path = self.path(name)?;
        self.remove_pinned(&path)?;
        self.remove_pinned(&crate::oci::userns::user_namespace_path(&path))
    }

    fn remove_pinned(&self, path: &Path) -> Result<(), NetnsError> {
        if !path.exists() {
            return Ok(());
        }
        unpin(&self.syscalls, path)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct FakeSyscalls {
        calls: Arc<Mutex<Vec<String>>>,
        fail_unshare: bool,
    }

    impl FakeSyscalls {
        fn record(&self, call: String) {
            self.calls.lock().expect("lock").push(call);
        }
    }

    impl NetnsSyscalls for FakeSyscalls {
        fn unshare_network(&self) -> io::Result<()> {
            self.record("unshare".into());
            if self.fail_unshare {
                Err(io::Error::from_raw_os_error(nix::libc::EPERM))
            } else {
                Ok(())
            }
        }
        fn loopback_up(&self) -> io::Result<()> {
            self.record("lo up".into());
            Ok(())
        }
        fn bind_current_netns(&self, target: &Path) -> io::Result<()> {
            self.record(format!("bind {}", target.display()));
            Ok(())
        }
        fn unmount(&self, target: &Path) -> io::Result<bool> {
            self.record(format!("unmount {}", target.display()));
            Ok(true)
        }
    }

    #[test]
    fn create_then_remove() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = FakeSyscalls::default();
        let manager = NetnsManager::with_syscalls(dir.path().join("netns"), fake.clone());
        let path = manager.create("pod-1").expect("create");
        assert_eq!(path, dir.path().join("netns/pod-1"));
        assert!(path.is_file());
        assert!(matches!(
            manager.create("pod-1"),
            Err(NetnsError::Exists(_))
        ));
        manager.remove("pod-1").expect("remove");
        assert!(!path.exists());
        manager.remove("pod-1").expect("second remove is a no-op");
        assert_eq!(
            *fake.calls.lock().expect("lock"),
            vec![
                "unshare".to_string(),
                "lo up".to_string(),
                format!("bind {}", path.display()),
                format!("unmount {}", path.display()),
            ]
        );
    }

    #[test]
    fn failed_create_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = FakeSyscalls {
            fail_unshare: true,
            ..Default::default()
        };
        let manager = NetnsManager::with_syscalls(dir.path(), fake);
        assert!(matches!(
            manager.create("p"),
            Err(NetnsError::Syscall {
                step: "unshare",
                ..
            })
        ));
        assert!(!dir.path().join("p").exists());
    }

    #[test]
    fn names_are_checked() {
        let manager = NetnsManager::with_syscalls("/run/x", FakeSyscalls::default());
        for bad in ["", "..", "a/b", "a b"] {
            assert!(
                matches!(manager.path(bad), Err(NetnsError::InvalidName(_))),
                "{bad}"
            );
        }
    }
}
