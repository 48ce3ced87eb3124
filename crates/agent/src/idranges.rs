//! Host uid/gid ranges for pods' user namespaces: every pod gets its own
//! [`IDS_PER_POD`]-wide range, never overlapping another pod's on this
//! node. The table lives in one file, written atomically and fsynced
//! before a range is handed out, so a range survives the agent's restart
//! and is never given twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::sandbox::IDS_PER_POD;
use crate::state::{StateError, write_atomically};

/// The first host id handed to pods: far above any system or login user.
pub const FIRST_HOST_ID: u32 = 1 << 20;

/// How many pods can hold a range at once (ids up to about 2^28).
pub const SLOTS: u32 = 4096;

/// Pod uid → slot. Pure; [`IdRanges`] persists it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeTable {
    slots: BTreeMap<String, u32>,
}

/// What [`RangeTable::transfer`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// The range moved; its first host id.
    Moved(u32),
    /// The receiver holds a range already (kept); its first host id.
    AlreadyHeld(u32),
}

/// The giver of a transfer holds no range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} holds no id range to give")]
pub struct Missing(pub String);

/// Every slot is taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no free user-namespace id range on this node: all {SLOTS} are held by pods")]
pub struct Exhausted;

impl RangeTable {
    /// The first host id of `pod`'s range, taking the lowest free slot if
    /// it has none. Returns whether the table changed.
    pub fn allocate(&mut self, pod: &str) -> Result<(u32, bool), Exhausted> {
        if let Some(slot) = self.slots.get(pod) {
            return Ok((base(*slot), false));
        }
        let mut used: Vec<u32> = self.slots.values().copied().collect();
        used.sort_unstable();
        let mut free = 0;
        for slot in used {
            if slot == free {
                free += 1;
            } else if slot > free {
                break;
            }
        }
        if free >= SLOTS {
            return Err(Exhausted);
        }
        self.slots.insert(pod.to_string(), free);
        Ok((base(free), true))
    }

    /// Gives `from`'s slot to `to` (a spare sandbox's range to the pod
    /// claiming it); `to` keeps its own if it holds one.
    pub fn transfer(&mut self, from: &str, to: &str) -> Result<Transfer, Missing> {
        if let Some(slot) = self.slots.get(to) {
            return Ok(Transfer::AlreadyHeld(base(*slot)));
        }
        let slot = self
            .slots
            .remove(from)
            .ok_or_else(|| Missing(from.to_string()))?;
        self.slots.insert(to.to_string(), slot);
        Ok(Transfer::Moved(base(slot)))
    }

    /// Frees every range held under a name starting with `prefix`; how
    /// many.
    pub fn release_prefixed(&mut self, prefix: &str) -> usize {
        let before = self.slots.len();
        self.slots.retain(|holder, _| !holder.starts_with(prefix));
        before - self.slots.len()
    }

    /// Frees `pod`'s range; whether it held one.
    pub fn release(&mut self, pod: &str) -> bool {
        self.slots.remove(pod).is_some()
    }

    /// The first host id of `pod`'s range, if it holds one.
    pub fn get(&self, pod: &str) -> Option<u32> {
        self.slots.get(pod).copied().map(base)
    }
}

fn base(slot: u32) -> u32 {
    FIRST_HOST_ID + slot * IDS_PER_POD
}

/// The node's range table on disk.
#[derive(Debug)]
pub struct IdRanges {
    path: PathBuf,
    table: Mutex<RangeTable>,
}

