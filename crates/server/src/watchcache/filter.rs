//! Which cached objects a list or watch serves, and what a watcher hears
//! when an object moves into or out of its scope.

use std::collections::BTreeMap;

use corral_api::LabelSelector;
use corral_api::watch::EventType;

use super::{CachedEvent, CachedObject};

/// The scope of one list or watch. `None` fields match everything.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Only objects whose `status.node` is this node (or, for a VM, the
    /// node it migrated from).
    pub node: Option<String>,
    pub selector: LabelSelector,
    /// Only objects whose `corral.dev/managed-by` annotation names this
    /// controller.
    pub manager: Option<String>,
}

/// What a scope looks at in one version of an object, besides its name.
struct Facts<'a> {
    /// Its `status.node` and, for a VM, the node it migrated from.
    nodes: [Option<&'a str>; 2],
    labels: &'a BTreeMap<String, String>,
    manager: Option<&'a str>,
}

impl Scope {
    /// Whether an object with these facts is in scope.
    fn admits(&self, namespace: &str, name: &str, facts: &Facts<'_>) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == namespace)
            && self.name.as_deref().is_none_or(|n| n == name)
            && self
                .node
                .as_deref()
                .is_none_or(|n| facts.nodes.contains(&Some(n)))
            && self.selector.matches(facts.labels)
            && self
                .manager
                .as_deref()
                .is_none_or(|m| facts.manager == Some(m))
    }

    pub fn admits_object(&self, object: &CachedObject) -> bool {
        let facts = Facts {
            nodes: [object.node.as_deref(), object.migrated_from.as_deref()],
            labels: &object.labels,
            manager: object.manager.as_deref(),
        };
        self.admits(&object.namespace, &object.name, &facts)
    }

