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
    pub boot: BootSource,
    #[serde(default)]
    pub availability: Availability,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
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
    /// The disk's virtual size when the node creates it; 1Gi by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Memory>,
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
