//! The QEMU driver: a pure command-line builder ([`qemu_args`]), the KVM
//! probe ([`kvm`]), the process and disk side effects ([`process`]), a
//! typed QMP client ([`qmp`]), the clean stop through the ACPI power
//! button ([`power`]), qcow2 snapshots ([`snapshot`]), live migration
//! ([`migration`]) and QEMU's confinement ([`sandbox`]).
//!
//! A VM is one `qemu-system-x86_64` process started inside the VM's own
//! network namespace (its tap device lives there), confined by
//! [`sandbox`] (its own uid, no capabilities, QEMU's seccomp filter, a
//! private mount namespace, its cgroups), with its serial console
//! on a unix socket (for `corral console`) that QEMU also logs to a file
//! (for `corral logs`). Guests boot from a kernel (`-M pc`, virtio-pci
//! devices; Debian's cloud kernel hangs calibrating its clock on `microvm`
//! under TCG) or from their disk.

pub mod kvm;
pub mod migration;
pub mod power;
pub mod process;
pub mod qmp;
pub mod sandbox;
pub mod snapshot;
mod tap;

use std::fmt;
use std::path::PathBuf;

/// How QEMU executes guest code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation through `/dev/kvm`.
    Kvm,
    /// QEMU's own translator: slower, works everywhere.
    Tcg,
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

/// Everything one QEMU invocation needs, already resolved to host paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    /// The VM's name, shown by QEMU (`-name`).
    pub name: String,
    pub cpus: u32,
    pub memory_bytes: u64,
    pub accel: Accel,
    /// Direct kernel boot; `None` boots from the disk.
    pub kernel: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
    pub cmdline: Option<String>,
    /// A qcow2 disk, attached as virtio-blk (`/dev/vda` in the guest).
    pub disk: Option<PathBuf>,
    /// Further qcow2 disks, by name, in order (`/dev/vdb`, …; the name is
    /// the device's serial).
    pub data_disks: Vec<(String, PathBuf)>,
    /// A tap device in the namespace QEMU runs in, attached as virtio-net.
    pub tap: Option<String>,
    /// The guest NIC's MAC address.
    pub mac: String,
    /// Further NICs after the first, in order (`net1`, …): each a tap
    /// device in the same namespace and its MAC address.
    pub extra_nics: Vec<(String, String)>,
    /// The serial console's unix socket (server side, never waits).
    pub console_socket: PathBuf,
    /// QEMU appends everything the console prints here.
    pub console_log: PathBuf,
    /// The QMP control socket.
    pub qmp_socket: PathBuf,
    /// Start waiting for a live migration on this unix socket
    /// (`-incoming unix:PATH`) instead of booting: the guest resumes where
    /// the source left it ([`migration`]).
    pub incoming: Option<PathBuf>,
    /// QEMU runs in a [`sandbox::Sandbox`]: its own seccomp filter is on
    /// (`-sandbox`, [`sandbox::SECCOMP_OPTIONS`]) and the taps are open
    /// descriptors from [`sandbox::TAP_FD`] on (the first NIC's, then
    /// `extra_nics`' in order) rather than opened by name.
    pub sandboxed: bool,
}

/// The `-drive id` of the VM's disk (QMP's `block_resize` names it).
pub const DISK_ID: &str = "disk0";

/// The `-drive id` of the data disk at `index` (`disk1`, `disk2`, …).
pub fn data_disk_id(index: usize) -> String {
    format!("disk{}", index + 1)
}

/// One mebibyte.
const MIB: u64 = 1024 * 1024;

/// The arguments after `qemu-system-x86_64` for `config`.
pub fn qemu_args(config: &VmConfig) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| args.extend(items.iter().map(|s| s.to_string()));
    push(&["-name", &config.name]);
    push(&["-M", "pc", "-accel", &config.accel.to_string()]);
    push(&[
        "-cpu",
        match config.accel {
            Accel::Kvm => "host",
            Accel::Tcg => "max",
        },
    ]);
    push(&["-smp", &config.cpus.max(1).to_string()]);
    // QEMU takes memory in MiB; round up so a request is never shrunk.
    push(&[
        "-m",
        &format!("{}M", config.memory_bytes.div_ceil(MIB).max(16)),
    ]);
    push(&["-nodefaults", "-no-user-config", "-display", "none"]);
    if config.sandboxed {
        push(&["-sandbox", sandbox::SECCOMP_OPTIONS]);
    }
    push(&[
        "-chardev",
        &format!(
            "socket,id=console,path={},server=on,wait=off,logfile={},logappend=on",
            config.console_socket.display(),
            config.console_log.display()
        ),
        "-serial",
        "chardev:console",
    ]);
    push(&[
        "-qmp",
        &format!("unix:{},server=on,wait=off", config.qmp_socket.display()),
    ]);
    if let Some(kernel) = &config.kernel {
        push(&["-kernel", &kernel.display().to_string()]);
        if let Some(initrd) = &config.initrd {
            push(&["-initrd", &initrd.display().to_string()]);
        }
        let cmdline = config.cmdline.as_deref().unwrap_or("console=ttyS0");
        push(&["-append", cmdline]);
    }
    if let Some(disk) = &config.disk {
        push(&[
            "-drive",
            &format!(
                "id={DISK_ID},file={},format=qcow2,if=none,cache=writeback",
                qemu_escape(&disk.display().to_string())
            ),
            "-device",
            "virtio-blk-pci,drive=disk0",
        ]);
        if config.kernel.is_none() {
            push(&["-boot", "c"]);
        }
    }
    for (index, (name, path)) in config.data_disks.iter().enumerate() {
        let id = data_disk_id(index);
        push(&[
            "-drive",
            &format!(
                "id={id},file={},format=qcow2,if=none,cache=writeback",
                qemu_escape(&path.display().to_string())
            ),
            "-device",
            &format!("virtio-blk-pci,drive={id},serial={}", qemu_escape(name)),
        ]);
    }
    if let Some(incoming) = &config.incoming {
        push(&["-incoming", &format!("unix:{}", incoming.display())]);
    }
    if let Some(tap) = &config.tap {
        let netdev = if config.sandboxed {
            format!("tap,id=net0,fd={}", sandbox::TAP_FD)
        } else {
            format!("tap,id=net0,ifname={tap},script=no,downscript=no")
        };
        push(&[
            "-netdev",
            &netdev,
            "-device",
            &format!("virtio-net-pci,netdev=net0,mac={}", config.mac),
        ]);
    }
    // Sandboxed, each tap is the next descriptor after the first NIC's.
    let first_extra_fd = sandbox::TAP_FD + i32::from(config.tap.is_some());
    for (index, (tap, mac)) in config.extra_nics.iter().enumerate() {
        let id = format!("net{}", index + 1);
        let netdev = if config.sandboxed {
            format!("tap,id={id},fd={}", first_extra_fd + index as i32)
        } else {
            format!("tap,id={id},ifname={tap},script=no,downscript=no")
        };
        push(&[
            "-netdev",
            &netdev,
            "-device",
            &format!("virtio-net-pci,netdev={id},mac={mac}"),
        ]);
    }
    args
}

/// QEMU's option syntax doubles commas inside a value.
fn qemu_escape(value: &str) -> String {
    value.replace(',', ",,")
}

/// A stable, locally administered unicast MAC derived from `seed` (the
/// VM's uid), so a restarted guest keeps its link-local address.
pub fn mac_for(seed: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(seed.as_bytes());
    format!(
        "52:54:{:02x}:{:02x}:{:02x}:{:02x}",
        digest[0], digest[1], digest[2], digest[3]
    )
}

#[cfg(test)]
mod tests;
