//! Whether an object is healthy now: what `why` answers once an object's
//! operation succeeded (the CLI and the dashboard both ask here, so they
//! say the same). A pod or VM answers first for the node it is bound to —
//! what the node reported is only as fresh as the node — then for itself.

use chrono::{DateTime, Utc};

use crate::kinds::{NodeStatus, PodStatus};
use crate::{Kind, Object};

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
            // (`Template` for a template, which is not run).
            let fine = matches!(phase, Some("Running" | "Template"));
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
}
