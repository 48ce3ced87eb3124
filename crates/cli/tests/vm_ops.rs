//! End to end through the real binary: VM operations like a hypervisor
//! manager's, on the test kit's guest (Debian's cloud kernel, a busybox
//! initramfs, a qcow2 disk in a local volume) under QEMU (TCG here):
//!
//! - QEMU's run state (QMP `query-status`) is the VM's `status.runState`;
//! - a second disk (`dataDisks`) is the guest's `/dev/vdb`;
//! - `corral vm snapshot` takes a snapshot with the guest's memory (of both
//!   disks), a file
//!   written afterwards is gone once `corral vm restore` returns the guest
//!   to it, the list names who took it, and each is a revision in history;
//! - a larger `disk.size` and `dataDisks[].size` grow both disks of the
//!   running guest (it sees the new sizes); a smaller one is refused by the
//!   API, naming the field, and changes nothing (no revision, same sizes);
//!   a rollback to a revision from before they grew keeps their sizes;
//! - `corral vm reset` reboots the guest in the same QEMU;
//! - `corral vm stop` powers the guest off and keeps the VM: QEMU is gone,
//!   `get` says Stopped, the disk stays, `why` says the spec asks for it
//!   and who asked, it stays stopped across a restart of the node's
//!   agent, a second stop writes nothing, a restart, reset or migration of
//!   it is refused naming the field, a snapshot of it holds its disk;
//!   `corral vm start` boots it again with what it wrote to its disk
//!   before the stop; a guest that powers itself off is started again;
//! - `corral delete` presses the ACPI power button: a guest that handles it
//!   powers off (its console shows its shutdown line) long before its
//!   grace period ends; one that does not is quit once the grace is over;
//! - a VM marked as a template stops running, and clones of it boot with
//!   its files while their own writes stay their own (qcow2 overlays over
//!   the template's disk); `corral vm restart` restarts a clone cleanly;
//!   a disk-only snapshot of the template, copied, makes a standalone VM.

use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

use corral_testkit::{
    ImageBuilder, ImageFormat, LayerBuilder, VM_POWEROFF_MARKER, VM_READY_MARKER, require_tool,
    unique_name, vm_assets,
};
use serde_json::Value;

mod common;
#[path = "vm_ops/stop_start.rs"]
mod stop_start;

const BOOT_IMAGE: &str = "local/vm-boot:1";

fn manifest(name: &str, volume: &str, grace: u32, cmdline: &str) -> String {
    manifest_with(
        name,
        &format!("{{volume: {volume}, size: 64Mi}}"),
        grace,
        cmdline,
        "",
    )
}

fn manifest_with(name: &str, disk: &str, grace: u32, cmdline: &str, extra: &str) -> String {
    format!(
        "kind: VirtualMachine\nmetadata: {{name: {name}}}\nspec:\n  cpus: 1\n  memory: 256Mi\n  stopGraceSeconds: {grace}\n  disk: {disk}\n  boot:\n    kernel: {BOOT_IMAGE}\n    initrd: {BOOT_IMAGE}\n    cmdline: \"console=ttyS0 quiet {cmdline}\"\n    marker: {VM_READY_MARKER}\n{extra}"
    )
}

fn import_boot_image(cluster: &common::Cluster) {
    let assets = vm_assets();
    let tar = ImageBuilder::new(BOOT_IMAGE)
        .layer(
            LayerBuilder::new()
                .dir("boot", 0o755)
                .file(
                    "boot/vmlinuz",
                    &std::fs::read(&assets.kernel).expect("read the kernel"),
                    0o644,
                )
                .file(
                    "boot/initrd.img",
                    &std::fs::read(&assets.initramfs).expect("read the initramfs"),
                    0o644,
                ),
        )
        .write_tar(cluster.data_dir.path(), ImageFormat::OciLayout)
        .expect("write the boot image");
    let data_dir = cluster.data_dir.path().to_string_lossy().into_owned();
    cluster.ok(&[
        "image",
        "import",
        &tar.to_string_lossy(),
        "--data-dir",
        &data_dir,
    ]);
}

fn console_log(cluster: &common::Cluster, uid: &str) -> std::path::PathBuf {
    cluster
        .data_dir
        .path()
        .join("vms")
        .join(uid)
        .join("console.log")
}

