use std::path::PathBuf;

use super::*;

fn config() -> VmConfig {
    VmConfig {
        name: "builder".into(),
        cpus: 2,
        memory_bytes: 256 * MIB,
        accel: Accel::Tcg,
        kernel: Some(PathBuf::from("/k/vmlinuz")),
        initrd: Some(PathBuf::from("/k/initrd")),
        cmdline: Some("console=ttyS0 quiet".into()),
        disk: Some(PathBuf::from("/v/disk.qcow2")),
        data_disks: Vec::new(),
        tap: Some("tap0".into()),
        mac: "52:54:00:00:00:01".into(),
        extra_nics: Vec::new(),
        console_socket: PathBuf::from("/run/vm/console.sock"),
        console_log: PathBuf::from("/run/vm/console.log"),
        qmp_socket: PathBuf::from("/run/vm/qmp.sock"),
        incoming: None,
        sandboxed: false,
    }
}

fn after<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|pair| pair[0] == flag)
        .map(|pair| pair[1].as_str())
        .collect()
}

#[test]
fn kernel_boot_under_tcg() {
    let args = qemu_args(&config());
    assert_eq!(after(&args, "-accel"), ["tcg"]);
    assert_eq!(after(&args, "-cpu"), ["max"]);
    assert_eq!(after(&args, "-smp"), ["2"]);
    assert_eq!(after(&args, "-m"), ["256M"]);
    assert_eq!(after(&args, "-kernel"), ["/k/vmlinuz"]);
    assert_eq!(after(&args, "-initrd"), ["/k/initrd"]);
    assert_eq!(after(&args, "-append"), ["console=ttyS0 quiet"]);
    assert!(!args.contains(&"-boot".to_string()));
    assert!(args.contains(&"-nodefaults".to_string()));
}

#[test]
fn kvm_uses_the_host_cpu() {
    let mut config = config();
    config.accel = Accel::Kvm;
    let args = qemu_args(&config);
    assert_eq!(after(&args, "-accel"), ["kvm"]);
    assert_eq!(after(&args, "-cpu"), ["host"]);
}

#[test]
fn console_is_a_socket_that_logs_to_a_file() {
    let args = qemu_args(&config());
    assert_eq!(
        after(&args, "-chardev"),
        [
            "socket,id=console,path=/run/vm/console.sock,server=on,wait=off,logfile=/run/vm/console.log,logappend=on"
        ]
    );
    assert_eq!(after(&args, "-serial"), ["chardev:console"]);
    assert_eq!(
        after(&args, "-qmp"),
        ["unix:/run/vm/qmp.sock,server=on,wait=off"]
    );
}

#[test]
fn disk_and_tap_are_virtio_devices() {
    let args = qemu_args(&config());
    assert_eq!(
        after(&args, "-drive"),
        ["id=disk0,file=/v/disk.qcow2,format=qcow2,if=none,cache=writeback"]
    );
    assert_eq!(
        after(&args, "-netdev"),
        ["tap,id=net0,ifname=tap0,script=no,downscript=no"]
    );
    assert_eq!(
        after(&args, "-device"),
        [
            "virtio-blk-pci,drive=disk0",
            "virtio-net-pci,netdev=net0,mac=52:54:00:00:00:01"
        ]
    );
}

#[test]
fn further_nics_follow_the_first_on_their_own_taps() {
    let mut config = config();
    config.extra_nics = vec![
        ("tap1".into(), "52:54:00:00:00:02".into()),
        ("tap2".into(), "52:54:00:00:00:03".into()),
    ];
    let args = qemu_args(&config);
    assert_eq!(
        after(&args, "-netdev"),
        [
            "tap,id=net0,ifname=tap0,script=no,downscript=no",
            "tap,id=net1,ifname=tap1,script=no,downscript=no",
            "tap,id=net2,ifname=tap2,script=no,downscript=no",
        ]
    );
    let nics: Vec<&str> = after(&args, "-device")
        .into_iter()
        .filter(|d| d.starts_with("virtio-net-pci"))
        .collect();
    assert_eq!(
        nics,
        [
            "virtio-net-pci,netdev=net0,mac=52:54:00:00:00:01",
            "virtio-net-pci,netdev=net1,mac=52:54:00:00:00:02",
            "virtio-net-pci,netdev=net2,mac=52:54:00:00:00:03",
        ]
    );
}

