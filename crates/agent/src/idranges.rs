//! Host uid/gid ranges for pods' user namespaces: every pod gets its own
//! [`IDS_PER_POD`]-wide range, never overlapping another pod's on this
//! node. Every change is durable before a range is handed out, so a range
//! survives the agent's restart and is never given twice.
//!
//! On disk: a snapshot of the table (`id-ranges.json`, written
//! atomically) and a journal beside it (`id-ranges.journal`), one line per
//! change appended and fdatasynced: a pod start's change costs one
//! append, not a new file, two fsyncs and a rename. Opening replays the
//! journal onto the snapshot and folds it in; so does a journal grown past
//! [`FOLD_AFTER`] lines. A change names each holder's new slot (or none), so
//! replaying a journal already folded in changes nothing.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
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

    /// Every holder of a range.
    pub fn holders(&self) -> impl Iterator<Item = &str> {
        self.slots.keys().map(String::as_str)
    }
}

fn base(slot: u32) -> u32 {
    FIRST_HOST_ID + slot * IDS_PER_POD
}

/// Journal lines after which the journal is folded into the snapshot.
pub const FOLD_AFTER: usize = 256;

/// One journal line: holders given a slot, and holders whose slot is free.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Change {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    set: BTreeMap<String, u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    unset: Vec<String>,
}

impl Change {
    /// What turns `old` into `new`.
    fn between(old: &RangeTable, new: &RangeTable) -> Self {
        let set = new
            .slots
            .iter()
            .filter(|(holder, slot)| old.slots.get(*holder) != Some(slot))
            .map(|(holder, slot)| (holder.clone(), *slot))
            .collect();
        let unset = old
            .slots
            .keys()
            .filter(|holder| !new.slots.contains_key(*holder))
            .cloned()
            .collect();
        Change { set, unset }
    }

    fn apply(self, table: &mut RangeTable) {
        for holder in self.unset {
            table.slots.remove(&holder);
        }
        table.slots.extend(self.set);
    }
}

/// The journal beside the snapshot at `path`.
fn journal_path(path: &Path) -> PathBuf {
    path.with_extension("journal")
}

/// The table as the snapshot at `path` and its journal say, without
/// changing either. A last line a crash cut short was never acknowledged
/// (its fdatasync had not returned) and is left out.
pub fn read_table(path: &Path) -> Result<RangeTable, StateError> {
    let mut table: RangeTable = match read_file(path)? {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(StateError::corrupt(path))?,
        None => RangeTable::default(),
    };
    let journal = journal_path(path);
    let bytes = read_file(&journal)?.unwrap_or_default();
    let whole = bytes
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |end| end + 1);
    for line in bytes[..whole].split(|b| *b == b'\n') {
        if !line.is_empty() {
            let change: Change =
                serde_json::from_slice(line).map_err(StateError::corrupt(&journal))?;
            change.apply(&mut table);
        }
    }
    Ok(table)
}

fn read_file(path: &Path) -> Result<Option<Vec<u8>>, StateError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateError::io("read", path)(source)),
    }
}

/// The node's range table on disk.
#[derive(Debug)]
pub struct IdRanges {
    path: PathBuf,
    table: Mutex<Journaled>,
}

/// The table and its open journal.
#[derive(Debug)]
struct Journaled {
    table: RangeTable,
    journal: File,
    lines: usize,
}

impl IdRanges {
    /// Opens (or starts) the table at `path`, folding its journal in.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        let table = read_table(path)?;
        let journal_path = journal_path(path);
        let journal = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&journal_path)
            .map_err(StateError::io("open", &journal_path))?;
        let mut journaled = Journaled {
            table,
            journal,
            lines: 0,
        };
        // Folded in, or the torn line a crash left cut off; and the
        // journal's name made durable in its directory.
        fold(path, &mut journaled)?;
        Ok(IdRanges {
            path: path.to_path_buf(),
            table: Mutex::new(journaled),
        })
    }

    /// `pod`'s first host id, allocated and persisted if new.
    pub fn allocate(&self, pod: &str) -> Result<u32, String> {
        let mut table = self
            .table
            .lock()
            .map_err(|_| "the id range table lock is poisoned".to_string())?;
        let mut next = table.table.clone();
        let (base, changed) = next.allocate(pod).map_err(|e| e.to_string())?;
        if changed {
            self.record(&mut table, next)
                .map_err(|e| crate::chain(&e))?;
        }
        Ok(base)
    }

    /// The first host id of `pod`'s range, if it holds one.
    pub fn get(&self, pod: &str) -> Option<u32> {
        self.table.lock().ok()?.table.get(pod)
    }

    /// Gives `from`'s range to `to` (persisted), unless `to` holds one.
    pub fn transfer(&self, from: &str, to: &str) -> Result<Transfer, String> {
        let mut table = self
            .table
            .lock()
            .map_err(|_| "the id range table lock is poisoned".to_string())?;
        let mut next = table.table.clone();
        let transfer = next.transfer(from, to).map_err(|e| e.to_string())?;
        if let Transfer::Moved(_) = transfer {
            self.record(&mut table, next)
                .map_err(|e| crate::chain(&e))?;
        }
        Ok(transfer)
    }

    /// Frees every range held under a name starting with `prefix`
    /// (persisted); how many.
    pub fn release_prefixed(&self, prefix: &str) -> Result<usize, StateError> {
        let Ok(mut table) = self.table.lock() else {
            return Ok(0);
        };
        let mut next = table.table.clone();
        let released = next.release_prefixed(prefix);
        if released > 0 {
            self.record(&mut table, next)?;
        }
        Ok(released)
    }

    /// Frees `pod`'s range once its containers are gone.
    pub fn release(&self, pod: &str) -> Result<(), StateError> {
        let Ok(mut table) = self.table.lock() else {
            return Ok(());
        };
        let mut next = table.table.clone();
        if next.release(pod) {
            self.record(&mut table, next)?;
        }
        Ok(())
    }

    /// Makes `next` the table once its change is durable in the journal
    /// (folded into the snapshot when the journal is long).
    fn record(&self, journaled: &mut Journaled, next: RangeTable) -> Result<(), StateError> {
        let change = Change::between(&journaled.table, &next);
        let journal = journal_path(&self.path);
        let mut line = serde_json::to_vec(&change).map_err(StateError::corrupt(&journal))?;
        line.push(b'\n');
        let io = |action| StateError::io(action, &journal);
        journaled
            .journal
            .write_all(&line)
            .map_err(io("append to"))?;
        journaled.journal.sync_data().map_err(io("fdatasync"))?;
        journaled.table = next;
        journaled.lines += 1;
        if journaled.lines >= FOLD_AFTER {
            fold(&self.path, journaled)?;
        }
        Ok(())
    }
}

