//! Whether KVM actually runs a guest here. `/dev/kvm` existing is not
//! enough (on some hosts it opens but every guest dies with a KVM internal
//! error), so the probe boots the smallest possible guest — a 64 KiB
//! firmware whose reset vector writes `OK` to the serial port and halts —
//! with `-accel kvm`, and believes KVM only when `OK` arrives in time.

use std::io::Read;
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

/// The probe's marker on the serial port.
const MARKER: &str = "OK";

/// The probe guest: 64 KiB of firmware, code only in the last 16 bytes
/// (the reset vector, real mode): `mov dx, 0x3f8; mov al, 'O'; out dx, al;
/// mov al, 'K'; out dx, al; mov al, '\n'; out dx, al; hlt; jmp hlt`.
pub fn probe_firmware() -> Vec<u8> {
    let mut image = vec![0u8; 64 * 1024];
    let code: [u8; 15] = [
        0xBA, 0xF8, 0x03, 0xB0, b'O', 0xEE, 0xB0, b'K', 0xEE, 0xB0, b'\n', 0xEE, 0xF4, 0xEB, 0xFD,
    ];
    let start = image.len() - 16;
    image[start..start + code.len()].copy_from_slice(&code);
    image
}

/// The verdict from what the probe saw: whether `/dev/kvm` exists, what
/// the guest printed, and what QEMU said on stderr.
pub fn verdict(present: bool, serial: &str, stderr: &str) -> KvmProbe {
    if !present {
        return KvmProbe::Absent;
    }
    if serial.contains(MARKER) {
        return KvmProbe::Usable;
    }
    let reason = stderr
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or("the probe guest printed nothing in time");
    KvmProbe::Unusable(reason.to_string())
}

/// Boots the probe guest with `qemu` under KVM, using `work_dir` for its
/// files, and waits up to `timeout` for its marker.
pub fn probe(qemu: &Path, work_dir: &Path, timeout: Duration) -> KvmProbe {
    if !Path::new("/dev/kvm").exists() {
        return KvmProbe::Absent;
    }
    let run = || -> std::io::Result<(String, String)> {
        std::fs::create_dir_all(work_dir)?;
        let firmware = work_dir.join("kvm-probe.bin");
        let serial = work_dir.join("kvm-probe.serial");
        std::fs::write(&firmware, probe_firmware())?;
        let _ = std::fs::remove_file(&serial);
        let mut child = {
            let _lock = reap::spawn_lock();
            let child = Command::new(qemu)
                .args([
                    "-M",
                    "pc",
                    "-accel",
                    "kvm",
                    "-nodefaults",
                    "-no-user-config",
                ])
                .args(["-display", "none", "-m", "16M", "-bios"])
                .arg(&firmware)
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
