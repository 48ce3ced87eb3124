//! Placements reserve resources for the next decision; releases and
//! re-placements give them back.

use super::{big_node, lines, node, pod, pod_key, snapshot};
use crate::{BoundWorkload, Free, Reason, Scheduler, Strategy};

#[test]
fn placing_until_a_node_is_full_moves_to_the_next() {
    let mut scheduler = Scheduler::new(
        &snapshot(vec![
            node("node-1", "2", "1Gi", 10),
            node("node-2", "2", "1Gi", 10),
        ]),
        Strategy::BinPack,
    );
    let mut nodes = Vec::new();
    for i in 0..8 {
        nodes.push(
            scheduler
                .place(&pod(&format!("p{i}"), "500m", "256Mi"))
                .expect("fits")
                .node,
        );
    }
    assert_eq!(nodes[..4], ["node-1"; 4]);
    assert_eq!(nodes[4..], ["node-2"; 4]);
    let error = scheduler
        .place(&pod("p8", "500m", "256Mi"))
        .expect_err("both full");
    assert_eq!(
        lines(&error),
        [
            "node-1: insufficient cpu: 0 free, 500m requested",
            "node-2: insufficient cpu: 0 free, 500m requested",
        ]
    );
    assert_eq!(
        scheduler.free("node-1"),
        Some(Free {
            cpu: super::cpu("0"),
            memory: super::memory("0"),
            pods: 6
        })
    );
}

#[test]
fn bound_workloads_in_the_snapshot_use_their_node() {
    let mut snapshot = snapshot(vec![node("node-1", "4", "1Gi", 10)]);
    snapshot
        .bound
        .push(BoundWorkload::new(&pod("old", "1", "960Mi"), "node-1"));
    // A workload bound to a node the snapshot lacks is ignored.
    snapshot
        .bound
        .push(BoundWorkload::new(&pod("ghost", "4", "1Gi"), "node-9"));
    let scheduler = Scheduler::new(&snapshot, Strategy::Spread);
    let free = scheduler.free("node-1").expect("node-1 exists");
    assert_eq!(
        (free.cpu.millis, free.memory.bytes, free.pods),
        (3000, 64 << 20, 9)
    );
    assert_eq!(scheduler.free("node-9"), None);
}

#[test]
fn release_gives_the_reservation_and_ports_back() {
    let mut scheduler = Scheduler::new(
        &snapshot(vec![node("node-1", "1", "1Gi", 10)]),
        Strategy::Spread,
    );
    let mut web = pod("web", "1", "512Mi");
    web.host_ports = vec![80];
    scheduler.place(&web).expect("fits");
    let mut other = pod("other", "0", "0");
    other.host_ports = vec![80];
    assert_eq!(
        lines(&scheduler.place(&other).expect_err("port taken")),
        ["node-1: host port 80 already used by pod default/web"]
    );
    assert!(scheduler.release(&pod_key("web")));
    assert!(!scheduler.release(&pod_key("web")));
    assert_eq!(scheduler.free("node-1").map(|f| f.cpu.millis), Some(1000));
    assert_eq!(scheduler.place(&other).expect("port free").node, "node-1");
}

#[test]
fn re_placing_a_bound_workload_does_not_count_it_twice() {
    let mut snapshot = snapshot(vec![node("node-1", "1", "1Gi", 1)]);
    let mut web = pod("web", "1", "1Gi");
    web.host_ports = vec![8080];
    snapshot.bound.push(BoundWorkload::new(&web, "node-1"));
    let mut scheduler = Scheduler::new(&snapshot, Strategy::Spread);
    assert_eq!(
        scheduler.place(&web).expect("fits its own room").node,
        "node-1"
    );
    // A grown request that fits nowhere leaves the old reservation in place.
    let grown = pod("web", "2", "1Gi");
    assert!(scheduler.place(&grown).is_err());
    let free = scheduler.free("node-1").expect("exists");
    assert_eq!((free.cpu.millis, free.pods), (0, 0));
}

#[test]
fn fits_answers_the_in_place_update_question() {
    let mut snapshot = snapshot(vec![node("node-1", "2", "1Gi", 10), big_node("node-2")]);
    snapshot
        .bound
        .push(BoundWorkload::new(&pod("web", "1", "512Mi"), "node-1"));
    snapshot
        .bound
        .push(BoundWorkload::new(&pod("db", "1", "256Mi"), "node-1"));
    let mut scheduler = Scheduler::new(&snapshot, Strategy::Spread);
    assert_eq!(scheduler.fits(&pod("web", "1", "768Mi"), "node-1"), Ok(()));
    assert_eq!(
        scheduler
            .fits(&pod("web", "1", "1Gi"), "node-1")
            .map_err(|r| r.to_string()),
        Err("insufficient memory: 768Mi free, 1Gi requested".to_string())
    );
    assert_eq!(
        scheduler.fits(&pod("web", "0", "0"), "node-7"),
        Err(Reason::NoSuchNode)
    );
    // Asking changed nothing.
    assert_eq!(
        scheduler.free("node-1").map(|f| f.memory.bytes),
        Some(256 << 20)
    );
}

#[test]
fn pinned_pets_stay_on_their_node_as_others_fill_the_cluster() {
    let mut scheduler = Scheduler::new(
        &snapshot(vec![
            node("node-1", "2", "2Gi", 10),
            node("node-2", "2", "2Gi", 10),
        ]),
        Strategy::Spread,
    );
    let mut pet = pod("db", "1", "1Gi");
    pet.node = Some("node-2".into());
    assert_eq!(scheduler.place(&pet).expect("fits").node, "node-2");
    // The cattle go to node-1, the emptier one, and then around the pet.
    assert_eq!(
        scheduler.place(&pod("a", "1", "1Gi")).expect("fits").node,
        "node-1"
    );
    assert_eq!(
        scheduler.place(&pod("b", "1", "1Gi")).expect("fits").node,
        "node-1"
    );
    assert_eq!(
        scheduler.place(&pod("c", "1", "1Gi")).expect("fits").node,
        "node-2"
    );
    let mut second_pet = pod("cache", "1", "1Gi");
    second_pet.node = Some("node-2".into());
    assert_eq!(
        lines(&scheduler.place(&second_pet).expect_err("node-2 full")),
        [
            "node-1: pinned to node-2",
            "node-2: insufficient cpu: 0 free, 1 requested",
        ]
    );
    // The pet itself can be re-placed: it keeps its node.
    assert_eq!(scheduler.place(&pet).expect("its own room").node, "node-2");
}

#[test]
fn a_placement_records_where_a_new_local_volume_lives() {
    let mut scheduler = Scheduler::new(
        &snapshot(vec![big_node("node-1"), big_node("node-2")]),
        Strategy::Spread,
    );
    let mut first = pod("web-0", "1", "1Gi");
    first.local_volumes = vec!["web-data".into()];
    assert_eq!(scheduler.place(&first).expect("fits").node, "node-1");
    assert_eq!(scheduler.volume_node("web-data"), Some("node-1"));
    // Spread alone would pick node-2; the volume pins the second user.
    let mut second = pod("web-1", "1", "1Gi");
    second.local_volumes = vec!["web-data".into()];
    assert_eq!(scheduler.place(&second).expect("fits").node, "node-1");
    // Releasing the pods leaves the volume where it is.
    scheduler.release(&pod_key("web-0"));
    scheduler.release(&pod_key("web-1"));
    assert_eq!(scheduler.volume_node("web-data"), Some("node-1"));
}
