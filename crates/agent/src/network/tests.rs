use super::*;
use corral_api::Kind;
use corral_net::datapath::FakeNetworkOps;

fn node(name: &str, prefix: Option<&str>, address: Option<&str>) -> Object {
    let mut object = Object::new(Kind::Node, None, name, serde_json::json!({}));
    object.status = serde_json::json!({"prefix": prefix, "address": address});
    object
}

fn config(uplink: Option<&str>) -> NetworkConfig {
    NetworkConfig {
        forwarding: Forwarding::Node,
        egress_uplink: uplink.map(str::to_string),
        egress_range: "10.87.0.0/22".parse().unwrap(),
        wireguard: None,
    }
}

#[test]
fn routes_go_to_every_other_node_with_prefix_and_address() {
    let nodes = vec![
        node("a", Some("fd00:1:2:1::/64"), Some("fd99::1")),
        node("b", Some("fd00:1:2:2::/64"), Some("fd99::2")),
        node("c", None, Some("fd99::3")),
        node("d", Some("fd00:1:2:4::/64"), None),
        node("e", Some("fd00:1:2:5::/64"), Some("not-an-address")),
    ];
    let routes = desired_routes("a", &nodes, None);
    assert_eq!(
        routes,
        vec![NodeRoute {
            destination: "fd00:1:2:2::/64".parse().unwrap(),
            next_hop: NextHop::Gateway("fd99::2".parse().unwrap()),
        }]
    );
    assert_eq!(describe(&routes), "fd00:1:2:2::/64 via fd99::2");
}

#[test]
fn routes_go_through_the_tunnel_only_to_nodes_with_one() {
    let mut b = node("b", Some("fd00:1:2:2::/64"), Some("fd99::2"));
    b.status["wireguard"] = serde_json::json!({
        "publicKey": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "endpoint": "[fd99::2]:51820",
    });
    let c = node("c", Some("fd00:1:2:3::/64"), Some("fd99::3"));
    let nodes = vec![b, c];
    let routes = desired_routes("a", &nodes, Some("crwg0"));
    assert_eq!(
        describe(&routes),
        "fd00:1:2:2::/64 dev crwg0, fd00:1:2:3::/64 via fd99::3"
    );
    // Without a tunnel of its own the node routes plainly to everyone.
    let plain = desired_routes("a", &nodes, None);
    assert_eq!(
        describe(&plain),
        "fd00:1:2:2::/64 via fd99::2, fd00:1:2:3::/64 via fd99::3"
    );
}

#[tokio::test]
async fn a_node_leaving_removes_its_route_and_joining_adds_it() {
    let fake = Arc::new(FakeNetworkOps::new());
    let network = PodNetwork::with_ops(fake.clone(), config(None));
    let mut nodes = vec![
        node("a", Some("fd00:1:2:1::/64"), Some("fd99::1")),
        node("b", Some("fd00:1:2:2::/64"), Some("fd99::2")),
        node("c", Some("fd00:1:2:3::/64"), Some("fd99::3")),
    ];
    let (_, plan) = network.reconcile_routes("a", &nodes, &[]).await.unwrap();
    assert_eq!(plan.ensure.len(), 2);
    nodes.remove(1);
    let (_, plan) = network.reconcile_routes("a", &nodes, &[]).await.unwrap();
    assert_eq!(plan.remove, vec!["fd00:1:2:2::/64".parse().unwrap()]);
    assert_eq!(fake.snapshot().routes.len(), 1);
    nodes.push(node("b", Some("fd00:1:2:9::/64"), Some("fd99::2")));
    let (_, plan) = network.reconcile_routes("a", &nodes, &[]).await.unwrap();
    assert_eq!(plan.ensure.len(), 1);
    assert_eq!(fake.snapshot().routes.len(), 2);
}

