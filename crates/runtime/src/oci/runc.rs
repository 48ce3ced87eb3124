//! [`RuncCli`]: the runc / runsc command lines. Argument building and
//! output parsing are pure and unit-tested; the rest runs the binary.

use std::ffi::CStr;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use serde::Deserialize;

use super::reap::{self, ExitStatus};
use super::sealed::{self, SealedBinary};
use super::{ContainerIo, ContainerState, ExecSpec, OciError, OciRuntime, Signal, Status};
use crate::bundle::UserIds;

/// An OCI runtime driven through its command line: `runc`, or `runsc`
/// (gVisor; give it `--rootless=false`, `--network=…` etc. in
/// `global_args`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuncCli {
    /// `runc`, `runsc` or a path to one.
    pub binary: PathBuf,
    /// The runtime's state directory (`--root`): one per agent, so its
    /// containers never mix with other users of the same runtime.
    pub root: PathBuf,
    /// Flags placed before every subcommand.
    pub global_args: Vec<String>,
    /// Runs `start` in a private mount namespace whose `/proc/sys/net` is
    /// an empty read-only tmpfs (see [`RuncCli::with_netstack_start`]).
    pub hide_proc_sys_net_on_start: bool,
    /// The sealed in-memory copy the binary runs from, if any (see
    /// [`RuncCli::with_sealed_binary`]).
    pub sealed: Option<Arc<SealedBinary>>,
}

