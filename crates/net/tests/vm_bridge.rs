//! A VM's namespace bridged to the node (`ensure_vm_interface`), without
//! QEMU: the "tap" is one end of a veth whose other end, in a third
//! namespace, plays the guest's NIC (its address /128, default route via
//! `fe80::1`, as the test guest's `/init` does). A pod on the same node
//! reaches the guest and the guest reaches the pod, both seeing each
//! other's own addresses. Needs root; fails (does not skip) without it.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::Command;

use corral_net::datapath::{Netlink, NetworkOps, PodInterface, VM_BRIDGE, host_interface_name};
use corral_net::ipam::{ClusterPrefix, allocate_pod_address};
use corral_net::netns;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Runs `ip ARGS…` inside the namespace at `ns`, insisting it succeeds.
fn ip_in(ns: &Path, args: &[&str]) {
    let output = Command::new("nsenter")
        .arg(format!("--net={}", ns.display()))
        .arg("ip")
        .args(args)
        .output()
        .expect("run nsenter ip");
    assert!(
        output.status.success(),
        "ip {args:?} in {}: {}",
        ns.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A stand-in guest: a veth `tap0` in `vm_ns` whose peer is `eth0` in
/// `guest_ns`, configured like the test guest configures its NIC.
fn fake_guest(vm_ns: &Path, guest_ns: &Path, address: Ipv6Addr) {
    ip_in(
        vm_ns,
        &[
            "link", "add", "tap0", "type", "veth", "peer", "name", "guest0",
        ],
    );
    ip_in(
        vm_ns,
        &[
            "link",
            "set",
            "guest0",
            "netns",
            &guest_ns.to_string_lossy(),
        ],
    );
    ip_in(guest_ns, &["link", "set", "guest0", "name", "eth0"]);
    ip_in(guest_ns, &["link", "set", "lo", "up"]);
    ip_in(guest_ns, &["link", "set", "eth0", "up"]);
    ip_in(
        guest_ns,
        &[
            "-6",
            "addr",
            "add",
            &format!("{address}/128"),
            "dev",
            "eth0",
            "nodad",
        ],
    );
    ip_in(
        guest_ns,
        &[
            "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_behind_the_vm_bridge_and_a_pod_reach_each_other() {
    common::require_root_and_tools(&["ip", "nsenter"]);
    let lab = common::lab(1).await;
    let [node] = lab.nodes() else {
        panic!("lab has {} nodes", lab.nodes().len())
    };
    let mut rng = StdRng::seed_from_u64(7);
    let subnet = ClusterPrefix::generate_ula(&mut rng)
        .allocate_node_subnet(&BTreeSet::new(), &mut rng)
        .unwrap();
    let ops = Netlink::connect(Some(&node.netns)).await.unwrap();
    ops.enable_forwarding().await.unwrap();

    let pod_ns = lab.dir().join("pod");
    let vm_ns = lab.dir().join("vm");
    let guest_ns = lab.dir().join("guest");
    for ns in [&pod_ns, &vm_ns, &guest_ns] {
        netns::create(ns).unwrap();
    }
    let pod = PodInterface {
        owner: "default/client".into(),
        host_interface: host_interface_name("default/client"),
        netns: pod_ns.clone(),
        ipv6: allocate_pod_address(subnet, &BTreeSet::new(), &mut rng).unwrap(),
        egress: None,
    };
    ops.ensure_pod_interface(&pod).await.unwrap();
    let vm = PodInterface {
        owner: "vm/default/tiny".into(),
        host_interface: host_interface_name("vm/default/tiny"),
        netns: vm_ns.clone(),
        ipv6: allocate_pod_address(subnet, &BTreeSet::from([pod.ipv6]), &mut rng).unwrap(),
        egress: None,
    };
    fake_guest(&vm_ns, &guest_ns, vm.ipv6);
    ops.ensure_vm_interface(&vm, "tap0").await.unwrap();
    // Repeating is harmless.
    ops.ensure_vm_interface(&vm, "tap0").await.unwrap();
    let listed = ops.list_pod_interfaces().await.unwrap();
    assert!(
        listed.iter().any(|i| i.owner == vm.owner),
        "the VM's veth is listed: {listed:?}"
    );

    // The VM namespace itself holds no address on the link: the guest does.
    let addresses = Command::new("nsenter")
        .arg(format!("--net={}", vm_ns.display()))
        .args(["ip", "-6", "addr", "show"])
        .output()
        .unwrap();
    let addresses = String::from_utf8_lossy(&addresses.stdout);
    assert!(
        !addresses.contains("eth0") && !addresses.contains(VM_BRIDGE),
        "{addresses}"
    );

    let to_guest = SocketAddr::new(IpAddr::V6(vm.ipv6), 7101);
    let listener = common::listen_in(&guest_ns, to_guest);
    let peer =
        common::connect_from(&pod_ns, &listener, to_guest).expect("the pod reaches the guest");
    assert_eq!(peer.ip(), IpAddr::V6(pod.ipv6));
    let to_pod = SocketAddr::new(IpAddr::V6(pod.ipv6), 7102);
    let listener = common::listen_in(&pod_ns, to_pod);
    let peer =
        common::connect_from(&guest_ns, &listener, to_pod).expect("the guest reaches the pod");
    assert_eq!(peer.ip(), IpAddr::V6(vm.ipv6));

    ops.remove_pod_interface(&vm.host_interface).await.unwrap();
    ops.remove_pod_interface(&pod.host_interface).await.unwrap();
    let dir = lab.dir().to_path_buf();
    lab.down().unwrap();
    assert!(!dir.exists(), "lab directory {} left behind", dir.display());
}
