//! The lab removes every namespace, link and process it made.
//! Needs root and `sleep`.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use corral_net::netns;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_nodes_share_a_bridge_and_down_removes_everything() {
    common::require_root_and_tools(&["sleep"]);
    let lab = common::lab(3).await;
    let nodes = lab.nodes().to_vec();
    assert_eq!(nodes.len(), 3);
    assert_eq!(
        nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["node-0", "node-1", "node-2"]
    );

    // Node 2 reaches node 0 on the bridge over IPv6 and IPv4.
    for ip in [IpAddr::V6(nodes[0].ipv6), IpAddr::V4(nodes[0].ipv4)] {
        let to = SocketAddr::new(ip, 7200);
        let listener = common::listen_in(&nodes[0].netns, to);
        let peer =
            common::connect_from(&nodes[2].netns, &listener, to).expect("nodes share the bridge");
        let expected = match ip {
            IpAddr::V6(_) => IpAddr::V6(nodes[2].ipv6),
            IpAddr::V4(_) => IpAddr::V4(nodes[2].ipv4),
        };
        assert_eq!(peer.ip(), expected);
    }

    // A process left inside a node is killed by `down`.
    let mut sleeper = netns::spawn(Some(&nodes[1].netns), Command::new("sleep").arg("60"))
        .unwrap()
        .unwrap();
    let dir = lab.dir().to_path_buf();
    lab.down().unwrap();
    let status = sleeper.wait().unwrap();
    assert!(!status.success(), "sleep inside the lab survived: {status}");
    assert!(!dir.exists(), "{} left behind", dir.display());
    for node in &nodes {
        assert!(!netns::exists(&node.netns));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_lab_removes_it() {
    common::require_root_and_tools(&[]);
    let lab = common::lab(1).await;
    let dir = lab.dir().to_path_buf();
    assert!(netns::exists(&lab.nodes()[0].netns));
    drop(lab);
    assert!(!dir.exists(), "{} left behind", dir.display());
}
