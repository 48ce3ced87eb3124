//! The rules of a VirtualMachine: its size, what it boots from, its disks
//! (one source each; clones, data disks, templates), its snapshots and the
//! times of its one-off actions (restore, power, migration); and what a
//! change may not do (shrink a disk).

use super::Checker;
use crate::kinds::VirtualMachineSpec;
use crate::quantity::Memory;

pub(super) fn check_vm(checker: &mut Checker, spec: &VirtualMachineSpec) {
    if spec.cpus == 0 {
        checker.fail("spec.cpus", "must be at least 1");
    }
    if spec.memory.bytes < (16 << 20) {
        checker.fail("spec.memory", "must be at least 16Mi");
    }
    if spec.boot.kernel.is_none() && spec.disk.is_none() {
        checker.fail("spec.boot", "needs a kernel, or a disk to boot from");
    }
    if let Some(disk) = &spec.disk {
        let sources = [
            disk.volume.is_some(),
            disk.image.is_some(),
            disk.clone.is_some(),
        ];
        if sources.iter().filter(|set| **set).count() != 1 {
            checker.fail(
                "spec.disk",
                "must set exactly one of volume, image or clone",
            );
        }
        if let Some(clone) = &disk.clone {
            checker.dns_label("spec.disk.clone.vm", &clone.vm);
            if clone
                .snapshot
                .as_deref()
                .is_some_and(|name| !crate::kinds::is_snapshot_name(name))
            {
                checker.fail("spec.disk.clone.snapshot", "is not a snapshot name");
            }
        }
    }
    let mut disk_names = std::collections::BTreeSet::new();
    for (index, disk) in spec.data_disks.iter().enumerate() {
        let path = format!("spec.dataDisks[{index}].name");
        checker.dns_label(&path, &disk.name);
        if !disk_names.insert(disk.name.as_str()) {
            checker.fail(path, "names a disk listed before");
        }
        if let Some(volume) = &disk.volume {
            checker.dns_label(&format!("spec.dataDisks[{index}].volume"), volume);
        }
    }
    let mut interface_names = std::collections::BTreeSet::new();
    for (index, interface) in spec.interfaces.iter().enumerate() {
        let path = format!("spec.interfaces[{index}].name");
        checker.dns_label(&path, &interface.name);
        if !interface_names.insert(interface.name.as_str()) {
            checker.fail(path, "names an interface listed before");
        }
    }
    if spec.interfaces.len() > crate::kinds::MAX_VM_INTERFACES {
        checker.fail(
            "spec.interfaces",
            format!(
                "at most {} further interfaces",
                crate::kinds::MAX_VM_INTERFACES
            ),
        );
    }
    if !spec.data_disks.is_empty() && spec.disk.is_none() {
        checker.fail("spec.dataDisks", "needs spec.disk, the first disk");
    }
    if spec.template && spec.disk.is_none() {
        checker.fail("spec.template", "a template needs a disk for its clones");
    }
    if spec.template && !spec.running {
        checker.fail(
            "spec.running",
            "a template never runs: leave running out (templates are always stopped)",
        );
    }
    let mut names = std::collections::BTreeSet::new();
    for (index, snapshot) in spec.snapshots.iter().enumerate() {
        let path = format!("spec.snapshots[{index}].name");
        if !crate::kinds::is_snapshot_name(&snapshot.name) {
            checker.fail(
                path,
                "must be letters, digits, '-', '_' or '.' (at most 64), not starting with '-' or '.'",
            );
        } else if !names.insert(snapshot.name.as_str()) {
            checker.fail(path, "names a snapshot listed before");
        }
    }
    if !spec.snapshots.is_empty() && spec.disk.is_none() {
        checker.fail("spec.snapshots", "needs a disk to keep them in");
    }
    if let Some(restore) = &spec.restore
        && !names.contains(restore.snapshot.as_str())
    {
        checker.fail(
            "spec.restore.snapshot",
            "must name a snapshot in spec.snapshots",
        );
    }
    for (path, at) in [
        ("spec.restore.at", spec.restore.as_ref().map(|r| &r.at)),
        ("spec.power.at", spec.power.as_ref().map(|p| &p.at)),
        ("spec.migration.at", spec.migration.as_ref().map(|m| &m.at)),
    ] {
        if let Some(at) = at
            && chrono::DateTime::parse_from_rfc3339(at).is_err()
        {
            checker.fail(path, "expected an RFC 3339 time like 2026-01-02T03:04:05Z");
        }
    }
    if let Some(migration) = &spec.migration {
        checker.dns_label("spec.migration.to", &migration.to);
    }
}

