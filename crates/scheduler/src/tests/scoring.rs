//! Spread, bin-pack, KVM preference and determinism.

use corral_api::{Kind, ObjectKey};

use super::{big_node, node, pod, snapshot};
use crate::{BoundWorkload, KVM_FEATURE, Scheduler, Snapshot, Strategy, schedule};

/// node-a is half used, node-b a quarter, node-c empty; all the same size.
fn loaded() -> Snapshot {
    let mut snapshot = snapshot(vec![
        node("node-a", "4", "4Gi", 10),
        node("node-b", "4", "4Gi", 10),
        node("node-c", "4", "4Gi", 10),
    ]);
    snapshot
        .bound
        .push(BoundWorkload::new(&pod("x", "2", "2Gi"), "node-a"));
    snapshot
        .bound
        .push(BoundWorkload::new(&pod("y", "1", "1Gi"), "node-b"));
    snapshot
}

#[test]
fn spread_picks_the_least_allocated_node() {
    let placement =
        schedule(&loaded(), &pod("web", "500m", "512Mi"), Strategy::Spread).expect("fits");
    assert_eq!(placement.node, "node-c");
    assert_eq!((placement.feasible, placement.nodes), (3, 3));
    assert_eq!(Strategy::default(), Strategy::Spread);
}

#[test]
fn bin_pack_picks_the_most_allocated_node_that_fits() {
    let request = pod("web", "500m", "512Mi");
    let placement = schedule(&loaded(), &request, Strategy::BinPack).expect("fits");
    assert_eq!(placement.node, "node-a");
    let too_big = pod("big", "2500m", "512Mi");
    let placement = schedule(&loaded(), &too_big, Strategy::BinPack).expect("fits");
    assert_eq!(placement.node, "node-b", "node-a has only 2 cpus left");
}

#[test]
fn spread_judges_by_the_scarcest_resource_as_a_share() {
    // node-a has lots of cpu left but little memory; node-b has less of
    // each in absolute terms but more of its scarcest resource as a share.
    let mut snapshot = snapshot(vec![
        node("node-a", "16", "4Gi", 10),
        node("node-b", "4", "4Gi", 10),
    ]);
    snapshot
        .bound
        .push(BoundWorkload::new(&pod("x", "0", "3Gi"), "node-a"));
    snapshot
        .bound
        .push(BoundWorkload::new(&pod("y", "2", "1Gi"), "node-b"));
    let placement =
        schedule(&snapshot, &pod("web", "100m", "256Mi"), Strategy::Spread).expect("fits");
    assert_eq!(placement.node, "node-b");
}

#[test]
fn ties_go_to_the_first_node_by_name_whatever_the_input_order() {
    for strategy in [Strategy::Spread, Strategy::BinPack] {
        let names = ["node-c", "node-a", "node-b"];
        let snapshot = snapshot(names.iter().map(|n| big_node(n)).collect());
        let placement = schedule(&snapshot, &pod("web", "1", "1Gi"), strategy).expect("fits");
        assert_eq!(placement.node, "node-a", "{strategy:?}");
    }
}

#[test]
fn zero_request_pods_still_spread_by_pod_slots() {
    let mut scheduler = Scheduler::new(
        &snapshot(vec![
            big_node("node-1"),
            big_node("node-2"),
            big_node("node-3"),
        ]),
        Strategy::Spread,
    );
    let nodes: Vec<String> = (0..6)
        .map(|i| {
            scheduler
                .place(&pod(&format!("p{i}"), "0", "0"))
                .expect("fits")
                .node
        })
        .collect();
    assert_eq!(
        nodes,
        ["node-1", "node-2", "node-3", "node-1", "node-2", "node-3"]
    );
}

#[test]
fn bin_pack_fills_one_node_before_the_next() {
    let mut scheduler = Scheduler::new(
        &snapshot(vec![
            node("node-1", "2", "2Gi", 10),
            node("node-2", "2", "2Gi", 10),
        ]),
        Strategy::BinPack,
    );
    let nodes: Vec<String> = (0..4)
        .map(|i| {
            scheduler
                .place(&pod(&format!("p{i}"), "1", "1Gi"))
                .expect("fits")
                .node
        })
        .collect();
    assert_eq!(nodes, ["node-1", "node-1", "node-2", "node-2"]);
}

#[test]
fn virtual_machines_prefer_kvm_nodes_but_do_not_need_them() {
    let mut kvm = big_node("node-2");
    kvm.features.insert(KVM_FEATURE.into(), "usable".into());
    let mut busy_kvm = kvm.clone();
    busy_kvm.name = "node-3".into();
    let mut snapshot = snapshot(vec![big_node("node-1"), kvm, busy_kvm]);
    snapshot
        .bound
        .push(BoundWorkload::new(&pod("x", "6", "12Gi"), "node-2"));
    let mut vm = pod("builder", "2", "1Gi");
    vm.workload = ObjectKey::new(Kind::VirtualMachine, None, "builder");
    vm.wants_kvm = true;
    let placement = schedule(&snapshot, &vm, Strategy::Spread).expect("fits");
    assert_eq!(placement.node, "node-3", "the emptier KVM node wins");
    // Pods do not care about KVM: the emptiest node by name wins.
    let placement = schedule(&snapshot, &pod("web", "2", "1Gi"), Strategy::Spread).expect("fits");
    assert_eq!(placement.node, "node-1");
    // Without a usable KVM node the VM still runs (under TCG).
    snapshot.nodes.retain(|n| n.name == "node-1");
    let placement = schedule(&snapshot, &vm, Strategy::Spread).expect("fits");
    assert_eq!(placement.node, "node-1");
}

#[test]
fn the_same_input_gives_the_same_sequence_of_placements() {
    let run = |reverse: bool| {
        let mut nodes: Vec<_> = (0..20)
            .map(|i| node(&format!("node-{i:02}"), "4", &format!("{}Gi", 2 + i % 3), 8))
            .collect();
        if reverse {
            nodes.reverse();
        }
        let mut scheduler = Scheduler::new(&snapshot(nodes), Strategy::Spread);
        (0..100)
            .map(|i| {
                let request = pod(
                    &format!("p{i}"),
                    &format!("{}m", 100 + (i * 37) % 400),
                    "256Mi",
                );
                scheduler
                    .place(&request)
                    .map(|p| p.node)
                    .map_err(|e| e.to_string())
            })
            .collect::<Vec<_>>()
    };
    let first = run(false);
    assert_eq!(first, run(false));
    assert_eq!(first, run(true));
    assert!(first.iter().all(Result::is_ok));
}
