//! WireGuard between two lab nodes (wireguard-go when the kernel has no
//! module): pod traffic routed `dev <wg>` crosses the tunnel.
//! Needs root, `wireguard-go` and `wg`.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use corral_net::datapath::{
    Netlink, NetworkOps, NextHop, NodeRoute, PodInterface, host_interface_name,
    reconcile_node_routes,
};
use corral_net::ipam::{ClusterPrefix, allocate_pod_address};
use corral_net::netns;
use corral_net::wireguard::{
    self, Backend, Peer, PrivateKey, USERSPACE_SOCKET_DIR, WireguardInterface,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

const PORT: u16 = 51820;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_traffic_between_nodes_crosses_wireguard() {
    common::require_root_and_tools(&["wireguard-go", "wg", "ip"]);
    let lab = common::lab(2).await;
    let nodes = lab.nodes().to_vec();
    let mut rng = StdRng::seed_from_u64(9);
    let cluster = ClusterPrefix::generate_ula(&mut rng);
    let mut taken = BTreeSet::new();
    let kernel = wireguard::kernel_module_available(Some(&nodes[0].netns))
        .await
        .unwrap();

    let mut subnets = Vec::new();
    let mut keys = Vec::new();
    let mut interfaces = Vec::new();
    let mut ops = Vec::new();
    let mut pods = Vec::new();
    for (index, node) in nodes.iter().enumerate() {
        let subnet = cluster.allocate_node_subnet(&taken, &mut rng).unwrap();
        taken.insert(subnet);
        subnets.push(subnet);
        let key = PrivateKey::generate(&mut rng);
        // Names are machine-wide for wireguard-go: pid + counter.
        let name = common::unique("cw");
        let interface = WireguardInterface::up(&name, Some(&node.netns), &key, PORT)
            .await
            .unwrap_or_else(|e| panic!("bring up {name}: {e}"));
        let expected = if kernel {
            Backend::Kernel
        } else {
            Backend::Userspace
        };
        assert_eq!(interface.backend(), expected);
        keys.push(key);
        interfaces.push(interface);

        let node_ops = Netlink::connect(Some(&node.netns)).await.unwrap();
        node_ops.enable_forwarding().await.unwrap();
        let ns = lab.dir().join(format!("pod-{index}"));
        netns::create(&ns).unwrap();
        let owner = format!("default/wg-{index}");
        let pod = PodInterface {
            host_interface: host_interface_name(&owner),
            owner,
            netns: ns,
            ipv6: allocate_pod_address(subnet, &BTreeSet::new(), &mut rng).unwrap(),
            egress: None,
        };
        node_ops.ensure_pod_interface(&pod).await.unwrap();
        ops.push(node_ops);
        pods.push(pod);
    }

    for (me, other) in [(0, 1), (1, 0)] {
        interfaces[me]
            .set_peer(&Peer {
                public_key: keys[other].public_key(),
                endpoint: SocketAddr::new(IpAddr::V6(nodes[other].ipv6), PORT),
                allowed_ips: vec![subnets[other].into()],
                persistent_keepalive: None,
            })
            .unwrap();
        let route = NodeRoute {
            destination: subnets[other],
            next_hop: NextHop::Interface(interfaces[me].name().to_string()),
        };
        reconcile_node_routes(&ops[me], std::slice::from_ref(&route))
            .await
            .unwrap();
        assert_eq!(ops[me].list_node_routes().await.unwrap(), vec![route]);
    }

    let before = interfaces[0].transfer().unwrap();
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].public_key, keys[1].public_key());

    let to_b = SocketAddr::new(IpAddr::V6(pods[1].ipv6), 7100);
    let listener = common::listen_in(&pods[1].netns, to_b);
    let peer =
        common::connect_from(&pods[0].netns, &listener, to_b).expect("pod 0 reaches pod 1 over wg");
    assert_eq!(peer.ip(), IpAddr::V6(pods[0].ipv6));

    let after = interfaces[0].transfer().unwrap();
    assert!(
        after[0].sent > before[0].sent && after[0].received > before[0].received,
        "wg counters did not rise: before {before:?} after {after:?}"
    );

    // Removing the peer cuts the path even though the route stays.
    interfaces[0].remove_peer(&keys[1].public_key()).unwrap();
    assert!(interfaces[0].transfer().unwrap().is_empty());

    let names: Vec<String> = interfaces.iter().map(|i| i.name().to_string()).collect();
    for interface in interfaces {
        interface.down().unwrap();
    }
    for name in &names {
        let socket = Path::new(USERSPACE_SOCKET_DIR).join(format!("{name}.sock"));
        assert!(!socket.exists(), "{} left behind", socket.display());
    }
    lab.down().unwrap();
}
