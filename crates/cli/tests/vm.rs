//! End to end through the real binary: a VirtualMachine (Debian's cloud
//! kernel and a busybox initramfs from the test kit, imported as an image)
//! is scheduled, given a tap in its own namespace and a qcow2 disk in a
//! node-local volume, boots to its console marker under QEMU (TCG here),
//! holds its IPv6 address on the pod network (a pod on the node fetches
//! from it), shows its console through `corral logs` and `corral console`,
//! and an edit of its memory restarts it in place: same uid, node, address
//! and disk, and the file the first boot wrote is still there.

use std::time::Duration;

use corral_testkit::{
    ImageBuilder, ImageFormat, LayerBuilder, VM_MARKER, VM_READY_MARKER, require_tool, unique_name,
    vm_assets,
};
use serde_json::Value;

mod common;

const BOOT_IMAGE: &str = "local/vm-boot:1";

fn manifest(name: &str, volume: &str, memory: &str, cmdline: &str) -> String {
    format!(
        "kind: VirtualMachine\nmetadata: {{name: {name}}}\nspec:\n  cpus: 1\n  memory: {memory}\n  disk: {{volume: {volume}, size: 64Mi}}\n  boot:\n    kernel: {BOOT_IMAGE}\n    initrd: {BOOT_IMAGE}\n    cmdline: \"{cmdline}\"\n    marker: {VM_READY_MARKER}\n"
    )
}

fn console(cluster: &common::Cluster, uid: &str) -> String {
    std::fs::read_to_string(
        cluster
            .data_dir
            .path()
            .join("vms")
            .join(uid)
            .join("console.log"),
    )
    .unwrap_or_default()
}

