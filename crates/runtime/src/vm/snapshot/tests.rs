use super::*;

#[test]
fn names_safe_for_hmp_and_qemu_img() {
    for good in ["s1", "before-upgrade", "v1.2_b"] {
        check_name(good).unwrap();
    }
    for bad in ["", "-c", ".x", "a b", "x;quit", "a/b", &"x".repeat(65)] {
        assert!(check_name(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_table_of_qemu_img_info() {
    let json = r#"{"virtual-size": 67108864, "filename": "d.qcow2", "format": "qcow2",
        "snapshots": [
          {"icount": 0, "vm-state-size": 0, "date-sec": 1700000000, "date-nsec": 1,
           "vm-clock-sec": 0, "id": "1", "name": "disk-only", "vm-clock-nsec": 0},
          {"vm-state-size": 48234496, "date-sec": 1700000100, "date-nsec": 2,
           "vm-clock-sec": 12, "id": "2", "name": "with-memory", "vm-clock-nsec": 5}
        ]}"#;
    let snapshots = table(json, "d.qcow2").unwrap();
    assert_eq!(snapshots.len(), 2);
    assert_eq!(snapshots[0].name, "disk-only");
    assert!(!snapshots[0].has_memory());
    assert!(snapshots[1].has_memory());
    assert_eq!(snapshots[1].date_sec, 1_700_000_100);
    assert!(table(r#"{"format": "qcow2"}"#, "d").unwrap().is_empty());
    assert!(table("not json", "d").is_err());
}

/// `qemu-img` for real: take, list, apply and delete on a disk nobody holds.
#[test]
fn offline_snapshots_on_a_real_disk() {
    corral_testkit::require_tool("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.qcow2");
    crate::vm::process::create_disk(&disk, 1 << 20, None).unwrap();
    crate::vm::process::grow_disk(&disk, 2 << 20).unwrap();
    assert_eq!(crate::vm::process::disk_size(&disk).unwrap(), 2 << 20);
    offline(&disk, Offline::Create, "first").unwrap();
    offline(&disk, Offline::Create, "second").unwrap();
    let names: Vec<String> = list_offline(&disk)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["first", "second"]);
    // A snapshot copied to a disk of its own (a clone of it).
    let copy = dir.path().join("copy.qcow2");
    crate::vm::process::copy_snapshot(&disk, "second", &copy).unwrap();
    assert!(copy.exists() && list_offline(&copy).unwrap().is_empty());
    assert!(crate::vm::process::copy_snapshot(&disk, "none", &dir.path().join("x.qcow2")).is_err());
    offline(&disk, Offline::Apply, "first").unwrap();
    offline(&disk, Offline::Delete, "first").unwrap();
    assert!(offline(&disk, Offline::Apply, "first").is_err());
    assert_eq!(list_offline(&disk).unwrap().len(), 1);
}
