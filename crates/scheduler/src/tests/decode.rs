//! Reading stored objects, and the one-line summary.

use corral_api::kinds::{NodePhase, RuntimeClass};
use corral_api::{Kind, Object, ObjectKey};
use serde_json::json;

use super::{big_node, node, pod, pod_key, snapshot};
use crate::{
    BoundWorkload, DecodeError, NodeInfo, Request, Snapshot, Strategy, Unschedulable, schedule,
};

fn pod_object(spec: serde_json::Value, status: serde_json::Value) -> Object {
    let mut object = Object::new(Kind::Pod, Some("default"), "web", spec);
    object.status = status;
    object
}

fn web_spec() -> serde_json::Value {
    json!({
        "placement": {"node": "node-1", "selector": {"zone": "home"}},
        "runtime": "gvisor",
        "security": {"relax": ["host-network", "host-port:9000", "run-as-root"]},
        "volumes": [
            {"name": "data", "local": {"name": "web-data"}},
            {"name": "scratch", "emptyDir": {}}
        ],
        "containers": [
            {"name": "web", "image": "local/busybox:1", "ports": [8080, 80],
             "resources": {"cpu": "100m", "memory": "64Mi"}},
            {"name": "side", "image": "local/busybox:1", "ports": [8080],
             "resources": {"cpu": "1", "memory": "64Mi"}},
            {"name": "bare", "image": "local/busybox:1"}
        ]
    })
}

#[test]
fn a_pod_request_sums_containers_and_reads_every_constraint() {
    let request = Request::from_pod(&pod_object(web_spec(), json!(null))).expect("decodes");
    assert_eq!(request.workload, pod_key("web"));
    assert_eq!(request.cpu.to_string(), "1100m");
    assert_eq!(request.memory.to_string(), "128Mi");
    assert_eq!(request.runtime, Some(RuntimeClass::Gvisor));
    assert_eq!(request.node.as_deref(), Some("node-1"));
    assert_eq!(
        request.selector.get("zone").map(String::as_str),
        Some("home")
    );
    assert_eq!(request.local_volumes, ["web-data"]);
    assert_eq!(request.host_ports, [80, 8080, 9000]);
    assert!(!request.wants_kvm);
}

#[test]
fn container_ports_are_host_ports_only_under_host_network() {
    let spec = json!({"containers": [
        {"name": "web", "image": "i", "ports": [8080]}
    ]});
    let request = Request::from_pod(&pod_object(spec, json!(null))).expect("decodes");
    assert!(request.host_ports.is_empty());
    assert_eq!(request.runtime, None);
    assert_eq!(request.cpu.millis, 0);
}

#[test]
fn a_vm_request_reads_cpus_memory_and_its_disk_volume() {
    let object = Object::new(
        Kind::VirtualMachine,
        Some("lab"),
        "builder",
        json!({"cpus": 2, "memory": "1Gi", "disk": {"volume": "builder-disk"},
               "boot": {"kernel": "local/kernels:6.1"}, "placement": {"node": "node-2"}}),
    );
    let request = Request::from_object(&object).expect("decodes");
    assert_eq!(request.workload.to_string(), "vm/lab/builder");
    assert_eq!(
        (request.cpu.millis, request.memory.to_string()),
        (2000, "1Gi".into())
    );
    // Its own disk's stand-in (for clones of it) and its volume.
    assert_eq!(request.local_volumes, ["vm/lab/builder", "builder-disk"]);
    assert_eq!(request.node.as_deref(), Some("node-2"));
    assert!(request.wants_kvm);
}

#[test]
fn a_template_reserves_nothing_and_a_clone_asks_for_its_sources_disk() {
    let template = Object::new(
        Kind::VirtualMachine,
        Some("lab"),
        "base",
        json!({"cpus": 2, "memory": "1Gi", "template": true, "disk": {"volume": "base-disk"},
               "boot": {"kernel": "k"}}),
    );
    let request = Request::from_object(&template).expect("decodes");
    assert_eq!((request.cpu.millis, request.memory.bytes), (0, 0));
    let clone = Object::new(
        Kind::VirtualMachine,
        Some("lab"),
        "copy",
        json!({"cpus": 1, "memory": "256Mi", "disk": {"clone": {"vm": "base"}},
               "boot": {"kernel": "k"}}),
    );
    let request = Request::from_object(&clone).expect("decodes");
    assert_eq!(request.local_volumes, ["vm/lab/copy", "vm/lab/base"]);
    assert_eq!(request.cpu.millis, 1000);
}

#[test]
fn wrong_kinds_and_bad_specs_are_errors_naming_the_object() {
    let policy = Object::new(Kind::Policy, None, "p", json!({"namespaces": []}));
    let error = Request::from_object(&policy).expect_err("not a workload");
    assert_eq!(
        error.to_string(),
        "policy/p cannot be scheduled: only pods and virtual machines can"
    );
    assert!(matches!(
        NodeInfo::from_node(&policy),
        Err(DecodeError::NotANode { .. })
    ));
    let bad = pod_object(json!({"containers": "nope"}), json!(null));
    let error = Request::from_pod(&bad).expect_err("bad spec");
    assert!(matches!(error, DecodeError::Spec { .. }));
    assert_eq!(error.to_string(), "pod/web has an invalid spec");
}

