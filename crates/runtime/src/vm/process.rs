//! The side effects of running a VM: its qcow2 disk (`qemu-img`), its tap
//! device (inside the VM's network namespace), and the QEMU process
//! (started on a thread inside that namespace, in its own process group
//! so it outlives the agent; stopped with SIGTERM, which QEMU handles by
//! flushing its disks and exiting, then SIGKILL after the grace period).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::oci::{netns, reap};
use crate::vm::{VmConfig, qemu_args, tap};

/// Why a VM's disk, tap or process could not be set up or stopped.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("cannot run {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        program: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("cannot prepare {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make tap {name} in network namespace {netns}")]
    Tap {
        name: String,
        netns: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot signal QEMU (pid {pid})")]
    Signal {
        pid: u32,
        #[source]
        source: nix::errno::Errno,
    },
}

fn run(command: &mut Command) -> Result<String, VmError> {
    let program = format!("{:?}", command.get_program());
    let output = {
        let _lock = reap::spawn_lock();
        command
            .stdin(Stdio::null())
            .output()
            .map_err(|source| VmError::Spawn {
                program: program.clone(),
                source,
            })?
    };
    if !output.status.success() {
        return Err(VmError::Failed {
            program,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Creates the qcow2 disk at `path` of `size_bytes` (over `backing`, a
/// qcow2 image, when given) unless it exists. Returns whether it created
/// one; an existing disk is kept as it is (a restarted VM keeps its data).
pub fn create_disk(path: &Path, size_bytes: u64, backing: Option<&Path>) -> Result<bool, VmError> {
    if path.exists() {
        return Ok(false);
    }
    let io = |source| VmError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let partial = path.with_extension("partial");
    let mut command = Command::new("qemu-img");
    command.args(["create", "-q", "-f", "qcow2"]);
    if let Some(backing) = backing {
        command.arg("-b").arg(backing).args(["-F", "qcow2"]);
    }
    command.arg(&partial).arg(size_bytes.to_string());
    run(&mut command)?;
    std::fs::rename(&partial, path).map_err(io)?;
    Ok(true)
}

/// Creates the persistent tap device `name` in the namespace at `netns`
/// and sets it up; an existing one is kept and set up.
pub fn create_tap(netns: &Path, name: &str) -> Result<(), VmError> {
    let failed = |source| VmError::Tap {
        name: name.to_string(),
        netns: netns.to_path_buf(),
        source,
    };
    match netns::run_in(netns, || tap::create_here(name)) {
        Ok(made) => made.map_err(failed),
        Err(e) => Err(failed(io::Error::other(e))),
    }
}

/// Starts `qemu` with `config` inside the namespace at `netns` (or the
/// agent's own when `None`), its own stdout and stderr going to `output`.
/// Returns QEMU's pid, a child of this process that it tracks for
/// [`exit_status`].
pub fn start(
    qemu: &Path,
    config: &VmConfig,
    netns: Option<&Path>,
    output: &Path,
) -> Result<u32, VmError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| VmError::Io { path, source }
    };
    for path in [&config.console_socket, &config.qmp_socket] {
        // A socket left by an earlier QEMU would make this one fail.
        let _ = std::fs::remove_file(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
    }
    let log = File::options()
        .create(true)
        .append(true)
        .open(output)
        .map_err(io(output))?;
    let log2 = log.try_clone().map_err(io(output))?;
    let mut command = Command::new(qemu);
    use std::os::unix::process::CommandExt;
    command
        .args(qemu_args(config))
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    let _lock = reap::spawn_lock();
    let spawn_error = |source| VmError::Spawn {
        program: qemu.display().to_string(),
        source,
    };
    let child = netns::spawn(netns, &mut command)
        .map_err(|e| spawn_error(io::Error::other(e)))?
        .map_err(spawn_error)?;
    reap::track(child.id());
    Ok(child.id())
}

/// `None` while `pid` runs; once it is gone, its exit code when this
/// process could collect it (`Some(None)` otherwise: a QEMU adopted after
/// an agent restart, or reaped already).
pub fn exit_status(pid: u32) -> Option<Option<i32>> {
    match reap::liveness(pid) {
        reap::Liveness::Alive => None,
        reap::Liveness::Exited(code) => Some(code),
    }
}

/// Whether `pid` is a QEMU running the VM called `name` (guards against a
/// pid reused after a reboot).
pub fn is_vm_process(pid: u32, name: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let words: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let is_qemu = words
        .first()
        .is_some_and(|w| w.ends_with(b"qemu-system-x86_64"));
    is_qemu
        && words
            .windows(2)
            .any(|pair| pair[0] == b"-name" && pair[1] == name.as_bytes())
}

/// Stops QEMU: SIGTERM (QEMU flushes its disks and exits), SIGKILL after
/// `grace`. Succeeds when the process is gone.
pub fn stop(pid: u32, grace: Duration) -> Result<(), VmError> {
    if exit_status(pid).is_some() {
        return Ok(());
    }
    let signal = |signal| match kill(Pid::from_raw(pid as i32), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(source) => Err(VmError::Signal { pid, source }),
    };
    signal(Signal::SIGTERM)?;
    let began = Instant::now();
    while began.elapsed() < grace {
        if exit_status(pid).is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(Signal::SIGKILL)?;
    while exit_status(pid).is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