#[test]
fn a_vm_boots_and_an_edit_restarts_it_in_place_keeping_its_disk() {
    require_tool("qemu-system-x86_64");
    require_tool("qemu-img");
    require_tool("nsenter");
    let assets = vm_assets();
    let cluster = common::start_node();
    let data_dir = cluster.data_dir.path().to_string_lossy().into_owned();
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
        .write_tar(cluster.data_dir.path(), ImageFormat::OciLayout)
        .expect("write the boot image");
    cluster.ok(&[
        "image",
        "import",
        &tar.to_string_lossy(),
        "--data-dir",
        &data_dir,
    ]);

    let name = unique_name("vm");
    let volume = unique_name("disk");
    let path = cluster.manifest(
        "vm.yaml",
        &manifest(
            &name,
            &volume,
            "256Mi",
            "console=ttyS0 quiet corral.write=first",
        ),
    );
    cluster.ok(&["apply", "-f", &path]);
    let target = format!("vm/{name}");
    let first: Value = common::wait_for("the VM to boot", Duration::from_secs(240), || {
        let vm = cluster.get_json(&target);
        (vm["status"]["phase"] == "Running").then_some(vm)
    });
    let uid = first["metadata"]["uid"].as_str().unwrap().to_string();
    let text = console(&cluster, &uid);
    assert!(text.contains(VM_MARKER), "{text}");
    assert!(text.contains("CORRAL-DISK-WROTE: first"), "{text}");
    assert!(first["status"]["node"].is_string(), "{first}");
    let message = first["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("under tcg") || message.contains("under kvm"),
        "{message}"
    );
    let kvm = common::wait_for(
        "the KVM verdict in the node's status",
        Duration::from_secs(60),
        || {
            let nodes: Value =
                serde_json::from_str(&cluster.ok(&["get", "nodes", "-o", "json"])).ok()?;
            let kvm = nodes["items"][0]["status"]["features"]["kvm"]
                .as_str()?
                .to_string();
            (kvm != "present (unprobed)").then_some(kvm)
        },
    );
    eprintln!("node kvm feature: {kvm}; VM status: {message}");
    let why = cluster.ok(&["why", &target]);
    assert!(why.contains("node/await-boot"), "{why}");
    let address = first["status"]["address"]
        .as_str()
        .expect("the VM has an address")
        .to_string();
    assert!(
        text.contains(&format!("CORRAL-VM-ADDRESS: {address}/128")),
        "{text}"
    );

    // A pod on the same node reaches the guest over IPv6.
    let pod = unique_name("vm-client");
    let pod_path = cluster.manifest("pod.yaml", &common::pod_manifest(&pod, "local/busybox:1"));
    cluster.ok(&["apply", "-f", &pod_path]);
    common::wait_for("the client pod to run", Duration::from_secs(120), || {
        (cluster.get_json(&format!("pod/{pod}"))["status"]["phase"] == "Running").then_some(())
    });
    let fetch = || {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let output = cluster.corral(&[
                "exec",
                &format!("pod/{pod}"),
                "--",
                "busybox",
                "timeout",
                "5",
                "wget",
                "-qO-",
                &format!("http://[{address}]:8080/"),
            ]);
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            if text.contains("CORRAL-VM-HTTP") {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the pod cannot fetch from the VM at [{address}]:8080: {text}{}\nconsole:\n{}",
                String::from_utf8_lossy(&output.stderr),
                console(&cluster, &uid)
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    fetch();

    // The console through the API: its log, and a line typed on it.
    let logs = cluster.ok(&["logs", &target]);
    assert!(logs.contains(VM_MARKER), "{logs}");
    let tag = unique_name("hi");
    let output = cluster.corral_with_stdin(
        &["console", &target],
        Some(&format!("echo {tag}-$((40+2))\n")),
    );
    let seen = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "corral console failed: {seen}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The shell's answer, not the echo of what was typed.
    assert!(seen.contains(&format!("{tag}-42")), "{seen}");
    let refused = cluster.fails(&["console", &format!("pod/{pod}")]);
    assert!(refused.contains("only VMs"), "{refused}");

    // QEMU dies: why answers for now (not the start that succeeded), and
    // the node starts it again.
    let status = cluster.get_json(&target);
    let pid: i32 = status["status"]["message"]
        .as_str()
        .and_then(|m| m.strip_prefix("qemu pid "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no QEMU pid in {status}"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill QEMU");
    let verdict = common::wait_for("why to see QEMU gone", Duration::from_secs(30), || {
        let why = cluster.ok(&["why", &target]);
        let first = why.lines().next().unwrap_or_default().to_string();
        first.contains("is not healthy").then_some(first)
    });
    assert!(
        verdict.contains("is not healthy: it is not running: "),
        "{verdict}"
    );
    common::wait_for("the VM to run again", Duration::from_secs(180), || {
        (cluster.get_json(&target)["status"]["phase"] == "Running").then_some(())
    });

    // Edit the memory: the same VM restarts in place with its disk.
    let path = cluster.manifest(
        "vm2.yaml",
        &manifest(&name, &volume, "320Mi", "console=ttyS0 quiet"),
    );
    cluster.ok(&["apply", "-f", &path]);
    let second: Value = common::wait_for("the edited VM to boot", Duration::from_secs(240), || {
        let vm = cluster.get_json(&target);
        (vm["status"]["phase"] == "Running" && vm["status"]["observedRevision"].as_u64() == Some(2))
            .then_some(vm)
    });
    assert_eq!(second["metadata"]["uid"], first["metadata"]["uid"]);
    assert_eq!(second["status"]["node"], first["status"]["node"]);
    assert_eq!(second["status"]["address"], first["status"]["address"]);
    let text = common::wait_for(
        "the disk's file on the console",
        Duration::from_secs(60),
        || {
            let text = console(&cluster, &uid);
            text.contains("CORRAL-DISK-FILE: first").then_some(text)
        },
    );
    assert!(text.matches(VM_READY_MARKER).count() >= 2, "{text}");
    let why = cluster.ok(&["why", &target]);
    assert!(why.contains("node/restart-vm"), "{why}");
    // The restarted guest is on the same link with the same address.
    fetch();
    let history = cluster.ok(&["history", &target]);
    assert!(history.lines().count() >= 2, "{history}");

    // Deleting the VM stops QEMU and removes its link to the node; its
    // local volume (the disk) stays.
    cluster.ok(&["delete", &target]);
    common::wait_for("QEMU to stop", Duration::from_secs(60), || {
        (!std::path::Path::new(&cluster.data_dir.path().join("vms").join(&uid)).exists())
            .then_some(())
    });
    // The veth goes in `node/remove-tap`, which may finish after
    // `node/release-disk` removed the directory waited for above.
    let alias = format!("corral-pod:vm/default/{name}");
    common::wait_for("the VM's veth to go", Duration::from_secs(30), || {
        let output = std::process::Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .expect("run ip link");
        (!String::from_utf8_lossy(&output.stdout).contains(&alias)).then_some(())
    });
    assert!(
        cluster
            .data_dir
            .path()
            .join("volumes")
            .join(&volume)
            .join("disk.qcow2")
            .exists()
    );
}
