//! Exit statuses of detached containers. `runc create` exits once the
//! container is set up, orphaning its init; a process that called
//! [`become_subreaper`] inherits it and can wait for it by pid (for runsc
//! the pid is the sandbox, which exits with the container's status).
//!
//! A subreaper also inherits the runtime's other orphans (runsc's gofer and
//! helpers), which must be reaped or runsc believes they still run.
//! [`reap_orphans`] reaps zombie children that nobody tracks; to never
//! steal a status someone else will wait for, container inits, exec
//! children and runtime commands are tracked from their spawn (under
//! [`spawn_lock`]) until they are waited for. A container started by
//! `run --detach` can exit before its pid is known and tracked: the statuses
//! a sweep collects are kept (the last [`KEPT_STATUSES`]), and waiting for a
//! pid that is no longer a child finds its status there. Other code in a subreaper
//! process that spawns children must hold [`spawn_lock`] from spawn until
//! it has waited for them, or until it has [`track`]ed them.

use std::collections::{BTreeSet, VecDeque};
use std::fs;
use std::sync::{Mutex, MutexGuard, PoisonError};

use nix::errno::Errno;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;
use procfs::process::ProcState;

/// How a container's init process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Signaled(i32),
}

impl ExitStatus {
    /// The shell convention: the code, or 128 + signal.
    pub fn code(self) -> i32 {
        match self {
            Self::Exited(code) => code,
            Self::Signaled(signal) => 128 + signal,
        }
    }
}

/// Why waiting failed.
#[derive(Debug, thiserror::Error)]
pub enum ReapError {
    #[error("failed to become a child subreaper")]
    Subreaper(#[source] Errno),
    #[error("failed to wait for pid {pid} (is this process its subreaper?)")]
    Wait {
        pid: u32,
        #[source]
        source: Errno,
    },
}

static SPAWN_LOCK: Mutex<()> = Mutex::new(());
static TRACKED: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// How many statuses of swept orphans are kept for a late waiter.
pub const KEPT_STATUSES: usize = 1024;

/// Statuses orphan sweeps collected, oldest first.
static SWEPT: Mutex<VecDeque<(u32, ExitStatus)>> = Mutex::new(VecDeque::new());

fn keep_swept(pid: u32, status: ExitStatus) {
    let mut swept = SWEPT.lock().unwrap_or_else(PoisonError::into_inner);
    swept.retain(|(kept, _)| *kept != pid);
    if swept.len() == KEPT_STATUSES {
        swept.pop_front();
    }
    swept.push_back((pid, status));
}

/// The status a sweep collected for `pid`, taken (asked once).
fn take_swept(pid: u32) -> Option<ExitStatus> {
    let mut swept = SWEPT.lock().unwrap_or_else(PoisonError::into_inner);
    let index = swept.iter().position(|(kept, _)| *kept == pid)?;
    swept.remove(index).map(|(_, status)| status)
}

/// Held while spawning and waiting for short-lived children, so
/// [`reap_orphans`] never reaps them first.
pub fn spawn_lock() -> MutexGuard<'static, ()> {
    SPAWN_LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

fn tracked() -> MutexGuard<'static, BTreeSet<u32>> {
    TRACKED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Marks `pid` as waited for by someone: [`reap_orphans`] leaves it.
pub fn track(pid: u32) {
    tracked().insert(pid);
}

/// Forgets a pid passed to [`track`].
pub fn untrack(pid: u32) {
    tracked().remove(&pid);
}

/// Zombie children of this process, from the process table.
fn zombie_children() -> Vec<u32> {
    let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    let Ok(processes) = procfs::process::all_processes() else {
        return Vec::new();
    };
    processes
        .flatten()
        .filter_map(|process| process.stat().ok())
        .filter(|stat| stat.ppid == me && stat.state().ok() == Some(ProcState::Zombie))
        .filter_map(|stat| u32::try_from(stat.pid).ok())
        .collect()
}

/// Whether a process still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// Gone; its exit code when this process could collect it.
    Exited(Option<i32>),
}

/// Whether `pid` still runs. A child of this process is waited for, which
/// yields its exit code; any other (one adopted after a restart, or reaped
/// already) is looked up in the process table, where a zombie or no entry
/// means it exited, code unknown.
pub fn liveness(pid: u32) -> Liveness {
    match try_wait(pid) {
        Ok(None) => Liveness::Alive,
        Ok(Some(status)) => Liveness::Exited(Some(status.code())),
        Err(_) if runs(pid) => Liveness::Alive,
        Err(_) => Liveness::Exited(None),
    }
}

/// Whether `pid` runs per the process table (a zombie or no entry: it
/// does not). Never waits, so it steals no child's status: for a pid that
/// may be anyone's, such as a container init recorded before a reboot.
pub fn runs(pid: u32) -> bool {
    let state = i32::try_from(pid)
        .ok()
        .and_then(|pid| procfs::process::Process::new(pid).ok())
        .and_then(|process| process.stat().ok())
        .and_then(|stat| stat.state().ok());
    !matches!(state, Some(ProcState::Zombie | ProcState::Dead) | None)
}

