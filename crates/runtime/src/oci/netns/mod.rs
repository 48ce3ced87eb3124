//! Network namespaces, the one module that makes them: persistent
//! namespaces named by a path (e.g. `/run/corral/netns/<pod>`, a lab
//! node's namespace), entering one to run code or commands, and the
//! [`NetnsManager`] of a run directory that pods' namespaces live in.
//!
//! A namespace is made persistent the way `ip netns add` does it: a thread
//! unshares a fresh network namespace and bind-mounts its
//! `/proc/thread-self/ns/net` onto the path. `unshare` and `setns` change
//! only the calling thread, so both happen on a dedicated short-lived
//! thread and the caller's threads never change namespace. Sockets and
//! child processes created on that thread stay in the namespace for life.
//!
//! The syscalls sit behind [`NetnsSyscalls`] ([`LinuxNetns`] is the real
//! one), so the manager's bookkeeping is tested without root. `corral-net`
//! re-exports this module as `corral_net::netns`.

pub mod link;
mod manager;

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use nix::sched::CloneFlags;
use nix::sys::statfs::{NSFS_MAGIC, fstatfs};

pub use manager::{LinuxNetns, NetnsManager, NetnsSyscalls};

/// Why a namespace could not be created, removed, opened or entered.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace name {0:?} must be 1-64 characters of [A-Za-z0-9_.-]")]
    InvalidName(String),
    #[error("network namespace {0:?} already exists")]
    Exists(PathBuf),
    #[error("{path} is not a network namespace (no namespace is mounted there)")]
    NotANamespace { path: PathBuf },
    #[error("failed to {step} for network namespace {path:?}")]
    Syscall {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("thread working in network namespace {path:?} panicked")]
    ThreadPanicked { path: PathBuf },
}

/// The error of `step` on `path`, for `map_err`.
pub(crate) fn failed(step: &'static str, path: &Path) -> impl FnOnce(io::Error) -> NetnsError {
    let path = path.to_path_buf();
    move |source| NetnsError::Syscall { step, path, source }
}

/// True when `path` has a namespace mounted on it.
pub fn exists(path: &Path) -> bool {
    File::open(path)
        .ok()
        .and_then(|file| fstatfs(&file).ok())
        .is_some_and(|fs| fs.filesystem_type() == NSFS_MAGIC)
}

/// Opens the namespace at `path` (for `setns`, or to move a link into it).
pub fn open(path: &Path) -> Result<File, NetnsError> {
    let file = File::open(path).map_err(failed("open", path))?;
    if !fstatfs(&file).is_ok_and(|fs| fs.filesystem_type() == NSFS_MAGIC) {
        return Err(NetnsError::NotANamespace {
            path: path.to_path_buf(),
        });
    }
    Ok(file)
}

/// Creates a persistent network namespace at `path` (its `lo` left down).
/// Idempotent: an existing namespace there is kept.
pub fn create(path: &Path) -> Result<(), NetnsError> {
    if exists(path) {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(failed("create parent directory", path))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(failed("create mount point", path))?;
    let result = pin_new(&LinuxNetns, path, false);
    if result.is_err() {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// On a thread of its own that ends once the namespace is pinned:
/// unshares a new network namespace, brings `lo` up if asked, and
/// bind-mounts the namespace onto `path` (an existing file).
pub(crate) fn pin_new(
    syscalls: &(impl NetnsSyscalls + ?Sized),
    path: &Path,
    loopback_up: bool,
) -> Result<(), NetnsError> {
    on_thread(path, || {
        syscalls
            .unshare_network()
            .map_err(failed("unshare", path))?;
        if loopback_up {
            syscalls
                .loopback_up()
                .map_err(failed("bring up lo", path))?;
        }
        syscalls
            .bind_current_netns(path)
            .map_err(failed("bind-mount", path))
    })
    .and_then(|inner| inner)
}

/// Removes the namespace at `path`: unmounts it and deletes the file. Absent
/// namespaces are fine. Interfaces inside vanish once no process holds it.
pub fn delete(path: &Path) -> Result<(), NetnsError> {
    unpin(&LinuxNetns, path)
}

/// Unmounts `path` (if mounted) and removes it (if present).
pub(crate) fn unpin(
    syscalls: &(impl NetnsSyscalls + ?Sized),
    path: &Path,
) -> Result<(), NetnsError> {
    syscalls.unmount(path).map_err(failed("unmount", path))?;
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(failed("remove mount point", path)(e)),
    }
}

/// Runs `f` on a fresh thread that has entered the namespace at `path`.
pub fn run_in<F, R>(path: &Path, f: F) -> Result<R, NetnsError>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let file = open(path)?;
    on_thread(path, move || {
        nix::sched::setns(&file, CloneFlags::CLONE_NEWNET)
            .map_err(|e| failed("enter", path)(e.into()))?;
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

/// Runs `command` to completion inside the namespace (or here for `None`)
/// with `stdin` written to it (none: `/dev/null`), capturing stdout and
/// stderr: how the tools corral drives (`nft`, `wg`) are run.
pub fn output_with_input(
    path: Option<&Path>,
    command: &mut Command,
    stdin: Option<&[u8]>,
) -> Result<io::Result<Output>, NetnsError> {
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Ok(spawn(path, command)?.and_then(|mut child| {
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(bytes)?;
        }
        child.wait_with_output()
    }))
}

/// Starts `command` inside the namespace (or here for `None`); the child stays
/// there for life.
pub fn spawn(path: Option<&Path>, command: &mut Command) -> Result<io::Result<Child>, NetnsError> {
    run_in_optional(path, || command.spawn())
}

/// Runs `f` on a scoped thread of its own (namespace changes stay there).
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
