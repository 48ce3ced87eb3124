//! IPv4 egress: a pod's connection to an "outside" host arrives from its
//! node's address through corral's nftables masquerade. Needs root and `nft`.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use corral_net::datapath::{Netlink, NetworkOps, PodEgress, PodInterface, host_interface_name};
use corral_net::egress::{self, EgressConfig};
use corral_net::ipam::EgressRange;
use corral_net::netns;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_ipv4_egress_is_masqueraded_behind_the_node() {
    common::require_root_and_tools(&["nft"]);
    let mut lab = common::lab(1).await;
    let node = lab.nodes()[0].clone();
    let outside = lab.add_host("outside").await.unwrap();

    let range = EgressRange::default();
    let ops = Netlink::connect(Some(&node.netns)).await.unwrap();
    ops.enable_forwarding().await.unwrap();
    let pod_ns = lab.dir().join("pod");
    netns::create(&pod_ns).unwrap();
    let pod = PodInterface {
        owner: "default/egress".into(),
        host_interface: host_interface_name("default/egress"),
        netns: pod_ns.clone(),
        ipv6: "fd00:1:2:3::10".parse().unwrap(),
        egress: Some(PodEgress {
            address: range.allocate(&BTreeSet::new()).unwrap(),
            gateway: range.gateway(),
        }),
    };
    ops.ensure_pod_interface(&pod).await.unwrap();

    let config = EgressConfig {
        range,
        uplink: node.uplink.clone(),
    };
    let target = SocketAddr::new(IpAddr::V4(outside.ipv4), 9000);
    let listener = common::listen_in(&outside.netns, target);

    // Without masquerade the outside host has no route back to 10.87/22.
    assert_eq!(egress::current(Some(&node.netns)).unwrap(), None);
    let unmasqueraded = common::connect_from(&pod_ns, &listener, target);
    assert!(
        unmasqueraded.is_err(),
        "reached outside without NAT: {unmasqueraded:?}"
    );

    egress::apply(Some(&node.netns), &config).unwrap();
    egress::apply(Some(&node.netns), &config).unwrap();
    let table = egress::current(Some(&node.netns))
        .unwrap()
        .expect("table exists");
    assert_eq!(table.matches("masquerade").count(), 1, "{table}");
    assert!(table.contains("10.87.0.0/22"), "{table}");

    let peer = common::connect_from(&pod_ns, &listener, target).expect("pod reaches outside");
    assert_eq!(
        peer.ip(),
        IpAddr::V4(node.ipv4),
        "connection must come from the node"
    );

    egress::remove(Some(&node.netns)).unwrap();
    egress::remove(Some(&node.netns)).unwrap();
    assert_eq!(egress::current(Some(&node.netns)).unwrap(), None);
    lab.down().unwrap();
}