impl IdRanges {
    /// Opens (or starts) the table at `path`.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        let table = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| StateError::Corrupt {
                path: path.to_path_buf(),
                source,
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => RangeTable::default(),
            Err(source) => {
                return Err(StateError::Io {
                    action: "read",
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Ok(IdRanges {
            path: path.to_path_buf(),
            table: Mutex::new(table),
        })
    }

    /// `pod`'s first host id, allocated and persisted if new.
    pub fn allocate(&self, pod: &str) -> Result<u32, String> {
        let mut table = self
            .table
            .lock()
            .map_err(|_| "the id range table lock is poisoned".to_string())?;
        let mut next = table.clone();
        let (base, changed) = next.allocate(pod).map_err(|e| e.to_string())?;
        if changed {
            self.persist(&next).map_err(|e| crate::chain(&e))?;
            *table = next;
        }
        Ok(base)
    }

    /// The first host id of `pod`'s range, if it holds one.
    pub fn get(&self, pod: &str) -> Option<u32> {
        self.table.lock().ok()?.get(pod)
    }

    /// Gives `from`'s range to `to` (persisted), unless `to` holds one.
    pub fn transfer(&self, from: &str, to: &str) -> Result<Transfer, String> {
        let mut table = self
            .table
            .lock()
            .map_err(|_| "the id range table lock is poisoned".to_string())?;
        let mut next = table.clone();
        let transfer = next.transfer(from, to).map_err(|e| e.to_string())?;
        if let Transfer::Moved(_) = transfer {
            self.persist(&next).map_err(|e| crate::chain(&e))?;
            *table = next;
        }
        Ok(transfer)
    }

    /// Frees every range held under a name starting with `prefix`
    /// (persisted); how many.
    pub fn release_prefixed(&self, prefix: &str) -> Result<usize, StateError> {
        let Ok(mut table) = self.table.lock() else {
            return Ok(0);
        };
        let mut next = table.clone();
        let released = next.release_prefixed(prefix);
        if released > 0 {
            self.persist(&next)?;
            *table = next;
        }
        Ok(released)
    }

    /// Frees `pod`'s range once its containers are gone.
    pub fn release(&self, pod: &str) -> Result<(), StateError> {
        let Ok(mut table) = self.table.lock() else {
            return Ok(());
        };
        let mut next = table.clone();
        if next.release(pod) {
            self.persist(&next)?;
            *table = next;
        }
        Ok(())
    }

    fn persist(&self, table: &RangeTable) -> Result<(), StateError> {
        let bytes = serde_json::to_vec_pretty(table).map_err(|source| StateError::Corrupt {
            path: self.path.clone(),
            source,
        })?;
        write_atomically(&self.path, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_never_overlap_and_freed_slots_are_reused() {
        let mut table = RangeTable::default();
        let (a, new_a) = table.allocate("a").expect("a");
        let (b, _) = table.allocate("b").expect("b");
        let (c, _) = table.allocate("c").expect("c");
        assert!(new_a);
        assert_eq!(a, FIRST_HOST_ID);
        assert_eq!(b, a + IDS_PER_POD);
        assert_eq!(c, b + IDS_PER_POD);
        assert_eq!(table.allocate("b").expect("again"), (b, false));
        assert!(table.release("b"));
        assert!(!table.release("b"));
        let (d, _) = table.allocate("d").expect("d");
        assert_eq!(d, b, "the freed slot is taken first");
        assert_eq!(table.get("c"), Some(c));
    }

    #[test]
    fn a_range_is_transferred_once_and_never_to_a_holder() {
        let mut table = RangeTable::default();
        let (spare, _) = table.allocate("spare:spare-1").expect("spare");
        let (own, _) = table.allocate("pod-own").expect("own");
        assert_eq!(
            table.transfer("spare:spare-1", "pod-own"),
            Ok(Transfer::AlreadyHeld(own))
        );
        assert_eq!(
            table.transfer("spare:spare-1", "pod-a"),
            Ok(Transfer::Moved(spare))
        );
        assert_eq!(table.get("pod-a"), Some(spare));
        assert_eq!(table.get("spare:spare-1"), None);
        assert_eq!(
            table.transfer("spare:spare-1", "pod-b"),
            Err(Missing("spare:spare-1".into()))
        );
        table.allocate("spare:spare-2").expect("spare 2");
        table.allocate("spare:spare-3").expect("spare 3");
        assert_eq!(table.release_prefixed("spare:"), 2);
        assert_eq!(table.get("pod-a"), Some(spare));
        assert_eq!(table.get("pod-own"), Some(own));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut table = RangeTable::default();
        for i in 0..SLOTS {
            table.allocate(&format!("p{i}")).expect("free slot");
        }
        assert_eq!(table.allocate("one-more"), Err(Exhausted));
        let last = FIRST_HOST_ID as u64 + SLOTS as u64 * IDS_PER_POD as u64;
        assert!(last <= u32::MAX as u64);
    }

    #[test]
    fn the_table_survives_a_restart() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("id-ranges.json");
        let ranges = IdRanges::open(&path).expect("open");
        let a = ranges.allocate("a").expect("a");
        let b = ranges.allocate("b").expect("b");
        ranges.release("a").expect("release");
        let reopened = IdRanges::open(&path).expect("reopen");
        assert_eq!(reopened.allocate("b").expect("b"), b);
        assert_eq!(reopened.allocate("c").expect("c"), a);
    }
}
