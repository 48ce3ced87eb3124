//! Whether an object is healthy now: what `why` answers once an object's
//! operation succeeded (the CLI and the dashboard both ask here, so they
//! say the same). A pod or VM answers first for the node it is bound to —
//! what the node reported is only as fresh as the node — then for itself.

use chrono::{DateTime, Utc};

use crate::kinds::{NodeStatus, PodStatus};
use crate::{Kind, Object, RevisionRecord};

/// The node whose health `object` depends on: a pod's or VM's
/// `status.node`.
pub fn bound_node(object: &Object) -> Option<String> {
    match object.kind {
        Kind::Pod => object.typed_status::<PodStatus>().ok()?.node,
        Kind::VirtualMachine => object
            .status
            .get("node")
            .and_then(|node| node.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// Why `object` is not healthy at `now`, in a sentence for `why`; `None`
/// when it is (or its kind has no health). `node` is the status of its
/// [`bound_node`], when that could be read.
pub fn unhealthy_now(
    object: &Object,
    node: Option<&NodeStatus>,
    now: DateTime<Utc>,
) -> Option<String> {
    let node_problem = || {
        let name = bound_node(object)?;
        node?.unhealthy(&name, now)
    };
    match object.kind {
        Kind::Node => {
            let status = object.typed_status::<NodeStatus>().ok()?;
            status
                .problem(now)
                .map(|problem| format!("it is {problem}"))
        }
        Kind::Pod => {
            let status = object.typed_status::<PodStatus>().ok()?;
            node_problem().or_else(|| status.unhealthy(now))
        }
        Kind::VirtualMachine => {
            if let Some(problem) = node_problem() {
                return Some(problem);
            }
            // The node reports `Running` only while QEMU runs and the guest
            // booted; anything else says why in its message.
            let node = object.status.get("node").and_then(|n| n.as_str());
            let phase = object.status.get("phase").and_then(|p| p.as_str());
            let message = object.status.get("message").and_then(|m| m.as_str());
            // (`Template` for a template, which is not run; `Stopped` for
            // a VM its spec keeps stopped, see [`kept_stopped`]).
            let fine = matches!(phase, Some("Running" | "Template"))
                || (phase == Some("Stopped") && kept_stopped(object));
            (node.is_some() && !fine).then(|| {
                format!(
                    "it is not running: {}",
                    message.unwrap_or("its node reported no reason")
                )
            })
        }
        _ => None,
    }
}

/// Whether `object` is a VM its spec keeps stopped (`spec.running: false`).
pub fn kept_stopped(object: &Object) -> bool {
    object.kind == Kind::VirtualMachine
        && object
            .spec
            .get("running")
            .and_then(serde_json::Value::as_bool)
            == Some(false)
}

/// `why`'s verdict on a VM its spec keeps stopped ([`kept_stopped`]), for
/// the CLI and the dashboard alike: stopped (or still stopping) because
/// the spec asks for it, by whom — `stopped_by`, the revision that set
/// `running: false` — and how to start it again.
pub fn stopped_line(name: &str, object: &Object, stopped_by: Option<&RevisionRecord>) -> String {
    let phase = object.status.get("phase").and_then(|p| p.as_str());
    let state = if phase == Some("Stopped") {
        "is stopped"
    } else {
        "is stopping"
    };
    let who = match stopped_by {
        Some(record) if record.message.is_empty() => {
            format!(
                ", asked for by {} in revision {}",
                record.author, record.revision
            )
        }
        Some(record) => format!(
            ", asked for by {} in revision {} ({:?})",
            record.author, record.revision, record.message
        ),
        None => String::new(),
    };
    let namespace = match object.metadata.namespace.as_deref() {
        None | Some("default") => String::new(),
        Some(ns) => format!(" -n {ns}"),
    };
    format!(
        "{name} (revision {}) {state} because its spec asks for it (spec.running: false){who}; its disks, address and node are kept: `corral vm start {name}{namespace}` starts it again",
        object.metadata.revision
    )
}

/// Of a VM's revisions, newest first, each with whether its spec asked
/// for the guest to run: the one that stopped it — the oldest of the
/// newest revisions that all say `running: false`.
pub fn stopping_revision(newest_first: impl IntoIterator<Item = (u64, bool)>) -> Option<u64> {
    let mut stopping = None;
    for (revision, running) in newest_first {
        if running {
            break;
        }
        stopping = Some(revision);
    }
    stopping
}

/// The revision that stopped a VM its spec keeps stopped, from its
/// `history` (oldest first, as the API lists it): the oldest of its newest
/// revisions that all say `running: false`, looking at most 50 back.
/// `spec_of` fetches the spec of a revision whose record does not carry
/// it; `None` when history does not tell.
pub async fn stopped_by<F, Fut>(
    history: Vec<RevisionRecord>,
    object: &Object,
    mut spec_of: F,
) -> Option<RevisionRecord>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Option<serde_json::Value>>,
{
    /// How many revisions back the lookup goes.
    const LOOK_BACK: usize = 50;
    let mut newest_first = Vec::new();
    for record in history
        .iter()
        .rev()
        .filter(|r| r.uid == object.metadata.uid && r.revision <= object.metadata.revision)
        .take(LOOK_BACK)
    {
        let spec = match &record.spec {
            Some(spec) => spec.clone(),
            None => spec_of(record.revision).await?,
        };
        let running = spec.get("running").and_then(serde_json::Value::as_bool) != Some(false);
        newest_first.push((record.revision, running));
        if running {
            break;
        }
    }
    let revision = stopping_revision(newest_first)?;
    history.into_iter().find(|r| r.revision == revision)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_vm_that_is_not_running_says_why_and_a_bad_node_comes_first() {
        let mut vm = Object::new(Kind::VirtualMachine, Some("default"), "vm", json!({}));
        vm.status = json!({"node": "n1", "phase": "Failed", "message": "qemu exited 1"});
        let now = Utc::now();
        assert_eq!(
            unhealthy_now(&vm, None, now).as_deref(),
            Some("it is not running: qemu exited 1")
        );
        let node = NodeStatus::default();
        let from_node = unhealthy_now(&vm, Some(&node), now).unwrap_or_default();
        assert!(from_node.starts_with("its node n1 is "), "{from_node}");
        vm.status = json!({"node": "n1", "phase": "Running"});
        assert_eq!(unhealthy_now(&vm, None, now), None);
    }

    #[test]
    fn a_vm_kept_stopped_is_healthy_and_says_who_stopped_it() {
        let mut vm = Object::new(
            Kind::VirtualMachine,
            Some("default"),
            "tiny",
            json!({"running": false}),
        );
        vm.metadata.revision = 7;
        vm.status = json!({"node": "n1", "phase": "Stopped", "message": "stopped"});
        assert!(kept_stopped(&vm));
        assert_eq!(unhealthy_now(&vm, None, Utc::now()), None);
        let record = RevisionRecord {
            revision: 6,
            time: Utc::now(),
            author: "alice".into(),
            class: crate::AuthorClass::External,
            message: "vm stop".into(),
            kind: Kind::VirtualMachine,
            namespace: "default".into(),
            name: "tiny".into(),
            uid: String::new(),
            deleted: false,
            spec: None,
        };
        let line = stopped_line("vm/tiny", &vm, Some(&record));
        assert_eq!(
            line,
            "vm/tiny (revision 7) is stopped because its spec asks for it (spec.running: false), asked for by alice in revision 6 (\"vm stop\"); its disks, address and node are kept: `corral vm start vm/tiny` starts it again"
        );
        // A VM whose spec runs it is not well when its node says Stopped.
        vm.spec = json!({});
        assert!(unhealthy_now(&vm, None, Utc::now()).is_some());
        // The revision that stopped it: the oldest of the newest stopped.
        assert_eq!(
            stopping_revision([(9, false), (8, false), (7, true), (6, false)]),
            Some(8)
        );
        assert_eq!(stopping_revision([(9, true), (8, false)]), None);
    }
}
