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
//! deletes (it binds only when writes are rare), found on the `events_time`
//! index at most once per second of write time, so nothing scans the log.

use chrono::{DateTime, TimeDelta, Utc};
use corral_api::ObjectKey;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::schema::{self, META_EVENTS_COMPACTED, META_REVISION, to_i64, to_u64};
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

/// When the age window was last applied, in write time.
#[derive(Debug, Default)]
pub(super) struct EventPruner {
    last_age_prune: Option<DateTime<Utc>>,
}

/// Applies the window after a group of writes, inside its transaction.
/// `newest_time` is the latest change time among the group's events.
pub(super) fn prune(
    conn: &Connection,
    window: EventWindow,
    newest_time: Option<DateTime<Utc>>,
    pruner: &mut EventPruner,
) -> Result<(), StoreError> {
    let newest = schema::get_meta(conn, META_REVISION)?;
    // The store keeps the count within 1..=EVENT_SLOTS.
    let mut through = newest.saturating_sub(window.count);
    if let Some(now) = newest_time {
        let due = pruner
            .last_age_prune
            .is_none_or(|last| now >= last + AGE_PRUNE_EVERY || now < last);
        if due {
            pruner.last_age_prune = Some(now);
            through = through.max(drop_aged(conn, window, now)?);
        }
    }
    forget(conn, through)
}

/// Deletes the events older than the window's age at `now` and returns the
/// newest store revision among them (0 if none): everything through it is
/// forgotten, so the log still starts at one revision even if change times
/// are not in revision order.
fn drop_aged(
    conn: &Connection,
    window: EventWindow,
    now: DateTime<Utc>,
) -> Result<u64, StoreError> {
    let Some(cutoff) = TimeDelta::from_std(window.max_age)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
    else {
        return Ok(0);
    };
    let cutoff = schema::time_to_millis(cutoff);
    let through: Option<i64> = conn
        .prepare_cached(
            "SELECT max(resource_version) FROM events INDEXED BY events_time WHERE time < ?1",
        )?
        .query_row([cutoff], |row| row.get(0))
        .optional()?
        .flatten();
    if through.is_some() {
        conn.prepare_cached("DELETE FROM events INDEXED BY events_time WHERE time < ?1")?
            .execute([cutoff])?;
    }
    Ok(through.map_or(0, to_u64))
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