#[tokio::test]
async fn a_migrated_vms_address_is_routed_to_its_node_until_it_goes() {
    let fake = Arc::new(FakeNetworkOps::new());
    let network = PodNetwork::with_ops(fake.clone(), config(None));
    let nodes = vec![
        node("a", Some("fd00:1:2:1::/64"), Some("fd99::1")),
        node("b", Some("fd00:1:2:2::/64"), Some("fd99::2")),
    ];
    // A VM of a's /64 now runs on b: a routes its /128 there.
    let moved = VmPlace {
        node: "b".to_string(),
        addresses: vec!["fd00:1:2:1::10".parse().unwrap()],
    };
    let (routes, plan) = network
        .reconcile_routes("a", &nodes, std::slice::from_ref(&moved))
        .await
        .unwrap();
    assert_eq!(
        describe(&routes),
        "fd00:1:2:2::/64 via fd99::2, fd00:1:2:1::10/128 via fd99::2"
    );
    assert_eq!(plan.ensure.len(), 2);
    // Deleted (or home again): the /128 goes.
    let (_, plan) = network.reconcile_routes("a", &nodes, &[]).await.unwrap();
    assert_eq!(plan.remove, vec!["fd00:1:2:1::10/128".parse().unwrap()]);
    assert_eq!(fake.snapshot().routes.len(), 1);
}

#[tokio::test]
async fn pods_are_wired_with_egress_only_when_the_node_has_an_uplink() {
    let fake = Arc::new(FakeNetworkOps::new());
    let without = PodNetwork::with_ops(fake.clone(), config(None));
    assert_eq!(without.allocate_egress(&BTreeSet::new()).unwrap(), None);
    let with = PodNetwork::with_ops(fake.clone(), config(Some("eth0")));
    let v4 = with.allocate_egress(&BTreeSet::new()).unwrap().unwrap();
    assert!(with.config().egress_range.net().contains(&v4));
    let note = with
        .wire_pod(
            "default/web",
            Path::new("/run/x"),
            "fd00::5".parse().unwrap(),
            Some(v4),
        )
        .await
        .unwrap();
    assert!(note.contains("fd00::5"), "{note}");
    let state = fake.snapshot();
    let pod = state.pods.values().next().unwrap();
    assert_eq!(
        pod.egress.unwrap().gateway,
        with.config().egress_range.gateway()
    );
    with.unwire_pod("default/web").await.unwrap();
    assert!(fake.snapshot().pods.is_empty());
    let note = with.configure_node().await.unwrap();
    assert!(note.contains("forwarding on"), "{note}");
    assert!(fake.snapshot().forwarding);
}

#[tokio::test]
async fn vms_are_bridged_to_their_taps_with_egress_on_the_first() {
    let fake = Arc::new(FakeNetworkOps::new());
    let network = PodNetwork::with_ops(fake.clone(), config(Some("eth0")));
    let v4 = network.allocate_egress(&BTreeSet::new()).unwrap();
    let note = network
        .wire_vm(
            "vm/default/builder",
            Path::new("/run/vm"),
            "fd00::9".parse().unwrap(),
            v4,
            &VmLink::nth(0, "tap0"),
        )
        .await
        .unwrap();
    assert!(note.contains("fd00::9") && note.contains("tap0"), "{note}");
    let note = network
        .wire_vm(
            "vm/default/builder#backend",
            Path::new("/run/vm"),
            "fd00::a".parse().unwrap(),
            None,
            &VmLink::nth(1, "tap1"),
        )
        .await
        .unwrap();
    assert!(note.contains("tap1 in br1"), "{note}");
    let state = fake.snapshot();
    let host = datapath::host_interface_name("vm/default/builder");
    let second = datapath::host_interface_name("vm/default/builder#backend");
    let vm = &state.pods[&host];
    assert_eq!(vm.egress.map(|e| e.address), v4);
    assert_eq!(vm.owner, "vm/default/builder");
    assert_eq!(state.pods[&second].egress, None);
    assert_eq!(
        state.calls,
        vec![
            format!("ensure_vm_interface {host} eth0 tap0"),
            format!("ensure_vm_interface {second} eth1 tap1"),
        ]
    );
    assert_ne!(host, datapath::host_interface_name("default/builder"));
    assert_ne!(host, second);
}

#[test]
fn pod_address_comes_from_status() {
    let mut pod = Object::new(Kind::Pod, Some("default"), "web", serde_json::json!({}));
    assert!(matches!(pod_address(&pod), Err(NetworkError::NoAddress)));
    pod.status = serde_json::json!({"address": "fd00::7"});
    assert_eq!(
        pod_address(&pod).unwrap(),
        "fd00::7".parse::<Ipv6Addr>().unwrap()
    );
    pod.status = serde_json::json!({"address": "10.0.0.1"});
    assert!(matches!(
        pod_address(&pod),
        Err(NetworkError::BadAddress(_))
    ));
}