    /// What a watcher with this scope is sent for `event`: nothing, the
    /// event as it is, or — when the object left the scope — a deletion
    /// (the object as it is now), and an addition when it entered it.
    pub fn view(&self, event: &CachedEvent) -> Option<EventType> {
        let now = self.admits_object(&event.object);
        let before = event.previous.as_ref().is_some_and(|previous| {
            let facts = Facts {
                nodes: [previous.node.as_deref(), previous.migrated_from.as_deref()],
                labels: &previous.labels,
                manager: previous.manager.as_deref(),
            };
            self.admits(&event.object.namespace, &event.object.name, &facts)
        });
        match (event.event_type, before, now) {
            (EventType::Deleted, _, now) => now.then_some(EventType::Deleted),
            (_, false, true) => Some(EventType::Added),
            (_, true, true) => Some(EventType::Modified),
            (_, true, false) => Some(EventType::Deleted),
            (_, false, false) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::super::PreviousFacts;
    use super::*;

    fn object(node: Option<&str>, app: &str) -> Arc<CachedObject> {
        Arc::new(CachedObject {
            namespace: "default".into(),
            name: "web".into(),
            resource_version: 1,
            node: node.map(str::to_string),
            migrated_from: None,
            labels: BTreeMap::from([("app".to_string(), app.to_string())]),
            owner_uid: None,
            manager: None,
            json: Bytes::new(),
        })
    }

    impl CachedObject {
        fn clone_facts(&self) -> CachedObject {
            CachedObject {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                resource_version: self.resource_version,
                node: self.node.clone(),
                migrated_from: self.migrated_from.clone(),
                labels: self.labels.clone(),
                owner_uid: self.owner_uid.clone(),
                manager: self.manager.clone(),
                json: self.json.clone(),
            }
        }
    }

    fn event(
        event_type: EventType,
        before: Option<(Option<&str>, &str)>,
        now: (Option<&str>, &str),
    ) -> CachedEvent {
        CachedEvent {
            event_type,
            object: object(now.0, now.1),
            previous: before.map(|(node, app)| PreviousFacts {
                node: node.map(str::to_string),
                migrated_from: None,
                labels: BTreeMap::from([("app".to_string(), app.to_string())]),
                manager: None,
            }),
        }
    }

    #[test]
    fn a_node_watch_hears_a_pod_arrive_and_leave() {
        let scope = Scope {
            node: Some("n1".into()),
            ..Scope::default()
        };
        let bound = event(EventType::Modified, Some((None, "a")), (Some("n1"), "a"));
        assert_eq!(scope.view(&bound), Some(EventType::Added));
        let changed = event(
            EventType::Modified,
            Some((Some("n1"), "a")),
            (Some("n1"), "b"),
        );
        assert_eq!(scope.view(&changed), Some(EventType::Modified));
        let moved = event(
            EventType::Modified,
            Some((Some("n1"), "a")),
            (Some("n2"), "a"),
        );
        assert_eq!(scope.view(&moved), Some(EventType::Deleted));
        let elsewhere = event(EventType::Modified, Some((Some("n2"), "a")), (None, "a"));
        assert_eq!(scope.view(&elsewhere), None);
        let deleted = event(EventType::Deleted, None, (Some("n1"), "a"));
        assert_eq!(scope.view(&deleted), Some(EventType::Deleted));
        let created = event(EventType::Added, None, (Some("n2"), "a"));
        assert_eq!(scope.view(&created), None);
    }

    #[test]
    fn a_vm_migrating_away_stays_in_its_old_node_scope() {
        let scope = Scope {
            node: Some("n1".into()),
            ..Scope::default()
        };
        let mut now = event(
            EventType::Modified,
            Some((Some("n1"), "a")),
            (Some("n2"), "a"),
        );
        let mut migrated = (*now.object).clone_facts();
        migrated.migrated_from = Some("n1".into());
        now.object = Arc::new(migrated);
        // Rebound to n2 with status.migration.from = n1: n1 still hears it.
        assert_eq!(scope.view(&now), Some(EventType::Modified));
        let target = Scope {
            node: Some("n2".into()),
            ..Scope::default()
        };
        assert_eq!(target.view(&now), Some(EventType::Added));
    }

    #[test]
    fn a_selector_watch_hears_labels_change() {
        let scope = Scope {
            selector: "app=a".parse().expect("selector"),
            ..Scope::default()
        };
        let relabelled = event(EventType::Modified, Some((None, "a")), (None, "b"));
        assert_eq!(scope.view(&relabelled), Some(EventType::Deleted));
        let labelled = event(EventType::Modified, Some((None, "b")), (None, "a"));
        assert_eq!(scope.view(&labelled), Some(EventType::Added));
    }

    #[test]
    fn a_manager_watch_hears_an_object_it_manages_arrive_and_leave() {
        let scope = Scope {
            manager: Some("job".into()),
            ..Scope::default()
        };
        let managed = |event_type, before: Option<Option<&str>>, now: Option<&str>| {
            let mut event = event(event_type, before.map(|_| (None, "a")), (None, "a"));
            let mut object = event.object.clone_facts();
            object.manager = now.map(str::to_string);
            event.object = Arc::new(object);
            if let (Some(previous), Some(manager)) = (event.previous.as_mut(), before) {
                previous.manager = manager.map(str::to_string);
            }
            event
        };
        let made = managed(EventType::Added, None, Some("job"));
        assert_eq!(scope.view(&made), Some(EventType::Added));
        let changed = managed(EventType::Modified, Some(Some("job")), Some("job"));
        assert_eq!(scope.view(&changed), Some(EventType::Modified));
        let let_go = managed(EventType::Modified, Some(Some("job")), None);
        assert_eq!(scope.view(&let_go), Some(EventType::Deleted));
        let taken = managed(EventType::Modified, Some(Some("job")), Some("pinned"));
        assert_eq!(scope.view(&taken), Some(EventType::Deleted));
        let adopted = managed(EventType::Modified, Some(None), Some("job"));
        assert_eq!(scope.view(&adopted), Some(EventType::Added));
        let others = managed(EventType::Modified, Some(Some("pinned")), Some("pinned"));
        assert_eq!(scope.view(&others), None);
        let unmanaged = managed(EventType::Added, None, None);
        assert_eq!(scope.view(&unmanaged), None);
        let gone = managed(EventType::Deleted, None, Some("job"));
        assert_eq!(scope.view(&gone), Some(EventType::Deleted));
    }
}