impl RuncCli {
    /// A runtime at `binary` keeping state in `root`.
    pub fn new(binary: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            root: root.into(),
            global_args: Vec::new(),
            hide_proc_sys_net_on_start: false,
            sealed: None,
        }
    }

    /// Runs the binary from a sealed in-memory copy of it, for runc: its
    /// `runc init` then skips the read-only bind mount and second exec it
    /// makes per container process otherwise (see [`super::sealed`]).
    /// Unchanged when the binary is not found or no copy can be made
    /// (the copy is an optimisation, never a requirement).
    pub fn with_sealed_binary(mut self) -> Self {
        match SealedBinary::of(&self.binary) {
            Ok(Some(sealed)) => self.sealed = Some(Arc::new(sealed)),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(binary = %self.binary.display(), %error, "runs from its file: no sealed copy");
            }
        }
        self
    }

    /// For `runsc --network=sandbox` (gVisor's own network stack): runsc
    /// sets the stack up in `start`, from the interfaces, addresses and
    /// routes of the container's network namespace, and first refuses a
    /// namespace it takes for the host's: runsc releases up to at least
    /// 2022-12 test for `/proc/sys/net/core/rmem_default`, which kernels
    /// since 6.x show in every network namespace. `start` therefore runs
    /// in a mount namespace of its own where `/proc/sys/net` is empty, so
    /// that probe fails as it does in a pod's namespace on older kernels.
    /// Only `start` is affected: such a runtime starts containers with
    /// `create` then `start`, never `run --detach`, so the sandbox process
    /// (made by `create`) never sees that mount. The caller must only
    /// start containers that join a namespace of their own under this
    /// setting: the probe exists to keep runsc from taking the node's own
    /// addresses.
    pub fn with_netstack_start(mut self) -> Self {
        self.hide_proc_sys_net_on_start = true;
        self
    }

    /// Adds flags placed before every subcommand.
    pub fn with_global_args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.global_args.extend(args.into_iter().map(Into::into));
        self
    }

    fn base_args(&self) -> Vec<String> {
        let mut args = vec![format!("--root={}", self.root.display())];
        args.extend(self.global_args.iter().cloned());
        args
    }

    /// Arguments of `create`, writing the runtime's own log beside the bundle.
    pub fn create_args(&self, id: &str, bundle: &Path) -> Vec<String> {
        self.launch_args(&["create"], id, bundle)
    }

    /// Arguments of `run --detach`: `create` and `start` in one runtime
    /// process.
    pub fn run_detached_args(&self, id: &str, bundle: &Path) -> Vec<String> {
        self.launch_args(&["run", "--detach"], id, bundle)
    }

    fn launch_args(&self, subcommand: &[&str], id: &str, bundle: &Path) -> Vec<String> {
        let mut args = self.base_args();
        args.push(format!("--log={}", runtime_log(bundle).display()));
        args.extend(subcommand.iter().map(|s| s.to_string()));
        args.extend([
            format!("--bundle={}", bundle.display()),
            format!("--pid-file={}", pid_file(bundle).display()),
            id.to_string(),
        ]);
        args
    }

    /// Runs `create` or `run --detach` (`args`) with the container's stdio
    /// going to `io`, and returns the pid the runtime wrote. The pid is
    /// tracked from then on; a container that already exited (possible
    /// after `run --detach`) was reaped by an orphan sweep, which keeps its
    /// status for [`reap::wait_for_exit`].
    fn launch(&self, args: &[String], bundle: &Path, io: &ContainerIo) -> Result<u32, OciError> {
        let stdout = open_log(&io.stdout)?;
        let stderr = if io.stderr == io.stdout {
            stdout.try_clone().map_err(|source| OciError::LogFile {
                path: io.stderr.clone(),
                source,
            })?
        } else {
            open_log(&io.stderr)?
        };
        let _ = fs::remove_file(pid_file(bundle));
        // The container inherits these descriptors: never pipe them, or
        // waiting for the runtime would wait for the container too.
        let (mut command, _copy) = self.command(args);
        command.stdout(stdout).stderr(stderr);
        let status = spawn_tracked(&mut command)
            .and_then(|mut child| {
                let pid = child.id();
                let status = child.wait();
                reap::untrack(pid);
                status
            })
            .map_err(|source| self.spawn_error(source))?;
        if !status.success() {
            return Err(OciError::Command {
                command: self.describe(args),
                status,
                stderr: tail(&runtime_log(bundle), 2048),
            });
        }
        let path = pid_file(bundle);
        let text = fs::read_to_string(&path).map_err(|source| OciError::Read {
            path: path.clone(),
            source,
        })?;
        let pid: u32 = text.trim().parse().map_err(|_| OciError::Parse {
            what: "pid file",
            detail: text.clone(),
        })?;
        // Tracked under the lock, so no orphan sweep takes it from now on.
        {
            let _guard = reap::spawn_lock();
            reap::track(pid);
        }
        Ok(pid)
    }

    /// Arguments of `exec`.
    /// The user of the container's process, from its bundle's config.
    fn process_user(&self, id: &str) -> Option<UserIds> {
        let state = self.state(id).ok()??;
        let config = std::fs::read(state.bundle.join("config.json")).ok()?;
        let spec: oci_spec::runtime::Spec = serde_json::from_slice(&config).ok()?;
        let user = spec.process().as_ref()?.user();
        Some(UserIds {
            uid: user.uid(),
            gid: user.gid(),
        })
    }

    pub fn exec_args(&self, id: &str, spec: &ExecSpec) -> Vec<String> {
        let mut args = self.base_args();
        args.push("exec".to_string());
        if spec.tty {
            args.push("--tty".to_string());
        }
        for env in &spec.env {
            args.push(format!("--env={env}"));
        }
        if let Some(cwd) = &spec.cwd {
            args.push(format!("--cwd={cwd}"));
        }
        if let Some(user) = spec.user {
            args.push(format!("--user={}:{}", user.uid, user.gid));
        }
        args.push(id.to_string());
        args.extend(spec.args.iter().cloned());
        args
    }

    /// The command line, and the sealed copy it executes, which must live
    /// until the child has been spawned.
    fn command(&self, args: &[String]) -> (Command, Option<Arc<sealed::Copy>>) {
        let copy = self.sealed.as_ref().and_then(|sealed| match sealed.current() {
            Ok(copy) => Some(copy),
            Err(error) => {
                tracing::warn!(binary = %sealed.source().display(), %error, "runs from its file: no sealed copy");
                None
            }
        });
        let mut command = match &copy {
            Some(copy) => {
                let mut command = Command::new(copy.program());
                command.arg0(&self.binary);
                command
            }
            None => Command::new(&self.binary),
        };
        command.args(args).stdin(Stdio::null());
        (command, copy)
    }

    /// Runs a subcommand to completion, failing on a non-zero exit.
    fn run(&self, subcommand: &[&str]) -> Result<Vec<u8>, OciError> {
        self.run_with(subcommand, false)
    }

    /// [`RuncCli::run`], with `/proc/sys/net` hidden when `hide_proc_sys_net`.
    fn run_with(&self, subcommand: &[&str], hide_proc_sys_net: bool) -> Result<Vec<u8>, OciError> {
        let mut args = self.base_args();
        args.extend(subcommand.iter().map(|s| s.to_string()));
        let (mut command, _copy) = self.command(&args);
        if hide_proc_sys_net {
            hide_proc_sys_net_in_child(&mut command);
        }
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let output = spawn_tracked(&mut command)
            .and_then(|child| {
                let pid = child.id();
                let output = child.wait_with_output();
                reap::untrack(pid);
                output
            })
            .map_err(|source| self.spawn_error(source))?;
        if !output.status.success() {
            return Err(OciError::Command {
                command: self.describe(&args),
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        Ok(output.stdout)
    }

    fn spawn_error(&self, source: std::io::Error) -> OciError {
        OciError::Spawn {
            binary: self.binary.clone(),
            source,
        }
    }

    fn describe(&self, args: &[String]) -> String {
        format!("{} {}", self.binary.display(), args.join(" "))
    }
}

/// Makes `command`'s child unshare its mount namespace (private from `/`
/// down, so nothing propagates back) and mount an empty read-only tmpfs
/// on `/proc/sys/net` before it execs.
fn hide_proc_sys_net_in_child(command: &mut Command) {
    use nix::mount::{MsFlags, mount};
    // SAFETY: between fork and exec only async-signal-safe work happens:
    // one unshare(2) and two mount(2) system calls on static C strings
    // (nothing is allocated), and errors are plain errno values.
    unsafe {
        command.pre_exec(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(io::Error::from)?;
            mount(
                None::<&CStr>,
                c"/",
                None::<&CStr>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&CStr>,
            )
            .map_err(io::Error::from)?;
            mount(
                Some(c"corral-hidden"),
                c"/proc/sys/net",
                Some(c"tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some(c"size=4k"),
            )
            .map_err(io::Error::from)
        });
    }
}

/// How often a failed `list` is asked again (see [`RuncCli::list`]).
const LIST_RETRIES: u32 = 5;

/// Spawns `command` under the spawn lock and tracks the child before the
/// lock is released, so no orphan sweep takes its status; the caller waits
/// for it (and untracks it) without the lock, so runtime commands of
/// different containers run at the same time. Orphans are swept first.
fn spawn_tracked(command: &mut Command) -> std::io::Result<Child> {
    let _guard = reap::spawn_lock();
    reap::reap_orphans_locked();
    let child = command.spawn()?;
    reap::track(child.id());
    Ok(child)
}

fn runtime_log(bundle: &Path) -> PathBuf {
    bundle.join("runtime.log")
}

fn pid_file(bundle: &Path) -> PathBuf {
    bundle.join("init.pid")
}

fn open_log(path: &Path) -> Result<File, OciError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
        .map_err(|source| OciError::LogFile {
            path: path.to_path_buf(),
            source,
        })
}

/// The last `max` bytes of a file, lossily as text (for error messages).
fn tail(path: &Path, max: usize) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let start = bytes.len().saturating_sub(max);
    String::from_utf8_lossy(&bytes[start..]).trim().to_string()
}

