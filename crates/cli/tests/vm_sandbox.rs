//! End to end through the real binary: a VM's QEMU is confined. It runs
//! as its own non-zero host uid with no capabilities, `no_new_privs` and
//! a seccomp filter (QEMU's `-sandbox`), in its own mount namespace that
//! holds its directory, disk and boot files but nothing else of the
//! node's data dir (and nothing it may write outside them), in a cgroup
//! limited by the VM's spec; the guest still boots to its marker and its
//! console answers; `explain-security vm/NAME` shows all of it; after an
//! agent crash that took QEMU with it, QEMU comes back under the same uid,
//! as confined; deleting the VM removes its cgroup.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use corral_testkit::{
    ImageBuilder, ImageFormat, LayerBuilder, VM_MARKER, VM_READY_MARKER, require_tool, unique_name,
    vm_assets,
};
use serde_json::Value;

mod common;

const BOOT_IMAGE: &str = "local/vm-sandbox-boot:1";

/// The value of `field` in `/proc/PID/status`.
fn status_field(pid: i32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("QEMU's status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {status}"))
        .trim()
        .to_string()
}

/// Runs `script` in QEMU's mount namespace as QEMU's uid and gid.
fn as_qemu(pid: i32, id: &str, script: &str) -> (bool, String) {
    let output = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-m", "-S", id, "-G", id, "--"])
        .args(["/bin/sh", "-c", script])
        .output()
        .expect("run nsenter");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The memory limit of the cgroup at `path` (v2 or v1).
fn memory_limit(path: &str) -> String {
    let root = Path::new("/sys/fs/cgroup");
    let inside = path.trim_start_matches('/');
    let file = if root.join("cgroup.controllers").exists() {
        root.join(inside).join("memory.max")
    } else {
        root.join("memory")
            .join(inside)
            .join("memory.limit_in_bytes")
    };
    std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()))
        .trim()
        .to_string()
}

