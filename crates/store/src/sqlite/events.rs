//! The watch-event log: one row per write, kept for a window of store
//! revisions and of time ([`EventWindow`]), like etcd's compaction.
//!
//! The log always starts at a store revision: everything up to
//! `events_compacted` is gone, everything after it is kept, so a watch from
//! before it gets `Expired`.
//!
//! The table is a ring of [`EVENT_SLOTS`] rows (design 0057): the event of
//! store revision `rv` is written over slot `rv % EVENT_SLOTS`, whose
//! previous event is a full ring behind and so outside every window. The
//! count window moves `events_compacted` only, and the ring drops what it
//! passed over as later writes take their slots; no write deletes at the
//! head of the table while it appends at the tail. The age window still
//! deletes (it binds only when writes are rare), at most once per second of
//! write time, by store revision: the writer keeps a mark of the change
//! times per second of writes ([`EventPruner`]), so the log needs no index
//! by time and nothing scans it (design 0061).

use std::collections::VecDeque;

use chrono::{DateTime, TimeDelta, Utc};
use corral_api::ObjectKey;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::schema::{self, META_EVENTS_COMPACTED, to_i64};
use crate::{EventType, EventWindow, StoreError};

/// Rows in the event ring, and so the largest count window: the default
/// window's count. Schema version 8 names the same number in SQL, and a
/// database's rows sit in the slots it gives: changing it needs a
/// migration that moves every row to its new slot.
pub(super) const EVENT_SLOTS: u64 = EventWindow::DEFAULT.count;

/// How far write time must move before the age window is applied again.
const AGE_PRUNE_EVERY: TimeDelta = TimeDelta::seconds(1);

/// The ring slot of store revision `resource_version`.
pub(super) fn slot(resource_version: u64) -> i64 {
    to_i64(resource_version % EVENT_SLOTS)
}

/// The slot ranges, inclusive and in revision order, that hold the events
/// of store revisions `first..=last` (at most [`EVENT_SLOTS`] of them):
/// one range, or two where the revisions wrap around the ring.
pub(super) fn slot_ranges(first: u64, last: u64) -> Vec<(i64, i64)> {
    if first > last {
        return Vec::new();
    }
    let last = last.min(first.saturating_add(EVENT_SLOTS - 1));
    let (from, to) = (slot(first), slot(last));
    if from <= to {
        vec![(from, to)]
    } else {
        vec![(from, to_i64(EVENT_SLOTS - 1)), (0, to)]
    }
}

/// Writes the event of the write at `resource_version` into its slot;
/// `body` is the object as JSON, `time` the write's change time.
pub(super) fn insert(
    conn: &Connection,
    resource_version: u64,
    key: &ObjectKey,
    event_type: EventType,
    body: &str,
    time: DateTime<Utc>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO events
         (slot, resource_version, kind, namespace, name, type, body, time)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        slot(resource_version),
        to_i64(resource_version),
        key.kind.as_str(),
        key.namespace,
        key.name,
        event_type_text(event_type),
        body,
        schema::time_to_millis(time),
    ])?;
    Ok(())
}

/// Forgets the events through `through` in a transaction of its own. Their
/// rows stay until the ring reaches them; no read returns them.
pub(super) fn compact(conn: &mut Connection, through: u64) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    forget(&tx, through)?;
    tx.commit()?;
    Ok(())
}

/// Records that the log starts after `through`, if it started earlier.
fn forget(conn: &Connection, through: u64) -> Result<(), StoreError> {
    if schema::get_meta(conn, META_EVENTS_COMPACTED)? < through {
        schema::set_meta(conn, META_EVENTS_COMPACTED, through)?;
    }
    Ok(())
}

/// What the writer knows of the events' change times, so the age window
/// needs no index by time (design 0061): marks in store-revision order, one
/// per [`AGE_PRUNE_EVERY`] of write time, each the newest store revision
/// written by then and the latest change time of any event through it.
/// Kept in memory: a writer that starts (or whose group failed) seeds it
/// with the newest event's time, so the events written before it go once
/// that time is old: late rather than early.
#[derive(Debug, Default)]
pub(super) struct EventPruner {
    /// When the age window was last applied, in write time.
    last_age_prune: Option<DateTime<Utc>>,
    /// The marks, oldest first; their times never decrease.
    marks: VecDeque<Mark>,
    /// Whether the marks were seeded since this pruner was made.
    seeded: bool,
    /// Every row through this store revision is deleted; `None` until the
    /// age window first deleted since this pruner was made.
    deleted_through: Option<u64>,
}

/// Every event through store revision `through` has a change time no
/// later than `latest` (milliseconds). `first` is the change time that
/// opened the mark: the writes of the next second join it.
#[derive(Debug, Clone, Copy)]
struct Mark {
    first: i64,
    latest: i64,
    through: u64,
}

