//! The dependents index: which cached objects name an owner, by the
//! owner's uid. A cascading delete asks it for an owner's dependents
//! instead of reading every object of every kind.

use std::collections::{BTreeSet, HashMap};

use corral_api::{Kind, ObjectKey};

use super::{CachedObject, WatchCache};
use crate::error::ApiError;

/// Dependents by owner uid. Kept under the cache's lock, changed with the
/// objects it indexes.
#[derive(Debug, Default)]
pub(super) struct Dependents {
    by_owner: HashMap<String, BTreeSet<ObjectKey>>,
}

impl Dependents {
    /// Files `object` under its owner, if it names one.
    pub(super) fn add(&mut self, kind: Kind, object: &CachedObject) {
        if let Some(uid) = &object.owner_uid {
            self.by_owner
                .entry(uid.clone())
                .or_default()
                .insert(key(kind, object));
        }
    }

    /// Forgets `object` (the version that was filed).
    pub(super) fn remove(&mut self, kind: Kind, object: &CachedObject) {
        let Some(uid) = &object.owner_uid else {
            return;
        };
        if let Some(keys) = self.by_owner.get_mut(uid) {
            keys.remove(&key(kind, object));
            if keys.is_empty() {
                self.by_owner.remove(uid);
            }
        }
    }

    /// The objects naming the owner of uid `owner`, in key order.
    pub(super) fn of(&self, owner: &str) -> Vec<ObjectKey> {
        self.by_owner
            .get(owner)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default()
    }
}

fn key(kind: Kind, object: &CachedObject) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: object.namespace.clone(),
        name: object.name.clone(),
    }
}

impl WatchCache {
    /// The objects whose `metadata.owner` names the uid `owner`, once the
    /// cache has every write this server made so far (the owner's own
    /// deletion included).
    pub async fn dependents(&self, owner: &str) -> Result<Vec<ObjectKey>, ApiError> {
        self.has_own_writes().await?;
        Ok(self.read().dependents.of(owner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn cached(name: &str, owner: Option<&str>) -> CachedObject {
        CachedObject {
            namespace: "default".into(),
            name: name.into(),
            resource_version: 1,
            node: None,
            migrated_from: None,
            labels: Default::default(),
            owner_uid: owner.map(str::to_string),
            manager: None,
            json: Bytes::new(),
        }
    }

    #[test]
    fn files_and_forgets_dependents_by_owner_uid() {
        let mut index = Dependents::default();
        index.add(Kind::Pod, &cached("web-1", Some("u-1")));
        index.add(Kind::Pod, &cached("web-0", Some("u-1")));
        index.add(Kind::Pod, &cached("api-0", Some("u-2")));
        index.add(Kind::Pod, &cached("lonely", None));
        let names = |index: &Dependents, uid| -> Vec<String> {
            index.of(uid).into_iter().map(|key| key.name).collect()
        };
        assert_eq!(names(&index, "u-1"), ["web-0", "web-1"]);
        assert_eq!(names(&index, "u-2"), ["api-0"]);
        index.remove(Kind::Pod, &cached("web-0", Some("u-1")));
        index.remove(Kind::Pod, &cached("lonely", None));
        assert_eq!(names(&index, "u-1"), ["web-1"]);
        index.remove(Kind::Pod, &cached("web-1", Some("u-1")));
        assert!(index.of("u-1").is_empty());
        assert!(
            !index.by_owner.contains_key("u-1"),
            "empty entries are dropped"
        );
    }
}
