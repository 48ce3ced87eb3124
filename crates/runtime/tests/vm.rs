//! The QEMU driver for real: the KVM probe gives a verdict quickly, and a
//! guest started in its own network namespace with a tap device and a
//! qcow2 disk reaches its console marker, powers off through the ACPI
//! power button when it handles it (and is quit after its grace period
//! when it does not), finds its file again after a restart, and a
//! snapshot with its memory taken and restored through QMP undoes a file
//! written after it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use corral_runtime::oci::netns::NetnsManager;
use corral_runtime::vm::power::StopOutcome;
use corral_runtime::vm::qmp::{Monitor, QmpClient, RunState};
use corral_runtime::vm::{self, Accel, VmConfig, kvm, process, snapshot};
use corral_testkit::{
    Defer, VM_POWEROFF_MARKER, VM_READY_MARKER, require_root, require_tool, unique_name, vm_assets,
};

fn wait_for_console(log: &Path, text: &str, timeout: Duration) -> String {
    let began = Instant::now();
    loop {
        let console = std::fs::read_to_string(log).unwrap_or_default();
        if console.contains(text) {
            return console;
        }
        assert!(
            began.elapsed() < timeout,
            "no {text:?} on the console within {timeout:?}:\n{console}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kvm_probe_gives_a_verdict_in_seconds() {
    require_tool("qemu-system-x86_64");
    let dir = tempfile::tempdir().unwrap();
    let began = Instant::now();
    let verdict = kvm::probe(
        Path::new("qemu-system-x86_64"),
        dir.path(),
        Duration::from_secs(5),
    );
    assert!(began.elapsed() < Duration::from_secs(15));
    eprintln!("kvm probe: {verdict:?} -> {}", verdict.feature());
    // Where the expectation is known (`CORRAL_EXPECT_KVM=usable|unusable`;
    // this kind of machine has a /dev/kvm whose guests never boot), hold
    // the probe to it.
    match std::env::var("CORRAL_EXPECT_KVM").as_deref() {
        Ok("usable") => assert_eq!(verdict, kvm::KvmProbe::Usable),
        Ok("unusable") => assert!(
            matches!(verdict, kvm::KvmProbe::Unusable(_) | kvm::KvmProbe::Absent),
            "{verdict:?}"
        ),
        _ => {}
    }
}

#[test]
fn a_guest_boots_in_its_namespace_and_keeps_its_disk() {
    require_root();
    require_tool("qemu-system-x86_64");
    require_tool("qemu-img");
    require_tool("nsenter");
    let assets = vm_assets();
    let dir = tempfile::tempdir().unwrap();
    let netns = std::sync::Arc::new(NetnsManager::new(dir.path().join("netns")));
    let ns_name = unique_name("vmt");
    let ns_path = netns.create(&ns_name).unwrap();
    let _remove_ns = {
        let (netns, name) = (netns.clone(), ns_name.clone());
        Defer::new(move || {
            let _ = netns.remove(&name);
        })
    };
    process::create_tap(&ns_path, "tap0").unwrap();
    process::create_tap(&ns_path, "tap0").unwrap();
    let link = Command::new("nsenter")
        .arg(format!("--net={}", ns_path.display()))
        .args(["ip", "-o", "link", "show", "dev", "tap0"])
        .output()
        .unwrap();
    let link = String::from_utf8_lossy(&link.stdout);
    assert!(link.contains(",UP") && link.contains("tap0"), "{link}");
    let disk = dir.path().join("disk.qcow2");
    assert!(process::create_disk(&disk, 64 << 20, None).unwrap());
    assert!(!process::create_disk(&disk, 64 << 20, None).unwrap());
    let name = unique_name("vm");
    let config = |cmdline: &str| VmConfig {
        name: name.clone(),
        cpus: 1,
        memory_bytes: 256 << 20,
        accel: Accel::Tcg,
        kernel: Some(assets.kernel.clone()),
        initrd: Some(assets.initramfs.clone()),
        cmdline: Some(format!("console=ttyS0 quiet {cmdline}")),
        disk: Some(disk.clone()),
        data_disks: Vec::new(),
        tap: Some("tap0".into()),
        mac: vm::mac_for(&name),
        extra_nics: Vec::new(),
        console_socket: dir.path().join("console.sock"),
        console_log: dir.path().join("console.log"),
        qmp_socket: dir.path().join("qmp.sock"),
        incoming: None,
        sandboxed: false,
    };
    let qemu = Path::new("qemu-system-x86_64");
    let output = dir.path().join("qemu.log");
    let qmp = dir.path().join("qmp.sock");
    let pid = process::start(
        qemu,
        &config("corral.write=first corral.acpi=1"),
        Some(&ns_path),
        &output,
    )
    .unwrap();
    let _kill = {
        let qmp = qmp.clone();
        Defer::new(move || {
            let _ = process::stop(pid, &qmp, Duration::ZERO);
        })
    };
    let console = wait_for_console(
        &config("").console_log,
        VM_READY_MARKER,
        Duration::from_secs(120),
    );
    assert!(console.contains("CORRAL-DISK-WROTE: first"), "{console}");
    assert!(process::is_vm_process(pid, &name));
    use std::os::unix::fs::MetadataExt;
    let netns_of = |path: &Path| std::fs::metadata(path).unwrap().ino();
    assert_eq!(
        netns_of(Path::new(&format!("/proc/{pid}/ns/net"))),
        netns_of(&ns_path),
        "QEMU runs in the VM's network namespace"
    );
    assert!(console.contains("CORRAL-VM-ACPI: /dev/input/"), "{console}");
    let mut monitor = QmpClient::connect(&qmp).unwrap();
    assert_eq!(monitor.query_status().unwrap().status, RunState::Running);
    drop(monitor);
    // The guest handles the power button: it powers itself off well
    // within its grace period.
    let outcome = process::stop(pid, &qmp, Duration::from_secs(60)).unwrap();
    assert!(
        matches!(outcome, StopOutcome::PoweredOff(after) if after < Duration::from_secs(30)),
        "{outcome:?}"
    );
    assert!(process::exit_status(pid).is_some());
    let console = std::fs::read_to_string(&config("").console_log).unwrap();
    assert!(console.contains(VM_POWEROFF_MARKER), "{console}");
    std::fs::remove_file(dir.path().join("console.log")).unwrap();
    let pid = process::start(qemu, &config(""), Some(&ns_path), &output).unwrap();
    let _kill2 = {
        let qmp = qmp.clone();
        Defer::new(move || {
            let _ = process::stop(pid, &qmp, Duration::ZERO);
        })
    };
    let console_log = config("").console_log;
    let console = wait_for_console(&console_log, VM_READY_MARKER, Duration::from_secs(120));
    assert!(console.contains("CORRAL-DISK-FILE: first"), "{console}");

    // A snapshot with memory, a file written after it, the snapshot
    // restored: the guest resumes before the write and the file is gone.
    let mut monitor = QmpClient::connect(&qmp)
        .unwrap()
        .slow(Duration::from_secs(120));
    snapshot::save_running(&mut monitor, "before").unwrap();
    let table = snapshot::list_offline(&disk).unwrap();
    assert!(
        table.iter().any(|s| s.name == "before" && s.has_memory()),
        "{table:?}"
    );
    type_on_console(
        &dir.path().join("console.sock"),
        "echo after > /mnt/later; sync; echo WROTE-$((6*7))\n",
    );
    wait_for_console(&console_log, "WROTE-42", Duration::from_secs(30));
    snapshot::load_running(&mut monitor, "before").unwrap();
    assert_eq!(monitor.query_status().unwrap().status, RunState::Running);
    type_on_console(
        &dir.path().join("console.sock"),
        "ls /mnt/later 2>/dev/null || echo GONE-$((6*7))\n",
    );
    wait_for_console(&console_log, "GONE-42", Duration::from_secs(30));
    snapshot::delete_running(&mut monitor, "before").unwrap();
    assert!(snapshot::list_offline(&disk).unwrap().is_empty());
    drop(monitor);

    // Without a handler the button does nothing: QEMU is quit once the
    // grace period is over.
    let began = Instant::now();
    let outcome = process::stop(pid, &qmp, Duration::from_secs(3)).unwrap();
    assert_eq!(outcome, StopOutcome::Quit);
    assert!(began.elapsed() >= Duration::from_secs(3));
    let console = std::fs::read_to_string(&console_log).unwrap();
    assert!(!console.contains(VM_POWEROFF_MARKER), "{console}");
    let qemu_log = std::fs::read_to_string(&output).unwrap_or_default();
    assert!(!qemu_log.contains("error"), "{qemu_log}");
}

/// Types `text` on the serial console (its unix socket).
fn type_on_console(socket: &Path, text: &str) {
    use std::io::Write;
    let mut stream =
        std::os::unix::net::UnixStream::connect(socket).expect("connect to the console");
    stream
        .write_all(text.as_bytes())
        .expect("type on the console");
    // Give QEMU the bytes before the connection goes.
    std::thread::sleep(Duration::from_millis(500));
}

/// Set in the process `the_kvm_probe_never_outlives_the_agent` starts to
/// play the agent: the directory of its stand-in QEMU.
const PROBE_AGENT: &str = "CORRAL_TEST_PROBE_AGENT";

#[test]
fn the_kvm_probe_never_outlives_the_agent() {
    if let Ok(dir) = std::env::var(PROBE_AGENT) {
        // The stand-in agent: probes until it is killed.
        let dir = Path::new(&dir);
        let verdict = kvm::boot(&dir.join("qemu"), dir, Duration::from_secs(120));
        panic!("the stand-in agent was not killed during its probe: {verdict:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("qemu.pid");
    let qemu = dir.path().join("qemu");
    std::fs::write(
        &qemu,
        format!(
            "#!/bin/sh\necho $$ > {}\nexec sleep 300\n",
            pid_file.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&qemu, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut agent = Command::new(std::env::current_exe().unwrap())
        .args(["the_kvm_probe_never_outlives_the_agent", "--exact"])
        .env(PROBE_AGENT, dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let began = Instant::now();
    let pid: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.trim().parse().ok())
        {
            break pid;
        }
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the probe never started its QEMU"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let _kill = Defer::new(move || {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    });
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    assert!(alive(pid), "the stand-in QEMU runs while the agent probes");
    agent.kill().unwrap();
    agent.wait().unwrap();
    let began = Instant::now();
    while alive(pid) {
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "the probe's QEMU (pid {pid}) outlived the agent that started it"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
