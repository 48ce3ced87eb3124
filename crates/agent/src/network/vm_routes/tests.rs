use super::*;
use corral_api::Kind;
use serde_json::json;

fn node(name: &str, prefix: &str, address: &str) -> Object {
    let mut object = Object::new(Kind::Node, None, name, json!({}));
    object.status = json!({"prefix": prefix, "address": address});
    object
}

/// Three nodes: a (fd00:0:0:1::/64), b (…:2::/64), c (…:3::/64).
fn nodes() -> Vec<Object> {
    vec![
        node("a", "fd00:0:0:1::/64", "fd99::1"),
        node("b", "fd00:0:0:2::/64", "fd99::2"),
        node("c", "fd00:0:0:3::/64", "fd99::3"),
    ]
}

fn place(node: &str, addresses: &[&str]) -> VmPlace {
    VmPlace {
        node: node.to_string(),
        addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
    }
}

fn described(routes: &[NodeRoute]) -> String {
    crate::network::describe(routes)
}

#[test]
fn a_vm_at_home_needs_no_route() {
    let vms = [place("a", &["fd00:0:0:1::10", "fd00:0:0:1::11"])];
    for own in ["a", "b", "c"] {
        assert!(vm_routes(own, &nodes(), &vms, None).is_empty(), "{own}");
    }
}

#[test]
fn every_other_node_routes_a_moved_vms_addresses_to_the_node_running_it() {
    // From a's /64, now on b, with a further interface.
    let vms = [place("b", &["fd00:0:0:1::10", "fd00:0:0:1::11"])];
    // b runs it: its host routes serve it.
    assert!(vm_routes("b", &nodes(), &vms, None).is_empty());
    // a, whose /64 the addresses come from, and c route them to b.
    for own in ["a", "c"] {
        assert_eq!(
            described(&vm_routes(own, &nodes(), &vms, None)),
            "fd00:0:0:1::10/128 via fd99::2, fd00:0:0:1::11/128 via fd99::2",
            "{own}"
        );
    }
}

#[test]
fn a_vm_moved_on_again_or_back_home_routes_accordingly() {
    // a → b → c: everyone but c routes it to c.
    let vms = [place("c", &["fd00:0:0:1::10"])];
    assert_eq!(
        described(&vm_routes("b", &nodes(), &vms, None)),
        "fd00:0:0:1::10/128 via fd99::3"
    );
    assert!(vm_routes("c", &nodes(), &vms, None).is_empty());
    // Back on a: its /64 covers it again, no /128 anywhere.
    let vms = [place("a", &["fd00:0:0:1::10"])];
    assert!(vm_routes("b", &nodes(), &vms, None).is_empty());
    assert!(vm_routes("c", &nodes(), &vms, None).is_empty());
}

#[test]
fn the_tunnel_carries_a_moved_vm_when_its_node_has_one() {
    let mut nodes = nodes();
    nodes[1].status["wireguard"] = json!({
        "publicKey": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "endpoint": "[fd99::2]:51820",
    });
    let vms = [
        place("b", &["fd00:0:0:1::10"]),
        place("c", &["fd00:0:0:1::20"]),
    ];
    assert_eq!(
        described(&vm_routes("a", &nodes, &vms, Some("crwg0"))),
        "fd00:0:0:1::10/128 dev crwg0, fd00:0:0:1::20/128 via fd99::3"
    );
    // b's peer is allowed the moved address besides its /64; c's too.
    let moved = moved_addresses(&nodes, &vms);
    assert_eq!(
        moved.get("b"),
        Some(&vec!["fd00:0:0:1::10/128".parse().unwrap()])
    );
    assert_eq!(
        moved.get("c"),
        Some(&vec!["fd00:0:0:1::20/128".parse().unwrap()])
    );
    assert_eq!(moved.get("a"), None);
}

