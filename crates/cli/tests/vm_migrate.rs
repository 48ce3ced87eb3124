//! End to end through the real binary: a live migration of a running VM
//! between two of three lab nodes (network namespaces, each with its own
//! agent and data dir) under QEMU's TCG.
//!
//! The test guest counts seconds on its console (`corral.count=1`). After
//! `corral vm migrate` the guest's console on the target goes on from
//! where the source's stopped — no boot marker, no counter starting over —
//! the VM is bound to the target (`status.node`, `status.migration`), its
//! history shows the person's request and the move as a system revision,
//! `why` shows the phases of the `migrate` workflow and the guest's
//! downtime, and nothing of the VM is left on the source. Its address
//! follows it (design `0039-migrated-vm-addresses`): pods on the source
//! and on the third node fetch the guest's page at the same address, which
//! both route as a /128 to the target, and those routes go with the VM. A
//! migration to a node that cannot take it fails at its first step, `why`
//! says why, and the guest runs on where it was. The target gives the
//! guest the IPv4 egress address it booted with, and says so.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_testkit::{
    ImageBuilder, ImageFormat, LayerBuilder, VM_COUNT_PREFIX, VM_MARKER, VM_READY_MARKER,
    require_tool, vm_assets,
};
use serde_json::Value;

mod common;

use common::lab::{Lab, httpd_pod};

const BOOT_IMAGE: &str = "local/vm-boot:1";

fn manifest(name: &str) -> String {
    format!(
        "kind: VirtualMachine\nmetadata: {{name: {name}}}\nspec:\n  cpus: 1\n  memory: 256Mi\n  disk: {{volume: {name}-disk, size: 64Mi}}\n  boot:\n    kernel: {BOOT_IMAGE}\n    initrd: {BOOT_IMAGE}\n    cmdline: \"console=ttyS0 quiet corral.count=1\"\n    marker: {VM_READY_MARKER}\n"
    )
}

/// The boot image (kernel and initramfs), written as an OCI layout tar.
fn boot_image(dir: &Path) -> PathBuf {
    let assets = vm_assets();
    ImageBuilder::new(BOOT_IMAGE)
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
        .write_tar(dir, ImageFormat::OciLayout)
        .expect("write the boot image")
}

/// The counter values the console log at `path` shows, in order.
fn counts(path: &Path) -> Vec<u64> {
    counts_in(&std::fs::read(path).unwrap_or_default())
}

fn counts_in(text: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|line| line.split_once(VM_COUNT_PREFIX))
        .filter_map(|(_, rest)| rest.trim().parse().ok())
        .collect()
}

fn console_log(lab: &Lab, node: &str, uid: &str) -> PathBuf {
    lab.dir.join(node).join("vms").join(uid).join("console.log")
}

fn wait_running(lab: &Lab, target: &str, node: Option<&str>) -> Value {
    common::wait_for(
        &format!("{target} to run on {node:?}"),
        Duration::from_secs(300),
        || {
            let vm = lab.json(target)?;
            let here = node.is_none_or(|node| vm["status"]["node"] == node);
            (here && vm["status"]["phase"] == "Running" && vm["status"]["runState"] == "running")
                .then_some(vm)
        },
    )
}

/// The `/128` route `node` has to `address` (corral's protocol 87), if any.
fn route_to(lab: &Lab, node: &str, address: &str) -> Option<String> {
    lab.routes(node)
        .lines()
        .find(|line| line.split_whitespace().next() == Some(address))
        .map(str::to_string)
}

/// `pod` fetches the guest's page at `address` (within a minute).
fn fetch_guest(lab: &Lab, pod: &str, address: &str) -> String {
    let url = format!("http://[{address}]:8080/");
    common::wait_for(
        &format!("pod {pod} to fetch the guest's page at {address}"),
        Duration::from_secs(60),
        || lab.fetch(pod, &url).ok(),
    )
}