/// Reaps zombie children that are not tracked (orphans a subreaper
/// inherited). Does nothing unless this process is a subreaper. Returns
/// the pids reaped. Takes [`spawn_lock`]; use [`reap_orphans_locked`] when
/// holding it already.
pub fn reap_orphans() -> Vec<u32> {
    let _guard = spawn_lock();
    reap_orphans_locked()
}

/// [`reap_orphans`] for a caller that holds [`spawn_lock`].
///
/// Every runtime command sweeps first, so a sweep must not cost more with
/// more processes: it asks the kernel for a zombie child without reaping
/// it (`waitid` with `WNOWAIT`), and most sweeps end there, finding none.
/// Only a tracked zombie first in line (its waiter has not got to it yet)
/// makes it look at each child of this process in turn.
pub fn reap_orphans_locked() -> Vec<u32> {
    if !nix::sys::prctl::get_child_subreaper().unwrap_or(false) {
        return Vec::new();
    }
    let mut tracked = tracked();
    let mut reaped = Vec::new();
    let mut previous = None;
    loop {
        match first_zombie() {
            None => return reaped,
            // Tracked, or (never expected) not reaped by the last try:
            // each child is looked at once below instead.
            Some(pid) if tracked.contains(&pid) || previous == Some(pid) => break,
            // A zombie reaped by someone else meanwhile is gone from the
            // next answer either way.
            Some(pid) => {
                reap_if_exited(pid, &mut reaped);
                previous = Some(pid);
            }
        }
    }
    // Forget tracked pids that no longer exist (their waiter reaped them).
    tracked.retain(|pid| fs::metadata(format!("/proc/{pid}")).is_ok());
    for pid in own_children() {
        if !tracked.contains(&pid) {
            reap_if_exited(pid, &mut reaped);
        }
    }
    reaped
}

/// The pid of a zombie child of this process, left unreaped; `None` when
/// it has none.
fn first_zombie() -> Option<u32> {
    let flags =
        WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT | WaitPidFlag::__WALL;
    match waitid(Id::All, flags) {
        Ok(WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)) => {
            u32::try_from(pid.as_raw()).ok()
        }
        _ => None,
    }
}

/// Reaps child `pid` if it exited, keeping its status for a late waiter.
fn reap_if_exited(pid: u32, reaped: &mut Vec<u32>) {
    let flags = WaitPidFlag::WNOHANG | WaitPidFlag::__WALL;
    let Ok(raw) = i32::try_from(pid) else {
        return;
    };
    let status = waitpid(Pid::from_raw(raw), Some(flags));
    if let Some(exit) = status.ok().and_then(|status| convert(pid, status)) {
        keep_swept(pid, exit);
        reaped.push(pid);
    }
}

/// The children of this process: the `children` list of each of its
/// threads (a child belongs to the thread that made it, an adopted orphan
/// to the one the kernel chose). Without that list in `/proc` (a kernel
/// built without `CONFIG_PROC_CHILDREN`), the zombies of the whole process
/// table.
fn own_children() -> Vec<u32> {
    let Ok(threads) = fs::read_dir("/proc/self/task") else {
        return zombie_children();
    };
    let mut children = Vec::new();
    for thread in threads.flatten() {
        match fs::read_to_string(thread.path().join("children")) {
            Ok(list) => children.extend(
                list.split_whitespace()
                    .filter_map(|pid| pid.parse::<u32>().ok()),
            ),
            // A thread that ended since the listing has no children left.
            Err(error)
                if error.kind() == std::io::ErrorKind::NotFound && thread.path().exists() =>
            {
                return zombie_children();
            }
            Err(_) => {}
        }
    }
    children
}

/// Makes this process the reaper of its orphaned descendants
/// (`PR_SET_CHILD_SUBREAPER`), so it can collect container exit statuses.
/// Affects the whole process; call once at start-up.
pub fn become_subreaper() -> Result<(), ReapError> {
    nix::sys::prctl::set_child_subreaper(true).map_err(ReapError::Subreaper)
}

fn convert(pid: u32, status: WaitStatus) -> Option<ExitStatus> {
    match status {
        WaitStatus::Exited(_, code) => Some(ExitStatus::Exited(code)),
        WaitStatus::Signaled(_, signal, _) => Some(ExitStatus::Signaled(signal as i32)),
        _ => {
            tracing::debug!(pid, ?status, "child changed state without exiting");
            None
        }
    }
}

