//! A pod's user namespace, with its network namespace owned by it, pinned
//! by bind mounts (`NAME.user` and `NAME` under the run dir).
//!
//! Containers join both by path. The network namespace must belong to the
//! pod's user namespace: `runc exec` joins the user namespace first, and
//! from inside it a network namespace owned by the host's would be out of
//! reach. A thread cannot create a user namespace in a threaded process,
//! so a short-lived helper process does (util-linux's `unshare`, under
//! `setpriv --pdeathsig`); this process writes its id maps, pins both
//! namespaces and ends the helper.

use std::fs::{self, OpenOptions};
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::mount::MsFlags;

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

/// How long the helper may take to enter its namespaces.
const UNSHARE_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits until `helper` is in a user namespace other than this process's
/// (its `unshare(2)` made both namespaces at once), or fails with what it
/// said if it exits or takes too long.
fn await_unshare(helper: &mut std::process::Child, net: &Path) -> Result<(), NetnsError> {
    let ours =
        fs::read_link("/proc/self/ns/user").map_err(syscall("read our user namespace", net))?;
    let theirs = PathBuf::from(format!("/proc/{}/ns/user", helper.id()));
    let began = std::time::Instant::now();
    loop {
        if fs::read_link(&theirs).is_ok_and(|ns| ns != ours) {
            return Ok(());
        }
        let exited = helper
            .try_wait()
            .map_err(syscall("wait for the namespace helper of", net))?;
        if exited.is_some() || began.elapsed() > UNSHARE_WITHIN {
            let mut said = String::new();
            if exited.is_some()
                && let Some(stderr) = helper.stderr.as_mut()
            {
                let _ = io::Read::read_to_string(stderr, &mut said);
            }
            let why = match exited {
                Some(status) => format!("it exited ({status}): {}", said.trim()),
                None => format!("it did not within {UNSHARE_WITHIN:?}"),
            };
            return Err(syscall("enter new namespaces in the helper for", net)(
                io::Error::other(format!("setpriv/unshare: {why}")),
            ));
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
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
    // util-linux's `setpriv` and `unshare` do in the helper what a
    // `pre_exec` hook would: with no hook, the helper is spawned without a
    // fork of this (large, threaded) process — no copy of its page tables
    // under the spawn lock, no copy-on-write faults in its threads after.
    // The helper gets SIGKILL if this thread dies first (the agent killed
    // mid-pin): it never outlives the agent.
    let mut command = Command::new("setpriv");
    command
        .args(["--pdeathsig", "KILL", "--", "unshare", "--user", "--net"])
        .args(["--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
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
    if let Err(error) = await_unshare(&mut helper, net) {
        let _ = helper.kill();
        let _ = helper.wait();
        reap::untrack(helper.id());
        return Err(error);
    }
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
