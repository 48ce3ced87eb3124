//! WireGuard between nodes, end to end on a 2-node `corral lab --wireguard`:
//! each node publishes its tunnel, `why` shows the tunnel step with its
//! peers, pod-to-pod traffic between the nodes crosses the tunnel (its
//! counters rise) while the nodes' plain links carry only WireGuard's UDP
//! (an nftables counter of pod-addressed packets on node-1's `eth0` stays
//! at zero), and a node leaving is dropped as a peer. Needs root, runc,
//! nft, wg and wireguard-go (or the kernel module); fails without.

mod common;

use std::path::Path;
use std::time::Duration;

use common::lab::{Lab, httpd_pod};
use common::wait_for;

/// The node's tunnel interface, as its agent recorded it.
fn interface(lab: &Lab, node: &str) -> String {
    let path = lab.dir.join(node).join("wireguard").join("interface");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// Bytes received and sent over `node`'s tunnel, summed over peers.
fn transfer(lab: &Lab, node: &str) -> (u64, u64) {
    let interface = interface(lab, node);
    let text = lab.run(node, &["wg", "show", &interface, "transfer"]);
    corral_net::wireguard::parse_transfer(&text)
        .expect("wg show transfer")
        .iter()
        .fold((0, 0), |(rx, tx), p| (rx + p.received, tx + p.sent))
}

/// Packets counted by the named nftables counter in `node`.
fn counter(lab: &Lab, node: &str, name: &str) -> u64 {
    let text = lab.run(node, &["nft", "list", "counter", "inet", NFT_TABLE, name]);
    text.split_whitespace()
        .skip_while(|word| *word != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no packet count in:\n{text}"))
}

/// Node `name` as JSON.
fn node(lab: &Lab, name: &str) -> serde_json::Value {
    lab.json(&format!("node/{name}")).expect("node JSON")
}

/// The pid of the wireguard-go serving `interface` (one, or the test fails).
fn wireguard_go_pid(interface: &str) -> u32 {
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                args.first().is_some_and(|a| a.ends_with(b"wireguard-go"))
                    && args.contains(&interface.as_bytes())
            })
        })
        .collect();
    assert_eq!(
        pids.len(),
        1,
        "wireguard-go processes for {interface}: {pids:?}"
    );
    pids[0]
}

/// The test's nftables table in node-1 (its namespace dies with the lab).
const NFT_TABLE: &str = "corral_wg_test";

