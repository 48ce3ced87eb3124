//! A pod's user namespace, with its network namespace owned by it, pinned
//! by bind mounts (`NAME.user` and `NAME` under the run dir).
//!
//! Containers join both by path. The network namespace must belong to the
//! pod's user namespace: `runc exec` joins the user namespace first, and
//! from inside it a network namespace owned by the host's would be out of
//! reach. A thread cannot create a user namespace in a threaded process,
//! so a short-lived helper process does (`unshare(2)` between fork and
//! exec); this process writes its id maps, pins both namespaces and ends
//! the helper.

use std::fs::{self, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::mount::MsFlags;
use nix::sched::CloneFlags;

use super::netns::{self, LinuxNetns, NetnsError, NetnsManager, NetnsSyscalls, failed as syscall};
use super::reap;

/// One id mapping of the pod's user namespace: ids `0..size` inside are
/// `host_base..host_base+size` on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub host_base: u32,
    pub size: u32,
}

/// The pinned namespace files of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNamespaces {
    pub user: PathBuf,
    pub net: PathBuf,
}

/// The file pinning the user namespace that goes with network namespace
/// `net`.
pub fn user_namespace_path(net: &Path) -> PathBuf {
    let mut name = net.as_os_str().to_owned();
    name.push(".user");
    PathBuf::from(name)
}

fn mount_point(path: &Path) -> Result<(), NetnsError> {
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(NetnsError::Exists(path.into())),
        Err(e) => Err(syscall("create mount point", path)(e)),
    }
}

fn bind(source: &Path, target: &Path) -> Result<(), NetnsError> {
    nix::mount::mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| syscall("bind-mount", target)(e.into()))
}

/// Brings `lo` up inside the network namespace pinned at `net`.
fn loopback_up(net: &Path) -> Result<(), NetnsError> {
    netns::run_in(net, || LinuxNetns.loopback_up())?.map_err(syscall("bring up lo", net))
}

impl NetnsManager<LinuxNetns> {
    /// Creates the pod namespaces `name` (network) and `name.user`, the
    /// user namespace mapping `ids`, owning the network namespace.
    pub fn create_with_user_namespace(
        &self,
        name: &str,
        ids: IdRange,
    ) -> Result<PodNamespaces, NetnsError> {
        let net = self.path(name)?;
        let user = user_namespace_path(&net);
        let run_dir = net.parent().unwrap_or(Path::new("/"));
        fs::create_dir_all(run_dir).map_err(syscall("create run dir", run_dir))?;
        mount_point(&net)?;
        if let Err(error) = mount_point(&user) {
            let _ = fs::remove_file(&net);
            return Err(error);
        }
        let pinned = pin(&net, &user, ids).and_then(|()| loopback_up(&net));
        if let Err(error) = pinned {
            let _ = self.remove(name);
            return Err(error);
        }
        Ok(PodNamespaces { user, net })
    }
}

impl NetnsManager<LinuxNetns> {
    /// Pins the namespaces `from` (network) and `from.user` under the name
    /// `to` (a bind mount each), then removes the pins of `from`. A
    /// namespace lives while any pin holds it: it is never gone between.
    pub fn move_pinned(&self, from: &str, to: &str) -> Result<PodNamespaces, NetnsError> {
        let (old_net, net) = (self.path(from)?, self.path(to)?);
        let (old_user, user) = (user_namespace_path(&old_net), user_namespace_path(&net));
        mount_point(&net)?;
        if let Err(error) = mount_point(&user) {
            let _ = fs::remove_file(&net);
            return Err(error);
        }
        let bound = bind(&old_net, &net).and_then(|()| bind(&old_user, &user));
        if let Err(error) = bound {
            let _ = self.remove(to);
            return Err(error);
        }
        self.remove(from)?;
        Ok(PodNamespaces { user, net })
    }
}

/// Runs the helper, maps its ids, pins its namespaces, ends it.
fn pin(net: &Path, user: &Path, ids: IdRange) -> Result<(), NetnsError> {
    let mut command = Command::new("sleep");
    command
        .arg("60")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: between fork and exec only async-signal-safe work happens:
    // one prctl(2) and one unshare(2) system call. The helper gets SIGKILL
    // if this thread dies first (the agent killed mid-pin): it never
    // outlives the agent.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(io::Error::from)?;
            nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)
        });
    }
    // Tracked from its spawn (so the orphan sweep leaves it to us); the
    // lock is not held while the helper lives, so sandboxes are made side
    // by side and runtime commands go on meanwhile.
    let mut helper = {
        let _guard = reap::spawn_lock();
        let helper = command
            .spawn()
            .map_err(syscall("start the namespace helper for", net))?;
        reap::track(helper.id());
        helper
    };
    let proc_dir = PathBuf::from(format!("/proc/{}", helper.id()));
    let map = format!("0 {} {}\n", ids.host_base, ids.size);
    let result = fs::write(proc_dir.join("uid_map"), &map)
        .map_err(syscall("write uid_map", user))
        .and_then(|()| {
            fs::write(proc_dir.join("gid_map"), &map).map_err(syscall("write gid_map", user))
        })
        .and_then(|()| bind(&proc_dir.join("ns/user"), user))
        .and_then(|()| bind(&proc_dir.join("ns/net"), net));
    let _ = helper.kill();
    let _ = helper.wait();
    reap::untrack(helper.id());
    result
}
