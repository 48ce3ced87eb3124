//! The writer's cache of each object's newest spec bytes, so appending a
//! revision does not decode the delta chain (up to 63 deltas) it is
//! encoded against, and an update tells whether its spec changed without
//! parsing the stored object.
//!
//! An entry is `(uid, revision) → bytes`, and revision N of a uid is
//! written once and never changes its decoded bytes (compaction re-encodes
//! but keeps them), so an entry is true for as long as it is in the
//! database. Entries of the group being written are staged and become
//! visible to later writes of the same group at once, but join the cache
//! only when the group commits; a failed commit forgets them. Only the
//! writer thread writes revisions, so nothing else can make an entry stale.

use std::collections::{HashMap, VecDeque};

/// How many objects' specs are kept; the oldest-cached go first.
const CAPACITY: usize = 16_384;

#[derive(Default)]
pub(super) struct SpecCache {
    committed: HashMap<String, (u64, Vec<u8>)>,
    /// Uids in the order they entered `committed`, for eviction.
    order: VecDeque<String>,
    /// This group's changes: bytes of a new revision, or `None` for an
    /// object deleted.
    staged: HashMap<String, Option<(u64, Vec<u8>)>>,
}

impl SpecCache {
    /// The bytes of revision `revision` of `uid`, if cached.
    pub fn get(&self, uid: &str, revision: u64) -> Option<&[u8]> {
        let entry = match self.staged.get(uid) {
            Some(staged) => staged.as_ref(),
            None => self.committed.get(uid),
        };
        entry
            .filter(|(cached, _)| *cached == revision)
            .map(|(_, bytes)| bytes.as_slice())
    }

    /// Records the bytes of a revision written in the current group.
    pub fn stage(&mut self, uid: &str, revision: u64, bytes: Vec<u8>) {
        self.staged.insert(uid.to_string(), Some((revision, bytes)));
    }

    /// Records that the current group deleted the object with `uid`.
    pub fn stage_removal(&mut self, uid: &str) {
        self.staged.insert(uid.to_string(), None);
    }

    /// Moves what `write` staged (one write of the group, applied
    /// successfully) into this cache's staged entries.
    pub fn take_staged(&mut self, write: &mut SpecCache) {
        self.staged.extend(write.staged.drain());
    }

    /// The group committed: its entries join the cache.
    pub fn commit(&mut self) {
        for (uid, entry) in self.staged.drain() {
            match entry {
                Some(entry) => {
                    if self.committed.insert(uid.clone(), entry).is_none() {
                        self.order.push_back(uid);
                    }
                }
                None => {
                    self.committed.remove(&uid);
                }
            }
        }
        while self.committed.len() > CAPACITY {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.committed.remove(&oldest);
        }
        // Removed uids linger in `order` until they reach its front; keep
        // it from growing past twice what is cached.
        if self.order.len() > 2 * CAPACITY {
            let committed = &self.committed;
            self.order.retain(|uid| committed.contains_key(uid));
        }
    }

    /// The group did not commit: forget its entries.
    pub fn abort(&mut self) {
        self.staged.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::SpecCache;

    #[test]
    fn staged_entries_are_seen_at_once_and_kept_only_on_commit() {
        let mut cache = SpecCache::default();
        cache.stage("a", 1, b"one".to_vec());
        assert_eq!(
            cache.get("a", 1),
            Some(&b"one"[..]),
            "a later write of the group sees it"
        );
        assert_eq!(cache.get("a", 2), None, "only the cached revision");
        cache.abort();
        assert_eq!(cache.get("a", 1), None, "an aborted group leaves nothing");

        cache.stage("a", 1, b"one".to_vec());
        cache.commit();
        cache.stage("a", 2, b"two".to_vec());
        assert_eq!(cache.get("a", 2), Some(&b"two"[..]));
        assert_eq!(
            cache.get("a", 1),
            None,
            "the staged revision shadows the old one"
        );
        cache.abort();
        assert_eq!(
            cache.get("a", 1),
            Some(&b"one"[..]),
            "abort restores the committed entry"
        );

        cache.stage_removal("a");
        assert_eq!(cache.get("a", 1), None);
        cache.commit();
        assert_eq!(cache.get("a", 1), None, "a deleted object is forgotten");
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut cache = SpecCache::default();
        for index in 0..(super::CAPACITY + 10) {
            cache.stage(&format!("uid-{index}"), 1, vec![0]);
            cache.commit();
        }
        assert_eq!(cache.committed.len(), super::CAPACITY);
        assert_eq!(cache.get("uid-0", 1), None, "the oldest went first");
        assert!(
            cache
                .get(&format!("uid-{}", super::CAPACITY + 9), 1)
                .is_some()
        );
    }
}