/// Writes the table as the snapshot at `path` and empties the journal.
fn fold(path: &Path, journaled: &mut Journaled) -> Result<(), StateError> {
    let bytes = serde_json::to_vec_pretty(&journaled.table).map_err(StateError::corrupt(path))?;
    // The snapshot first: a crash before the journal is emptied replays
    // changes the snapshot holds already, which changes nothing.
    write_atomically(path, &bytes)?;
    let journal = journal_path(path);
    journaled
        .journal
        .set_len(0)
        .and_then(|()| journaled.journal.sync_all())
        .map_err(StateError::io("empty", &journal))?;
    journaled.lines = 0;
    Ok(())
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

    #[test]
    fn a_change_is_one_journal_line_and_opening_folds_the_journal_in() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("id-ranges.json");
        let journal = journal_path(&path);
        let ranges = IdRanges::open(&path).expect("open");
        let spare = ranges.allocate("spare:1").expect("spare");
        ranges.allocate("b").expect("b");
        assert_eq!(
            ranges.transfer("spare:1", "pod-a"),
            Ok(Transfer::Moved(spare))
        );
        ranges.allocate("b").expect("held already: no line");
        let text = std::fs::read_to_string(&journal).expect("journal");
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(
            text.ends_with("{\"set\":{\"pod-a\":0},\"unset\":[\"spare:1\"]}\n"),
            "{text}"
        );
        // Read as it stands, without changing it.
        let table = read_table(&path).expect("read");
        assert_eq!(table.get("pod-a"), Some(spare));
        assert_eq!(table.holders().collect::<Vec<_>>(), ["b", "pod-a"]);
        assert_eq!(std::fs::read_to_string(&journal).expect("journal"), text);
        drop(ranges);
        let reopened = IdRanges::open(&path).expect("reopen");
        assert_eq!(std::fs::read(&journal).expect("journal").len(), 0, "folded");
        assert_eq!(reopened.get("pod-a"), Some(spare));
        assert_eq!(read_table(&path).expect("read"), table);
    }

    #[test]
    fn a_line_cut_short_by_a_crash_is_left_out_and_a_folded_journal_replays_to_the_same_table() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("id-ranges.json");
        let journal = journal_path(&path);
        let ranges = IdRanges::open(&path).expect("open");
        let a = ranges.allocate("a").expect("a");
        ranges.release("a").expect("release");
        let b = ranges.allocate("b").expect("b");
        assert_eq!(a, b, "a's freed slot");
        let lines = std::fs::read(&journal).expect("journal");
        drop(ranges);
        // A crash between writing the snapshot and emptying the journal:
        // the journal's changes are replayed onto a snapshot holding them.
        let folded = IdRanges::open(&path).expect("fold");
        drop(folded);
        std::fs::write(&journal, &lines).expect("journal back");
        // And an append the crash cut short.
        let mut torn = lines.clone();
        torn.extend_from_slice(b"{\"set\":{\"c\":");
        std::fs::write(&journal, &torn).expect("torn");
        let table = read_table(&path).expect("read");
        assert_eq!(table.holders().collect::<Vec<_>>(), ["b"]);
        let reopened = IdRanges::open(&path).expect("reopen");
        assert_eq!(reopened.get("b"), Some(b));
        assert_eq!(reopened.get("c"), None);
        // Appends after the fold start on a clean line.
        reopened.allocate("c").expect("c");
        drop(reopened);
        let again = IdRanges::open(&path).expect("again");
        assert_eq!(again.get("c"), Some(b + IDS_PER_POD));
        // A whole line that is not a change is corruption, not a crash.
        std::fs::write(&journal, b"not json\n").expect("garbage");
        assert!(matches!(read_table(&path), Err(StateError::Corrupt { .. })));
    }

    #[test]
    fn a_long_journal_is_folded_into_the_snapshot() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("id-ranges.json");
        let ranges = IdRanges::open(&path).expect("open");
        for i in 0..FOLD_AFTER + 3 {
            ranges.allocate(&format!("p{i}")).expect("allocate");
        }
        let journal = std::fs::read_to_string(journal_path(&path)).expect("journal");
        assert_eq!(
            journal.lines().count(),
            3,
            "folded after {FOLD_AFTER} lines"
        );
        let snapshot: RangeTable =
            serde_json::from_slice(&std::fs::read(&path).expect("snapshot")).expect("json");
        assert_eq!(snapshot.holders().count(), FOLD_AFTER);
        assert_eq!(
            read_table(&path).expect("read").holders().count(),
            FOLD_AFTER + 3
        );
    }
}
