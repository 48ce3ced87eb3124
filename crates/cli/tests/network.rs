//! IPv6-only networking across nodes, end to end on a 3-node `corral lab`:
//! pods on different nodes reach each other over plain routes, a pod's
//! `status.address` is the address it has, routes follow nodes leaving
//! and joining, IPv4 egress leaves masqueraded as the node, and `why`
//! shows the join steps. Needs root, runc, nft and busybox; fails without.
//! (busybox 1.35's `wget -T` crashes, so `timeout` bounds each fetch.)

mod common;

use std::process::Command;
use std::time::Duration;

use common::lab::{Lab, OutsideHost, accept_one, httpd_pod};
use common::{CORRAL, wait_for};

#[test]
fn three_node_lab_routes_pods_across_nodes() {
    corral_testkit::require_root();
    for tool in ["runc", "nft", "ip"] {
        corral_testkit::require_tool(tool);
    }
    let images = tempfile::tempdir().expect("temp dir");
    let tar =
        corral_testkit::busybox_image_tar(images.path(), corral_testkit::ImageFormat::OciLayout);
    let lab = Lab::up("network", 3, &tar, &[]);

    // `why node/NAME` shows the join steps.
    let why = lab.corral(&["why", "node/node-1"]);
    for expected in [
        "ipam/assign-prefix",
        "node/configure-routes",
        "routes:",
        "node/configure-egress",
        "masqueraded out of eth0",
        "ready (target)",
    ] {
        assert!(why.contains(expected), "why lacks {expected:?}:\n{why}");
    }

    // Every node routes to the other two nodes' /64s: at once for the
    // nodes that joined last, and, for a node that joined before the others
    // had a /64, as soon as its routes loop sees their Node objects.
    for node in ["node-0", "node-1", "node-2"] {
        let routes = wait_for(
            &format!("{node}'s routes to the other nodes"),
            Duration::from_secs(10),
            || {
                let routes = lab.routes(node);
                (routes.lines().count() == 2).then_some(routes)
            },
        );
        assert_eq!(routes.lines().count(), 2, "{node} routes:\n{routes}");
    }

    // Pods on different nodes reach each other over IPv6.
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

    // status.address is the address the pod has.
    let seen = lab.corral(&[
        "exec",
        "pod/web-0",
        "--",
        "ip",
        "-6",
        "addr",
        "show",
        "dev",
        "eth0",
    ]);
    assert!(
        seen.contains(&format!("{address0}/128")),
        "web-0 has not {address0}:\n{seen}"
    );

    let fetched = wait_for("web-1 fetches from web-0", Duration::from_secs(30), || {
        lab.fetch("web-1", &format!("http://[{address0}]:8080/passwd"))
            .ok()
    });
    assert!(fetched.contains("root:"), "{fetched}");
    let back = lab
        .fetch("web-0", &format!("http://[{address1}]:8080/group"))
        .unwrap_or_else(|error| panic!("fetch failed: {error}"));
    assert!(back.contains("root:"), "{back}");

    // Pods find each other by DNS name, served by their node's agent.
    let resolv = lab.corral(&["exec", "pod/web-1", "--", "cat", "/etc/resolv.conf"]);
    assert!(resolv.contains("nameserver "), "{resolv}");
    let answer = wait_for(
        "nslookup of web-0 from web-1",
        Duration::from_secs(20),
        || {
            lab.try_corral(&[
                "exec",
                "pod/web-1",
                "--",
                "nslookup",
                "-type=AAAA",
                "web-0.default.pod.corral",
            ])
            .ok()
            .filter(|out| out.contains(&address0))
        },
    );
    assert!(answer.contains(&address0), "{answer}");
    let by_name = lab.corral(&[
        "exec",
        "pod/web-1",
        "--",
        "busybox",
        "timeout",
        "5",
        "wget",
        "-qO-",
        "http://web-0.default.pod.corral:8080/passwd",
    ]);
    assert!(by_name.contains("root:"), "{by_name}");

    // IPv4 egress reaches an "outside" namespace, arriving from the node.
    let outside = OutsideHost::create(&lab);
    let listener = outside.listen();
    let target = format!("http://{}:9000/", outside.ipv4);
    let fetch = std::thread::spawn({
        let dir = lab.dir.clone();
        move || {
            Command::new(CORRAL)
                .args(["lab", "exec", "--dir"])
                .arg(&dir)
                .args([
                    "--",
                    CORRAL,
                    "exec",
                    "pod/web-1",
                    "--",
                    "busybox",
                    "timeout",
                    "10",
                    "wget",
                    "-qO-",
                ])
                .arg(&target)
                .output()
                .expect("run wget in web-1")
        }
    });
    let peer = accept_one(&listener);
    let fetched = fetch.join().expect("wget thread");
    assert!(
        String::from_utf8_lossy(&fetched.stdout).contains("outside"),
        "wget through egress: {}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    assert_eq!(
        peer.ip().to_string(),
        lab.node_field(1, "ipv4"),
        "egress must arrive masqueraded as node-1"
    );

    // A node leaving removes its route on the others; joining adds it.
    let node2 = lab.corral(&["get", "node/node-2", "-o", "json"]);
    let node2: serde_json::Value = serde_json::from_str(&node2).expect("node JSON");
    let prefix2 = node2["status"]["prefix"]
        .as_str()
        .expect("prefix")
        .to_string();
    assert!(lab.routes("node-0").contains(&prefix2));
    let stopped = lab.lab(&["stop-agent", "node-2"]);
    assert!(stopped.status.success(), "{stopped:?}");
    lab.corral(&["delete", "node/node-2"]);
    for node in ["node-0", "node-1"] {
        wait_for(
            &format!("{node} to drop the route to {prefix2}"),
            Duration::from_secs(20),
            || (!lab.routes(node).contains(&prefix2)).then_some(()),
        );
    }
    let started = lab.lab(&["start-agent", "node-2"]);
    assert!(started.status.success(), "{started:?}");
    let prefix2 = wait_for("node-2 to join again", Duration::from_secs(30), || {
        let text = lab.try_corral(&["get", "node/node-2", "-o", "json"]).ok()?;
        let node: serde_json::Value = serde_json::from_str(&text).ok()?;
        node["status"]["prefix"].as_str().map(str::to_string)
    });
    for node in ["node-0", "node-1"] {
        wait_for(
            &format!("{node} to route to {prefix2} again"),
            Duration::from_secs(20),
            || lab.routes(node).contains(&prefix2).then_some(()),
        );
    }
}
