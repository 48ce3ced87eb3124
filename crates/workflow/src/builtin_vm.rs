//! The built-in workflows of a VirtualMachine: `start`, `update` (an edit
//! restarts QEMU in place, or applies a snapshot, restore, power action or
//! disk growth to the running one), `stop` (its deletion) and `migrate`
//! (a live migration to another node).

use corral_api::workflow::StepDefinition;

use super::{UNSCHEDULABLE_RETRIES, node_step, step, target};
use crate::node_step::VmStep;
use crate::owner::MIGRATION_SOURCE_OWNER;

pub(super) fn vm_start() -> Vec<StepDefinition> {
    vec![
        step(
            "scheduler/place",
            "choose a node with room for the VM and bind it",
        )
        .wanted_by("scheduled")
        .timeout_secs(60)
        .attempts(UNSCHEDULABLE_RETRIES)
        .build(),
        target("scheduled", "the VM is bound to a node", &[]),
        step(
            "ipam/assign-address",
            "pick the VM's IPv6 address in its node's /64",
        )
        .requires(&["scheduled"])
        .wanted_by("network")
        .timeout_secs(30)
        .attempts(3)
        .build(),
        node_step(
            VmStep::CreateTap,
            "create the VM's tap device and route its address",
        )
        .requires(&["ipam/assign-address"])
        .wanted_by("network")
        .timeout_secs(60)
        .attempts(3)
        .build(),
        target("network", "the VM's network device is ready", &[]),
        node_step(
            VmStep::FetchKernel,
            "make the kernel, initramfs or disk image present",
        )
        .requires(&["scheduled"])
        .wanted_by("image")
        .timeout_secs(600)
        .attempts(3)
        .build(),
        target("image", "every boot artifact is on the node", &[]),
        node_step(VmStep::PrepareDisk, "create or attach the VM's disk")
            .requires(&["scheduled"])
            .wanted_by("storage")
            .timeout_secs(300)
            .attempts(3)
            .build(),
        target("storage", "the VM's disk is ready", &[]),
        target(
            "boot",
            "every prerequisite of the VM is in place; it boots after it",
            &["network", "storage", "image"],
        ),
        node_step(VmStep::StartVm, "start QEMU with the VM's configuration")
            .requires(&["boot"])
            .wanted_by("running")
            .timeout_secs(120)
            .attempts(2)
            .build(),
        node_step(
            VmStep::AwaitBoot,
            "wait until the guest reports it has booted",
        )
        .requires(&[VmStep::StartVm.as_str()])
        .wanted_by("running")
        .timeout_secs(300)
        .build(),
        target("running", "the VM runs and has booted", &[]),
    ]
}

/// An edit restarts the VM in place: same node, disk, tap and address.
pub(super) fn vm_update() -> Vec<StepDefinition> {
    vec![
        node_step(
            VmStep::FetchKernel,
            "make the new revision's kernel, initramfs or disk image present",
        )
        .wanted_by("image")
        .timeout_secs(600)
        .attempts(3)
        .build(),
        target(
            "image",
            "every boot artifact of the new revision is on the node",
            &[],
        ),
        node_step(
            VmStep::PrepareDisk,
            "create the VM's disk if the new revision needs one",
        )
        .wanted_by("storage")
        .timeout_secs(300)
        .attempts(3)
        .build(),
        target("storage", "the VM's disk is ready", &[]),
        target(
            "boot",
            "every prerequisite of the new revision is in place; it boots after it",
            &["storage", "image"],
        ),
        node_step(
            VmStep::RestartVm,
            "stop QEMU (SIGTERM, grace, kill) and start it with the new configuration",
        )
        .requires(&["boot"])
        .wanted_by("running")
        .timeout_secs(120)
        .attempts(2)
        .build(),
        node_step(
            VmStep::AwaitBoot,
            "wait until the guest reports it has booted",
        )
        .requires(&[VmStep::RestartVm.as_str()])
        .wanted_by("running")
        .timeout_secs(300)
        .build(),
        target("running", "the new revision runs and has booted", &[]),
    ]
}

