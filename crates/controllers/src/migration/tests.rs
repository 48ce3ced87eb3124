use corral_api::kinds::NodeCapacity;
use corral_api::{Kind, ObjectKey};
use corral_scheduler::{NodeInfo, Snapshot, Strategy};

use super::*;

fn node(name: &str, memory: &str) -> NodeInfo {
    NodeInfo::ready(
        name,
        NodeCapacity {
            cpu: "4".parse().expect("cpu"),
            memory: memory.parse().expect("memory"),
            pods: 10,
        },
    )
}

fn scheduler() -> Scheduler {
    Scheduler::new(
        &Snapshot {
            nodes: vec![node("a", "4Gi"), node("b", "4Gi"), node("small", "64Mi")],
            ..Snapshot::default()
        },
        Strategy::Spread,
    )
}

fn vm_request() -> Request {
    Request {
        memory: "256Mi".parse().expect("memory"),
        local_volumes: vec!["vm/default/v".into(), "disk-v".into()],
        ..Request::new(ObjectKey::new(Kind::VirtualMachine, Some("default"), "v"))
    }
}

fn ask(to: &str) -> Ask {
    Ask {
        to: Some(to.into()),
        ..Ask::default()
    }
}

#[test]
fn a_running_vm_moves_with_its_disks_to_a_node_with_room() {
    let mut scheduler = scheduler();
    let request = vm_request();
    // Bound on `a`, its disk volumes live there.
    scheduler.reserve(BoundWorkload::new(&request, "a"));
    let to_b = ask("b");
    let moved = decide(
        &mut scheduler,
        &request,
        &Migration {
            from: Some("a"),
            ask: &to_b,
        },
    )
    .expect("b has room, and the disks travel");
    assert_eq!((moved.from.as_str(), moved.to.as_str()), ("a", "b"));
    assert_eq!(moved.reservation.node, "b");
    let status = status(&moved);
    assert_eq!(status["node"], "b");
    assert_eq!(status["migration"], json!({"from": "a", "to": "b"}));
    // Once relocated, the disks' volumes live on b: it may come back.
    scheduler.relocate(moved.reservation);
    let to_a = ask("a");
    decide(
        &mut scheduler,
        &request,
        &Migration {
            from: Some("b"),
            ask: &to_a,
        },
    )
    .expect("a has room again");
}

#[test]
fn refusals_say_why() {
    let mut scheduler = scheduler();
    let request = vm_request();
    let refused = |scheduler: &mut Scheduler, from: Option<&str>, ask: Ask| {
        decide(scheduler, &request, &Migration { from, ask: &ask }).expect_err("refused")
    };
    assert_eq!(
        refused(&mut scheduler, Some("a"), Ask::default()),
        "spec.migration names no node"
    );
    assert!(refused(&mut scheduler, None, ask("b")).contains("not bound"));
    assert_eq!(
        refused(&mut scheduler, Some("a"), ask("a")),
        "the VM already runs on a"
    );
    let small = refused(&mut scheduler, Some("a"), ask("small"));
    assert!(small.starts_with("small cannot take the VM: "), "{small}");
    let missing = refused(&mut scheduler, Some("a"), ask("nowhere"));
    assert!(
        missing.starts_with("nowhere cannot take the VM"),
        "{missing}"
    );
    let clone = Ask {
        clone_of: Some("tmpl".into()),
        ..ask("b")
    };
    assert!(refused(&mut scheduler, Some("a"), clone).contains("a clone does not migrate"));
    let template = Ask {
        template: true,
        ..ask("b")
    };
    assert!(refused(&mut scheduler, Some("a"), template).contains("template"));
    let stopped = Ask {
        stopped: true,
        ..ask("b")
    };
    assert!(
        refused(&mut scheduler, Some("a"), stopped)
            .contains("the VM is stopped (spec.running: false)")
    );
}

#[test]
fn the_ask_is_read_from_the_spec() {
    let object: Object = serde_json::from_value(json!({
        "kind": "VirtualMachine",
        "metadata": {"name": "v", "namespace": "default"},
        "spec": {"migration": {"to": "b", "at": "2026-12-02T01:00:00Z"},
                 "disk": {"clone": {"vm": "tmpl"}}}
    }))
    .expect("a VM");
    assert_eq!(
        Ask::of(&object),
        Ask {
            to: Some("b".into()),
            clone_of: Some("tmpl".into()),
            template: false,
            stopped: false,
        }
    );
}
