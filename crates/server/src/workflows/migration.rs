//! Which revision of a VirtualMachine is a live migration: one whose only
//! change is a newer `spec.migration` (`corral vm migrate` writes it). It
//! runs the VM's `migrate` workflow instead of `update`, so the running
//! guest moves rather than restarts.

use corral_api::{Kind, Object};
use serde_json::Value;

/// Whether `next` asks `current`'s VM to migrate: `spec.migration` is new
/// (a later `at`) and nothing else of the spec changed.
pub(super) fn asked(current: &Object, next: &Object) -> bool {
    if next.kind != Kind::VirtualMachine {
        return false;
    }
    let migration = |object: &Object| object.spec.get("migration").cloned();
    let Some(asked) = migration(next) else {
        return false;
    };
    let at = |migration: Option<&Value>| {
        migration
            .and_then(|m| m.get("at"))
            .and_then(Value::as_str)
            .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
    };
    let Some(asked_at) = at(Some(&asked)) else {
        return false;
    };
    // Only a newer request: a rollback to an older one moves nothing.
    if at(migration(current).as_ref()).is_some_and(|before| before >= asked_at) {
        return false;
    }
    without_migration(&current.spec) == without_migration(&next.spec)
}

/// The history message of a live migration's move, when `next` is
/// `current` bound to another node by `scheduler/rebind` (`status.node`
/// changed and `status.migration` names the new pair): `moved from A to
/// B by live migration`. Recorded as a system revision like a pod's move,
/// while the person's request stays their own revision.
pub(super) fn moved(current: &Object, next: &Object) -> Option<String> {
    if next.kind != Kind::VirtualMachine {
        return None;
    }
    let text = |object: &Object, pointer: &str| {
        object
            .status
            .pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let from = text(current, "/node")?;
    let to = text(next, "/node")?;
    if from == to
        || text(next, "/migration/from").as_deref() != Some(from.as_str())
        || text(next, "/migration/to").as_deref() != Some(to.as_str())
    {
        return None;
    }
    Some(format!("moved from {from} to {to} by live migration"))
}

fn without_migration(spec: &Value) -> Value {
    let mut spec = spec.clone();
    if let Some(fields) = spec.as_object_mut() {
        fields.remove("migration");
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vm(spec: Value) -> Object {
        serde_json::from_value(json!({
            "kind": "VirtualMachine",
            "metadata": {"name": "v", "namespace": "default"},
            "spec": spec
        }))
        .expect("a VM object")
    }

    fn bound(node: Option<&str>, migration: Option<(&str, &str)>) -> Object {
        let mut object = vm(json!({"cpus": 1}));
        object.status = json!({
            "node": node,
            "migration": migration.map(|(from, to)| json!({"from": from, "to": to})),
        });
        object
    }

    #[test]
    fn the_rebind_to_another_node_is_the_move() {
        let before = bound(Some("a"), None);
        let rebound = bound(Some("b"), Some(("a", "b")));
        assert_eq!(
            moved(&before, &rebound).as_deref(),
            Some("moved from a to b by live migration")
        );
        // Back again, after an earlier move.
        assert_eq!(
            moved(&rebound, &bound(Some("a"), Some(("b", "a")))).as_deref(),
            Some("moved from b to a by live migration")
        );
        // Any other status write is no move: the same node, a first
        // placement, an unbinding, a node change without a migration.
        assert_eq!(moved(&rebound, &rebound), None);
        assert_eq!(moved(&bound(None, None), &bound(Some("a"), None)), None);
        assert_eq!(moved(&before, &bound(None, None)), None);
        assert_eq!(moved(&before, &bound(Some("b"), Some(("c", "b")))), None);
        let mut pod = rebound.clone();
        pod.kind = Kind::Pod;
        assert_eq!(moved(&before, &pod), None);
    }

    #[test]
    fn only_a_new_migration_alone_is_a_migration() {
        let plain = vm(json!({"cpus": 1}));
        let first = vm(json!({"cpus": 1, "migration": {"to": "b", "at": "2026-12-02T01:00:00Z"}}));
        assert!(asked(&plain, &first));
        // The same request again (a re-apply, a rollback's spec) is not.
        assert!(!asked(&first, &first));
        let again = vm(json!({"cpus": 1, "migration": {"to": "a", "at": "2026-12-02T02:00:00Z"}}));
        assert!(asked(&first, &again));
        // A migration together with another change is an edit.
        let edited = vm(json!({"cpus": 2, "migration": {"to": "a", "at": "2026-12-02T02:00:00Z"}}));
        assert!(!asked(&first, &edited));
        // A rollback to an older request is not.
        assert!(!asked(&again, &first));
        // Dropping it is an edit too.
        assert!(!asked(&first, &plain));
        // Other kinds never migrate.
        let mut pod = first.clone();
        pod.kind = Kind::Pod;
        assert!(!asked(&plain, &pod));
    }
}
