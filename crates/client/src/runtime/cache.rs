//! The shared in-memory copy of one kind's objects an [`super::Informer`]
//! keeps, with secondary indexes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use corral_api::{Object, ObjectKey};

/// A secondary index: the values an object is filed under (`node-1` for a
/// pod bound to node-1). An object may be under several values or none.
#[derive(Clone, Copy)]
pub struct Index {
    pub name: &'static str,
    pub values: fn(&Object) -> Vec<String>,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index").field("name", &self.name).finish()
    }
}

/// What a cache holds. Readers take the lock briefly and clone `Arc`s out;
/// nobody holds it across an `.await`.
#[derive(Debug, Default)]
struct CacheState {
    objects: HashMap<ObjectKey, Arc<Object>>,
    /// Index name → value → keys filed under it.
    indexed: HashMap<&'static str, HashMap<String, BTreeSet<ObjectKey>>>,
    indexes: Vec<Index>,
    /// The store revision the cache reflects.
    resource_version: u64,
    /// Whether the first list has been applied.
    synced: bool,
}

/// A shared, read-only (to its users) view of one kind's objects. Cheap to
/// clone; clones share the same state.
#[derive(Debug, Clone, Default)]
pub struct Cache {
    state: Arc<RwLock<CacheState>>,
}

impl Cache {
    pub(crate) fn new(indexes: Vec<Index>) -> Self {
        let indexed = indexes
            .iter()
            .map(|index| (index.name, HashMap::new()))
            .collect();
        Cache {
            state: Arc::new(RwLock::new(CacheState {
                indexed,
                indexes,
                ..CacheState::default()
            })),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, CacheState> {
        // A panic in a reader cannot leave the maps half-written (writers
        // finish each change before releasing), so a poisoned lock is fine.
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, CacheState> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get(&self, key: &ObjectKey) -> Option<Arc<Object>> {
        self.read().objects.get(key).cloned()
    }

    /// Every object, in no particular order. O(n): for rare whole-kind
    /// questions, never for per-change work.
    pub fn list(&self) -> Vec<Arc<Object>> {
        self.read().objects.values().cloned().collect()
    }

    /// The objects filed under `value` in index `index` (empty for an
    /// unknown index).
    pub fn by_index(&self, index: &str, value: &str) -> Vec<Arc<Object>> {
        let state = self.read();
        let Some(keys) = state
            .indexed
            .get(index)
            .and_then(|values| values.get(value))
        else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|key| state.objects.get(key).cloned())
            .collect()
    }

    /// How many objects are filed under `value` in index `index`.
    pub fn count_by_index(&self, index: &str, value: &str) -> usize {
        self.read()
            .indexed
            .get(index)
            .and_then(|values| values.get(value))
            .map_or(0, BTreeSet::len)
    }

    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the first list has been applied: before that, an absent
    /// object may simply not be known yet.
    pub fn synced(&self) -> bool {
        self.read().synced
    }

    /// The store revision the cache reflects.
    pub fn resource_version(&self) -> u64 {
        self.read().resource_version
    }

    /// Stores `object` unless the cache already has it at the same or a
    /// newer `resourceVersion` (a replayed, older event). Returns the
    /// object it replaced, and whether anything changed.
    pub(crate) fn apply(&self, object: Object) -> Option<(Option<Arc<Object>>, Arc<Object>)> {
        let mut state = self.write();
        let key = object.key();
        let version = object.metadata.resource_version;
        state.resource_version = state.resource_version.max(version);
        if let Some(current) = state.objects.get(&key)
            && current.metadata.resource_version >= version
        {
            return None;
        }
        let object = Arc::new(object);
        let old = state.objects.insert(key.clone(), object.clone());
        if let Some(old) = &old {
            unindex(&mut state, &key, old);
        }
        index(&mut state, &key, &object);
        Some((old, object))
    }

    /// Forgets the object at `key` if the deletion is newer than what the
    /// cache has. Returns the object removed.
    pub(crate) fn remove(&self, key: &ObjectKey, version: u64) -> Option<Arc<Object>> {
        let mut state = self.write();
        state.resource_version = state.resource_version.max(version);
        if state
            .objects
            .get(key)
            .is_none_or(|current| current.metadata.resource_version > version)
        {
            return None;
        }
        let old = state.objects.remove(key)?;
        unindex(&mut state, key, &old);
        Some(old)
    }

    /// Replaces everything with a fresh list read at `resource_version`.
    /// Returns the objects that are gone and the ones that are new or
    /// changed (with what they replaced).
    #[allow(clippy::type_complexity)]
    pub(crate) fn replace(
        &self,
        objects: Vec<Object>,
        resource_version: u64,
    ) -> (Vec<Arc<Object>>, Vec<(Option<Arc<Object>>, Arc<Object>)>) {
        let mut state = self.write();
        let mut old = std::mem::take(&mut state.objects);
        for values in state.indexed.values_mut() {
            values.clear();
        }
        let mut applied = Vec::new();
        for object in objects {
            let key = object.key();
            let previous = old.remove(&key);
            let object = match previous {
                Some(previous)
                    if previous.metadata.resource_version == object.metadata.resource_version =>
                {
                    previous
                }
                previous => {
                    let object = Arc::new(object);
                    applied.push((previous, object.clone()));
                    object
                }
            };
            index(&mut state, &key, &object);
            state.objects.insert(key, object);
        }
        state.resource_version = resource_version;
        state.synced = true;
        (old.into_values().collect(), applied)
    }
}

fn index(state: &mut CacheState, key: &ObjectKey, object: &Object) {
    for position in 0..state.indexes.len() {
        let index = state.indexes[position];
        let values = (index.values)(object);
        let filed = state.indexed.entry(index.name).or_default();
        for value in values {
            filed.entry(value).or_default().insert(key.clone());
        }
    }
}

fn unindex(state: &mut CacheState, key: &ObjectKey, object: &Object) {
    for position in 0..state.indexes.len() {
        let index = state.indexes[position];
        let Some(filed) = state.indexed.get_mut(index.name) else {
            continue;
        };
        for value in (index.values)(object) {
            if let Some(keys) = filed.get_mut(&value) {
                keys.remove(key);
                if keys.is_empty() {
                    filed.remove(&value);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use corral_api::Kind;
    use serde_json::json;

    use super::*;

    fn pod(name: &str, node: Option<&str>, version: u64) -> Object {
        let mut object = Object::new(Kind::Pod, Some("default"), name, json!({}));
        object.metadata.resource_version = version;
        if let Some(node) = node {
            object.status = json!({"node": node});
        }
        object
    }

    fn by_node(object: &Object) -> Vec<String> {
        object
            .status
            .get("node")
            .and_then(|n| n.as_str())
            .map(str::to_string)
            .into_iter()
            .collect()
    }

    fn cache() -> Cache {
        Cache::new(vec![Index {
            name: "node",
            values: by_node,
        }])
    }

    fn names(objects: &[Arc<Object>]) -> Vec<String> {
        let mut names: Vec<String> = objects.iter().map(|o| o.metadata.name.clone()).collect();
        names.sort();
        names
    }

    #[test]
    fn an_older_event_never_replaces_a_newer_object() {
        let cache = cache();
        assert!(cache.apply(pod("a", None, 5)).is_some());
        assert!(cache.apply(pod("a", Some("n1"), 4)).is_none());
        assert!(cache.apply(pod("a", Some("n1"), 5)).is_none());
        let key = pod("a", None, 0).key();
        assert_eq!(
            cache.get(&key).map(|o| o.metadata.resource_version),
            Some(5)
        );
        assert!(
            cache.remove(&key, 3).is_none(),
            "an older deletion is stale"
        );
        assert!(cache.remove(&key, 6).is_some());
        assert!(cache.get(&key).is_none());
    }

    #[test]
    fn indexes_follow_changes() {
        let cache = cache();
        cache.apply(pod("a", Some("n1"), 1));
        cache.apply(pod("b", Some("n1"), 2));
        cache.apply(pod("c", Some("n2"), 3));
        assert_eq!(names(&cache.by_index("node", "n1")), ["a", "b"]);
        cache.apply(pod("b", Some("n2"), 4));
        assert_eq!(names(&cache.by_index("node", "n1")), ["a"]);
        assert_eq!(names(&cache.by_index("node", "n2")), ["b", "c"]);
        cache.remove(&pod("c", None, 0).key(), 5);
        assert_eq!(cache.count_by_index("node", "n2"), 1);
        assert!(cache.by_index("zone", "x").is_empty());
    }

    #[test]
    fn replace_reports_what_is_gone_and_what_changed() {
        let cache = cache();
        cache.apply(pod("a", Some("n1"), 1));
        cache.apply(pod("b", Some("n1"), 2));
        let (gone, applied) = cache.replace(vec![pod("b", Some("n1"), 2), pod("c", None, 7)], 9);
        assert_eq!(names(&gone), ["a"]);
        let changed: Vec<String> = applied
            .iter()
            .map(|(_, o)| o.metadata.name.clone())
            .collect();
        assert_eq!(changed, ["c"], "b is unchanged");
        assert_eq!(names(&cache.by_index("node", "n1")), ["b"]);
        assert_eq!(cache.resource_version(), 9);
        assert!(cache.synced());
    }
}
