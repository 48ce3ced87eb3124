//! The VM test assets boot: QEMU (TCG) reaches the marker, formats and
//! writes the disk, and finds the file again on the next boot.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use corral_testkit::{Defer, VM_MARKER, VM_READY_MARKER, require_tool, vm_assets};

/// Boots the assets with `disk`, returns the console output up to the
/// ready marker.
fn boot(disk: &std::path::Path, append: &str) -> String {
    let assets = vm_assets();
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-M", "pc", "-cpu", "max", "-accel", "tcg", "-m", "256M"])
        .args([
            "-nodefaults",
            "-no-user-config",
            "-nographic",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(&assets.kernel)
        .arg("-initrd")
        .arg(&assets.initramfs)
        .arg("-append")
        .arg(format!("console=ttyS0 quiet {append}"))
        .arg("-drive")
        .arg(format!(
            "id=d0,file={},format=qcow2,if=none",
            disk.display()
        ))
        .args(["-device", "virtio-blk-pci,drive=d0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("qemu-system-x86_64 starts");
    let pid = child.id();
    let _kill = Defer::new(move || {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    });
    let stdout = child.stdout.take().expect("piped");
    let mut console = String::new();
    // A guest that stops talking is killed, which ends the output.
    let _deadline = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    });
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap_or_default();
        console.push_str(&line);
        console.push('\n');
        if line.contains(VM_READY_MARKER) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    console
}

#[test]
fn the_test_guest_boots_and_keeps_a_file_on_its_disk() {
    require_tool("qemu-system-x86_64");
    require_tool("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.qcow2");
    let status = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&disk)
        .arg("64M")
        .status()
        .unwrap();
    assert!(status.success());
    let first = boot(&disk, "corral.write=kept");
    assert!(first.contains(VM_MARKER), "no marker:\n{first}");
    assert!(first.contains("CORRAL-DISK-EMPTY"), "{first}");
    assert!(first.contains("CORRAL-DISK-WROTE: kept"), "{first}");
    let second = boot(&disk, "");
    assert!(second.contains("CORRAL-DISK-FILE: kept"), "{second}");
}
