//! Workflow step logs: append-only rows keyed by object uid, read back in
//! time order (ties in append order).
//!
//! A write appends its entries to `step_logs` (in `seq` order) and nothing
//! else; [`index_tail`] copies the entries past the `step_logs_indexed`
//! mark into `step_logs_by_object` a batch at a time, so a batch touches
//! each object's leaf of that b-tree once instead of every write touching
//! one (design 0054). A reader finds an object's entries there and in the
//! tail past the mark, which is never longer than [`INDEX_BATCH`] entries.

use std::collections::BTreeMap;

use corral_api::workflow::{LogLevel, StepLogEntry};
use rusqlite::{Connection, params};
use serde_json::Value;

use super::schema::{
    self, META_STEP_LOGS_INDEXED, corrupt_json, time_from_text, time_to_text, to_i64, to_u64,
};
use crate::{StepLogFilter, StoreError};

/// Entries past the index mark after which the writer indexes them: the
/// longest tail a reader scans (about 200 bytes an entry, 50 pages).
pub(super) const INDEX_BATCH: u64 = 1024;

/// Entries ready to append: each with its fields as JSON, encoded before
/// anything is written.
pub(super) struct EncodedEntries<'a> {
    entries: &'a [StepLogEntry],
    fields: Vec<String>,
}

pub(super) fn encode(entries: &[StepLogEntry]) -> Result<EncodedEntries<'_>, StoreError> {
    let fields = entries
        .iter()
        .map(|entry| serde_json::to_string(&entry.fields).map_err(corrupt_json("step log fields")))
        .collect::<Result<_, _>>()?;
    Ok(EncodedEntries { entries, fields })
}

/// Appends encoded entries inside the writer's transaction, numbered on
/// from `seq` (the newest number given out), which ends at the last one
/// given.
pub(super) fn insert(
    conn: &Connection,
    encoded: &EncodedEntries<'_>,
    seq: &mut u64,
) -> Result<(), StoreError> {
    if encoded.entries.is_empty() {
        return Ok(());
    }
    let mut insert = conn.prepare_cached(
        "INSERT INTO step_logs
         (seq, object_uid, time, workflow_id, workflow, step, owner, level, message, fields)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    for (entry, fields) in encoded.entries.iter().zip(&encoded.fields) {
        *seq += 1;
        insert.execute(params![
            to_i64(*seq),
            entry.object_uid,
            time_to_text(entry.time),
            entry.workflow_id,
            entry.workflow,
            entry.step,
            entry.owner,
            entry.level.as_str(),
            entry.message,
            fields,
        ])?;
    }
    Ok(())
}

/// Indexes by object the entries past the index mark, inside the
/// caller's write transaction: when there are [`INDEX_BATCH`] of them or
/// more, or any at all when `every` is set (before entries are deleted by
/// object).
pub(super) fn index_tail(conn: &Connection, every: bool) -> Result<(), StoreError> {
    let indexed = schema::get_meta(conn, META_STEP_LOGS_INDEXED)?;
    // The last rowid: one seek, not a scan (NULL when the table is empty).
    let newest: Option<i64> = conn
        .prepare_cached("SELECT MAX(seq) FROM step_logs")?
        .query_row([], |row| row.get(0))?;
    let newest = newest.map_or(0, to_u64);
    let waiting = newest.saturating_sub(indexed);
    if waiting == 0 || (!every && waiting < INDEX_BATCH) {
        return Ok(());
    }
    conn.prepare_cached(
        "INSERT INTO step_logs_by_object (object_uid, seq)
         SELECT object_uid, seq FROM step_logs WHERE seq > ?1",
    )?
    .execute([schema::to_i64(indexed)])?;
    schema::set_meta(conn, META_STEP_LOGS_INDEXED, newest)
}

/// The entries of object `uid` that pass `filter`, in time order (ties in
/// append order): those indexed by object, and those in the tail past the
/// index mark, in one statement and so one snapshot.
pub(super) fn read(
    conn: &Connection,
    uid: &str,
    filter: &StepLogFilter,
) -> Result<Vec<StepLogEntry>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT time, workflow_id, workflow, step, owner, level, message, fields
         FROM (
             SELECT log.* FROM step_logs_by_object AS object
             JOIN step_logs AS log ON log.seq = object.seq
             WHERE object.object_uid = ?1
             UNION ALL
             SELECT * FROM step_logs
             WHERE seq > (SELECT value FROM meta WHERE key = ?5)
               AND object_uid = ?1
         )
         WHERE (?2 IS NULL OR step = ?2)
           AND (?3 IS NULL OR owner = ?3)
           AND (?4 IS NULL OR workflow_id = ?4)
         ORDER BY time, seq",
    )?;
    let mut rows = statement.query(params![
        uid,
        filter.step,
        filter.owner,
        filter.workflow_id,
        META_STEP_LOGS_INDEXED
    ])?;
    let mut entries = Vec::new();
    while let Some(row) = rows.next()? {
        let time: String = row.get(0)?;
        let level: String = row.get(5)?;
        let fields: String = row.get(7)?;
        entries.push(StepLogEntry {
            time: time_from_text(&time)?,
            object_uid: uid.to_string(),
            workflow_id: row.get(1)?,
            workflow: row.get(2)?,
            step: row.get(3)?,
            owner: row.get(4)?,
            level: level_from_text(&level)?,
            message: row.get(6)?,
            fields: serde_json::from_str::<BTreeMap<String, Value>>(&fields)
                .map_err(corrupt_json("step log fields"))?,
        });
    }
    Ok(entries)
}

pub(super) fn level_from_text(text: &str) -> Result<LogLevel, StoreError> {
    match text {
        "debug" => Ok(LogLevel::Debug),
        "info" => Ok(LogLevel::Info),
        "warn" => Ok(LogLevel::Warn),
        "error" => Ok(LogLevel::Error),
        other => Err(StoreError::Corrupt(format!(
            "stored step log level {other:?} is not debug, info, warn or error"
        ))),
    }
}
