//! Running containers through an OCI runtime binary (`runc` or `runsc`),
//! network namespaces (the one module that makes them, for pods, VMs and
//! the lab) and a pod's user namespace, and
//! collecting container exit statuses.

pub mod netns;
pub mod reap;
mod runc;
pub mod sealed;
pub mod userns;

use std::io;
use std::path::{Path, PathBuf};
use std::process::Child;

pub use nix::sys::signal::Signal;
pub use reap::ExitStatus;
pub use runc::RuncCli;

use crate::bundle::UserIds;

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("failed to run {binary:?}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("failed to open log file {path:?}")]
    LogFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to read {path:?}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("runtime printed unparsable {what}: {detail}")]
    Parse { what: &'static str, detail: String },
    #[error("container {0} does not exist")]
    NotFound(String),
    #[error(transparent)]
    Reap(#[from] reap::ReapError),
}

/// Where a container's stdout and stderr go (appended; no TTY). The two
/// paths may be the same file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerIo {
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

impl ContainerIo {
    /// Both streams into one file.
    pub fn combined(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self {
            stdout: path.clone(),
            stderr: path,
        }
    }
}

/// The lifecycle status the runtime reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Creating,
    Created,
    Running,
    Paused,
    Stopped,
    Other(String),
}

impl Status {
    fn parse(text: &str) -> Self {
        match text {
            "creating" => Self::Creating,
            "created" => Self::Created,
            "running" => Self::Running,
            "paused" => Self::Paused,
            "stopped" => Self::Stopped,
            other => Self::Other(other.to_string()),
        }
    }
}

/// One container as the runtime sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerState {
    pub id: String,
    pub status: Status,
    /// The container's init (runc) or sandbox (runsc) process; `None` once
    /// stopped.
    pub pid: Option<u32>,
    pub bundle: PathBuf,
}

/// A command to run inside a running container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecSpec {
    pub args: Vec<String>,
    /// `NAME=value`, added to the container's environment.
    pub env: Vec<String>,
    pub cwd: Option<String>,
    /// Runs as the container's process user when `None`.
    pub user: Option<UserIds>,
    /// Allocate a pseudo-terminal in the container; the runtime proxies it
    /// to its own stdin and stdout. runc insists that its stdin (or stdout)
    /// is a terminal then: use [`OciRuntime::exec_with_stdin`] with the
    /// other side of a pseudo-terminal the caller allocated.
    pub tty: bool,
}

/// What a finished exec printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub status: std::process::ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The operations of the OCI runtime command line.
pub trait OciRuntime: Send + Sync {
    /// Creates container `id` from `bundle` (its init waits for `start`),
    /// stdio going to `io`; returns the pid of its init process.
    fn create(&self, id: &str, bundle: &Path, io: &ContainerIo) -> Result<u32, OciError>;
    fn start(&self, id: &str) -> Result<(), OciError>;
    /// Creates and starts container `id` (`create` then `start`; a runtime
    /// may do both in one command) and returns the pid of its init. The
    /// init may have exited by the time this returns: [`wait`](Self::wait)
    /// still reports how.
    fn run_detached(&self, id: &str, bundle: &Path, io: &ContainerIo) -> Result<u32, OciError> {
        let pid = self.create(id, bundle, io)?;
        self.start(id)?;
        Ok(pid)
    }
    /// `None` when the runtime has no container `id`.
    fn state(&self, id: &str) -> Result<Option<ContainerState>, OciError>;
    /// Sends `signal` to the container's init. Note that init (pid 1 of
    /// its namespace) ignores signals it has no handler for: follow
    /// `SIGTERM` with `SIGKILL` after the grace period.
    fn kill(&self, id: &str, signal: Signal) -> Result<(), OciError>;
    /// Blocks until the container (init pid `pid`, as `create` returned)
    /// exits, and returns how. This process must be a child subreaper
    /// ([`reap::become_subreaper`]). Under runsc the pid is the sandbox,
    /// which reports a signal death as `Exited(128 + signal)`: compare
    /// [`ExitStatus::code`].
    fn wait(&self, id: &str, pid: u32) -> Result<ExitStatus, OciError>;
    /// Deletes the container; `force` kills it first if running. Deleting
    /// a container that does not exist succeeds.
    fn delete(&self, id: &str, force: bool) -> Result<(), OciError>;
    /// Starts `spec` in the container with piped stdin, stdout and stderr.
    fn exec(&self, id: &str, spec: &ExecSpec) -> Result<Child, OciError> {
        self.exec_with_stdin(id, spec, std::process::Stdio::piped())
    }
    /// [`exec`](Self::exec) with the runtime's stdin given (stdout and
    /// stderr piped): for a TTY, the slave side of a pseudo-terminal, which
    /// runc needs as its console. The pid is tracked for the caller to wait.
    fn exec_with_stdin(
        &self,
        id: &str,
        spec: &ExecSpec,
        stdin: std::process::Stdio,
    ) -> Result<Child, OciError>;
    fn list(&self) -> Result<Vec<ContainerState>, OciError>;

    /// Runs `spec` to completion and collects its output (stdin closed).
    fn exec_output(&self, id: &str, spec: &ExecSpec) -> Result<ExecOutput, OciError> {
        let mut child = self.exec(id, spec)?;
        drop(child.stdin.take());
        let output = child.wait_with_output().map_err(|source| OciError::Spawn {
            binary: PathBuf::from("exec"),
            source,
        })?;
        Ok(ExecOutput {
            status: output.status,
            stdout: output.stdout,
            stderr: output.stderr,
        })
    }
}