/// Blocks until `pid` (a child of this process) exits, then untracks it.
/// A pid an orphan sweep reaped already answers with the status it kept.
pub fn wait_for_exit(pid: u32) -> Result<ExitStatus, ReapError> {
    loop {
        match waitpid(Pid::from_raw(pid as i32), None) {
            Ok(status) => {
                if let Some(exit) = convert(pid, status) {
                    untrack(pid);
                    return Ok(exit);
                }
            }
            Err(Errno::EINTR) => {}
            Err(Errno::ECHILD) if let Some(exit) = take_swept(pid) => {
                untrack(pid);
                return Ok(exit);
            }
            Err(source) => return Err(ReapError::Wait { pid, source }),
        }
    }
}

/// The exit status of `pid` if it has exited, without blocking.
pub fn try_wait(pid: u32) -> Result<Option<ExitStatus>, ReapError> {
    match waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::StillAlive) => Ok(None),
        Ok(status) => {
            let exit = convert(pid, status);
            if exit.is_some() {
                untrack(pid);
            }
            Ok(exit)
        }
        Err(Errno::ECHILD) if let Some(exit) = take_swept(pid) => {
            untrack(pid);
            Ok(Some(exit))
        }
        Err(source) => Err(ReapError::Wait { pid, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // These children are reaped through `waitpid` by pid, not `Child::wait`.
    #[test]
    #[allow(clippy::zombie_processes)]
    fn waits_for_own_children() {
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .expect("spawn sh");
        assert_eq!(
            wait_for_exit(child.id()).expect("wait"),
            ExitStatus::Exited(7)
        );
        assert_eq!(ExitStatus::Signaled(9).code(), 137);
    }

    /// An orphan that exits before anyone tracks it (a container started
    /// with `run --detach`) is reaped by a sweep, which keeps its status.
    #[test]
    fn a_swept_orphan_still_reports_its_status() {
        become_subreaper().expect("subreaper");
        let output = std::process::Command::new("sh")
            .args(["-c", "sh -c 'sleep 0.2; exit 5' >/dev/null & echo $!"])
            .output()
            .expect("spawn sh");
        let orphan: u32 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("pid");
        let began = std::time::Instant::now();
        while !zombie_children().contains(&orphan) {
            assert!(
                began.elapsed().as_secs() < 10,
                "orphan {orphan} never exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(reap_orphans().contains(&orphan), "swept");
        assert_eq!(try_wait(orphan).expect("kept"), Some(ExitStatus::Exited(5)));
        assert!(
            matches!(wait_for_exit(orphan), Err(ReapError::Wait { .. })),
            "a kept status is answered once"
        );
    }

    /// Waits until `pid` is a zombie child of this process.
    fn until_zombie(pid: u32) {
        let began = std::time::Instant::now();
        while !zombie_children().contains(&pid) {
            assert!(began.elapsed().as_secs() < 10, "{pid} never exited");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// A tracked zombie first in line (its waiter has not got to it) is
    /// left for its waiter, and the sweep still finds the orphans behind
    /// it, each reaped once.
    #[test]
    #[allow(clippy::zombie_processes)]
    fn a_tracked_zombie_does_not_hide_the_orphans_behind_it() {
        become_subreaper().expect("subreaper");
        let tracked_child = {
            let _guard = spawn_lock();
            let child = std::process::Command::new("sh")
                .args(["-c", "exit 3"])
                .spawn()
                .expect("spawn sh");
            track(child.id());
            child.id()
        };
        until_zombie(tracked_child);
        let output = {
            // Waited for here: no sweep may take it.
            let _guard = spawn_lock();
            std::process::Command::new("sh")
                .args([
                    "-c",
                    "for i in 1 2 3; do sh -c 'sleep 0.2; exit 6' >/dev/null & echo $!; done",
                ])
                .output()
                .expect("spawn sh")
        };
        let orphans: Vec<u32> = String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .map(|pid| pid.parse().expect("pid"))
            .collect();
        assert_eq!(orphans.len(), 3);
        for orphan in &orphans {
            until_zombie(*orphan);
        }
        assert_eq!(
            first_zombie(),
            Some(tracked_child),
            "the tracked child is first in line"
        );
        let mut reaped = reap_orphans();
        reaped.sort_unstable();
        let mut expected = orphans.clone();
        expected.sort_unstable();
        assert_eq!(reaped, expected, "every orphan and nothing else");
        assert!(reap_orphans().is_empty(), "nothing is reaped twice");
        assert_eq!(
            wait_for_exit(tracked_child).expect("its waiter"),
            ExitStatus::Exited(3)
        );
        for orphan in orphans {
            assert_eq!(try_wait(orphan).expect("kept"), Some(ExitStatus::Exited(6)));
        }
        assert_eq!(first_zombie(), None);
    }

    #[test]
    #[allow(clippy::zombie_processes)]
    fn try_wait_reports_running_then_exit() {
        let me = std::process::id();
        assert_eq!(
            liveness(me),
            Liveness::Alive,
            "not a child, found in the table"
        );
        let child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("spawn sleep");
        assert_eq!(try_wait(child.id()).expect("try"), None);
        assert_eq!(
            wait_for_exit(child.id()).expect("wait"),
            ExitStatus::Exited(0)
        );
    }
}
