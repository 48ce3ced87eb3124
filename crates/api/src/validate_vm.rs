//! The rules of a VirtualMachine: its size, what it boots from, its disks
//! (one source each; clones, data disks, templates), its snapshots and the
//! times of its one-off actions (restore, power, migration).

use super::Checker;
use crate::kinds::VirtualMachineSpec;

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
    if !spec.data_disks.is_empty() && spec.disk.is_none() {
        checker.fail("spec.dataDisks", "needs spec.disk, the first disk");
    }
    if spec.template && spec.disk.is_none() {
        checker.fail("spec.template", "a template needs a disk for its clones");
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
