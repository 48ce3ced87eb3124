//! The side effects of running a VM: its qcow2 disk (`qemu-img`), its tap
//! device (inside the VM's network namespace), and the QEMU process
//! (started on a thread inside that namespace, in its own process group
//! so it outlives the agent; stopped through the ACPI power button, then
//! `quit`, then SIGKILL: [`stop`]).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::oci::{netns, reap};
use crate::vm::power::{self, Guest, QemuProcess, StopOutcome};
use crate::vm::qmp::{Monitor, QmpClient};
use crate::vm::sandbox::{Prepared, Sandbox};
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

pub(crate) fn run(command: &mut Command) -> Result<String, VmError> {
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
    start_in(qemu, config, netns, output, None)
}

/// [`start`], with QEMU confined to `sandbox` (`config.sandboxed` must
/// be set: the tap is handed over as a descriptor).
pub fn start_sandboxed(
    qemu: &Path,
    config: &VmConfig,
    netns: Option<&Path>,
    output: &Path,
    sandbox: &Sandbox,
) -> Result<u32, VmError> {
    let prepared = sandbox.prepare().map_err(|error| VmError::Io {
        path: sandbox.root.clone(),
        source: io::Error::new(io::ErrorKind::InvalidInput, error),
    })?;
    start_in(qemu, config, netns, output, Some(Arc::new(prepared)))
}

fn start_in(
    qemu: &Path,
    config: &VmConfig,
    netns: Option<&Path>,
    output: &Path,
    sandbox: Option<Arc<Prepared>>,
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
    // Sandboxed, QEMU gets its taps as descriptors, in NIC order.
    let taps: Vec<String> = match sandbox {
        Some(_) => config
            .tap
            .iter()
            .chain(config.extra_nics.iter().map(|(tap, _)| tap))
            .cloned()
            .collect(),
        None => Vec::new(),
    };
    let child = netns::run_in_optional(netns, move || {
        // Opened inside the VM's namespace, where its taps are.
        let taps = taps
            .iter()
            .map(|name| tap::open_here(name))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(sandbox) = sandbox {
            let fds: Vec<i32> = taps.iter().map(|file| file.as_raw_fd()).collect();
            // SAFETY: `enter` makes only system calls on data prepared
            // before the fork; it neither allocates nor takes locks.
            unsafe { command.pre_exec(move || sandbox.enter(&fds)) };
        }
        // The parent's copies of the taps close when `taps` drops, after
        // the child has its own.
        command.spawn()
    })
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

/// Sends `signal` to QEMU (a process already gone is fine).
pub fn signal(pid: u32, signal: Signal) -> Result<(), VmError> {
    match kill(Pid::from_raw(pid as i32), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(source) => Err(VmError::Signal { pid, source }),
    }
}

/// Stops QEMU as a person at its console would ([`power::stop_cleanly`]):
/// the ACPI power button through QMP at `qmp_socket`, `grace` for the
/// guest to power off, then `quit` (SIGTERM when QMP does not answer),
/// then SIGKILL.
pub fn stop(pid: u32, qmp_socket: &Path, grace: Duration) -> Result<StopOutcome, VmError> {
    let guest = QemuProcess(pid);
    if guest.exited() {
        return Ok(StopOutcome::AlreadyGone);
    }
    let mut client = match QmpClient::connect(qmp_socket) {
        Ok(client) => Some(client),
        Err(error) => {
            tracing::warn!(pid, error = %error, "QEMU's QMP socket does not answer");
            None
        }
    };
    power::stop_cleanly(
        client.as_mut().map(|c| c as &mut dyn Monitor),
        &guest,
        grace,
    )
}

/// Writes snapshot `snapshot` of the qcow2 disk `source` to a new qcow2
/// disk at `path` (a whole copy; `-U`: the source may be in use, its
/// snapshot does not change).
pub fn copy_snapshot(source: &Path, snapshot: &str, path: &Path) -> Result<(), VmError> {
    let io = |source| VmError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let partial = path.with_extension("partial");
    run(Command::new("qemu-img")
        .args(["convert", "-U", "-O", "qcow2", "-l"])
        .arg(format!("snapshot.name={snapshot}"))
        .arg(source)
        .arg(&partial))?;
    std::fs::rename(&partial, path).map_err(io)
}

/// The virtual size of the qcow2 disk at `path` (`qemu-img info -U`:
/// readable while QEMU holds it).
pub fn disk_size(path: &Path) -> Result<u64, VmError> {
    let output = run(Command::new("qemu-img")
        .args(["info", "-U", "--output=json"])
        .arg(path))?;
    let info: serde_json::Value = serde_json::from_str(&output).map_err(|source| VmError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, source),
    })?;
    info.get("virtual-size")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| VmError::Io {
            path: path.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::InvalidData,
                "qemu-img info gave no virtual-size",
            ),
        })
}

/// Grows the disk at `path` (not held by QEMU) to `bytes`.
pub fn grow_disk(path: &Path, bytes: u64) -> Result<(), VmError> {
    run(Command::new("qemu-img")
        .args(["resize", "-q", "-f", "qcow2"])
        .arg(path)
        .arg(bytes.to_string()))?;
    Ok(())
}

/// The files below the qcow2 disk at `path` in its backing chain, nearest
/// first (`qemu-img info --backing-chain -U`: readable while QEMU holds
/// the disk); empty for a disk without one.
pub fn backing_chain(path: &Path) -> Result<Vec<PathBuf>, VmError> {
    let output = run(Command::new("qemu-img")
        .args(["info", "--backing-chain", "-U", "--output=json"])
        .arg(path))?;
    let chain: Vec<serde_json::Value> =
        serde_json::from_str(&output).map_err(|source| VmError::Io {
            path: path.to_path_buf(),
            source: io::Error::new(io::ErrorKind::InvalidData, source),
        })?;
    Ok(backing_files(&chain))
}

/// The backing files `qemu-img info --backing-chain` names.
fn backing_files(chain: &[serde_json::Value]) -> Vec<PathBuf> {
    chain
        .iter()
        .filter_map(|image| {
            image
                .get("full-backing-filename")
                .or_else(|| image.get("backing-filename"))
                .and_then(serde_json::Value::as_str)
        })
        .map(PathBuf::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backing_files_follow_the_chain() {
        let chain: Vec<serde_json::Value> = serde_json::from_str(
            r#"[{"filename": "/v/clone.qcow2", "full-backing-filename": "/t/disk.qcow2", "backing-filename": "disk.qcow2"},
                {"filename": "/t/disk.qcow2", "backing-filename": "/img/disk.qcow2"},
                {"filename": "/img/disk.qcow2"}]"#,
        )
        .unwrap();
        assert_eq!(
            backing_files(&chain),
            [
                PathBuf::from("/t/disk.qcow2"),
                PathBuf::from("/img/disk.qcow2")
            ]
        );
    }
}