#[test]
fn a_node_reads_labels_cordon_and_status() {
    let mut object = Object::new(Kind::Node, None, "node-1", json!({"unschedulable": true}));
    object.metadata.labels.insert("zone".into(), "home".into());
    object.status = json!({
        "phase": "Ready",
        "capacity": {"cpu": "4", "memory": "8Gi", "pods": 110},
        "runtimes": ["runc", "gvisor"],
        "features": {"kvm": "usable"}
    });
    let info = NodeInfo::from_node(&object).expect("decodes");
    assert_eq!(info.name, "node-1");
    assert_eq!(info.phase, NodePhase::Ready);
    assert!(info.unschedulable);
    assert_eq!(info.capacity.memory.to_string(), "8Gi");
    assert_eq!(info.capacity.pods, 110);
    assert_eq!(info.runtimes, [RuntimeClass::Runc, RuntimeClass::Gvisor]);
    assert!(info.kvm_usable());
    assert_eq!(info.labels.get("zone").map(String::as_str), Some("home"));

    let bare = Object::new(Kind::Node, None, "node-2", json!(null));
    let info = NodeInfo::from_node(&bare).expect("an empty node decodes");
    assert_eq!(
        (info.phase, info.unschedulable),
        (NodePhase::Joining, false)
    );
    assert!(!info.kvm_usable());
}

#[test]
fn a_snapshot_from_objects_binds_running_workloads_only() {
    let mut node_object = Object::new(Kind::Node, None, "node-1", json!({}));
    node_object
        .metadata
        .labels
        .insert("zone".into(), "home".into());
    node_object.status = json!({"phase": "Ready",
        "capacity": {"cpu": "4", "memory": "4Gi", "pods": 10}, "runtimes": ["runc", "gvisor"]});
    let running = pod_object(web_spec(), json!({"phase": "Running", "node": "node-1"}));
    let mut finished = pod_object(web_spec(), json!({"phase": "Succeeded", "node": "node-1"}));
    finished.metadata.name = "done".into();
    let mut pending = pod_object(web_spec(), json!({"phase": "Pending"}));
    pending.metadata.name = "new".into();
    let mut vm = Object::new(
        Kind::VirtualMachine,
        None,
        "builder",
        json!({"cpus": 1, "memory": "1Gi", "boot": {}}),
    );
    vm.status = json!({"node": "node-1"});
    let policy = Object::new(Kind::Policy, None, "p", json!({"namespaces": []}));

    let snapshot =
        Snapshot::from_objects([&node_object, &running, &finished, &pending, &vm, &policy])
            .expect("decodes");
    assert_eq!(snapshot.nodes.len(), 1);
    let bound: Vec<String> = snapshot
        .bound
        .iter()
        .map(|b| format!("{} on {}", b.workload, b.node))
        .collect();
    assert_eq!(bound, ["pod/web on node-1", "vm/builder on node-1"]);
    assert_eq!(
        snapshot.bound[0],
        BoundWorkload {
            workload: pod_key("web"),
            node: "node-1".into(),
            cpu: super::cpu("1100m"),
            memory: super::memory("128Mi"),
            host_ports: vec![80, 8080, 9000],
            local_volumes: vec!["web-data".into()],
        }
    );
    // The new pod wants host port 8080 too: taken on the only node.
    let request = Request::from_pod(&pending).expect("decodes");
    let error = schedule(&snapshot, &request, Strategy::Spread).expect_err("port taken");
    assert_eq!(
        error.to_string(),
        "0/1 nodes can run pod/new: node-1: host port 80 already used by pod default/web"
    );
}

#[test]
fn the_summary_lists_a_few_nodes_then_counts_the_rest_by_cause() {
    let mut nodes: Vec<_> = (0..12)
        .map(|i| node(&format!("node-{i:02}"), "1", "1Gi", 10))
        .collect();
    for node in nodes.iter_mut().skip(9) {
        node.phase = NodePhase::Silent;
    }
    let error = schedule(&snapshot(nodes), &pod("web", "2", "64Mi"), Strategy::Spread)
        .expect_err("too big");
    assert_eq!(error.reasons.len(), 12);
    let summary = error.to_string();
    assert!(
        summary.starts_with(
            "0/12 nodes can run pod/web: node-00: insufficient cpu: 1 free, 2 requested; node-01:"
        ),
        "{summary}"
    );
    assert!(
        summary.ends_with("; and 4 more (insufficient cpu: 9, not Ready: 3 in all)"),
        "{summary}"
    );
    assert_eq!(error.causes(), [("insufficient cpu", 9), ("not Ready", 3)]);
}

#[test]
fn a_short_summary_lists_every_node_and_an_empty_cluster_says_so() {
    let mut pinned = pod("web", "0", "0");
    pinned.node = Some("node-4".into());
    let mut silent = big_node("node-3");
    silent.phase = NodePhase::Silent;
    let error = schedule(
        &snapshot(vec![big_node("node-1"), silent]),
        &pinned,
        Strategy::Spread,
    )
    .expect_err("pinned elsewhere");
    assert_eq!(
        error.to_string(),
        "0/2 nodes can run pod/web: node-1: pinned to node-4; node-3: not Ready (Silent)"
    );
    let empty = schedule(
        &Snapshot::default(),
        &pod("web", "0", "0"),
        Strategy::Spread,
    )
    .expect_err("no nodes");
    assert_eq!(
        empty,
        Unschedulable {
            workload: ObjectKey::new(Kind::Pod, None, "web"),
            reasons: vec![]
        }
    );
    assert_eq!(
        empty.to_string(),
        "0/0 nodes can run pod/web: the cluster has no nodes"
    );
}