/// The most memory the cgroup at `path` held (v2 or v1), for the log.
fn memory_peak(path: &str) -> String {
    let root = Path::new("/sys/fs/cgroup");
    let inside = path.trim_start_matches('/');
    let file = if root.join("cgroup.controllers").exists() {
        root.join(inside).join("memory.peak")
    } else {
        root.join("memory")
            .join(inside)
            .join("memory.max_usage_in_bytes")
    };
    std::fs::read_to_string(file)
        .map(|text| text.trim().to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

#[test]
fn a_vms_qemu_runs_confined_and_still_boots() {
    require_tool("qemu-system-x86_64");
    require_tool("qemu-img");
    require_tool("nsenter");
    let assets = vm_assets();
    let mut cluster = common::start_node();
    let data = cluster.data_dir.path().to_path_buf();
    let tar = ImageBuilder::new(BOOT_IMAGE)
        .layer(
            LayerBuilder::new()
                .dir("boot", 0o755)
                .file(
                    "boot/vmlinuz",
                    &std::fs::read(&assets.kernel).unwrap(),
                    0o644,
                )
                .file(
                    "boot/initrd.img",
                    &std::fs::read(&assets.initramfs).unwrap(),
                    0o644,
                ),
        )
        .write_tar(&data, ImageFormat::OciLayout)
        .expect("write the boot image");
    cluster.ok(&[
        "image",
        "import",
        &tar.to_string_lossy(),
        "--data-dir",
        &data.to_string_lossy(),
    ]);
    // A file of the node's that QEMU must not see.
    let canary = data.join(unique_name("canary"));
    std::fs::write(&canary, b"not for QEMU").unwrap();

    let name = unique_name("boxed");
    let volume = unique_name("disk");
    let manifest = format!(
        "kind: VirtualMachine\nmetadata: {{name: {name}}}\nspec:\n  cpus: 1\n  memory: 192Mi\n  disk: {{volume: {volume}, size: 64Mi}}\n  boot:\n    kernel: {BOOT_IMAGE}\n    initrd: {BOOT_IMAGE}\n    cmdline: \"console=ttyS0 quiet\"\n    marker: {VM_READY_MARKER}\n"
    );
    let path = cluster.manifest("vm.yaml", &manifest);
    cluster.ok(&["apply", "-f", &path]);
    let target = format!("vm/{name}");
    let vm: Value = common::wait_for("the VM to boot", Duration::from_secs(240), || {
        let vm = cluster.get_json(&target);
        (vm["status"]["phase"] == "Running").then_some(vm)
    });
    let uid = vm["metadata"]["uid"].as_str().unwrap().to_string();
    let vm_dir = data.join("vms").join(&uid);
    let console_log = std::fs::read_to_string(vm_dir.join("console.log")).unwrap_or_default();
    assert!(console_log.contains(VM_MARKER), "{console_log}");
    let pid: i32 = vm["status"]["message"]
        .as_str()
        .and_then(|m| m.strip_prefix("qemu pid "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no QEMU pid in {vm}"));

    // Its own uid and gid, no capabilities, no_new_privs, a seccomp filter.
    let uids = status_field(pid, "Uid");
    let host_id = uids.split_whitespace().next().unwrap().to_string();
    assert_ne!(host_id, "0", "QEMU runs as root: Uid {uids}");
    assert!(
        uids.split_whitespace().all(|id| id == host_id),
        "real, effective, saved and fs uids differ: {uids}"
    );
    assert!(
        status_field(pid, "Gid")
            .split_whitespace()
            .all(|id| id == host_id),
        "{}",
        status_field(pid, "Gid")
    );
    assert_eq!(status_field(pid, "Groups"), "");
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(pid, caps), "0000000000000000", "{caps}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Seccomp"), "2");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        cmdline.contains(
            "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
        ),
        "{cmdline}"
    );

    // Its own mount namespace: its directory and disk, not the rest.
    let namespace = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(namespace(&pid.to_string()), namespace("self"));
    let disk = data.join("volumes").join(&volume).join("disk.qcow2");
    let (ok, seen) = as_qemu(
        pid,
        &host_id,
        &format!(
            "ls -a {data}; test -S {dir}/qmp.sock && test -w {disk} && echo SEES-ITS-OWN; \
             test -e {canary} || echo NO-CANARY; test -e {data}/agent || echo NO-AGENT-STATE; \
             test -e /etc/passwd || echo NO-PASSWD; touch {dir}/probe && echo WROTE-OWN-DIR; \
             touch /probe 2>/dev/null || echo ROOT-READ-ONLY; touch /usr/probe 2>/dev/null || echo USR-READ-ONLY",
            data = data.display(),
            dir = vm_dir.display(),
            disk = disk.display(),
            canary = canary.display(),
        ),
    );
    assert!(ok, "{seen}");
    for wanted in [
        "SEES-ITS-OWN",
        "NO-CANARY",
        "NO-AGENT-STATE",
        "NO-PASSWD",
        "WROTE-OWN-DIR",
        "ROOT-READ-ONLY",
        "USR-READ-ONLY",
    ] {
        assert!(
            seen.contains(wanted),
            "{wanted} missing from QEMU's view:\n{seen}"
        );
    }
    // The data dir shows only the paths to this VM's files: no node
    // state, no runtime state, no other VM.
    let listing: Vec<&str> = seen
        .lines()
        .take_while(|l| !l.contains("SEES-ITS-OWN"))
        .collect();
    assert!(
        listing
            .iter()
            .all(|l| [".", "..", "vms", "volumes", "images"].contains(l)),
        "QEMU sees more of the data dir than its VM: {listing:?}"
    );
    let (_, vms) = as_qemu(pid, &host_id, &format!("ls {}/vms", data.display()));
    assert_eq!(vms.trim(), uid, "QEMU sees other VMs' directories");

    // Its cgroup holds it, limited by the spec (192 MiB + 256 MiB overhead).
    let explained: Value =
        serde_json::from_str(&cluster.ok(&["explain-security", &target, "-o", "json"])).unwrap();
    let cgroup = explained["cgroup"].as_str().expect("a cgroup").to_string();
    assert_eq!(cgroup, format!("/corral/vm-{uid}"));
    let membership = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        membership.lines().any(|l| l.ends_with(&cgroup)),
        "{membership}"
    );
    assert_eq!(memory_limit(&cgroup), ((192u64 + 256) << 20).to_string());
    eprintln!(
        "QEMU's cgroup for a 192 MiB TCG guest after boot: peak {} bytes, RSS {}",
        memory_peak(&cgroup),
        status_field(pid, "VmRSS")
    );
    assert_eq!(explained["uid"].as_u64(), host_id.parse().ok());
    let table = cluster.ok(&["explain-security", &target]);
    eprintln!("corral explain-security {target}:\n{table}");
    for wanted in [
        &format!("{host_id} (its own"),
        "-sandbox on,obsolete=deny",
        "private, over a read-only tmpfs root",
        &cgroup,
        "1 CPU",
    ] {
        assert!(table.contains(wanted), "{wanted} missing:\n{table}");
    }

    // The console works.
    let tag = unique_name("hi");
    let output = cluster.corral_with_stdin(
        &["console", &target],
        Some(&format!("echo {tag}-$((40+2))\n")),
    );
    let typed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{typed}");
    assert!(typed.contains(&format!("{tag}-42")), "{typed}");

    // The agent crashes and QEMU dies with it: the restarted agent starts
    // QEMU again from local state, under the same uid, as confined.
    cluster.kill9();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill QEMU");
    cluster.restart();
    let again: i32 = common::wait_for("QEMU to run again", Duration::from_secs(180), || {
        let vm = cluster.get_json(&target);
        let new_pid: i32 = vm["status"]["message"]
            .as_str()?
            .strip_prefix("qemu pid ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        (vm["status"]["phase"] == "Running" && new_pid != pid).then_some(new_pid)
    });
    assert_eq!(
        status_field(again, "Uid").split_whitespace().next(),
        Some(host_id.as_str()),
        "QEMU came back under another uid"
    );
    assert_eq!(status_field(again, "Seccomp"), "2");
    assert_eq!(status_field(again, "CapEff"), "0000000000000000");
    assert_ne!(namespace(&again.to_string()), namespace("self"));

    // Deleting the VM removes its cgroup.
    cluster.ok(&["delete", &target]);
    common::wait_for("the VM to go", Duration::from_secs(90), || {
        (!vm_dir.exists()).then_some(())
    });
    let memory_dir = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        format!("/sys/fs/cgroup{cgroup}")
    } else {
        format!("/sys/fs/cgroup/memory{cgroup}")
    };
    common::wait_for("the VM's cgroup to go", Duration::from_secs(30), || {
        (!Path::new(&memory_dir).exists()).then_some(())
    });
}
