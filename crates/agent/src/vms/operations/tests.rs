use super::*;
use crate::vms::test_spec as spec;

fn taken(name: &str, memory: bool) -> SnapshotInfo {
    SnapshotInfo {
        name: name.into(),
        vm_state_size: if memory { 1 << 20 } else { 0 },
        date_sec: 0,
    }
}

#[test]
fn snapshots_listed_are_taken_and_unlisted_deleted_before_the_restore() {
    let admitted = spec(json!({"snapshots": [{"name": "a"}, {"name": "b"}]}));
    let desired = spec(json!({
        "snapshots": [{"name": "b"}, {"name": "c"}],
        "restore": {"snapshot": "b", "at": "2026-12-01T10:00:00Z"},
        "power": {"action": "reset", "at": "2026-12-01T10:00:00Z"}
    }));
    let existing = [taken("a", true), taken("b", true)];
    assert_eq!(
        plan(&admitted, &desired, &existing, &[]).unwrap(),
        [
            InPlace::Delete("a".into()),
            InPlace::Restore(taken("b", true)),
            InPlace::Take("c".into()),
            InPlace::Reset,
        ]
    );
    // The same revision admitted again does nothing more.
    let existing = [taken("b", true), taken("c", true)];
    assert_eq!(plan(&desired, &desired, &existing, &[]).unwrap(), []);
}

/// The plan given each resized disk's size now.
fn plan_sized(
    admitted: &VirtualMachineSpec,
    desired: &VirtualMachineSpec,
    actual: &[u64],
) -> Result<Vec<InPlace>, String> {
    let sized: Vec<(Resize, u64)> = resizes(admitted, desired)
        .into_iter()
        .zip(actual.iter().copied())
        .collect();
    plan(admitted, desired, &[], &sized)
}

#[test]
fn a_larger_size_grows_the_disk_and_a_smaller_one_fails() {
    let small = spec(json!({"disk": {"volume": "d", "size": "64Mi"}}));
    let large = spec(json!({"disk": {"volume": "d", "size": "96Mi"}}));
    assert_eq!(small.machine(), large.machine());
    let grow = |bytes| {
        InPlace::Grow(Resize {
            drive: "disk0".into(),
            field: "spec.disk.size".into(),
            data_disk: None,
            bytes,
        })
    };
    assert_eq!(
        plan_sized(&small, &large, &[64 << 20]).unwrap(),
        [grow(96 << 20)]
    );
    // Already that large (a retry after it grew): nothing to do.
    assert_eq!(plan_sized(&small, &large, &[96 << 20]).unwrap(), []);
    let error = plan_sized(&large, &small, &[96 << 20]).unwrap_err();
    assert!(
        error.contains("spec.disk.size asks for 67108864 bytes")
            && error.contains("a disk only grows"),
        "{error}"
    );
    // An unchanged size is not looked at.
    assert!(resizes(&large, &large).is_empty());
}

#[test]
fn a_data_disk_grows_on_its_own_drive_and_a_new_one_is_not_resized() {
    let before = spec(json!({"dataDisks": [{"name": "a"}, {"name": "b", "size": "32Mi"}]}));
    let after = spec(json!({"dataDisks": [
        {"name": "a"}, {"name": "b", "size": "48Mi"}, {"name": "c", "size": "8Mi"}
    ]}));
    // Same disks, other sizes: the same QEMU.
    let mut same = after.clone();
    same.data_disks.pop();
    assert_eq!(before.machine(), same.machine());
    assert_eq!(
        plan_sized(&before, &after, &[32 << 20]).unwrap(),
        [InPlace::Grow(Resize {
            drive: "disk2".into(),
            field: "spec.dataDisks[1].size".into(),
            data_disk: Some(1),
            bytes: 48 << 20,
        })]
    );
    // The default size written out is no change.
    let explicit =
        spec(json!({"dataDisks": [{"name": "a", "size": "1Gi"}, {"name": "b", "size": "32Mi"}]}));
    assert!(resizes(&before, &explicit).is_empty());
}

#[test]
fn a_rollback_repeats_no_restore_and_a_missing_snapshot_fails() {
    let done = spec(json!({
        "snapshots": [{"name": "s"}],
        "restore": {"snapshot": "s", "at": "2026-12-01T10:00:00Z"},
        "power": {"action": "restart", "at": "2026-12-01T10:00:00Z"}
    }));
    let older = spec(json!({
        "snapshots": [{"name": "s"}],
        "restore": {"snapshot": "s", "at": "2026-12-01T09:00:00Z"}
    }));
    assert_eq!(plan(&done, &older, &[taken("s", false)], &[]).unwrap(), []);
    let again = spec(json!({
        "snapshots": [{"name": "s"}],
        "restore": {"snapshot": "s", "at": "2026-12-01T11:00:00Z"}
    }));
    let error = plan(&done, &again, &[], &[]).unwrap_err();
    assert!(
        error.contains("snapshot s is not in the VM's disk"),
        "{error}"
    );
}

#[test]
fn a_request_is_done_once_and_a_rollback_does_not_repeat_it() {
    assert!(newer(Some("2026-12-01T10:00:00Z"), None));
    assert!(newer(
        Some("2026-12-01T10:00:01Z"),
        Some("2026-12-01T10:00:00Z")
    ));
    assert!(!newer(
        Some("2026-12-01T10:00:00Z"),
        Some("2026-12-01T10:00:00Z")
    ));
    assert!(!newer(
        Some("2026-12-01T09:00:00Z"),
        Some("2026-12-01T10:00:00Z")
    ));
    assert!(!newer(None, Some("2026-12-01T10:00:00Z")));
}

#[test]
fn a_stopped_vm_is_neither_restarted_nor_reset_but_keeps_its_disk_operations() {
    let admitted = spec(json!({"running": false}));
    for action in ["restart", "reset"] {
        let desired = spec(json!({
            "running": false,
            "snapshots": [{"name": "s"}],
            "power": {"action": action, "at": "2026-12-01T10:00:00Z"}
        }));
        // (The API refuses the request; the node would not start it.)
        assert_eq!(
            plan(&admitted, &desired, &[], &[]).unwrap(),
            [InPlace::Take("s".into())]
        );
    }
}
