//! The shared in-memory copy of one kind's objects an [`super::Informer`]
//! keeps, with secondary indexes.
//!
//! The cache holds what the informer's projection makes of each object:
//! the whole object by default, or just the facts a controller needs (a
//! scheduler keeps each pod's node and requests, not its spec), so a
//! controller of 10,000 pods keeps 10,000 small records.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use corral_api::ObjectKey;

/// A secondary index: the values an item is filed under (`node-1` for a
/// pod bound to node-1). An item may be under several values or none.
pub struct Index<T> {
    pub name: &'static str,
    pub values: fn(&T) -> Vec<String>,
}

impl<T> Clone for Index<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Index<T> {}

impl<T> std::fmt::Debug for Index<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index").field("name", &self.name).finish()
    }
}

/// One cached item and the `resourceVersion` of the object it came from.
#[derive(Debug)]
struct Entry<T> {
    version: u64,
    item: Arc<T>,
}

/// What a cache holds. Readers take the lock briefly and clone `Arc`s out;
/// nobody holds it across an `.await`.
#[derive(Debug)]
struct CacheState<T> {
    entries: HashMap<ObjectKey, Entry<T>>,
    /// Index name → value → keys filed under it.
    indexed: HashMap<&'static str, HashMap<String, BTreeSet<ObjectKey>>>,
    indexes: Vec<Index<T>>,
    /// The store revision the cache reflects.
    resource_version: u64,
    /// Whether the first list has been applied.
    synced: bool,
}

/// A shared, read-only (to its users) view of one kind's objects, as
/// projected. Cheap to clone; clones share the same state.
#[derive(Debug)]
pub struct Cache<T> {
    state: Arc<RwLock<CacheState<T>>>,
}

impl<T> Clone for Cache<T> {
    fn clone(&self) -> Self {
        Cache {
            state: self.state.clone(),
        }
    }
}

/// What [`Cache::replace`] found: the items gone, and the new or changed
/// ones with what they replaced.
pub(crate) type Replaced<T> = (
    Vec<(ObjectKey, Arc<T>)>,
    Vec<(ObjectKey, Option<Arc<T>>, Arc<T>)>,
);