/// Whether a one-off request stamped `new` is newer than `old`'s (RFC 3339
/// times in UTC compare as text; a rollback to an older one is not).
fn newer(new: Option<&str>, old: Option<&str>) -> bool {
    match (new, old) {
        (Some(new), Some(old)) => new > old,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// The rules of a change from `old` to `new`: the network interfaces are
/// the ones the VM was created with, a stopped VM (`running: false`) is
/// neither migrated nor restarted or reset (there is no guest to move or
/// reboot: start it first), and a disk only grows. The same
/// disk (`disk` with the same source; a data disk with the same name and
/// volume) may not get a smaller size than it has, since the node would
/// have to cut off the guest's data; the refusal names the field and the
/// size to keep. A disk given another source is another disk.
pub(super) fn check_vm_update(
    checker: &mut Checker,
    old: &VirtualMachineSpec,
    new: &VirtualMachineSpec,
) {
    if old.interfaces != new.interfaces {
        checker.fail(
            "spec.interfaces",
            "cannot change once the VM exists (each interface is a link and an address the VM was started with): create a new VM, or a clone, with the interfaces it needs",
        );
    }
    if !new.running {
        let at = |migration: &Option<crate::kinds::VmMigration>| {
            migration.as_ref().map(|m| m.at.clone())
        };
        if newer(at(&new.migration).as_deref(), at(&old.migration).as_deref()) {
            checker.fail(
                "spec.migration",
                "the VM is stopped (spec.running: false): a live migration moves a running guest; start it first (corral vm start), then migrate it",
            );
        }
        let at = |power: &Option<crate::kinds::VmPower>| power.as_ref().map(|p| p.at.clone());
        if newer(at(&new.power).as_deref(), at(&old.power).as_deref()) {
            checker.fail(
                "spec.power",
                "the VM is stopped (spec.running: false): there is no guest to restart or reset; start it instead (corral vm start)",
            );
        }
    }
    let mut shrunk = |path: String, old_bytes: u64, new_bytes: u64| {
        if new_bytes < old_bytes {
            checker.fail(
                path,
                format!(
                    "{} is smaller than {}, the disk's size now: a disk only grows (keep at least {})",
                    Memory { bytes: new_bytes },
                    Memory { bytes: old_bytes },
                    Memory { bytes: old_bytes },
                ),
            );
        }
    };
    if let (Some(old_disk), Some(new_disk)) = (&old.disk, &new.disk)
        && old_disk.same_disk(new_disk)
    {
        shrunk(
            "spec.disk.size".into(),
            old_disk.size_bytes(),
            new_disk.size_bytes(),
        );
    }
    for (index, disk) in new.data_disks.iter().enumerate() {
        if let Some(before) = old
            .data_disks
            .iter()
            .find(|d| d.name == disk.name && d.volume == disk.volume)
        {
            shrunk(
                format!("spec.dataDisks[{index}].size"),
                before.size_bytes(),
                disk.size_bytes(),
            );
        }
    }
}

/// `new` with every disk it shares with `current` at least as large as
/// there (a rollback to a revision from before a disk grew keeps the
/// disk's size); returns the fields raised.
pub fn keep_grown_disks(current: &VirtualMachineSpec, new: &mut VirtualMachineSpec) -> Vec<String> {
    let mut raised = Vec::new();
    if let (Some(now), Some(disk)) = (&current.disk, &mut new.disk)
        && now.same_disk(disk)
        && disk.size_bytes() < now.size_bytes()
    {
        disk.size = Some(Memory {
            bytes: now.size_bytes(),
        });
        raised.push("spec.disk.size".to_string());
    }
    for (index, disk) in new.data_disks.iter_mut().enumerate() {
        if let Some(now) = current
            .data_disks
            .iter()
            .find(|d| d.name == disk.name && d.volume == disk.volume)
            && disk.size_bytes() < now.size_bytes()
        {
            disk.size = Some(Memory {
                bytes: now.size_bytes(),
            });
            raised.push(format!("spec.dataDisks[{index}].size"));
        }
    }
    raised
}
