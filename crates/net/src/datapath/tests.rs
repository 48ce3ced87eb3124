use super::*;

fn net(s: &str) -> Ipv6Net {
    s.parse().unwrap()
}

fn via(dst: &str, gw: &str) -> NodeRoute {
    NodeRoute {
        destination: net(dst),
        next_hop: NextHop::Gateway(gw.parse().unwrap()),
    }
}

#[test]
fn plan_adds_missing_replaces_changed_removes_stale() {
    let existing = vec![
        via("fd00:0:0:1::/64", "fd99::1"),
        via("fd00:0:0:2::/64", "fd99::2"),
        via("fd00:0:0:3::/64", "fd99::3"),
    ];
    let desired = vec![
        via("fd00:0:0:1::/64", "fd99::1"),
        NodeRoute {
            destination: net("fd00:0:0:2::/64"),
            next_hop: NextHop::Interface("wg0".into()),
        },
        via("fd00:0:0:4::/64", "fd99::4"),
    ];
    let plan = plan_node_routes(&desired, &existing);
    assert_eq!(plan.ensure, vec![desired[1].clone(), desired[2].clone()]);
    assert_eq!(plan.remove, vec![net("fd00:0:0:3::/64")]);
    assert!(!plan.is_empty());
}

#[test]
fn plan_is_empty_when_in_sync_and_last_duplicate_wins() {
    let existing = vec![via("fd00:0:0:1::/64", "fd99::1")];
    assert!(plan_node_routes(&existing, &existing).is_empty());
    let desired = vec![
        via("fd00:0:0:1::/64", "fd99::9"),
        via("fd00:0:0:1::/64", "fd99::1"),
    ];
    assert!(plan_node_routes(&desired, &existing).is_empty());
}

#[tokio::test]
async fn reconcile_through_fake_is_idempotent() {
    let ops = FakeNetworkOps::new();
    ops.ensure_node_route(&via("fd00:0:0:9::/64", "fd99::9"))
        .await
        .unwrap();
    let desired = vec![
        via("fd00:0:0:1::/64", "fd99::1"),
        via("fd00:0:0:2::/64", "fd99::2"),
    ];
    let plan = reconcile_node_routes(&ops, &desired).await.unwrap();
    assert_eq!(plan.ensure.len(), 2);
    assert_eq!(plan.remove, vec![net("fd00:0:0:9::/64")]);
    assert_eq!(ops.list_node_routes().await.unwrap(), desired);
    let again = reconcile_node_routes(&ops, &desired).await.unwrap();
    assert!(again.is_empty());
}

#[tokio::test]
async fn fake_pod_interfaces_round_trip_and_remove_tolerates_absence() {
    let ops = FakeNetworkOps::new();
    let pod = PodInterface {
        owner: "default/web".into(),
        host_interface: host_interface_name("default/web"),
        netns: "/run/corral/netns/web".into(),
        ipv6: "fd00::5".parse().unwrap(),
        egress: None,
    };
    ops.ensure_pod_interface(&pod).await.unwrap();
    ops.ensure_pod_interface(&pod).await.unwrap();
    assert_eq!(
        ops.list_pod_interfaces().await.unwrap(),
        vec![PodInterfaceInfo {
            host_interface: pod.host_interface.clone(),
            owner: "default/web".into()
        }]
    );
    ops.remove_pod_interface(&pod.host_interface).await.unwrap();
    ops.remove_pod_interface(&pod.host_interface).await.unwrap();
    assert!(ops.list_pod_interfaces().await.unwrap().is_empty());
    let bad = PodInterface {
        host_interface: "much-too-long-name".into(),
        ..pod
    };
    let err = ops.ensure_pod_interface(&bad).await.unwrap_err();
    assert!(matches!(err, DatapathError::InterfaceName { .. }));
    assert!(err.to_string().contains("much-too-long-name"), "{err}");
}

#[test]
fn host_interface_names_are_stable_short_and_distinct() {
    let a = host_interface_name("default/web");
    assert_eq!(a, host_interface_name("default/web"));
    assert_ne!(a, host_interface_name("default/web2"));
    assert_eq!(a.len(), 14);
    assert!(a.starts_with(HOST_INTERFACE_PREFIX));
    validate_host_interface(&a).unwrap();
}

#[test]
fn host_interface_validation() {
    for bad in ["", "fifteen-chars-x", "a/b", "a:b", "a b", ".", ".."] {
        assert!(validate_host_interface(bad).is_err(), "{bad:?}");
    }
    for ok in ["crl0", "veth-a.1", "fourteen-chars"] {
        validate_host_interface(ok).unwrap();
    }
}

#[test]
fn link_local_addresses_follow_the_kernels_eui64() {
    // As the kernel made it for a veth with this address.
    assert_eq!(
        eui64_link_local(&[0xb2, 0xcc, 0xea, 0xa4, 0xbf, 0x5d]),
        Some("fe80::b0cc:eaff:fea4:bf5d".parse().unwrap())
    );
    assert_eq!(eui64_link_local(&[1, 2, 3]), None);
}

#[test]
fn a_vm_gateway_mac_is_the_same_everywhere_local_and_unicast() {
    let name = host_interface_name("vm/default/mover");
    let mac = gateway_mac(&name);
    assert_eq!(mac, gateway_mac(&name), "stable");
    assert_eq!(mac[0] & 0x01, 0, "unicast");
    assert_eq!(mac[0] & 0x02, 0x02, "locally administered");
    assert_ne!(mac, gateway_mac(&host_interface_name("vm/default/other")));
}
