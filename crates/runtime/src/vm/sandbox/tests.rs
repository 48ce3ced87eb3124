use super::*;
use std::path::{Path, PathBuf};

fn config() -> VmConfig {
    VmConfig {
        name: "corral-u".into(),
        cpus: 1,
        memory_bytes: 128 << 20,
        accel: Accel::Tcg,
        kernel: Some("/img/l1/boot/vmlinuz".into()),
        initrd: Some("/img/l1/boot/initrd.img".into()),
        cmdline: None,
        disk: Some("/data/volumes/v/disk.qcow2".into()),
        data_disks: vec![("scratch".into(), "/data/vms/u/disks/scratch.qcow2".into())],
        tap: Some("tap0".into()),
        mac: "52:54:00:00:00:01".into(),
        extra_nics: vec![("tap1".into(), "52:54:00:00:00:02".into())],
        console_socket: "/data/vms/u/console.sock".into(),
        console_log: "/data/vms/u/console.log".into(),
        qmp_socket: "/data/vms/u/qmp.sock".into(),
        incoming: None,
        sandboxed: true,
    }
}

fn bind(path: &str, writable: bool) -> Mount {
    Mount::Bind {
        path: path.into(),
        writable,
    }
}

#[test]
fn the_vm_dir_and_disks_are_writable_and_boot_files_read_only() {
    let mounts = plan(&config(), &["/img/l2/disk.qcow2".into()]);
    let binds: Vec<&Mount> = mounts
        .iter()
        .filter(|m| matches!(m, Mount::Bind { .. }))
        .collect();
    assert_eq!(
        binds,
        [
            &bind("/data/vms/u", true),
            // The data disk is in the VM's directory: not bound again.
            &bind("/data/volumes/v/disk.qcow2", true),
            &bind("/img/l1/boot/vmlinuz", false),
            &bind("/img/l1/boot/initrd.img", false),
            &bind("/img/l2/disk.qcow2", false),
        ]
    );
    assert!(mounts.contains(&Mount::Proc));
    let devices: Vec<&str> = mounts
        .iter()
        .filter_map(|m| match m {
            Mount::Device { name, .. } => Some(*name),
            _ => None,
        })
        .collect();
    assert_eq!(devices, ["null", "zero", "full", "random", "urandom"]);
}

#[test]
fn kvm_gets_a_device_node_only_the_vm_may_open() {
    let mut config = config();
    config.accel = Accel::Kvm;
    let mounts = plan(&config, &[]);
    assert!(mounts.contains(&Mount::Device {
        name: "kvm",
        major: 10,
        minor: 232,
        owned: true
    }));
}

#[test]
fn seccomp_and_the_tap_descriptor_only_when_sandboxed() {
    let args = crate::vm::qemu_args(&config());
    let joined = args.join(" ");
    assert!(
        joined.contains(&format!("-sandbox {SECCOMP_OPTIONS}")),
        "{joined}"
    );
    assert!(joined.contains("tap,id=net0,fd=3"), "{joined}");
    assert!(
        joined.contains("tap,id=net1,fd=4"),
        "the next NIC, the next fd: {joined}"
    );
    assert!(
        !joined.contains("ifname="),
        "no tap opened by name: {joined}"
    );
    let mut plain = config();
    plain.sandboxed = false;
    let joined = crate::vm::qemu_args(&plain).join(" ");
    assert!(!joined.contains("-sandbox"), "{joined}");
    assert!(joined.contains("ifname=tap0"), "{joined}");
    assert!(joined.contains("ifname=tap1"), "{joined}");
}

#[test]
fn preparing_makes_parents_before_each_mount_and_pivots_last() {
    let host = tempfile::tempdir().unwrap();
    let vm_dir = host.path().join("vms/u");
    std::fs::create_dir_all(&vm_dir).unwrap();
    let kernel = host.path().join("img/vmlinuz");
    std::fs::create_dir_all(kernel.parent().unwrap()).unwrap();
    std::fs::write(&kernel, b"k").unwrap();
    let root = PathBuf::from("/r");
    let sandbox = Sandbox {
        uid: 1 << 20,
        gid: 1 << 20,
        root: root.clone(),
        mounts: vec![
            Mount::Symlink {
                path: "/lib".into(),
                target: "usr/lib".into(),
            },
            bind(vm_dir.to_str().unwrap(), true),
            bind(kernel.to_str().unwrap(), false),
        ],
        cgroups: vec!["/sys/fs/cgroup/memory/corral/vm-u/cgroup.procs".into()],
    };
    let prepared = sandbox.prepare().unwrap();
    let words: Vec<String> = prepared
        .steps
        .iter()
        .map(|(_, what)| what.to_string_lossy().into_owned())
        .collect();
    let position = |wanted: &str| {
        words
            .iter()
            .position(|w| w == wanted)
            .unwrap_or_else(|| panic!("no step {wanted} in {words:?}"))
    };
    assert_eq!(
        words[0],
        "join cgroup /sys/fs/cgroup/memory/corral/vm-u/cgroup.procs"
    );
    assert_eq!(words[1], "make mounts private");
    assert_eq!(words[2], "mount a tmpfs on /r");
    let inside = |p: &Path| under(&root, p).unwrap().display().to_string();
    assert!(
        position(&format!("make {}", inside(&vm_dir)))
            < position(&format!("bind {}", vm_dir.display()))
    );
    assert!(
        position(&format!("make {}", inside(kernel.parent().unwrap())))
            < position(&format!("make {}", inside(&kernel)))
    );
    assert!(matches!(
        prepared.steps.last(),
        Some((Step::PivotRoot(_), _))
    ));
    // The kernel is a file: its mount point is touched, not made a
    // directory.
    assert!(
        prepared.steps.iter().any(
            |(step, _)| matches!(step, Step::Touch(p) if p.to_str().unwrap() == inside(&kernel))
        )
    );
    let relative = Sandbox {
        mounts: vec![bind("relative/path", false)],
        ..sandbox
    };
    assert!(matches!(relative.prepare(), Err(SandboxError::Relative(_))));
}
