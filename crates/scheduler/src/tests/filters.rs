//! Every filter, and the exact words of its reason.

use std::collections::BTreeMap;

use corral_api::kinds::{NodePhase, RuntimeClass};

use super::{big_node, lines, node, pod, pod_key, snapshot};
use crate::{BoundWorkload, Reason, Snapshot, Strategy, schedule};

fn refused(snapshot: &Snapshot, request: &crate::Request) -> Vec<String> {
    let error = schedule(snapshot, request, Strategy::Spread).expect_err("no node should fit");
    lines(&error)
}

fn placed(snapshot: &Snapshot, request: &crate::Request) -> String {
    schedule(snapshot, request, Strategy::Spread)
        .expect("a node should fit")
        .node
}

fn selector(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn insufficient_memory_names_free_and_requested() {
    let snapshot = snapshot(vec![node("node-2", "4", "64Mi", 10)]);
    assert_eq!(
        refused(&snapshot, &pod("web", "100m", "128Mi")),
        ["node-2: insufficient memory: 64Mi free, 128Mi requested"]
    );
    assert_eq!(placed(&snapshot, &pod("web", "100m", "64Mi")), "node-2");
}

#[test]
fn insufficient_cpu_names_free_and_requested() {
    let snapshot = snapshot(vec![node("node-1", "1500m", "1Gi", 10)]);
    assert_eq!(
        refused(&snapshot, &pod("web", "2", "64Mi")),
        ["node-1: insufficient cpu: 1500m free, 2 requested"]
    );
}

#[test]
fn nodes_not_ready_are_refused_with_their_phase() {
    let mut nodes = Vec::new();
    for (name, phase) in [
        ("node-1", NodePhase::Joining),
        ("node-3", NodePhase::Silent),
        ("node-4", NodePhase::Lost),
    ] {
        let mut node = big_node(name);
        node.phase = phase;
        nodes.push(node);
    }
    assert_eq!(
        refused(&snapshot(nodes), &pod("web", "0", "0")),
        [
            "node-1: not Ready (Joining)",
            "node-3: not Ready (Silent)",
            "node-4: not Ready (Lost)",
        ]
    );
}

#[test]
fn unschedulable_nodes_are_refused() {
    let mut cordoned = big_node("node-1");
    cordoned.unschedulable = true;
    let snapshot = snapshot(vec![cordoned, big_node("node-2")]);
    assert_eq!(placed(&snapshot, &pod("web", "1", "1Gi")), "node-2");
    let mut pinned = pod("web", "1", "1Gi");
    pinned.node = Some("node-1".into());
    assert_eq!(
        refused(&snapshot, &pinned),
        ["node-1: marked unschedulable", "node-2: pinned to node-1"]
    );
}

#[test]
fn a_pinned_pod_goes_only_to_its_node() {
    let snapshot = snapshot(vec![
        big_node("node-1"),
        big_node("node-2"),
        big_node("node-3"),
    ]);
    let mut pet = pod("db", "1", "1Gi");
    pet.node = Some("node-3".into());
    let placement = schedule(&snapshot, &pet, Strategy::Spread).expect("fits");
    assert_eq!((placement.node.as_str(), placement.feasible), ("node-3", 1));
    pet.node = Some("node-4".into());
    assert_eq!(
        refused(&snapshot, &pet),
        [
            "node-1: pinned to node-4",
            "node-2: pinned to node-4",
            "node-3: pinned to node-4",
        ]
    );
}

#[test]
fn a_pinned_pod_on_a_full_node_says_why_its_node_refuses() {
    let snapshot = snapshot(vec![node("node-1", "1", "256Mi", 10), big_node("node-2")]);
    let mut pet = pod("db", "500m", "512Mi");
    pet.node = Some("node-1".into());
    assert_eq!(
        refused(&snapshot, &pet),
        [
            "node-1: insufficient memory: 256Mi free, 512Mi requested",
            "node-2: pinned to node-1",
        ]
    );
}

#[test]
fn label_selector_must_match_every_label() {
    let mut home = big_node("node-1");
    home.labels = selector(&[("zone", "home"), ("disk", "ssd")]);
    let mut office = big_node("node-6");
    office.labels = selector(&[("zone", "office")]);
    let snapshot = snapshot(vec![home, office]);
    let mut request = pod("web", "1", "1Gi");
    request.selector = selector(&[("zone", "home")]);
    assert_eq!(placed(&snapshot, &request), "node-1");
    request.selector = selector(&[("zone", "home"), ("disk", "hdd")]);
    assert_eq!(
        refused(&snapshot, &request),
        [
            "node-1: label selector disk=hdd,zone=home does not match",
            "node-6: label selector disk=hdd,zone=home does not match",
        ]
    );
    request.selector = selector(&[("zone", "home"), ("disk", "ssd")]);
    assert_eq!(placed(&snapshot, &request), "node-1");
    request.selector = selector(&[("zone", "home")]);
    let mut only_office = snapshot.clone();
    only_office.nodes.remove(0);
    assert_eq!(
        refused(&only_office, &request),
        ["node-6: label selector zone=home does not match"]
    );
}

#[test]
fn runtime_must_be_offered_and_runc_is_the_default() {
    let mut runc_only = big_node("node-5");
    runc_only.runtimes = vec![RuntimeClass::Runc];
    let mut gvisor_only = big_node("node-6");
    gvisor_only.runtimes = vec![RuntimeClass::Gvisor];
    let snapshot = snapshot(vec![runc_only, gvisor_only]);
    let mut sandboxed = pod("web", "1", "1Gi");
    sandboxed.runtime = Some(RuntimeClass::Gvisor);
    assert_eq!(placed(&snapshot, &sandboxed), "node-6");
    assert_eq!(placed(&snapshot, &pod("plain", "1", "1Gi")), "node-5");

    let mut runc_snapshot = snapshot.clone();
    runc_snapshot.nodes.truncate(1);
    assert_eq!(
        refused(&runc_snapshot, &sandboxed),
        ["node-5: runtime gvisor not available"]
    );
    let mut no_runtimes = runc_snapshot.clone();
    no_runtimes.nodes[0].runtimes.clear();
    assert_eq!(
        refused(&no_runtimes, &pod("plain", "1", "1Gi")),
        ["node-5: runtime runc not available"]
    );
}

#[test]
fn virtual_machines_need_no_oci_runtime() {
    let mut bare = big_node("node-1");
    bare.runtimes.clear();
    let mut vm = pod("builder", "2", "1Gi");
    vm.workload = corral_api::ObjectKey::new(corral_api::Kind::VirtualMachine, None, "builder");
    assert_eq!(placed(&snapshot(vec![bare]), &vm), "node-1");
}

#[test]
fn host_ports_already_bound_on_a_node_are_refused() {
    let mut snapshot = snapshot(vec![big_node("node-7"), big_node("node-8")]);
    snapshot.bound.push(BoundWorkload {
        host_ports: vec![8080],
        ..BoundWorkload::new(&pod("web", "100m", "64Mi"), "node-7")
    });
    let mut request = pod("proxy", "100m", "64Mi");
    request.host_ports = vec![443, 8080];
    request.node = Some("node-7".into());
    assert_eq!(
        refused(&snapshot, &request),
        [
            "node-7: host port 8080 already used by pod default/web",
            "node-8: pinned to node-7",
        ]
    );
    request.node = None;
    assert_eq!(placed(&snapshot, &request), "node-8");
    request.host_ports = vec![9090];
    request.node = Some("node-7".into());
    assert_eq!(placed(&snapshot, &request), "node-7");
}

#[test]
fn pod_slots_are_a_resource() {
    let mut snapshot = snapshot(vec![node("node-1", "8", "8Gi", 2)]);
    for name in ["a", "b"] {
        snapshot
            .bound
            .push(BoundWorkload::new(&pod(name, "0", "0"), "node-1"));
    }
    assert_eq!(
        refused(&snapshot, &pod("c", "0", "0")),
        ["node-1: no pod slots free: 2 of 2 used"]
    );
    let empty = super::snapshot(vec![node("node-9", "8", "8Gi", 0)]);
    assert_eq!(
        refused(&empty, &pod("c", "0", "0")),
        ["node-9: no pod slots free: 0 of 0 used"]
    );
}

#[test]
fn a_local_volume_pins_the_workload_to_where_it_lives() {
    let mut snapshot = snapshot(vec![big_node("node-1"), big_node("node-2")]);
    snapshot.volumes.insert("web-data".into(), "node-2".into());
    let mut request = pod("web", "1", "1Gi");
    request.local_volumes = vec!["web-data".into()];
    assert_eq!(placed(&snapshot, &request), "node-2");

    snapshot.nodes[1].unschedulable = true;
    assert_eq!(
        refused(&snapshot, &request),
        [
            "node-1: local volume web-data lives on node-2",
            "node-2: marked unschedulable",
        ]
    );
}

#[test]
fn a_volume_held_by_a_bound_workload_lives_on_its_node() {
    let mut snapshot = snapshot(vec![big_node("node-1"), big_node("node-2")]);
    let mut holder = pod("old", "0", "0");
    holder.local_volumes = vec!["cache".into()];
    snapshot.bound.push(BoundWorkload::new(&holder, "node-1"));
    let mut request = pod("new", "1", "1Gi");
    request.local_volumes = vec!["cache".into()];
    assert_eq!(placed(&snapshot, &request), "node-1");
}

#[test]
fn volumes_on_two_nodes_cannot_be_satisfied() {
    let mut snapshot = snapshot(vec![big_node("node-1"), big_node("node-2")]);
    snapshot.volumes.insert("a".into(), "node-1".into());
    snapshot.volumes.insert("b".into(), "node-2".into());
    let mut request = pod("web", "0", "0");
    request.local_volumes = vec!["a".into(), "b".into()];
    assert_eq!(
        refused(&snapshot, &request),
        [
            "node-1: local volume b lives on node-2",
            "node-2: local volume a lives on node-1",
        ]
    );
}

#[test]
fn a_volume_on_a_vanished_node_is_named() {
    let mut snapshot = snapshot(vec![big_node("node-1")]);
    snapshot.volumes.insert("data".into(), "node-9".into());
    let mut request = pod("web", "0", "0");
    request.local_volumes = vec!["data".into()];
    assert_eq!(
        refused(&snapshot, &request),
        ["node-1: local volume data lives on node-9"]
    );
}

#[test]
fn each_node_reports_only_its_first_failed_filter() {
    let mut silent = node("node-1", "0", "0", 0);
    silent.phase = NodePhase::Silent;
    silent.unschedulable = true;
    let mut cordoned = node("node-2", "0", "0", 0);
    cordoned.unschedulable = true;
    let mut request = pod("web", "1", "1Gi");
    request.runtime = Some(RuntimeClass::Gvisor);
    assert_eq!(
        refused(&snapshot(vec![cordoned, silent]), &request),
        ["node-1: not Ready (Silent)", "node-2: marked unschedulable"]
    );
}

#[test]
fn reason_messages_use_the_quantities_display() {
    let reason = Reason::InsufficientMemory {
        free: super::memory("1536Mi"),
        requested: super::memory("2Gi"),
    };
    assert_eq!(
        reason.to_string(),
        "insufficient memory: 1536Mi free, 2Gi requested"
    );
    let holder = Reason::HostPortInUse {
        port: 53,
        holder: corral_api::ObjectKey::new(corral_api::Kind::VirtualMachine, Some("lab"), "dns"),
    };
    assert_eq!(
        holder.to_string(),
        "host port 53 already used by vm lab/dns"
    );
    assert_eq!(pod_key("web").to_string(), "pod/web");
}