#[derive(Debug, Deserialize)]
struct ListedContainer {
    id: String,
    #[serde(default)]
    pid: i64,
    status: String,
    #[serde(default)]
    bundle: PathBuf,
}

/// Parses `list --format=json` output (runc prints `null` when empty).
pub(crate) fn parse_list(stdout: &[u8]) -> Result<Vec<ContainerState>, OciError> {
    let listed: Option<Vec<ListedContainer>> =
        serde_json::from_slice(stdout).map_err(|e| OciError::Parse {
            what: "container list",
            detail: e.to_string(),
        })?;
    Ok(listed
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            let status = Status::parse(&c.status);
            ContainerState {
                id: c.id,
                pid: (c.pid > 0 && status != Status::Stopped).then_some(c.pid as u32),
                status,
                bundle: c.bundle,
            }
        })
        .collect())
}

impl OciRuntime for RuncCli {
    fn create(&self, id: &str, bundle: &Path, io: &ContainerIo) -> Result<u32, OciError> {
        // Its init waits for `start`: it cannot exit before it is tracked.
        self.launch(&self.create_args(id, bundle), bundle, io)
    }

    fn run_detached(&self, id: &str, bundle: &Path, io: &ContainerIo) -> Result<u32, OciError> {
        if self.hide_proc_sys_net_on_start {
            // Two commands: only `start` runs with `/proc/sys/net` hidden.
            let pid = self.create(id, bundle, io)?;
            self.start(id)?;
            return Ok(pid);
        }
        self.launch(&self.run_detached_args(id, bundle), bundle, io)
    }

    fn start(&self, id: &str) -> Result<(), OciError> {
        self.run_with(&["start", id], self.hide_proc_sys_net_on_start)
            .map(drop)
    }

    fn state(&self, id: &str) -> Result<Option<ContainerState>, OciError> {
        Ok(self.list()?.into_iter().find(|c| c.id == id))
    }