pub(super) fn vm_stop() -> Vec<StepDefinition> {
    vec![
        node_step(
            VmStep::StopVm,
            "ask the guest to power off, wait its grace period, then kill",
        )
        .wanted_by("stopped")
        .timeout_secs(300)
        .attempts(2)
        .build(),
        target("stopped", "QEMU no longer runs", &[]),
        node_step(
            VmStep::ReleaseDisk,
            "remove the VM's files (a local volume's disk stays)",
        )
        .requires(&["stopped"])
        .wanted_by("released")
        .timeout_secs(120)
        .attempts(3)
        .build(),
        node_step(VmStep::RemoveTap, "remove the VM's tap device")
            .requires(&["stopped"])
            .wanted_by("released")
            .timeout_secs(60)
            .attempts(3)
            .build(),
        step(
            "ipam/release-address",
            "return the VM's address to its node's /64",
        )
        .requires(&[VmStep::RemoveTap.as_str()])
        .wanted_by("released")
        .timeout_secs(30)
        .attempts(3)
        .build(),
        step(
            "scheduler/release",
            "free the VM's reservation on its node and unbind it",
        )
        .requires(&["ipam/release-address", VmStep::ReleaseDisk.as_str()])
        .wanted_by("released")
        .timeout_secs(30)
        .attempts(3)
        .build(),
        target("released", "the VM holds no node resource", &[]),
        target(
            "deleted",
            "every finalizer is done; the object is removed",
            &["released"],
        ),
    ]
}

/// A live migration (`spec.migration` asked for one): the VM is bound to
/// the target first (its room reserved there), the target prepares a QEMU
/// waiting for the guest, the source sends the disks and then the memory
/// while the guest runs, the target resumes it, and the source cleans up.
/// The source's steps are owned by `migration-source`: the agent of
/// `status.migration.from`, no longer the VM's node.
pub(super) fn vm_migrate() -> Vec<StepDefinition> {
    let source = |step: VmStep, description: &str| {
        node_step(step, description).owned_by(MIGRATION_SOURCE_OWNER)
    };
    vec![
        step(
            "scheduler/rebind",
            "reserve room on the target node and bind the VM to it (status.migration names the source)",
        )
        .wanted_by("bound")
        .timeout_secs(60)
        .build(),
        target("bound", "the VM is bound to the target node", &[]),
        node_step(
            VmStep::CreateTap,
            "create the VM's tap device on the target and route its address",
        )
        .requires(&["bound"])
        .wanted_by("prepared")
        .timeout_secs(60)
        .attempts(3)
        .build(),
        node_step(
            VmStep::FetchKernel,
            "make the kernel and initramfs present on the target",
        )
        .requires(&["bound"])
        .wanted_by("prepared")
        .timeout_secs(600)
        .attempts(3)
        .build(),
        node_step(
            VmStep::PrepareIncoming,
            "create empty disks and start QEMU waiting for the guest (-incoming)",
        )
        .requires(&[VmStep::CreateTap.as_str(), VmStep::FetchKernel.as_str()])
        .wanted_by("prepared")
        .timeout_secs(120)
        .build(),
        target(
            "prepared",
            "the target's QEMU waits for the guest",
            &[],
        ),
        source(
            VmStep::CopyDisk,
            "start the migration from the source and copy the disks while the guest runs",
        )
        .requires(&["prepared"])
        .wanted_by("migrated")
        .timeout_secs(1_800)
        .build(),
        source(
            VmStep::MigrateRam,
            "send the guest's memory; pause it only for the last dirty pages",
        )
        .requires(&[VmStep::CopyDisk.as_str()])
        .wanted_by("migrated")
        .timeout_secs(1_800)
        .build(),
        target("migrated", "the source's QEMU has sent the whole guest", &[]),
        node_step(
            VmStep::SwitchOver,
            "the guest runs on the target (its QEMU takes over)",
        )
        .requires(&["migrated"])
        .wanted_by("running")
        .timeout_secs(120)
        .build(),
        source(
            VmStep::CleanupSource,
            "quit the source's QEMU, remove its tap and files",
        )
        .requires(&[VmStep::SwitchOver.as_str()])
        .wanted_by("running")
        .timeout_secs(120)
        .attempts(3)
        .build(),
        target("running", "the VM runs on its new node", &[]),
    ]
}
