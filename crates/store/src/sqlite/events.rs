//! The watch-event log: one row per write, kept for a window of store
//! revisions and of time ([`EventWindow`]), like etcd's compaction.
//!
//! The log always starts at a store revision: everything up to
//! `events_compacted` is gone, everything after it is kept, so a watch from
//! before it gets `Expired`. Pruning by count costs one primary-key seek
//! per group; pruning by age runs at most once per second of write time and
//! finds its cut on the `events_time` index, so neither scans the log.

use chrono::{DateTime, TimeDelta, Utc};
use corral_api::ObjectKey;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::schema::{self, META_EVENTS_COMPACTED, META_REVISION, to_i64, to_u64};
use crate::{EventType, EventWindow, StoreError};

/// How far write time must move before the age window is applied again.
const AGE_PRUNE_EVERY: TimeDelta = TimeDelta::seconds(1);

/// Appends the event of the write at `resource_version`; `body` is the
/// object as JSON, `time` the write's change time.
pub(super) fn insert(
    conn: &Connection,
    resource_version: u64,
    key: &ObjectKey,
    event_type: EventType,
    body: &str,
    time: DateTime<Utc>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO events (resource_version, kind, namespace, name, type, body, time)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
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

/// Forgets the events through `through` in a transaction of its own.
pub(super) fn compact(conn: &mut Connection, through: u64) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    forget(&tx, through)?;
    tx.commit()?;
    Ok(())
}

/// Forgets the events through `through` and records how far the log now
/// starts.
fn forget(conn: &Connection, through: u64) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM events WHERE resource_version <= ?1")?
        .execute([to_i64(through)])?;
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
    let mut through = newest.saturating_sub(window.count.max(1));
    if let Some(now) = newest_time {
        let due = pruner
            .last_age_prune
            .is_none_or(|last| now >= last + AGE_PRUNE_EVERY || now < last);
        if due {
            pruner.last_age_prune = Some(now);
            through = through.max(aged_out(conn, window, now)?);
        }
    }
    if through == 0 {
        return Ok(());
    }
    // Cheap when there is nothing to drop: one seek on the primary key.
    let oldest: Option<i64> = conn
        .prepare_cached("SELECT min(resource_version) FROM events")?
        .query_row([], |row| row.get(0))?;
    if oldest.is_some_and(|oldest| oldest <= to_i64(through)) {
        forget(conn, through)?;
    }
    Ok(())
}

/// The newest store revision whose event is older than the window's age at
/// `now` (0 if none): everything through it goes, so the log still starts
/// at one revision even if change times are not in revision order.
fn aged_out(conn: &Connection, window: EventWindow, now: DateTime<Utc>) -> Result<u64, StoreError> {
    let Some(cutoff) = TimeDelta::from_std(window.max_age)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
    else {
        return Ok(0);
    };
    // Without the hint SQLite answers max() by walking the primary key
    // down from the newest event: the whole log when nothing is old.
    let through: Option<i64> = conn
        .prepare_cached(
            "SELECT max(resource_version) FROM events INDEXED BY events_time WHERE time < ?1",
        )?
        .query_row([schema::time_to_millis(cutoff)], |row| row.get(0))
        .optional()?
        .flatten();
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
