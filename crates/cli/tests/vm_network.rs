//! End to end through the real binary: a VM's network like a pod's, on a
//! one-node `corral lab` under QEMU's TCG.
//!
//! - A VM with a further interface (`spec.interfaces: [{name: backend}]`)
//!   gets a second address from its node's /64 (`status.interfaces`);
//!   the guest shows both on `eth0` and `eth1`, and a pod on the node
//!   fetches the guest's page at the second address, which only the
//!   second link carries.
//! - The guest has IPv4 egress like a pod: an address of the node's range
//!   and a default route to its gateway; it reaches an IPv4 address in an
//!   "outside" namespace this test creates on the lab's bridge, arriving
//!   masqueraded as the node.
//! - Changing the interfaces of an existing VM is refused, naming the field.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use corral_testkit::{
    ImageBuilder, ImageFormat, LayerBuilder, VM_READY_MARKER, require_root, require_tool, vm_assets,
};
use serde_json::Value;

mod common;

use common::CORRAL;
use common::lab::{Lab, OutsideHost, accept_one, httpd_pod};

const BOOT_IMAGE: &str = "local/vm-boot:1";

fn manifest(name: &str, interfaces: &str) -> String {
    format!(
        "kind: VirtualMachine\nmetadata: {{name: {name}}}\nspec:\n  cpus: 1\n  memory: 256Mi\n  interfaces: {interfaces}\n  placement: {{node: node-0}}\n  boot:\n    kernel: {BOOT_IMAGE}\n    initrd: {BOOT_IMAGE}\n    cmdline: \"console=ttyS0 quiet\"\n    marker: {VM_READY_MARKER}\n"
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

/// Types `line` on the VM's console (`corral console` in node-0 of the lab
/// in `dir`) and returns what the console showed.
fn type_line(dir: &Path, target: &str, line: &str) -> String {
    let mut child = Command::new(CORRAL)
        .args(["lab", "exec", "--dir"])
        .arg(dir)
        .args(["--node", "node-0", "--", CORRAL, "console", target])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run corral console");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{line}\n").as_bytes())
        .expect("type on the console");
    let output = child.wait_with_output().expect("corral console");
    assert!(
        output.status.success(),
        "corral console failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_vm_with_two_interfaces_and_ipv4_egress() {
    require_root();
    for tool in [
        "qemu-system-x86_64",
        "qemu-img",
        "nsenter",
        "runc",
        "nft",
        "ip",
    ] {
        require_tool(tool);
    }
    let images = tempfile::tempdir().expect("temp dir");
    let tar = corral_testkit::busybox_image_tar(images.path(), ImageFormat::OciLayout);
    let lab = Lab::up("vmnet", 1, &tar, &[]);
    let boot = boot_image(images.path());
    lab.corral(&[
        "image",
        "import",
        &boot.to_string_lossy(),
        "--name",
        BOOT_IMAGE,
    ]);
    let file = images.path().join("pod.yaml");
    std::fs::write(&file, httpd_pod("client", "node-0")).expect("write the pod");
    lab.corral(&["apply", "-f", &file.to_string_lossy()]);
    let name = "twolinks";
    let target = format!("vm/{name}");
    let file = images.path().join("vm.yaml");
    std::fs::write(&file, manifest(name, "[{name: backend}]")).expect("write the manifest");
    lab.corral(&["apply", "-f", &file.to_string_lossy()]);
    let vm: Value = common::wait_for(
        &format!("{target} to run"),
        Duration::from_secs(300),
        || {
            let vm = lab.json(&target)?;
            (vm["status"]["phase"] == "Running").then_some(vm)
        },
    );
    let first = vm["status"]["address"].as_str().expect("an address");
    let second = vm["status"]["interfaces"]["backend"]
        .as_str()
        .unwrap_or_else(|| panic!("no status.interfaces.backend: {vm}"));
    assert_ne!(first, second);
    let prefix = |a: &str| a.split(':').take(4).collect::<Vec<_>>().join(":");
    assert_eq!(prefix(first), prefix(second), "both in the node's /64");
    let why = lab.corral(&["why", &target]);
    assert!(why.contains(&format!("backend {second}")), "{why}");

    // The guest holds both addresses, one on each NIC, and an IPv4 one.
    let shown = type_line(
        &lab.dir,
        &target,
        "ip -6 addr show dev eth0; ip -6 addr show dev eth1; ip -4 addr show dev eth0; echo SHOWN-$((6*7))",
    );
    assert!(shown.contains("SHOWN-42"), "{shown}");
    let eth1 = shown
        .split("eth1:")
        .nth(1)
        .unwrap_or_else(|| panic!("no eth1 in the guest:\n{shown}"));
    assert!(eth1.contains(&format!("{second}/128")), "{shown}");
    let eth0 = shown.split("eth1:").next().unwrap_or_default();
    assert!(eth0.contains(&format!("{first}/128")), "{shown}");
    assert!(shown.contains("inet 10."), "no IPv4 on eth0:\n{shown}");

    // A pod on the node reaches the guest at its second address.
    lab.running_address("client");
    let page = common::wait_for(
        "the pod to fetch from the second address",
        Duration::from_secs(60),
        || {
            lab.fetch("client", &format!("http://[{second}]:8080/"))
                .ok()
        },
    );
    assert!(page.contains("CORRAL-VM-HTTP"), "{page}");

    // IPv4 egress from the guest reaches the outside namespace,
    // masqueraded as the node.
    let outside = OutsideHost::create(&lab);
    let listener = outside.listen();
    let url = format!("http://{}:9000/", outside.ipv4);
    let fetch = std::thread::spawn({
        let dir = lab.dir.clone();
        let target = target.clone();
        move || {
            type_line(
                &dir,
                &target,
                &format!("timeout 10 wget -qO- {url} && echo FETCHED-$((6*7))"),
            )
        }
    });
    let peer = accept_one(&listener);
    let seen = fetch.join().expect("the console thread");
    assert!(seen.contains("FETCHED-42"), "{seen}");
    assert_eq!(
        peer.ip().to_string(),
        lab.node_field(0, "ipv4"),
        "egress must arrive masqueraded as node-0"
    );

    // The interfaces are fixed once the VM exists.
    std::fs::write(&file, manifest(name, "[{name: backend}, {name: storage}]"))
        .expect("write the manifest");
    let refused = lab
        .try_corral(&["apply", "-f", &file.to_string_lossy()])
        .expect_err("changing the interfaces is refused");
    assert!(
        refused.contains("spec.interfaces: cannot change"),
        "{refused}"
    );

    lab.corral(&["delete", &target, "--wait"]);
    let vm = lab.json(&target);
    assert!(vm.is_none(), "{vm:?}");
}
