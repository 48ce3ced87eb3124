//! Two lab nodes, a pod on each, plain IPv6 routes between the node /64s.
//! Needs root; fails (does not skip) without it.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use corral_net::datapath::{
    Netlink, NetworkOps, NextHop, NodeRoute, PodEgress, PodInterface, PodInterfaceInfo,
    host_interface_name, reconcile_node_routes,
};
use corral_net::ipam::{ClusterPrefix, EgressRange, allocate_pod_address};
use corral_net::netns;
use rand::SeedableRng;
use rand::rngs::StdRng;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_two_nodes_reach_each_other_over_plain_ipv6_routes() {
    common::require_root_and_tools(&[]);
    let lab = common::lab(2).await;
    let [node_a, node_b] = lab.nodes() else {
        panic!("lab has {} nodes", lab.nodes().len())
    };

    let mut rng = StdRng::seed_from_u64(1);
    let cluster = ClusterPrefix::generate_ula(&mut rng);
    let subnet_a = cluster
        .allocate_node_subnet(&BTreeSet::new(), &mut rng)
        .unwrap();
    let subnet_b = cluster
        .allocate_node_subnet(&BTreeSet::from([subnet_a]), &mut rng)
        .unwrap();
    let egress = EgressRange::default();

    let ops_a = Netlink::connect(Some(&node_a.netns)).await.unwrap();
    let ops_b = Netlink::connect(Some(&node_b.netns)).await.unwrap();
    let mut pods = Vec::new();
    for (ops, subnet, name) in [(&ops_a, subnet_a, "pod-a"), (&ops_b, subnet_b, "pod-b")] {
        ops.enable_forwarding().await.unwrap();
        let ns = lab.dir().join(name);
        netns::create(&ns).unwrap();
        let owner = format!("default/{name}");
        let pod = PodInterface {
            host_interface: host_interface_name(&owner),
            owner,
            netns: ns,
            ipv6: allocate_pod_address(subnet, &BTreeSet::new(), &mut rng).unwrap(),
            egress: Some(PodEgress {
                address: egress.allocate(&BTreeSet::new()).unwrap(),
                gateway: egress.gateway(),
            }),
        };
        ops.ensure_pod_interface(&pod).await.unwrap();
        // Repeating is harmless.
        ops.ensure_pod_interface(&pod).await.unwrap();
        assert_eq!(
            ops.list_pod_interfaces().await.unwrap(),
            vec![PodInterfaceInfo {
                host_interface: pod.host_interface.clone(),
                owner: pod.owner.clone()
            }]
        );
        pods.push(pod);
    }
    let (pod_a, pod_b) = (&pods[0], &pods[1]);

    let route_to_b = NodeRoute {
        destination: subnet_b,
        next_hop: NextHop::Gateway(node_b.ipv6),
    };
    let route_to_a = NodeRoute {
        destination: subnet_a,
        next_hop: NextHop::Gateway(node_a.ipv6),
    };
    let plan = reconcile_node_routes(&ops_a, std::slice::from_ref(&route_to_b))
        .await
        .unwrap();
    assert_eq!(plan.ensure, vec![route_to_b.clone()]);
    reconcile_node_routes(&ops_b, std::slice::from_ref(&route_to_a))
        .await
        .unwrap();
    assert!(
        reconcile_node_routes(&ops_a, std::slice::from_ref(&route_to_b))
            .await
            .unwrap()
            .is_empty(),
        "second reconcile must change nothing"
    );
    assert_eq!(
        ops_a.list_node_routes().await.unwrap(),
        vec![route_to_b.clone()]
    );

    // Pod A -> pod B over IPv6, no NAT: B sees A's own address.
    let to_b = SocketAddr::new(IpAddr::V6(pod_b.ipv6), 7001);
    let listener = common::listen_in(&pod_b.netns, to_b);
    let peer = common::connect_from(&pod_a.netns, &listener, to_b).expect("pod A reaches pod B");
    assert_eq!(peer.ip(), IpAddr::V6(pod_a.ipv6));
    // And back.
    let to_a = SocketAddr::new(IpAddr::V6(pod_a.ipv6), 7002);
    let listener_a = common::listen_in(&pod_a.netns, to_a);
    let peer = common::connect_from(&pod_b.netns, &listener_a, to_a).expect("pod B reaches pod A");
    assert_eq!(peer.ip(), IpAddr::V6(pod_b.ipv6));

    // Node B leaves: its route goes, and so does reachability.
    ops_a.remove_node_route(subnet_b).await.unwrap();
    ops_a.remove_node_route(subnet_b).await.unwrap();
    assert!(ops_a.list_node_routes().await.unwrap().is_empty());
    let refused = common::connect_from(&pod_a.netns, &listener, to_b);
    assert!(
        refused.is_err(),
        "pod B still reachable without a route: {refused:?}"
    );

    // Removing pod interfaces twice is fine and leaves nothing listed.
    ops_a
        .remove_pod_interface(&pod_a.host_interface)
        .await
        .unwrap();
    ops_a
        .remove_pod_interface(&pod_a.host_interface)
        .await
        .unwrap();
    assert!(ops_a.list_pod_interfaces().await.unwrap().is_empty());

    let dir = lab.dir().to_path_buf();
    lab.down().unwrap();
    assert!(!dir.exists(), "lab directory {} left behind", dir.display());
}

