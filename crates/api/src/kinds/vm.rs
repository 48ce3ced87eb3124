//! `kind: VirtualMachine` — a QEMU guest scheduled, versioned and explained
//! like a pod.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::{Availability, Placement};
use crate::quantity::Memory;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualMachineSpec {
    pub cpus: u32,
    pub memory: Memory,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<VmDisk>,
    /// More disks after `disk`, in order (`/dev/vdb`, `/dev/vdc`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_disks: Vec<VmDataDisk>,
    /// Further network interfaces after the first (`eth1`, `eth2`, … in
    /// the guest, in order): each is another link to the node on the pod
    /// network with an address of its own from the node's /64
    /// (`status.interfaces`). Fixed when the VM is created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<VmInterface>,
    pub boot: BootSource,
    #[serde(default)]
    pub availability: Availability,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// A template is not run: its disk is the read-only base its clones
    /// (`disk.clone.vm`) write their own changes over.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub template: bool,
    /// Whether the guest should run: `false` stops it cleanly and keeps it
    /// (its disks, address, node and room there), `true` starts it again
    /// (`corral vm stop|start`). True by default, and then left out of the
    /// spec.
    #[serde(default = "running_by_default", skip_serializing_if = "is_running")]
    pub running: bool,
    /// Seconds the guest gets to power off after the ACPI power button
    /// (on delete, restart or an edit) before QEMU is quit; 10 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_grace_seconds: Option<u32>,
    /// The snapshots the VM's disk keeps: one listed here is taken (with
    /// the guest's memory when it runs) once, one removed from the list
    /// is deleted. `corral vm snapshot` writes this list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<VmSnapshot>,
    /// The last restore asked for (`corral vm restore`): the node returns
    /// the VM to the snapshot once, when a revision brings a newer `at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<VmRestore>,
    /// The last power action asked for (`corral vm restart|reset`), done
    /// once, when a revision brings a newer `at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<VmPower>,
    /// The last live migration asked for (`corral vm migrate`): a revision
    /// that brings a newer `at` runs the VM's `migrate` workflow, which
    /// moves the running guest to node `to`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<VmMigration>,
}

/// `spec.running` when the spec leaves it out.
fn running_by_default() -> bool {
    true
}

/// Whether `running` is the default (so it is left out of the spec).
fn is_running(running: &bool) -> bool {
    *running
}

impl VirtualMachineSpec {
    /// Whether the spec asks for the guest to run now: not stopped
    /// (`running: false`) and no template (which never runs).
    pub fn runs(&self) -> bool {
        self.running && !self.template
    }

    /// The stop grace period in seconds.
    pub fn stop_grace(&self) -> u32 {
        self.stop_grace_seconds
            .unwrap_or(DEFAULT_STOP_GRACE_SECONDS)
    }

    /// The spec without what the node applies to a VM in place
    /// (snapshots, restores, power actions, whether it runs, the grace
    /// period, the disks' sizes): two specs with the same machine run the
    /// same QEMU.
    pub fn machine(&self) -> VirtualMachineSpec {
        VirtualMachineSpec {
            running: true,
            stop_grace_seconds: None,
            snapshots: Vec::new(),
            restore: None,
            power: None,
            migration: None,
            disk: self.disk.clone().map(|disk| VmDisk { size: None, ..disk }),
            data_disks: self
                .data_disks
                .iter()
                .map(|disk| VmDataDisk {
                    size: None,
                    ..disk.clone()
                })
                .collect(),
            ..self.clone()
        }
    }
}

/// The grace period when the spec gives none.
pub const DEFAULT_STOP_GRACE_SECONDS: u32 = 10;

/// A disk's size when the spec gives none.
pub const DEFAULT_DISK_BYTES: u64 = 1 << 30;

/// A further disk: a qcow2 in a `local` volume, or in the VM's own
/// directory (gone with the VM).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmDataDisk {
    /// Names it in the VM (its serial number in the guest).
    pub name: String,
    /// A `local` volume holding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// Its virtual size when the node creates it; 1Gi by default.
    /// Raising it later grows the disk in place, like `disk.size`; a disk
    /// never shrinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Memory>,
}

