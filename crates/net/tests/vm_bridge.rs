//! A VM's namespace bridged to the node (`ensure_vm_interface`), without
//! QEMU: the "tap" is one end of a veth whose other end, in a third
//! namespace, plays the guest's NIC (its address /128, default route via
//! `fe80::1`, as the test guest's `/init` does). A pod on the same node
//! reaches the guest and the guest reaches the pod, both seeing each
//! other's own addresses. A second link (`tap1`, bridged as `br1`) gives
//! the guest a second address the pod reaches through it, and with IPv4
//! egress on the first link the guest and the pod talk over IPv4 too.
//! Needs root; fails (does not skip) without it.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::Command;

use corral_net::datapath::{
    Netlink, NetworkOps, NextHop, NodeRoute, PodEgress, PodInterface, VM_BRIDGE, VmLink,
    gateway_mac, host_interface_name,
};
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

/// A stand-in guest NIC: a veth `tapN` in `vm_ns` whose peer is `ethN`
/// in `guest_ns`, configured like the test guest configures its NICs (the
/// first holds the default route).
fn fake_guest(vm_ns: &Path, guest_ns: &Path, index: usize, address: Ipv6Addr) {
    let (tap, peer, eth) = (
        format!("tap{index}"),
        format!("guest{index}"),
        format!("eth{index}"),
    );
    ip_in(
        vm_ns,
        &["link", "add", &tap, "type", "veth", "peer", "name", &peer],
    );
    ip_in(
        vm_ns,
        &["link", "set", &peer, "netns", &guest_ns.to_string_lossy()],
    );
    ip_in(guest_ns, &["link", "set", &peer, "name", &eth]);
    ip_in(guest_ns, &["link", "set", "lo", "up"]);
    ip_in(guest_ns, &["link", "set", &eth, "up"]);
    ip_in(
        guest_ns,
        &[
            "-6",
            "addr",
            "add",
            &format!("{address}/128"),
            "dev",
            &eth,
            "nodad",
        ],
    );
    if index == 0 {
        ip_in(
            guest_ns,
            &[
                "-6", "route", "add", "default", "via", "fe80::1", "dev", &eth,
            ],
        );
    }
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
    let gateway = Ipv4Addr::new(10, 87, 0, 1);
    let pod = PodInterface {
        owner: "default/client".into(),
        host_interface: host_interface_name("default/client"),
        netns: pod_ns.clone(),
        ipv6: allocate_pod_address(subnet, &BTreeSet::new(), &mut rng).unwrap(),
        egress: Some(PodEgress {
            address: Ipv4Addr::new(10, 87, 0, 2),
            gateway,
        }),
    };
    ops.ensure_pod_interface(&pod).await.unwrap();
    let vm = PodInterface {
        owner: "vm/default/tiny".into(),
        host_interface: host_interface_name("vm/default/tiny"),
        netns: vm_ns.clone(),
        ipv6: allocate_pod_address(subnet, &BTreeSet::from([pod.ipv6]), &mut rng).unwrap(),
        egress: Some(PodEgress {
            address: Ipv4Addr::new(10, 87, 0, 3),
            gateway,
        }),
    };
    fake_guest(&vm_ns, &guest_ns, 0, vm.ipv6);
    ops.ensure_vm_interface(&vm, &VmLink::nth(0, "tap0"))
        .await
        .unwrap();
    // Repeating is harmless.
    ops.ensure_vm_interface(&vm, &VmLink::nth(0, "tap0"))
        .await
        .unwrap();
    // The guest's IPv4, as the test guest sets it from the kernel command line.
    ip_in(&guest_ns, &["addr", "add", "10.87.0.3/32", "dev", "eth0"]);
    ip_in(&guest_ns, &["route", "add", "10.87.0.1", "dev", "eth0"]);
    ip_in(&guest_ns, &["route", "add", "default", "via", "10.87.0.1"]);
    // A second link with its own address (and its own host veth).
    let second = PodInterface {
        owner: "vm/default/tiny#backend".into(),
        host_interface: host_interface_name("vm/default/tiny#backend"),
        netns: vm_ns.clone(),
        ipv6: allocate_pod_address(subnet, &BTreeSet::from([pod.ipv6, vm.ipv6]), &mut rng).unwrap(),
        egress: None,
    };
    fake_guest(&vm_ns, &guest_ns, 1, second.ipv6);
    ops.ensure_vm_interface(&second, &VmLink::nth(1, "tap1"))
        .await
        .unwrap();
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
    assert!(
        !addresses.contains("eth1") && !addresses.contains("br1"),
        "{addresses}"
    );

    // The guest's gateway has the MAC every node gives this VM's link.
    let link = Command::new("nsenter")
        .arg(format!("--net={}", node.netns.display()))
        .args(["ip", "-o", "link", "show", "dev", &vm.host_interface])
        .output()
        .unwrap();
    let link = String::from_utf8_lossy(&link.stdout);
    let mac: Vec<String> = gateway_mac(&vm.host_interface)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        link.contains(&format!("link/ether {} ", mac.join(":"))),
        "{link}"
    );
    // A node route to the guest's /128 (as for a VM migrated away) lies
    // below the host route: both stay, and the guest is still reached
    // over its own link until that goes.
    let moved = NodeRoute {
        destination: vm.ipv6.into(),
        next_hop: NextHop::Interface(pod.host_interface.clone()),
    };
    ops.ensure_node_route(&moved).await.unwrap();
    assert_eq!(ops.list_node_routes().await.unwrap(), vec![moved.clone()]);

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

    // The second address is reached over the second link: the node routes
    // it to the second veth, whose bridge ends at the guest's eth1.
    let to_second = SocketAddr::new(IpAddr::V6(second.ipv6), 7103);
    let listener = common::listen_in(&guest_ns, to_second);
    let peer = common::connect_from(&pod_ns, &listener, to_second)
        .expect("the pod reaches the guest's second address");
    assert_eq!(peer.ip(), IpAddr::V6(pod.ipv6));

    // IPv4 between the guest and the pod, through the node.
    let to_pod = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 87, 0, 2)), 7104);
    let listener = common::listen_in(&pod_ns, to_pod);
    let peer = common::connect_from(&guest_ns, &listener, to_pod)
        .expect("the guest reaches the pod over IPv4");
    assert_eq!(peer.ip(), IpAddr::V4(Ipv4Addr::new(10, 87, 0, 3)));

    ops.remove_node_route(moved.destination).await.unwrap();
    assert!(ops.list_node_routes().await.unwrap().is_empty());
    ops.remove_pod_interface(&second.host_interface)
        .await
        .unwrap();
    ops.remove_pod_interface(&vm.host_interface).await.unwrap();
    ops.remove_pod_interface(&pod.host_interface).await.unwrap();
    let dir = lab.dir().to_path_buf();
    lab.down().unwrap();
    assert!(!dir.exists(), "lab directory {} left behind", dir.display());
}