#[test]
fn persistent_namespaces_are_idempotent() {
    common::require_root_and_tools(&[]);
    let path = std::path::PathBuf::from("/run/corral/test-netns").join(common::unique("ns"));
    struct Cleanup<'a>(&'a std::path::Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = netns::delete(self.0);
        }
    }
    let _cleanup = Cleanup(&path);
    assert!(!netns::exists(&path));
    netns::create(&path).unwrap();
    netns::create(&path).unwrap();
    assert!(netns::exists(&path));
    // A different namespace than ours: it has only `lo`.
    let links = netns::run_in(&path, || {
        std::fs::read_to_string("/proc/thread-self/net/dev")
    })
    .unwrap()
    .unwrap();
    assert_eq!(links.lines().count(), 3, "{links}");
    netns::delete(&path).unwrap();
    netns::delete(&path).unwrap();
    assert!(!path.exists());
    let err = netns::run_in(&path, || ()).unwrap_err();
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

/// A pod's veth is made in one request with its pod end already inside the
/// pod's namespace under its final name. A namespace that cannot take it
/// (here one that has an `eth0` already) leaves nothing on the node; the
/// pair used to be made on the node, then moved and renamed, so a failure
/// in between, or an agent killed between those requests, left the node's
/// end behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_veth_whose_namespace_cannot_take_it_leaves_nothing_on_the_node() {
    common::require_root_and_tools(&["nsenter", "ip"]);
    let lab = common::lab(1).await;
    let node = lab.nodes()[0].clone();
    let ops = Netlink::connect(Some(&node.netns)).await.unwrap();
    let in_netns = |netns: &std::path::Path, args: &[&str]| {
        std::process::Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(args)
            .output()
            .expect("run ip in a namespace")
    };
    let pod_ns = lab.dir().join("spare");
    netns::create(&pod_ns).unwrap();
    let taken = in_netns(
        &pod_ns,
        &[
            "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other",
        ],
    );
    assert!(taken.status.success(), "{taken:?}");
    let host = host_interface_name("default/spare");

    let made = ops.create_spare_interface(&host, &pod_ns).await;
    assert!(made.is_err(), "a second eth0 was made: {made:?}");
    let links = in_netns(&node.netns, &["ip", "-o", "link", "show"]);
    assert!(links.status.success(), "{links:?}");
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(
        !links.contains(&host),
        "a veth end was left on the node:\n{links}"
    );

    // Once the name is free the namespace takes it, as `eth0`.
    let freed = in_netns(&pod_ns, &["ip", "link", "del", "eth0"]);
    assert!(freed.status.success(), "{freed:?}");
    ops.create_spare_interface(&host, &pod_ns).await.unwrap();
    let inside = in_netns(&pod_ns, &["ip", "-o", "link", "show", "eth0"]);
    assert!(
        inside.status.success(),
        "no eth0 in the namespace: {inside:?}"
    );
    let inside = String::from_utf8_lossy(&inside.stdout);
    assert!(inside.contains("eth0@"), "eth0 is no veth end: {inside}");
    ops.remove_pod_interface(&host).await.unwrap();
}
