//! Persistent network namespaces named by a path (e.g.
//! `/run/corral/netns/<pod>`), and running code or commands inside one.
//!
//! A namespace is made persistent the way `ip netns add` does it: a thread
//! unshares a fresh network namespace and bind-mounts its
//! `/proc/thread-self/ns/net` onto the path. Entering one happens on a
//! dedicated short-lived thread (`setns` changes only the calling thread), so
//! the caller's threads never change namespace. Sockets and child processes
//! created on that thread stay in the namespace for life.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::statfs::{NSFS_MAGIC, fstatfs};

/// Why a namespace could not be created, removed or entered.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("create parent directory of network namespace {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("create mount point for network namespace {path}")]
    CreateFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unshare a new network namespace for {path}")]
    Unshare {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("bind-mount network namespace onto {path}")]
    BindMount {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("unmount network namespace {path}")]
    Unmount {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("remove network namespace file {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("open network namespace {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a network namespace (no namespace is mounted there)")]
    NotANamespace { path: PathBuf },
    #[error("enter network namespace {path}")]
    Enter {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("thread working in network namespace {path} panicked")]
    ThreadPanicked { path: PathBuf },
}

/// True when `path` has a namespace mounted on it.
pub fn exists(path: &Path) -> bool {
    File::open(path)
        .ok()
        .and_then(|file| fstatfs(&file).ok())
        .is_some_and(|fs| fs.filesystem_type() == NSFS_MAGIC)
}

/// Creates a persistent network namespace at `path`. Idempotent: an existing
/// namespace there is kept.
pub fn create(path: &Path) -> Result<(), NetnsError> {
    if exists(path) {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| NetnsError::CreateDir {
            path: path.to_path_buf(),
            source,
        })?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|source| NetnsError::CreateFile {
            path: path.to_path_buf(),
            source,
        })?;
    let target = path.to_path_buf();
    let result = on_thread(path, move || {
        unshare(CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Unshare {
            path: target.clone(),
            source,
        })?;
        mount(
            Some("/proc/thread-self/ns/net"),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|source| NetnsError::BindMount {
            path: target.clone(),
            source,
        })
    })
    .and_then(|inner| inner);
    if result.is_err() {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// Removes the namespace at `path`: unmounts it and deletes the file. Absent
/// namespaces are fine. Interfaces inside vanish once no process holds it.
pub fn delete(path: &Path) -> Result<(), NetnsError> {
    match umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
        Err(source) => {
            return Err(NetnsError::Unmount {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NetnsError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Runs `f` on a fresh thread that has entered the namespace at `path`.
pub fn run_in<F, R>(path: &Path, f: F) -> Result<R, NetnsError>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let file = File::open(path).map_err(|source| NetnsError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    if !fstatfs(&file).is_ok_and(|fs| fs.filesystem_type() == NSFS_MAGIC) {
        return Err(NetnsError::NotANamespace {
            path: path.to_path_buf(),
        });
    }
    let target = path.to_path_buf();
    on_thread(path, move || {
        setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
            path: target,
            source,
        })?;
        Ok(f())
    })
    .and_then(|inner| inner)
}

/// Runs `f` in the namespace at `path`, or right here when `path` is `None`
/// (the caller's own namespace).
pub fn run_in_optional<F, R>(path: Option<&Path>, f: F) -> Result<R, NetnsError>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    match path {
        Some(path) => run_in(path, f),
        None => Ok(f()),
    }
}

/// Runs `command` to completion inside the namespace (or here for `None`).
pub fn output(
    path: Option<&Path>,
    command: &mut Command,
) -> Result<io::Result<Output>, NetnsError> {
    run_in_optional(path, || command.output())
}

/// Starts `command` inside the namespace (or here for `None`); the child stays
/// there for life.
pub fn spawn(path: Option<&Path>, command: &mut Command) -> Result<io::Result<Child>, NetnsError> {
    run_in_optional(path, || command.spawn())
}

fn on_thread<F, R>(path: &Path, f: F) -> Result<R, NetnsError>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(f)
            .join()
            .map_err(|_| NetnsError::ThreadPanicked {
                path: path.to_path_buf(),
            })
    })
}