impl EventPruner {
    /// Seeds the marks with the time of the event at `committed`, the store
    /// revision before this group.
    fn seed(&mut self, conn: &Connection, committed: u64) -> Result<(), StoreError> {
        self.seeded = true;
        let time: Option<i64> = conn
            .prepare_cached("SELECT time FROM events WHERE slot = ?1 AND resource_version = ?2")?
            .query_row(params![slot(committed), to_i64(committed)], |row| {
                row.get(0)
            })
            .optional()?;
        if let Some(time) = time {
            self.mark(time, committed);
        }
        Ok(())
    }

    /// Records that the events through `through` were written by change
    /// time `time` (milliseconds).
    fn mark(&mut self, time: i64, through: u64) {
        let latest = self.marks.back().map_or(time, |last| last.latest.max(time));
        match self.marks.back_mut() {
            Some(last) if time < last.first + AGE_PRUNE_EVERY.num_milliseconds() => {
                last.latest = latest;
                last.through = through;
            }
            _ => self.marks.push_back(Mark {
                first: time,
                latest,
                through,
            }),
        }
    }

    /// Drops the marks the ring has overwritten the events of, given the
    /// newest store revision: their rows are gone without a delete.
    fn forget_overwritten(&mut self, newest: u64) {
        let overwritten = newest.saturating_sub(EVENT_SLOTS);
        while self
            .marks
            .front()
            .is_some_and(|mark| mark.through <= overwritten)
        {
            self.marks.pop_front();
        }
    }

    /// Takes the marks older than `cutoff` (milliseconds) and returns the
    /// newest store revision they cover (0 if none).
    fn take_older_than(&mut self, cutoff: i64) -> u64 {
        let mut through = 0;
        while let Some(mark) = self.marks.front().filter(|mark| mark.latest < cutoff) {
            through = mark.through;
            self.marks.pop_front();
        }
        through
    }
}

/// Applies the window after a group of writes, inside its transaction.
/// `committed` is the store revision before the group, `newest` after it,
/// and `newest_time` the latest change time among the group's events.
pub(super) fn prune(
    conn: &Connection,
    window: EventWindow,
    (committed, newest): (u64, u64),
    newest_time: Option<DateTime<Utc>>,
    pruner: &mut EventPruner,
) -> Result<(), StoreError> {
    if !pruner.seeded {
        pruner.seed(conn, committed)?;
    }
    if let Some(time) = newest_time {
        pruner.mark(schema::time_to_millis(time), newest);
    }
    pruner.forget_overwritten(newest);
    // The store keeps the count within 1..=EVENT_SLOTS.
    let mut through = newest.saturating_sub(window.count);
    if let Some(now) = newest_time {
        let due = pruner
            .last_age_prune
            .is_none_or(|last| now >= last + AGE_PRUNE_EVERY || now < last);
        if due {
            pruner.last_age_prune = Some(now);
            through = through.max(drop_aged(conn, window, now, newest, pruner)?);
        }
    }
    forget(conn, through)
}

/// Deletes the events older than the window's age at `now` (by the marks)
/// and returns the newest store revision among them (0 if none):
/// everything through it is forgotten, so the log still starts at one
/// revision even if change times are not in revision order.
fn drop_aged(
    conn: &Connection,
    window: EventWindow,
    now: DateTime<Utc>,
    newest: u64,
    pruner: &mut EventPruner,
) -> Result<u64, StoreError> {
    let Some(cutoff) = TimeDelta::from_std(window.max_age)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
    else {
        return Ok(0);
    };
    let through = pruner.take_older_than(schema::time_to_millis(cutoff));
    // The rows a ring behind are overwritten already; those deleted before
    // are gone.
    let after = pruner
        .deleted_through
        .unwrap_or(0)
        .max(newest.saturating_sub(EVENT_SLOTS));
    if through > after {
        let mut delete = conn.prepare_cached(
            "DELETE FROM events
             WHERE slot BETWEEN ?1 AND ?2 AND resource_version > ?3 AND resource_version <= ?4",
        )?;
        for (first, last) in slot_ranges(after + 1, through) {
            delete.execute(params![first, last, to_i64(after), to_i64(through)])?;
        }
        pruner.deleted_through = Some(through);
    }
    Ok(through)
}

pub(super) fn event_type_text(event_type: EventType) -> &'static str {
    match event_type {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    }
}

pub(super) fn event_type_from_text(text: &str) -> Result<EventType, StoreError> {
    match text {
        "ADDED" => Ok(EventType::Added),
        "MODIFIED" => Ok(EventType::Modified),
        "DELETED" => Ok(EventType::Deleted),
        other => Err(StoreError::Corrupt(format!("unknown event type {other:?}"))),
    }
}
