//! Whether KVM actually runs a guest here. `/dev/kvm` existing is not
//! enough (on some hosts it opens but guests die with a KVM internal error
//! or never print a line), so the probe boots QEMU's own firmware (SeaBIOS,
//! which switches to protected mode and prints its banner on the serial
//! port) with `-accel kvm`, and believes KVM only when the banner arrives
//! in time. A guest that only runs real-mode code at the reset vector is
//! not enough: on such hosts it runs, and every real kernel hangs.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::oci::reap;
use crate::vm::Accel;

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmProbe {
    /// A guest ran under KVM.
    Usable,
    /// `/dev/kvm` is missing.
    Absent,
    /// `/dev/kvm` is there but no guest ran; why.
    Unusable(String),
}

impl KvmProbe {
    /// The accelerator VMs on this node use.
    pub fn accel(&self) -> Accel {
        match self {
            KvmProbe::Usable => Accel::Kvm,
            KvmProbe::Absent | KvmProbe::Unusable(_) => Accel::Tcg,
        }
    }

    /// The node's `status.features.kvm` value (`usable` is what the
    /// scheduler looks for).
    pub fn feature(&self) -> String {
        match self {
            KvmProbe::Usable => "usable".to_string(),
            KvmProbe::Absent => "absent: no /dev/kvm; VMs run under TCG".to_string(),
            KvmProbe::Unusable(reason) => {
                format!("unusable: a probe guest failed ({reason}); VMs run under TCG")
            }
        }
    }
}

/// The firmware's banner on the serial port.
const MARKER: &str = "SeaBIOS";

/// The verdict from what the probe saw: whether `/dev/kvm` exists, what
/// the guest printed, and what QEMU said on stderr.
pub fn verdict(present: bool, serial: &str, stderr: &str) -> KvmProbe {
    if !present {
        return KvmProbe::Absent;
    }
    if serial.contains(MARKER) {
        return KvmProbe::Usable;
    }
    let said = stderr
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .map(|line| format!("; qemu said: {line}"))
        .unwrap_or_default();
    let reason = format!("no firmware banner on the serial port in time{said}");
    KvmProbe::Unusable(reason)
}

/// Boots the probe guest with `qemu` under KVM, using `work_dir` for its
/// files, and waits up to `timeout` for its marker.
pub fn probe(qemu: &Path, work_dir: &Path, timeout: Duration) -> KvmProbe {
    if !Path::new("/dev/kvm").exists() {
        return KvmProbe::Absent;
    }
    boot(qemu, work_dir, timeout)
}

/// Runs the probe guest and judges what it printed. The QEMU it starts is
/// the agent's own helper: it gets SIGKILL if the thread that started it
/// dies (the agent stopped or was killed mid-probe), so it never outlives
/// the agent the way pods and VMs do by design.
pub fn boot(qemu: &Path, work_dir: &Path, timeout: Duration) -> KvmProbe {
    let run = || -> std::io::Result<(String, String)> {
        std::fs::create_dir_all(work_dir)?;
        let serial = work_dir.join("kvm-probe.serial");
        let _ = std::fs::remove_file(&serial);
        let mut child = {
            let _lock = reap::spawn_lock();
            let mut command = Command::new(qemu);
            // SAFETY: between fork and exec only one prctl(2) call happens,
            // which is async-signal-safe. The signal follows the spawning
            // thread, which waits for the probe below before it returns.
            unsafe {
                command.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                        .map_err(std::io::Error::from)
                });
            }
            let child = command
                .args([
                    "-M",
                    "pc",
                    "-accel",
                    "kvm",
                    "-nodefaults",
                    "-no-user-config",
                ])
                .args(["-display", "none", "-m", "32M"])
                .arg("-serial")
                .arg(format!("file:{}", serial.display()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()?;
            reap::track(child.id());
            child
        };
        let began = Instant::now();
        let mut printed = String::new();
        while began.elapsed() < timeout {
            printed = std::fs::read_to_string(&serial).unwrap_or_default();
            if printed.contains(MARKER) || matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        let _ = child.wait();
        reap::untrack(child.id());
        Ok((printed, stderr))
    };
    match run() {
        Ok((serial, stderr)) => verdict(true, &serial, &stderr),
        Err(error) => KvmProbe::Unusable(format!("cannot run {}: {error}", qemu.display())),
    }
}