#[test]
fn pod_traffic_between_nodes_crosses_wireguard_only() {
    corral_testkit::require_root();
    for tool in ["runc", "nft", "ip", "wg"] {
        corral_testkit::require_tool(tool);
    }
    // This kernel may lack the module; then wireguard-go must be there.
    if !Path::new("/sys/module/wireguard").exists() {
        corral_testkit::require_tool("wireguard-go");
    }
    let images = tempfile::tempdir().expect("temp dir");
    let tar =
        corral_testkit::busybox_image_tar(images.path(), corral_testkit::ImageFormat::OciLayout);
    let lab = Lab::up("wg", 2, &tar, &["--wireguard"]);

    // Each node publishes its tunnel: key and endpoint.
    let node0 = node(&lab, "node-0");
    let node1 = node(&lab, "node-1");
    let lab_state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lab.dir.join("lab.json")).expect("lab.json"))
            .expect("lab.json is JSON");
    for (index, node) in [&node0, &node1].into_iter().enumerate() {
        let wireguard = &node["status"]["wireguard"];
        let key = wireguard["publicKey"]
            .as_str()
            .expect("status.wireguard.publicKey");
        key.parse::<corral_net::wireguard::PublicKey>()
            .expect("a WireGuard public key");
        let address = lab_state["nodes"][index]["ipv6"].as_str().expect("ipv6");
        assert_eq!(wireguard["endpoint"], format!("[{address}]:51820"));
    }
    let key_file = lab.dir.join("node-0").join("wireguard").join("private.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key_file)
            .expect("private key")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "{} mode {mode:o}", key_file.display());

    // `why node/NAME` shows the join steps: prefix, tunnel and its peers,
    // routes. The notes are what each step saw: the node that joined while
    // the other had no tunnel yet says so, and gets its peer from the
    // routes loop right after (checked on the tunnel itself below).
    let interface1 = interface(&lab, "node-1");
    let why = lab.corral(&["why", "node/node-1"]);
    let peer0 = format!(
        "peers: node-0 at [{}]:51820 for {}",
        lab_state["nodes"][0]["ipv6"].as_str().unwrap_or_default(),
        node0["status"]["prefix"].as_str().unwrap_or_default()
    );
    for expected in [
        "ipam/assign-prefix".to_string(),
        "node/configure-tunnel".to_string(),
        format!("tunnel {interface1}"),
        "peers: ".to_string(),
        "node/configure-routes".to_string(),
        "ready (target)".to_string(),
    ] {
        assert!(why.contains(&expected), "why lacks {expected:?}:\n{why}");
    }
    assert!(
        why.contains(&peer0) || why.contains("peers: no other node has a tunnel yet"),
        "why names neither node-0 nor the absence of peers:\n{why}"
    );
    // Each tunnel has the other node as its peer.
    for (node, other) in [("node-0", &node1), ("node-1", &node0)] {
        let key = other["status"]["wireguard"]["publicKey"]
            .as_str()
            .expect("the other node's key")
            .to_string();
        let interface = interface(&lab, node);
        wait_for(
            &format!("{node}'s tunnel to peer with the other node"),
            Duration::from_secs(20),
            || {
                lab.run(node, &["wg", "show", &interface, "peers"])
                    .contains(&key)
                    .then_some(())
            },
        );
    }

    // Routes to the other node's /64 go through the tunnel.
    let interface0 = interface(&lab, "node-0");
    let prefix1 = node1["status"]["prefix"]
        .as_str()
        .expect("prefix")
        .to_string();
    wait_for(
        "node-0 to route node-1 through its tunnel",
        Duration::from_secs(20),
        || {
            let routes = lab.run("node-0", &["ip", "-6", "route", "show", "proto", "87"]);
            routes
                .lines()
                .any(|l| l.starts_with(&prefix1) && l.contains(&format!("dev {interface0}")))
                .then_some(())
        },
    );

    let manifest = lab.dir.join("pods.yaml");
    std::fs::write(
        &manifest,
        format!(
            "{}---\n{}",
            httpd_pod("web-0", "node-0"),
            httpd_pod("web-1", "node-1")
        ),
    )
    .expect("write manifest");
    lab.corral(&["apply", "-f", &manifest.to_string_lossy()]);
    let address0 = lab.running_address("web-0");
    let address1 = lab.running_address("web-1");

    // Count, on node-1's plain link, every packet to or from a pod /64 or
    // the pods' port, and the WireGuard UDP.
    let prefix0 = node0["status"]["prefix"].as_str().expect("prefix");
    let pods = format!("{{ {prefix0}, {prefix1} }}");
    let rules = format!(
        "table inet {NFT_TABLE} {{\n\
         counter leaked {{}}\n\
         counter wireguard {{}}\n\
         chain in {{ type filter hook prerouting priority -300; policy accept;\n\
           iifname \"eth0\" ip6 saddr {pods} counter name leaked\n\
           iifname \"eth0\" ip6 daddr {pods} counter name leaked\n\
           iifname \"eth0\" tcp sport 8080 counter name leaked\n\
           iifname \"eth0\" tcp dport 8080 counter name leaked\n\
           iifname \"eth0\" udp dport 51820 counter name wireguard\n }}\n\
         chain out {{ type filter hook postrouting priority -300; policy accept;\n\
           oifname \"eth0\" ip6 saddr {pods} counter name leaked\n\
           oifname \"eth0\" ip6 daddr {pods} counter name leaked\n\
           oifname \"eth0\" tcp sport 8080 counter name leaked\n\
           oifname \"eth0\" tcp dport 8080 counter name leaked\n\
           oifname \"eth0\" udp dport 51820 counter name wireguard\n }}\n\
         }}\n"
    );
    let rules_file = lab.dir.join("count.nft");
    std::fs::write(&rules_file, rules).expect("write nft rules");
    lab.run("node-1", &["nft", "-f", &rules_file.to_string_lossy()]);
    let wireguard_before = counter(&lab, "node-1", "wireguard");
    let (rx0, tx0) = transfer(&lab, "node-0");
    let (rx1, tx1) = transfer(&lab, "node-1");

    // Pods on the two nodes reach each other, both ways.
    let fetched = wait_for("web-1 fetches from web-0", Duration::from_secs(30), || {
        lab.fetch("web-1", &format!("http://[{address0}]:8080/passwd"))
            .ok()
    });
    assert!(fetched.contains("root:"), "{fetched}");
    for _ in 0..5 {
        let back = lab
            .fetch("web-0", &format!("http://[{address1}]:8080/group"))
            .unwrap_or_else(|error| panic!("fetch failed: {error}"));
        assert!(back.contains("root:"), "{back}");
    }

    // The tunnel carried it: its counters rose on both ends.
    let (rx0_after, tx0_after) = transfer(&lab, "node-0");
    let (rx1_after, tx1_after) = transfer(&lab, "node-1");
    assert!(
        rx0_after > rx0 && tx0_after > tx0 && rx1_after > rx1 && tx1_after > tx1,
        "tunnel counters did not rise: node-0 {rx0}/{tx0} -> {rx0_after}/{tx0_after}, \
         node-1 {rx1}/{tx1} -> {rx1_after}/{tx1_after}"
    );
    // The plain link saw WireGuard's UDP, and nothing pod-addressed.
    let wireguard_after = counter(&lab, "node-1", "wireguard");
    assert!(
        wireguard_after > wireguard_before,
        "no WireGuard UDP on node-1's eth0 ({wireguard_before} -> {wireguard_after})"
    );
    assert_eq!(
        counter(&lab, "node-1", "leaked"),
        0,
        "pod traffic crossed node-1's eth0 outside the tunnel"
    );

    // The tunnel outlives its agent: with node-1's agent stopped pods still
    // talk, and the restarted agent adopts the same wireguard-go.
    let userspace = why.contains("(wireguard-go)");
    let interface1_pid = userspace.then(|| wireguard_go_pid(&interface1));
    lab.lab_ok(&["stop-agent", "node-1"]);
    let during = lab
        .fetch("web-0", &format!("http://[{address1}]:8080/group"))
        .unwrap_or_else(|error| panic!("fetch failed: {error}"));
    assert!(during.contains("root:"), "{during}");
    lab.lab_ok(&["start-agent", "node-1"]);
    // `start-agent` starts a fresh log; the agent logs its tunnel at start.
    wait_for(
        "node-1's restarted agent to take its tunnel",
        Duration::from_secs(30),
        || {
            let log = std::fs::read_to_string(lab.dir.join("logs").join("node-1.log")).ok()?;
            log.contains("wireguard tunnel up").then_some(())
        },
    );
    if let Some(pid) = interface1_pid {
        assert_eq!(
            wireguard_go_pid(&interface1),
            pid,
            "the restarted agent replaced wireguard-go instead of adopting it"
        );
    }
    let (rx_before, _) = transfer(&lab, "node-1");
    let after_restart = lab
        .fetch("web-0", &format!("http://[{address1}]:8080/group"))
        .unwrap_or_else(|error| panic!("fetch failed: {error}"));
    assert!(after_restart.contains("root:"), "{after_restart}");
    assert!(transfer(&lab, "node-1").0 > rx_before);

    // A node leaving stops being a peer (and its route goes). Its agent
    // is gone and web-1 is pinned there, so the drain would wait for
    // web-1 (design 0030): the operator skips it.
    lab.lab_ok(&["stop-agent", "node-1"]);
    lab.corral(&["delete", "node/node-1", "--force"]);
    wait_for(
        "node-0 to drop node-1 as a peer",
        Duration::from_secs(20),
        || {
            let peers = lab.run("node-0", &["wg", "show", &interface0, "peers"]);
            let routes = lab.run("node-0", &["ip", "-6", "route", "show", "proto", "87"]);
            (peers.trim().is_empty() && !routes.contains(&prefix1)).then_some(())
        },
    );
}