#[test]
fn disk_boot_without_kernel() {
    let mut config = config();
    config.kernel = None;
    config.initrd = None;
    let args = qemu_args(&config);
    assert!(after(&args, "-kernel").is_empty());
    assert!(after(&args, "-initrd").is_empty());
    assert!(after(&args, "-append").is_empty());
    assert_eq!(after(&args, "-boot"), ["c"]);
}

#[test]
fn no_disk_no_tap_no_devices() {
    let mut config = config();
    config.disk = None;
    config.tap = None;
    let args = qemu_args(&config);
    assert!(after(&args, "-device").is_empty());
}

#[test]
fn memory_rounds_up_to_whole_mebibytes_and_a_floor() {
    let mut config = config();
    config.memory_bytes = 100 * MIB + 1;
    assert_eq!(after(&qemu_args(&config), "-m"), ["101M"]);
    config.memory_bytes = 0;
    assert_eq!(after(&qemu_args(&config), "-m"), ["16M"]);
    config.cpus = 0;
    assert_eq!(after(&qemu_args(&config), "-smp"), ["1"]);
}

#[test]
fn commas_in_disk_paths_are_doubled() {
    let mut config = config();
    config.disk = Some(PathBuf::from("/v/a,b.qcow2"));
    assert!(after(&qemu_args(&config), "-drive")[0].contains("file=/v/a,,b.qcow2,"));
}

#[test]
fn macs_are_stable_local_unicast() {
    let mac = mac_for("uid-1");
    assert_eq!(mac, mac_for("uid-1"));
    assert_ne!(mac, mac_for("uid-2"));
    assert!(mac.starts_with("52:54:"));
    assert_eq!(mac.len(), 17);
}

#[test]
fn probe_verdicts() {
    assert_eq!(
        kvm::verdict(true, "SeaBIOS (version 1.16)\n", ""),
        kvm::KvmProbe::Usable
    );
    assert!(matches!(
        kvm::verdict(false, "SeaBIOS", ""),
        kvm::KvmProbe::Absent
    ));
    match kvm::verdict(true, "", "\nKVM internal error. Suberror: 1\n") {
        kvm::KvmProbe::Unusable(reason) => assert!(reason.contains("KVM internal error")),
        other => panic!("{other:?}"),
    }
    assert_eq!(kvm::KvmProbe::Usable.accel(), Accel::Kvm);
    assert_eq!(kvm::KvmProbe::Unusable("x".into()).accel(), Accel::Tcg);
    assert_eq!(kvm::KvmProbe::Usable.feature(), "usable");
    assert!(kvm::KvmProbe::Absent.feature().starts_with("absent"));
}

#[test]
fn data_disks_follow_the_first_in_order_with_their_names_as_serials() {
    let mut config = config();
    config.data_disks = vec![
        ("scratch".into(), PathBuf::from("/v/scratch.qcow2")),
        ("logs".into(), PathBuf::from("/v/logs.qcow2")),
    ];
    let args = qemu_args(&config);
    assert_eq!(
        after(&args, "-drive"),
        [
            "id=disk0,file=/v/disk.qcow2,format=qcow2,if=none,cache=writeback",
            "id=disk1,file=/v/scratch.qcow2,format=qcow2,if=none,cache=writeback",
            "id=disk2,file=/v/logs.qcow2,format=qcow2,if=none,cache=writeback",
        ]
    );
    let devices = after(&args, "-device");
    assert!(
        devices.contains(&"virtio-blk-pci,drive=disk1,serial=scratch"),
        "{devices:?}"
    );
    assert!(
        devices.contains(&"virtio-blk-pci,drive=disk2,serial=logs"),
        "{devices:?}"
    );
}

#[test]
fn an_incoming_migration_waits_on_its_socket() {
    assert!(after(&qemu_args(&config()), "-incoming").is_empty());
    let mut incoming = config();
    incoming.incoming = Some(PathBuf::from("/run/vm/incoming.sock"));
    let args = qemu_args(&incoming);
    assert_eq!(after(&args, "-incoming"), ["unix:/run/vm/incoming.sock"]);
    // The machine is the same: only the start differs.
    let mut without = args.clone();
    let at = without
        .iter()
        .position(|a| a == "-incoming")
        .expect("-incoming is there");
    without.drain(at..at + 2);
    let plain = qemu_args(&config());
    assert_eq!(without, plain);
}