    fn kill(&self, id: &str, signal: Signal) -> Result<(), OciError> {
        let number = (signal as i32).to_string();
        // Asked at once; only a failure is looked into (one command, not
        // two, and no `list` racing other containers' deletes).
        match self.run(&["kill", id, &number]) {
            Ok(_) => Ok(()),
            Err(error) => match self.state(id) {
                Ok(None) => Err(OciError::NotFound(id.to_string())),
                _ => Err(error),
            },
        }
    }

    fn wait(&self, _id: &str, pid: u32) -> Result<ExitStatus, OciError> {
        Ok(reap::wait_for_exit(pid)?)
    }

    fn delete(&self, id: &str, force: bool) -> Result<(), OciError> {
        let deleted = if force {
            self.run(&["delete", "--force", id])
        } else {
            self.run(&["delete", id])
        };
        // A failure for a container that is not there is no failure.
        match deleted {
            Ok(_) => Ok(()),
            Err(error) => match self.state(id) {
                Ok(None) => Ok(()),
                _ => Err(error),
            },
        }
    }

    fn exec_with_stdin(&self, id: &str, spec: &ExecSpec, stdin: Stdio) -> Result<Child, OciError> {
        // runc runs an exec as the container's user by itself, runsc as
        // root: name the container's user for both.
        let mut spec = spec.clone();
        if spec.user.is_none() {
            spec.user = self.process_user(id);
        }
        let args = self.exec_args(id, &spec);
        let (mut command, _copy) = self.command(&args);
        let _guard = reap::spawn_lock();
        let child = command
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| self.spawn_error(source))?;
        // The caller waits for it; orphan sweeps must leave it alone.
        reap::track(child.id());
        Ok(child)
    }

    fn list(&self) -> Result<Vec<ContainerState>, OciError> {
        // Runtime commands run concurrently: a container deleted while
        // `list` reads the state directory makes it fail. What it would
        // have listed is stale anyway, so it is asked again.
        let mut retries = LIST_RETRIES;
        loop {
            match self.run(&["list", "--format=json"]) {
                Ok(stdout) => return parse_list(&stdout),
                Err(OciError::Command { .. }) if retries > 0 => {
                    retries -= 1;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(error) => return Err(error),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> RuncCli {
        RuncCli::new("runsc", "/var/lib/corral/runsc").with_global_args(["--network=host"])
    }

    #[test]
    fn create_args_put_globals_first() {
        assert_eq!(
            cli().create_args("c1", Path::new("/b/c1")),
            vec![
                "--root=/var/lib/corral/runsc",
                "--network=host",
                "--log=/b/c1/runtime.log",
                "create",
                "--bundle=/b/c1",
                "--pid-file=/b/c1/init.pid",
                "c1",
            ]
        );
    }

    #[test]
    fn run_detached_args_name_the_bundle_and_pid_file() {
        assert_eq!(
            cli().run_detached_args("c1", Path::new("/b/c1")),
            vec![
                "--root=/var/lib/corral/runsc",
                "--network=host",
                "--log=/b/c1/runtime.log",
                "run",
                "--detach",
                "--bundle=/b/c1",
                "--pid-file=/b/c1/init.pid",
                "c1",
            ]
        );
    }

    #[test]
    fn exec_args_carry_env_cwd_user_and_tty() {
        let spec = ExecSpec {
            args: vec!["id".into(), "-u".into()],
            env: vec!["A=1".into()],
            cwd: Some("/tmp".into()),
            user: Some(UserIds {
                uid: 65534,
                gid: 65534,
            }),
            tty: true,
        };
        assert_eq!(
            cli().exec_args("c1", &spec),
            vec![
                "--root=/var/lib/corral/runsc",
                "--network=host",
                "exec",
                "--tty",
                "--env=A=1",
                "--cwd=/tmp",
                "--user=65534:65534",
                "c1",
                "id",
                "-u",
            ]
        );
    }

    #[test]
    fn parses_list_output() {
        assert_eq!(parse_list(b"null\n").expect("null"), vec![]);
        let text = br#"[{"ociVersion":"1.0.2-dev","id":"a","pid":42,"status":"running","bundle":"/b/a","rootfs":"/b/a/rootfs","created":"2024-01-01T00:00:00Z","owner":"root"},
                        {"ociVersion":"1.0.2-dev","id":"b","pid":0,"status":"stopped","bundle":"/b/b"}]"#;
        let listed = parse_list(text).expect("list");
        assert_eq!(listed[0].id, "a");
        assert_eq!(listed[0].status, Status::Running);
        assert_eq!(listed[0].pid, Some(42));
        assert_eq!(listed[1].status, Status::Stopped);
        assert_eq!(listed[1].pid, None);
        assert!(matches!(
            parse_list(b"not json"),
            Err(OciError::Parse { .. })
        ));
    }
}