/// Types `line` on the VM's console through `corral console` and returns
/// what the console showed.
fn type_line(cluster: &common::Cluster, target: &str, line: &str) -> String {
    let output = cluster.corral_with_stdin(&["console", target], Some(&format!("{line}\n")));
    assert!(
        output.status.success(),
        "corral console failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn wait_running(cluster: &common::Cluster, target: &str) -> Value {
    common::wait_for(
        &format!("{target} to run"),
        Duration::from_secs(240),
        || {
            let vm = cluster.get_json(target);
            (vm["status"]["phase"] == "Running" && vm["status"]["runState"] == "running")
                .then_some(vm)
        },
    )
}

/// Deletes the VM and returns how long its node took to remove it, and
/// everything its console printed (read through a handle opened before,
/// since the node removes the log with the VM).
fn delete_and_watch(cluster: &common::Cluster, target: &str, uid: &str) -> (Duration, String) {
    let mut log = std::fs::File::open(console_log(cluster, uid)).expect("open the console log");
    let began = Instant::now();
    cluster.ok(&["delete", target]);
    let dir = cluster.data_dir.path().join("vms").join(uid);
    common::wait_for(
        &format!("{target} to be removed from its node"),
        Duration::from_secs(120),
        || (!dir.exists()).then_some(()),
    );
    let took = began.elapsed();
    let mut text = String::new();
    log.seek(SeekFrom::Start(0))
        .expect("rewind the console log");
    log.read_to_string(&mut text).expect("read the console log");
    (took, text)
}

#[test]
fn snapshots_restore_reset_and_a_clean_stop() {
    require_tool("qemu-system-x86_64");
    require_tool("qemu-img");
    require_tool("nsenter");
    let mut cluster = common::start_node();
    import_boot_image(&cluster);

    // Two guests: one handles the ACPI power button (grace 120 s), one
    // does not (grace 5 s).
    let (acpi, plain) = (unique_name("vm-acpi"), unique_name("vm-plain"));
    let (acpi_disk, plain_disk) = (unique_name("disk"), unique_name("disk"));
    // The ACPI guest also has a second disk (`/dev/vdb`).
    let data_disks = "  dataDisks: [{name: scratch, size: 32Mi}]\n";
    let path = cluster.manifest(
        "acpi.yaml",
        &manifest_with(
            &acpi,
            &format!("{{volume: {acpi_disk}, size: 64Mi}}"),
            120,
            "corral.acpi=1",
            data_disks,
        ),
    );
    cluster.ok(&["apply", "-f", &path]);
    let path = cluster.manifest("plain.yaml", &manifest(&plain, &plain_disk, 5, ""));
    cluster.ok(&["apply", "-f", &path]);
    let (acpi_target, plain_target) = (format!("vm/{acpi}"), format!("vm/{plain}"));
    let vm = wait_running(&cluster, &acpi_target);
    let acpi_uid = vm["metadata"]["uid"].as_str().unwrap().to_string();
    let message = vm["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("; running; "), "{message}");
    // 32 MiB in 512-byte sectors, named by its serial.
    let seen = type_line(
        &cluster,
        &acpi_target,
        "echo VDB-$(cat /sys/block/vdb/size)-$(cat /sys/block/vdb/serial)",
    );
    assert!(seen.contains("VDB-65536-scratch"), "{seen}");

    // Snapshot (disk and memory), write a file, restore: the file is gone.
    let began = Instant::now();
    let taken = cluster.ok(&["vm", "snapshot", &acpi_target, "s1"]);
    let snapshot_took = began.elapsed();
    assert!(taken.contains("vm snapshot s1"), "{taken}");
    let list = cluster.ok(&["vm", "snapshot", "list", &acpi_target]);
    let row = list
        .lines()
        .find(|line| line.starts_with("s1 "))
        .unwrap_or_else(|| panic!("no s1 in the list:\n{list}"));
    assert!(row.split_whitespace().nth(1) == Some("yes"), "{list}");
    assert!(!row.contains("(not yet)") && !row.ends_with(" -"), "{list}");
    let why = cluster.ok(&["why", &acpi_target]);
    assert!(why.contains("snapshot s1 taken (disk and memory)"), "{why}");
    let seen = type_line(
        &cluster,
        &acpi_target,
        "echo later > /mnt/later; sync; test -e /mnt/later && echo WROTE-$((6*7))",
    );
    // (The arithmetic keeps the echo of the typed line from matching.)
    assert!(seen.contains("WROTE-42"), "{seen}");
    let began = Instant::now();
    cluster.ok(&["vm", "restore", &acpi_target, "s1"]);
    eprintln!(
        "vm snapshot (256 MiB guest, disk and memory) took {snapshot_took:?}; vm restore took {:?}",
        began.elapsed()
    );
    let seen = type_line(
        &cluster,
        &acpi_target,
        "test -e /mnt/later && echo STILL-$((6*7)) || echo GONE-$((6*7))",
    );
    assert!(seen.contains("GONE-42"), "{seen}");
    assert!(!seen.contains("STILL-42"), "{seen}");
    let vm = cluster.get_json(&acpi_target);
    assert_eq!(vm["status"]["runState"], "running", "{vm}");
    assert_eq!(vm["metadata"]["uid"].as_str(), Some(acpi_uid.as_str()));
    let history = cluster.ok(&["history", &acpi_target]);
    assert!(history.contains("vm snapshot s1"), "{history}");
    assert!(history.contains("vm restore s1"), "{history}");
    // A bad name is refused before anything is written.
    let refused = cluster.fails(&["vm", "snapshot", &acpi_target, "no way"]);
    assert!(refused.contains("cannot name a snapshot"), "{refused}");
    cluster.ok(&["vm", "snapshot", "delete", &acpi_target, "s1"]);
    let list = cluster.ok(&["vm", "snapshot", "list", &acpi_target]);
    assert_eq!(list.lines().count(), 1, "{list}");

    // Grow the disk from 64 MiB to 96 MiB and the data disk from 32 MiB
    // to 48 MiB in one edit: the running guest sees both.
    let path = cluster.manifest(
        "acpi-grown.yaml",
        &manifest_with(
            &acpi,
            &format!("{{volume: {acpi_disk}, size: 96Mi}}"),
            120,
            "corral.acpi=1",
            "  dataDisks: [{name: scratch, size: 48Mi}]\n",
        ),
    );
    cluster.ok(&["apply", "-f", &path, "--wait"]);
    let why = cluster.ok(&["why", &acpi_target]);
    assert!(
        why.contains("disk grown to 100663296 bytes while the guest runs"),
        "{why}"
    );
    assert!(
        why.contains("disk disk1 grown to 50331648 bytes while the guest runs"),
        "{why}"
    );
    // 96 MiB and 48 MiB in 512-byte sectors.
    let sizes = "echo SECTORS-$(cat /sys/block/vda/size)-$(cat /sys/block/vdb/size)";
    let seen = type_line(&cluster, &acpi_target, sizes);
    assert!(seen.contains("SECTORS-196608-98304"), "{seen}");
    let vm = cluster.get_json(&acpi_target);
    assert_eq!(vm["metadata"]["uid"].as_str(), Some(acpi_uid.as_str()));
    assert!(
        vm["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("restarts 0"),
        "{vm}"
    );

    // Shrinking either disk is refused before anything is written: the
    // error names the field, the revision stays, the guest sees the same.
    let revision = vm["metadata"]["revision"].clone();
    let path = cluster.manifest(
        "acpi-shrunk.yaml",
        &manifest_with(
            &acpi,
            &format!("{{volume: {acpi_disk}, size: 64Mi}}"),
            120,
            "corral.acpi=1",
            "  dataDisks: [{name: scratch, size: 16Mi}]\n",
        ),
    );
    let refused = cluster.fails(&["apply", "-f", &path]);
    for expected in [
        "spec.disk.size: 64Mi is smaller than 96Mi",
        "spec.dataDisks[0].size: 16Mi is smaller than 48Mi",
        "a disk only grows",
    ] {
        assert!(refused.contains(expected), "{expected:?} not in {refused}");
    }
    let vm = cluster.get_json(&acpi_target);
    assert_eq!(vm["metadata"]["revision"], revision, "{vm}");
    let seen = type_line(&cluster, &acpi_target, sizes);
    assert!(seen.contains("SECTORS-196608-98304"), "{seen}");

    // A rollback to the revision that took s1 (before the disks grew)
    // takes s1 again but keeps the disks' sizes, and says so.
    let history: Vec<Value> =
        serde_json::from_str(&cluster.ok(&["history", &acpi_target, "-o", "json"])).unwrap();
    let took_s1 = history
        .iter()
        .find(|record| record["message"] == "vm snapshot s1")
        .and_then(|record| record["revision"].as_u64())
        .unwrap_or_else(|| panic!("no 'vm snapshot s1' revision: {history:?}"));
    cluster.ok(&["rollback", &acpi_target, "--to", &took_s1.to_string()]);
    let history: Vec<Value> =
        serde_json::from_str(&cluster.ok(&["history", &acpi_target, "-o", "json"])).unwrap();
    let message = history.last().unwrap()["message"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        message,
        format!(
            "rollback to revision {took_s1} (kept spec.disk.size, spec.dataDisks[0].size: a disk only grows)"
        )
    );
    let vm = common::wait_for(
        "the rollback to be applied",
        Duration::from_secs(120),
        || {
            let vm = cluster.get_json(&acpi_target);
            (vm["status"]["observedRevision"] == vm["metadata"]["revision"]
                && vm["status"]["snapshots"]
                    .as_array()
                    .is_some_and(|s| s.len() == 1))
            .then_some(vm)
        },
    );
    assert_eq!(vm["spec"]["disk"]["size"], "96Mi", "{vm}");
    assert_eq!(vm["spec"]["dataDisks"][0]["size"], "48Mi", "{vm}");
    let seen = type_line(&cluster, &acpi_target, sizes);
    assert!(seen.contains("SECTORS-196608-98304"), "{seen}");

    // Reset: the same QEMU, the guest boots again.
    let vm = wait_running(&cluster, &plain_target);
    let plain_uid = vm["metadata"]["uid"].as_str().unwrap().to_string();
    let pid_before = vm["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    cluster.ok(&["vm", "reset", &plain_target]);
    let text = std::fs::read_to_string(console_log(&cluster, &plain_uid)).unwrap();
    assert_eq!(text.matches(VM_READY_MARKER).count(), 2, "{text}");
    let vm = wait_running(&cluster, &plain_target);
    let pid = |message: &str| message.split(';').next().unwrap_or_default().to_string();
    assert_eq!(
        pid(vm["status"]["message"].as_str().unwrap_or_default()),
        pid(&pid_before)
    );

    stop_start::stop_keep_and_start(&mut cluster, &acpi_target, &acpi_uid, &acpi_disk);

    // Delete: the ACPI guest powers itself off well within its 120 s; the
    // other is quit once its 5 s are over.
    let (took, text) = delete_and_watch(&cluster, &acpi_target, &acpi_uid);
    assert!(text.contains(VM_POWEROFF_MARKER), "{text}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    eprintln!("deleting the guest with an ACPI handler took {took:?}");
    let (took, text) = delete_and_watch(&cluster, &plain_target, &plain_uid);
    assert!(!text.contains(VM_POWEROFF_MARKER), "{text}");
    assert!(took >= Duration::from_secs(5), "{took:?}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    eprintln!("deleting the guest without an ACPI handler took {took:?}");
}

#[test]
fn clones_of_a_template_share_its_files_and_keep_their_own() {
    require_tool("qemu-system-x86_64");
    require_tool("qemu-img");
    require_tool("nsenter");
    let cluster = common::start_node();
    import_boot_image(&cluster);
    let template = unique_name("vm-base");
    let disk = unique_name("disk");
    let target = format!("vm/{template}");
    let path = cluster.manifest(
        "base.yaml",
        &manifest(&template, &disk, 2, "corral.write=from-template"),
    );
    cluster.ok(&["apply", "-f", &path]);
    let vm = wait_running(&cluster, &target);
    let uid = vm["metadata"]["uid"].as_str().unwrap().to_string();
    let text = std::fs::read_to_string(console_log(&cluster, &uid)).unwrap();
    assert!(text.contains("CORRAL-DISK-WROTE: from-template"), "{text}");

    // A clone of a VM that is not a template is refused: its disk changes.
    let early = unique_name("vm-early");
    let path = cluster.manifest(
        "early.yaml",
        &manifest_with(&early, &format!("{{clone: {{vm: {template}}}}}"), 2, "", ""),
    );
    cluster.ok(&["apply", "-f", &path]);
    common::wait_for("why to refuse the clone", Duration::from_secs(60), || {
        let why = cluster.ok(&["why", &format!("vm/{early}")]);
        why.contains("is not a template").then_some(())
    });
    cluster.ok(&["delete", &format!("vm/{early}")]);

    // Marked as a template, it stops (the guest has no ACPI handler: quit
    // after its 2 s) and stays stopped.
    let path = cluster.manifest(
        "base2.yaml",
        &manifest_with(
            &template,
            &format!("{{volume: {disk}, size: 64Mi}}"),
            2,
            "corral.write=from-template",
            "  template: true\n",
        ),
    );
    cluster.ok(&["apply", "-f", &path]);
    common::wait_for("the template to stop", Duration::from_secs(60), || {
        let vm = cluster.get_json(&target);
        (vm["status"]["phase"] == "Template" && vm["status"]["runState"] == "stopped").then_some(())
    });

    // Two clones: each boots with the template's file and writes its own.
    let clones: Vec<String> = (0..2).map(|_| unique_name("vm-clone")).collect();
    for (index, clone) in clones.iter().enumerate() {
        let path = cluster.manifest(
            &format!("clone{index}.yaml"),
            &manifest_with(
                clone,
                &format!("{{clone: {{vm: {template}}}}}"),
                2,
                &format!("corral.write=clone-{index}"),
                "",
            ),
        );
        cluster.ok(&["apply", "-f", &path]);
    }
    let mut uids = Vec::new();
    for (index, clone) in clones.iter().enumerate() {
        let vm = wait_running(&cluster, &format!("vm/{clone}"));
        let uid = vm["metadata"]["uid"].as_str().unwrap().to_string();
        let text = std::fs::read_to_string(console_log(&cluster, &uid)).unwrap();
        assert!(text.contains("CORRAL-DISK-FILE: from-template"), "{text}");
        assert!(
            text.contains(&format!("CORRAL-DISK-WROTE: clone-{index}")),
            "{text}"
        );
        uids.push(uid);
    }
    // A clean restart of the first clone: it finds its own write.
    let first = format!("vm/{}", clones[0]);
    cluster.ok(&["vm", "restart", &first]);
    let text = std::fs::read_to_string(console_log(&cluster, &uids[0])).unwrap();
    assert!(text.contains("CORRAL-DISK-FILE: clone-0"), "{text}");
    let why = cluster.ok(&["why", &first]);
    assert!(why.contains("restarted"), "{why}");
    // The template's own disk never saw the clones' writes.
    let overlay = cluster
        .data_dir
        .path()
        .join("vms")
        .join(&uids[1])
        .join("disk.qcow2");
    let info = std::process::Command::new("qemu-img")
        .args(["info", "-U", "--output=json"])
        .arg(&overlay)
        .output()
        .unwrap();
    let info: Value = serde_json::from_slice(&info.stdout).unwrap();
    let backing = info["backing-filename"].as_str().unwrap_or_default();
    assert!(backing.ends_with(&format!("{disk}/disk.qcow2")), "{info}");
    for clone in &clones {
        cluster.ok(&["delete", &format!("vm/{clone}")]);
    }
    // The clones' QEMUs hold the template's disk (shared, read-only) until
    // they are gone: only then may the template's disk change.
    for uid in &uids {
        let dir = cluster.data_dir.path().join("vms").join(uid);
        common::wait_for("a clone to be removed", Duration::from_secs(60), || {
            (!dir.exists()).then_some(())
        });
    }

    // A snapshot of the template is of its disk only (QEMU does not run);
    // a VM made from a copy of it has no backing file and the same files.
    cluster.ok(&["vm", "snapshot", &target, "golden"]);
    let list = cluster.ok(&["vm", "snapshot", "list", &target]);
    let row = list
        .lines()
        .find(|line| line.starts_with("golden "))
        .unwrap_or_else(|| panic!("no golden in the list:\n{list}"));
    assert_eq!(row.split_whitespace().nth(1), Some("no"), "{list}");
    let copy = unique_name("vm-copy");
    let path = cluster.manifest(
        "copy.yaml",
        &manifest_with(
            &copy,
            &format!("{{clone: {{vm: {template}, snapshot: golden}}}}"),
            2,
            "",
            "",
        ),
    );
    cluster.ok(&["apply", "-f", &path]);
    let vm = wait_running(&cluster, &format!("vm/{copy}"));
    let uid = vm["metadata"]["uid"].as_str().unwrap().to_string();
    let text = std::fs::read_to_string(console_log(&cluster, &uid)).unwrap();
    assert!(text.contains("CORRAL-DISK-FILE: from-template"), "{text}");
    let disk = cluster
        .data_dir
        .path()
        .join("vms")
        .join(&uid)
        .join("disk.qcow2");
    let info = std::process::Command::new("qemu-img")
        .args(["info", "-U", "--output=json"])
        .arg(&disk)
        .output()
        .unwrap();
    let info: Value = serde_json::from_slice(&info.stdout).unwrap();
    assert!(info.get("backing-filename").is_none(), "{info}");
    cluster.ok(&["delete", &format!("vm/{copy}")]);
    cluster.ok(&["delete", &target]);
}