#[test]
fn a_vm_on_an_unknown_node_or_one_without_an_address_is_not_routed() {
    let mut nodes = nodes();
    nodes[2].status["address"] = serde_json::Value::Null;
    let vms = [
        place("c", &["fd00:0:0:1::10"]),
        place("z", &["fd00:0:0:1::11"]),
    ];
    assert!(vm_routes("a", &nodes, &vms, None).is_empty());
}

fn vm(status: serde_json::Value) -> Object {
    let mut object = Object::new(Kind::VirtualMachine, Some("default"), "v", json!({}));
    object.status = status;
    object
}

fn migrate_instance(outcome: &str, steps: serde_json::Value) -> serde_json::Value {
    json!({"instances": [
        {"id": "start-1", "workflow": "start", "definition": "vm-start", "revision": 1,
         "startedAt": "2026-12-02T10:00:00Z", "outcome": "succeeded"},
        {"id": "migrate-2", "workflow": "migrate", "definition": "vm-migrate", "revision": 3,
         "startedAt": "2026-12-02T10:01:00Z", "outcome": outcome, "steps": steps},
    ]})
}

fn done() -> serde_json::Value {
    json!({"phase": "done", "started": "2026-12-02T10:01:00Z",
           "finished": "2026-12-02T10:01:01Z", "attempt": 1})
}

#[test]
fn a_vm_runs_where_it_is_bound_unless_its_guest_has_not_switched_over() {
    let moved = |workflow: serde_json::Value| {
        vm(json!({
            "node": "b",
            "address": "fd00:0:0:1::10",
            "interfaces": {"backend": "fd00:0:0:1::11"},
            "migration": {"from": "a", "to": "b"},
            "workflow": workflow,
        }))
    };
    // Bound to b, the guest still on a: the routes stay with a.
    let copying = moved(migrate_instance(
        "running",
        json!({"scheduler/rebind": done()}),
    ));
    let place = VmPlace::of(&copying).expect("a place");
    assert_eq!(place.node, "a");
    assert_eq!(
        place.addresses,
        vec![
            "fd00:0:0:1::10".parse::<Ipv6Addr>().unwrap(),
            "fd00:0:0:1::11".parse().unwrap()
        ]
    );
    // A migration that failed before the switch-over left it there too.
    let failed = moved(migrate_instance(
        "failed",
        json!({"scheduler/rebind": done()}),
    ));
    assert_eq!(VmPlace::of(&failed).expect("a place").node, "a");
    // Switched over: on b.
    let switched = moved(migrate_instance(
        "Running",
        json!({"scheduler/rebind": done(), "node/switch-over": done()}),
    ));
    assert_eq!(VmPlace::of(&switched).expect("a place").node, "b");
    // Finished (its steps are gone): on b.
    let finished = moved(migrate_instance("succeeded", json!({})));
    assert_eq!(VmPlace::of(&finished).expect("a place").node, "b");
}

#[test]
fn a_refused_migration_leaves_the_vm_where_it_is_bound() {
    // An older migration brought it from c to a; a new one to b was
    // refused at its rebind: it runs on a, not on c.
    let refused = vm(json!({
        "node": "a",
        "address": "fd00:0:0:3::10",
        "migration": {"from": "c", "to": "a"},
        "workflow": migrate_instance("failed", json!({
            "scheduler/rebind": {"phase": "failed", "error": "b cannot take the VM",
                                 "started": "2026-12-02T10:01:00Z", "at": "2026-12-02T10:01:00Z", "attempt": 1}
        })),
    }));
    assert_eq!(VmPlace::of(&refused).expect("a place").node, "a");
}

#[test]
fn a_vm_without_node_or_address_has_no_place() {
    assert_eq!(VmPlace::of(&vm(json!({"address": "fd00::1"}))), None);
    assert_eq!(VmPlace::of(&vm(json!({"node": "a"}))), None);
    assert_eq!(
        VmPlace::of(&vm(json!({"node": "a", "address": "fd00::1"}))),
        Some(place("a", &["fd00::1"]))
    );
}