#[test]
fn a_running_guest_keeps_counting_across_a_live_migration() {
    require_tool("qemu-system-x86_64");
    require_tool("qemu-img");
    require_tool("nsenter");
    require_tool("ip");
    let images = tempfile::tempdir().expect("temp dir");
    let tar = corral_testkit::busybox_image_tar(images.path(), ImageFormat::OciLayout);
    let lab = Lab::up("migrate", 3, &tar, &[]);
    let boot = boot_image(images.path());
    lab.corral(&[
        "image",
        "import",
        &boot.to_string_lossy(),
        "--name",
        BOOT_IMAGE,
    ]);
    let name = "mover";
    let target = format!("vm/{name}");
    let file = images.path().join("vm.yaml");
    std::fs::write(&file, manifest(name)).expect("write the manifest");
    lab.corral(&["apply", "-f", &file.to_string_lossy()]);
    let vm = wait_running(&lab, &target, None);
    let uid = vm["metadata"]["uid"].as_str().expect("a uid").to_string();
    let source = vm["status"]["node"].as_str().expect("bound").to_string();
    let address = vm["status"]["address"]
        .as_str()
        .expect("an address")
        .to_string();
    let others: Vec<String> = ["node-0", "node-1", "node-2"]
        .into_iter()
        .filter(|node| *node != source)
        .map(str::to_string)
        .collect();
    let (destination, third) = (others[0].as_str(), others[1].as_str());
    // A pod on the node the VM leaves and one on the third node; both
    // reach the guest at its address before it moves.
    for (pod, node) in [("near", source.as_str()), ("far", third)] {
        let file = images.path().join(format!("{pod}.yaml"));
        std::fs::write(&file, httpd_pod(pod, node)).expect("write the pod");
        lab.corral(&["apply", "-f", &file.to_string_lossy()]);
    }
    for pod in ["near", "far"] {
        lab.running_address(pod);
        let page = fetch_guest(&lab, pod, &address);
        assert!(page.contains("CORRAL-VM-HTTP"), "{page}");
    }
    assert_eq!(
        route_to(&lab, third, &address),
        None,
        "at home: its /64 routes it"
    );
    let source_log = console_log(&lab, &source, &uid);
    common::wait_for("the guest to count", Duration::from_secs(120), || {
        (counts(&source_log).len() >= 3).then_some(())
    });

    // A node that does not exist cannot take it: the first step says so,
    // and the guest goes on where it is.
    let refused = lab
        .try_corral(&[
            "vm",
            "migrate",
            &target,
            "--to",
            "node-9",
            "--timeout",
            "60s",
        ])
        .expect_err("a migration to no node fails");
    assert!(refused.contains("node-9"), "{refused}");
    let why = lab.corral(&["why", &target]);
    assert!(why.contains("scheduler/rebind"), "{why}");
    assert!(why.contains("node-9 cannot take the VM"), "{why}");
    let still = lab.json(&target).expect("the VM");
    assert_eq!(still["status"]["node"], source.as_str());
    let before = counts(&source_log).len();
    common::wait_for(
        "the guest to go on counting",
        Duration::from_secs(60),
        || (counts(&source_log).len() > before).then_some(()),
    );

    // The live migration. The source removes the console log with the
    // VM's files: it is read through a handle opened before.
    let mut source_handle =
        std::fs::File::open(&source_log).expect("open the source's console log");
    let out = lab.corral(&["vm", "migrate", &target, "--to", destination]);
    assert!(
        out.contains(&format!("vm migrate to {destination}")),
        "{out}"
    );
    let vm = wait_running(&lab, &target, Some(destination));
    assert_eq!(vm["status"]["migration"]["from"], source.as_str(), "{vm}");
    assert_eq!(vm["status"]["migration"]["to"], destination, "{vm}");

    // The counter goes on on the target from where the source stopped.
    let mut source_text = Vec::new();
    source_handle
        .read_to_end(&mut source_text)
        .expect("read the source's console log");
    let last_on_source = *counts_in(&source_text)
        .last()
        .expect("counted on the source");
    let target_log = console_log(&lab, destination, &uid);
    let on_target = common::wait_for(
        "the guest to count on the target",
        Duration::from_secs(60),
        || {
            let seen = counts(&target_log);
            (seen.len() >= 3).then_some(seen)
        },
    );
    assert!(
        on_target[0] > last_on_source && on_target[0] <= last_on_source + 30,
        "the target's first count {} does not follow the source's last {last_on_source}",
        on_target[0]
    );
    assert!(
        on_target.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "the counter on the target skips or restarts: {on_target:?}"
    );
    let text =
        String::from_utf8_lossy(&std::fs::read(&target_log).expect("target log")).into_owned();
    assert!(
        !text.contains(VM_MARKER) && !text.contains(VM_READY_MARKER),
        "the guest booted again on the target: {text}"
    );

    // The request is the person's revision, the move a system revision
    // (like a pod's), and `why` shows its phases.
    let history = lab.corral(&["history", &target]);
    let row = |words: &str| {
        history
            .lines()
            .find(|line| line.contains(words))
            .unwrap_or_else(|| panic!("no {words:?} in the history:\n{history}"))
            .to_string()
    };
    assert!(
        !row(&format!("vm migrate to {destination}")).contains(" system "),
        "{history}"
    );
    let moved = row(&format!(
        "moved from {source} to {destination} by live migration"
    ));
    assert!(moved.contains(" system "), "{history}");
    assert!(moved.contains("scheduler"), "{history}");
    let why = lab.corral(&["why", &target]);
    for phase in [
        "scheduler/rebind",
        "node/prepare-incoming",
        "node/copy-disk",
        "node/migrate-ram",
        "node/switch-over",
        "node/cleanup-source",
    ] {
        assert!(why.contains(phase), "{phase} missing: {why}");
    }
    // The lab's nodes give IPv4 egress and the target holds no other
    // workload: it gives the guest the address it booted with.
    assert!(
        why.contains("the guest's IPv4 egress address is 10.")
            && why.contains("it keeps its IPv4 egress address 10."),
        "{why}"
    );
    let downtime: u64 = why
        .split("downtime ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no downtime in: {why}"));
    eprintln!("live migration downtime under TCG: {downtime} ms\n{why}");

    // Nothing of it is left on the source; its disk lives on the target.
    common::wait_for("the source to clean up", Duration::from_secs(60), || {
        let dir = lab.dir.join(&source).join("vms").join(&uid);
        (!dir.exists()).then_some(())
    });
    let disk = |node: &str| {
        lab.dir
            .join(node)
            .join("volumes")
            .join(format!("{name}-disk"))
            .join("disk.qcow2")
    };
    assert!(!disk(&source).exists(), "the source kept the disk");
    assert!(disk(destination).exists(), "the target has no disk");

    // Its address went with it: the source and the third node route it
    // to the target, the target to the VM's link; pods on both reach the
    // guest there.
    let target_address = lab
        .json(&format!("node/{destination}"))
        .expect("the target node")["status"]["address"]
        .as_str()
        .expect("the target's address")
        .to_string();
    for node in [source.as_str(), third] {
        let route = common::wait_for(
            &format!("{node} to route {address} to {destination}"),
            Duration::from_secs(30),
            || route_to(&lab, node, &address),
        );
        assert!(
            route.contains(&format!("via {target_address} ")),
            "{node}: {route}"
        );
    }
    assert_eq!(route_to(&lab, destination, &address), None);
    for pod in ["near", "far"] {
        let page = fetch_guest(&lab, pod, &address);
        assert!(page.contains("CORRAL-VM-HTTP"), "{pod}: {page}");
    }

    // It goes away cleanly from its new node. Its disk, a local volume,
    // stays there: it holds the ext2 file system the guest made on the
    // source (its superblock's magic, 0xEF53 at byte 1080), so the disk
    // was copied — the target started from an empty one.
    lab.corral(&["delete", &target, "--wait"]);
    assert!(lab.json(&target).is_none(), "the VM is still there");
    for node in [source.as_str(), third] {
        common::wait_for(
            &format!("{node} to drop its route to {address}"),
            Duration::from_secs(30),
            || route_to(&lab, node, &address).is_none().then_some(()),
        );
    }
    let head = images.path().join("head.raw");
    let copied = std::process::Command::new("qemu-img")
        .args(["dd", "-f", "qcow2", "-O", "raw", "bs=2048", "count=1"])
        .arg(format!("if={}", disk(destination).display()))
        .arg(format!("of={}", head.display()))
        .output()
        .expect("run qemu-img dd");
    assert!(copied.status.success(), "qemu-img dd: {copied:?}");
    let head = std::fs::read(&head).expect("read the disk's first blocks");
    assert_eq!(
        head.get(1080..1082),
        Some(&[0x53, 0xef][..]),
        "no ext2 superblock on the target's disk: it was not copied"
    );
}