impl<T> Cache<T> {
    pub(crate) fn new(indexes: Vec<Index<T>>) -> Self {
        let indexed = indexes
            .iter()
            .map(|index| (index.name, HashMap::new()))
            .collect();
        Cache {
            state: Arc::new(RwLock::new(CacheState {
                entries: HashMap::new(),
                indexed,
                indexes,
                resource_version: 0,
                synced: false,
            })),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, CacheState<T>> {
        // A panic in a reader cannot leave the maps half-written (writers
        // finish each change before releasing), so a poisoned lock is fine.
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, CacheState<T>> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get(&self, key: &ObjectKey) -> Option<Arc<T>> {
        self.read().entries.get(key).map(|entry| entry.item.clone())
    }

    /// Every item with its key, in no particular order. O(n): for rare
    /// whole-kind questions, never for per-change work.
    pub fn list(&self) -> Vec<(ObjectKey, Arc<T>)> {
        self.read()
            .entries
            .iter()
            .map(|(key, entry)| (key.clone(), entry.item.clone()))
            .collect()
    }

    /// The items filed under `value` in index `index` (empty for an
    /// unknown index).
    pub fn by_index(&self, index: &str, value: &str) -> Vec<(ObjectKey, Arc<T>)> {
        let state = self.read();
        let Some(keys) = state
            .indexed
            .get(index)
            .and_then(|values| values.get(value))
        else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|key| {
                state
                    .entries
                    .get(key)
                    .map(|entry| (key.clone(), entry.item.clone()))
            })
            .collect()
    }

    /// How many items are filed under `value` in index `index`.
    pub fn count_by_index(&self, index: &str, value: &str) -> usize {
        self.read()
            .indexed
            .get(index)
            .and_then(|values| values.get(value))
            .map_or(0, BTreeSet::len)
    }

    pub fn len(&self) -> usize {
        self.read().entries.len()
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

    /// Stores `item` for the object at `key` unless the cache already has
    /// it at the same or a newer `version` (a replayed, older event).
    /// Returns the item it replaced, if anything changed.
    pub(crate) fn apply(
        &self,
        key: &ObjectKey,
        version: u64,
        item: T,
    ) -> Option<(Option<Arc<T>>, Arc<T>)> {
        let mut state = self.write();
        state.resource_version = state.resource_version.max(version);
        if state
            .entries
            .get(key)
            .is_some_and(|current| current.version >= version)
        {
            return None;
        }
        let item = Arc::new(item);
        let entry = Entry {
            version,
            item: item.clone(),
        };
        let old = state.entries.insert(key.clone(), entry).map(|old| old.item);
        if let Some(old) = &old {
            unindex(&mut state, key, old);
        }
        index(&mut state, key, &item);
        Some((old, item))
    }

    /// Forgets the object at `key` if the deletion (at `version`) is newer
    /// than what the cache has. Returns the item removed.
    pub(crate) fn remove(&self, key: &ObjectKey, version: u64) -> Option<Arc<T>> {
        let mut state = self.write();
        state.resource_version = state.resource_version.max(version);
        if state
            .entries
            .get(key)
            .is_none_or(|current| current.version > version)
        {
            return None;
        }
        let old = state.entries.remove(key)?.item;
        unindex(&mut state, key, &old);
        Some(old)
    }

    /// Replaces everything with a fresh list read at `resource_version`.
    pub(crate) fn replace(
        &self,
        items: Vec<(ObjectKey, u64, T)>,
        resource_version: u64,
    ) -> Replaced<T> {
        let mut state = self.write();
        let mut old = std::mem::take(&mut state.entries);
        for values in state.indexed.values_mut() {
            values.clear();
        }
        let mut applied = Vec::new();
        for (key, version, item) in items {
            let entry = match old.remove(&key) {
                Some(previous) if previous.version == version => previous,
                previous => {
                    let item = Arc::new(item);
                    applied.push((key.clone(), previous.map(|p| p.item), item.clone()));
                    Entry { version, item }
                }
            };
            let item = entry.item.clone();
            state.entries.insert(key.clone(), entry);
            index(&mut state, &key, &item);
        }
        state.resource_version = resource_version;
        state.synced = true;
        let gone = old
            .into_iter()
            .map(|(key, entry)| (key, entry.item))
            .collect();
        (gone, applied)
    }
}

fn index<T>(state: &mut CacheState<T>, key: &ObjectKey, item: &T) {
    for position in 0..state.indexes.len() {
        let index = state.indexes[position];
        let values = (index.values)(item);
        let filed = state.indexed.entry(index.name).or_default();
        for value in values {
            filed.entry(value).or_default().insert(key.clone());
        }
    }
}

fn unindex<T>(state: &mut CacheState<T>, key: &ObjectKey, item: &T) {
    for position in 0..state.indexes.len() {
        let index = state.indexes[position];
        let Some(filed) = state.indexed.get_mut(index.name) else {
            continue;
        };
        for value in (index.values)(item) {
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
    use corral_api::{Kind, Object};
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

    fn cache() -> Cache<Object> {
        Cache::new(vec![Index {
            name: "node",
            values: by_node,
        }])
    }

    fn apply(cache: &Cache<Object>, object: Object) -> bool {
        let (key, version) = (object.key(), object.metadata.resource_version);
        cache.apply(&key, version, object).is_some()
    }

    fn names(items: &[(ObjectKey, Arc<Object>)]) -> Vec<String> {
        let mut names: Vec<String> = items.iter().map(|(key, _)| key.name.clone()).collect();
        names.sort();
        names
    }

    fn entry(object: Object) -> (ObjectKey, u64, Object) {
        (object.key(), object.metadata.resource_version, object)
    }

    #[test]
    fn an_older_event_never_replaces_a_newer_object() {
        let cache = cache();
        assert!(apply(&cache, pod("a", None, 5)));
        assert!(!apply(&cache, pod("a", Some("n1"), 4)));
        assert!(!apply(&cache, pod("a", Some("n1"), 5)));
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
        apply(&cache, pod("a", Some("n1"), 1));
        apply(&cache, pod("b", Some("n1"), 2));
        apply(&cache, pod("c", Some("n2"), 3));
        assert_eq!(names(&cache.by_index("node", "n1")), ["a", "b"]);
        apply(&cache, pod("b", Some("n2"), 4));
        assert_eq!(names(&cache.by_index("node", "n1")), ["a"]);
        assert_eq!(names(&cache.by_index("node", "n2")), ["b", "c"]);
        cache.remove(&pod("c", None, 0).key(), 5);
        assert_eq!(cache.count_by_index("node", "n2"), 1);
        assert!(cache.by_index("zone", "x").is_empty());
    }

    #[test]
    fn replace_reports_what_is_gone_and_what_changed() {
        let cache = cache();
        apply(&cache, pod("a", Some("n1"), 1));
        apply(&cache, pod("b", Some("n1"), 2));
        let (gone, applied) = cache.replace(
            vec![entry(pod("b", Some("n1"), 2)), entry(pod("c", None, 7))],
            9,
        );
        assert_eq!(names(&gone), ["a"]);
        let changed: Vec<String> = applied.iter().map(|(key, _, _)| key.name.clone()).collect();
        assert_eq!(changed, ["c"], "b is unchanged");
        assert_eq!(names(&cache.by_index("node", "n1")), ["b"]);
        assert_eq!(cache.resource_version(), 9);
        assert!(cache.synced());
    }
}
