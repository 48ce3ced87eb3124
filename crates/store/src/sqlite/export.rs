//! Reading the whole database into a [`Dump`] (see [`crate::dump`]), in one
//! read transaction so the dump is one consistent moment.

use std::collections::BTreeMap;

use corral_api::workflow::StepLogEntry;
use rusqlite::{Connection, params};
use serde_json::Value;

use super::history::{RECORD_COLUMNS, record_from_row, spec_bytes};
use super::objects::parse_object;
use super::schema::{corrupt_json, time_from_text};
use super::steplogs::level_from_text;
use crate::dump::Dump;
use crate::{SealedRecord, StoreError};

pub(super) fn export(conn: &mut Connection) -> Result<Dump, StoreError> {
    let tx = conn.transaction()?;
    let mut dump = Dump::default();

    let mut statement = tx.prepare("SELECT body FROM objects ORDER BY resource_version")?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        dump.objects.push(parse_object(&row.get::<_, String>(0)?)?);
    }
    drop(rows);
    drop(statement);

    let mut statement = tx.prepare(&format!(
        "SELECT {RECORD_COLUMNS} FROM revisions ORDER BY seq, revision"
    ))?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        let mut record = record_from_row(row)?;
        let bytes = spec_bytes(&tx, &record.uid, record.revision)?.ok_or_else(|| {
            StoreError::Corrupt(format!(
                "revision {} of uid {} is listed but its spec cannot be read",
                record.revision, record.uid
            ))
        })?;
        record.spec = Some(serde_json::from_slice(&bytes).map_err(corrupt_json("revision spec"))?);
        dump.revisions.push(record);
    }
    drop(rows);
    drop(statement);

    let mut statement = tx.prepare(
        "SELECT hash, identity, created_at, last_used FROM tokens ORDER BY created_at, hash",
    )?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        dump.tokens.push(super::tokens::from_row(row)?);
    }
    drop(rows);
    drop(statement);

    let mut statement = tx.prepare("SELECT name, value FROM sealed ORDER BY name")?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        dump.sealed.push(SealedRecord {
            name: row.get(0)?,
            value: row.get(1)?,
        });
    }
    drop(rows);
    drop(statement);

    let mut statement = tx.prepare(
        "SELECT object_uid, time, workflow_id, workflow, step, owner, level, message, fields
         FROM step_logs ORDER BY seq",
    )?;
    let mut rows = statement.query(params![])?;
    while let Some(row) = rows.next()? {
        dump.step_logs.push(StepLogEntry {
            object_uid: row.get(0)?,
            time: time_from_text(&row.get::<_, String>(1)?)?,
            workflow_id: row.get(2)?,
            workflow: row.get(3)?,
            step: row.get(4)?,
            owner: row.get(5)?,
            level: level_from_text(&row.get::<_, String>(6)?)?,
            message: row.get(7)?,
            fields: serde_json::from_str::<BTreeMap<String, Value>>(&row.get::<_, String>(8)?)
                .map_err(corrupt_json("step log fields"))?,
        });
    }
    Ok(dump)
}
