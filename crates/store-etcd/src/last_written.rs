//! What this store last wrote under each object key, so the next write of
//! the same object needs neither a read of the object nor of the history
//! chain its delta is encoded against: one transaction instead of three
//! round trips.
//!
//! Several servers share etcd, so an entry is only ever a *guess*: a write
//! that uses it compares, in its own transaction, the key's `mod_revision`
//! and its whole stored value with the entry's. If anyone else wrote the
//! key since (or etcd was restored from a backup), the transaction fails,
//! the entry is dropped and the write starts over the ordinary way,
//! reading etcd. Entries are made only from this store's successful writes,
//! where the spec bytes are exactly those the history revision was encoded
//! from (bytes parsed back from etcd could differ from them by a float's
//! last digit).

use std::collections::{HashMap, VecDeque};

use corral_api::Object;

/// How many objects are remembered; the oldest-remembered go first.
const CAPACITY: usize = 16_384;

/// One object as this store last wrote it.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    /// The key's `mod_revision` after the write.
    pub mod_revision: i64,
    /// The value stored under the key (compared byte for byte).
    pub body: Vec<u8>,
    /// The object as written, `resourceVersion` set.
    pub object: Object,
    /// The JSON of revision `object.metadata.revision`'s spec as history
    /// holds it, when this store wrote that revision.
    pub spec_bytes: Option<Vec<u8>>,
}

#[derive(Debug, Default)]
pub(crate) struct LastWritten {
    entries: HashMap<String, Written>,
    /// Keys in the order they entered `entries`, for eviction.
    order: VecDeque<String>,
}

impl LastWritten {
    /// The entry for etcd key `key`, if its `mod_revision` is `mod_revision`
    /// (any when `None`).
    pub fn get(&self, key: &str, mod_revision: Option<i64>) -> Option<&Written> {
        self.entries
            .get(key)
            .filter(|written| mod_revision.is_none_or(|wanted| written.mod_revision == wanted))
    }

    pub fn insert(&mut self, key: String, written: Written) {
        if self.entries.insert(key.clone(), written).is_none() {
            self.order.push_back(key);
        }
        while self.entries.len() > CAPACITY {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        if self.order.len() > 2 * CAPACITY {
            let entries = &self.entries;
            self.order.retain(|key| entries.contains_key(key));
        }
    }

    pub fn remove(&mut self, key: &str) {
        self.entries.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::Kind;
    use serde_json::json;

    fn written(mod_revision: i64) -> Written {
        Written {
            mod_revision,
            body: b"{}".to_vec(),
            object: Object::new(Kind::Pod, Some("default"), "web", json!({})),
            spec_bytes: None,
        }
    }

    #[test]
    fn an_entry_answers_only_for_its_mod_revision() {
        let mut last = LastWritten::default();
        last.insert("k".into(), written(7));
        assert!(last.get("k", Some(7)).is_some());
        assert!(last.get("k", Some(8)).is_none());
        assert!(last.get("k", None).is_some());
        last.remove("k");
        assert!(last.get("k", None).is_none());
    }

    #[test]
    fn memory_stays_bounded() {
        let mut last = LastWritten::default();
        for index in 0..(CAPACITY + 5) {
            last.insert(format!("k{index}"), written(1));
        }
        assert_eq!(last.entries.len(), CAPACITY);
        assert!(last.get("k0", None).is_none(), "the oldest went first");
        assert!(last.get(&format!("k{}", CAPACITY + 4), None).is_some());
    }
}
