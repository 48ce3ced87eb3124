//! Workflow step logs: append-only rows keyed by object uid, read back in
//! time order (ties in append order).

use std::collections::BTreeMap;

use corral_api::workflow::{LogLevel, StepLogEntry};
use rusqlite::{Connection, params};
use serde_json::Value;

use super::schema::{corrupt_json, time_from_text, time_to_text};
use crate::{StepLogFilter, StoreError};

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

/// Appends encoded entries inside the writer's transaction.
pub(super) fn insert(conn: &Connection, encoded: &EncodedEntries<'_>) -> Result<(), StoreError> {
    if encoded.entries.is_empty() {
        return Ok(());
    }
    let mut insert = conn.prepare_cached(
        "INSERT INTO step_logs
         (object_uid, time, workflow_id, workflow, step, owner, level, message, fields)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    for (entry, fields) in encoded.entries.iter().zip(&encoded.fields) {
        insert.execute(params![
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

pub(super) fn read(
    conn: &Connection,
    uid: &str,
    filter: &StepLogFilter,
) -> Result<Vec<StepLogEntry>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT time, workflow_id, workflow, step, owner, level, message, fields
         FROM step_logs
         WHERE object_uid = ?1
           AND (?2 IS NULL OR step = ?2)
           AND (?3 IS NULL OR owner = ?3)
           AND (?4 IS NULL OR workflow_id = ?4)
         ORDER BY time, seq",
    )?;
    let mut rows = statement.query(params![uid, filter.step, filter.owner, filter.workflow_id])?;
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