impl VmDataDisk {
    /// Its size in bytes ([`DEFAULT_DISK_BYTES`] when the spec gives none).
    pub fn size_bytes(&self) -> u64 {
        self.size.map_or(DEFAULT_DISK_BYTES, |size| size.bytes)
    }
}

/// The most further network interfaces a VM may have.
pub const MAX_VM_INTERFACES: usize = 7;

/// A further network interface on the pod network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmInterface {
    /// Names it in `status.interfaces` (its address) and on the node.
    pub name: String,
}

/// Where a cloned disk comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmClone {
    /// The VM whose disk is cloned.
    pub vm: String,
    /// One of its snapshots, copied whole; absent, the VM must be a
    /// template and the clone's disk is an overlay over its disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// A snapshot the VM's disk keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmSnapshot {
    /// Letters, digits, `-`, `_` and `.`; at most 64.
    pub name: String,
}

/// A request to return the VM to one of its snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmRestore {
    pub snapshot: String,
    /// When it was asked for (RFC 3339); a restore is done once per value.
    pub at: String,
}

/// A request to move the running VM to another node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmMigration {
    /// The node the VM goes to.
    pub to: String,
    /// When it was asked for (RFC 3339); a migration is done once per value.
    pub at: String,
}

/// A power action on the running VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmPower {
    pub action: PowerAction,
    /// When it was asked for (RFC 3339); an action is done once per value.
    pub at: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PowerAction {
    /// A clean stop (ACPI power button, then quit after the grace period)
    /// and a fresh start.
    Restart,
    /// The machine's reset button: the guest reboots at once.
    Reset,
}

/// Whether `name` may name a snapshot (safe on QEMU's monitor command line
/// and for `qemu-img`).
pub fn is_snapshot_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmDisk {
    /// A `local` volume holding the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// A qcow2 image from the image store (its `/disk.qcow2`); the VM
    /// writes to its own copy-on-write overlay, kept across restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// A disk made from another VM's (on the same node, in the same
    /// namespace): a copy-on-write overlay over a template's disk, or a
    /// copy of one of its snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<VmClone>,
    /// The disk's virtual size when the node creates it; 1Gi by default.
    /// Raising it later grows the disk in place (the guest sees the new
    /// size at once); a disk never shrinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Memory>,
}

impl VmDisk {
    /// Its size in bytes ([`DEFAULT_DISK_BYTES`] when the spec gives none).
    pub fn size_bytes(&self) -> u64 {
        self.size.map_or(DEFAULT_DISK_BYTES, |size| size.bytes)
    }

    /// Whether `other` is the same disk (the same source), whatever its size.
    pub fn same_disk(&self, other: &VmDisk) -> bool {
        (&self.volume, &self.image, &self.clone) == (&other.volume, &other.image, &other.clone)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootSource {
    /// An image from the image store holding the kernel as `/boot/vmlinuz`;
    /// absent means boot from the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// An image holding the initramfs as `/boot/initrd.img`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// A line the guest prints on its serial console once it has booted:
    /// `node/await-boot` waits for it. Absent: booted once QEMU runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marker: Option<String>,
}

/// How its node confines a VM's QEMU (`status.sandbox`, written by the
/// VM's node while QEMU runs; `corral explain-security vm/NAME` shows it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VmSandboxStatus {
    /// The host uid QEMU runs as (the VM's own; never 0).
    pub uid: u32,
    pub gid: u32,
    /// QEMU's capabilities (none) and whether it may gain privileges.
    pub capabilities: String,
    /// QEMU's own seccomp filter: its `-sandbox` options.
    pub seccomp: String,
    /// What QEMU's private mount namespace holds.
    pub mount_namespace: String,
    /// The host paths QEMU can write (everything else it sees is read-only).
    pub writable: Vec<String>,
    /// The VM's cgroup, in each hierarchy that limits it.
    pub cgroup: String,
    /// The memory limit (the guest's RAM plus QEMU's own overhead).
    pub memory_limit_bytes: u64,
    /// The CPU limit: a CFS quota of whole CPUs.
    pub cpu_limit: String,
}
