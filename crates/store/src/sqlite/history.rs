//! Spec revisions: appending them delta-encoded, reading them back,
//! cluster-wide queries and compaction.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};
use corral_api::history::CompactionPolicy;
use corral_api::{HistoryQuery, ObjectKey, RevisionRecord};
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params, params_from_iter};

use super::schema::{
    class_from_text, corrupt_json, kind_from_text, time_from_text, time_to_text, to_i64, to_u64,
};
use crate::codec;
use crate::{ChangeMeta, CompactionReport, HistorySize, StoreError};

/// The columns every record query selects, in [`record_from_row`]'s order.
pub(super) const RECORD_COLUMNS: &str =
    "uid, revision, kind, namespace, name, time, author, class, message, deleted";

/// One revision about to be appended.
pub(super) struct NewRevision<'a> {
    pub uid: &'a str,
    pub revision: u64,
    pub key: &'a ObjectKey,
    pub change: &'a ChangeMeta,
    pub deleted: bool,
    /// The store revision of the write.
    pub seq: u64,
}

/// Appends a revision whose spec is `spec`, as a delta against the previous
/// revision of the same uid where the codec wants one.
pub(super) fn append(
    conn: &Connection,
    new: &NewRevision<'_>,
    spec: &serde_json::Value,
) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec(spec).map_err(corrupt_json("spec"))?;
    let previous = if codec::is_keyframe_revision(new.revision) {
        None
    } else {
        // Decoded from history itself, so the delta applies to exactly the
        // bytes a reader will reconstruct.
        spec_bytes(conn, new.uid, new.revision - 1)?
    };
    let payload = codec::encode(new.revision, previous.as_deref(), &bytes)
        .map_err(|error| codec_error(new.uid, new.revision, &error))?;
    let keyframe =
        codec::is_keyframe(&payload).map_err(|error| codec_error(new.uid, new.revision, &error))?;
    conn.execute(
        "INSERT INTO revisions (uid, revision, kind, namespace, name, time, author, class,
                                message, deleted, keyframe, payload, raw_len, seq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        params![
            new.uid,
            to_i64(new.revision),
            new.key.kind.as_str(),
            new.key.namespace,
            new.key.name,
            time_to_text(new.change.time),
            new.change.author,
            new.change.class.as_str(),
            new.change.message,
            new.deleted,
            keyframe,
            payload,
            to_i64(bytes.len() as u64),
            to_i64(new.seq),
        ],
    )?;
    Ok(())
}

/// The spec bytes of one revision, decoded from the nearest keyframe; `None`
/// when that revision is not kept.
pub(super) fn spec_bytes(
    conn: &Connection,
    uid: &str,
    revision: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT revision, payload FROM revisions
         WHERE uid = ?1 AND revision <= ?2 AND revision >= (
             SELECT max(revision) FROM revisions
             WHERE uid = ?1 AND revision <= ?2 AND keyframe = 1)
         ORDER BY revision",
    )?;
    let chain = statement
        .query_map(params![uid, to_i64(revision)], |row| {
            Ok((to_u64(row.get(0)?), row.get::<_, Vec<u8>>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    match chain.last() {
        Some((last, _)) if *last == revision => {}
        _ => return Ok(None),
    }
    let contiguous = chain.windows(2).all(|pair| pair[1].0 == pair[0].0 + 1);
    if !contiguous {
        return Err(StoreError::Corrupt(format!(
            "revision {revision} of uid {uid}: its delta chain has a gap"
        )));
    }
    codec::decode_chain(chain.iter().map(|(_, payload)| payload.as_slice()))
        .map(Some)
        .map_err(|error| codec_error(uid, revision, &error))
}

/// The uid whose history `key` shows: the live object's, else the one most
/// recently deleted under that key.
fn uid_for_key(conn: &Connection, key: &ObjectKey) -> Result<Option<String>, StoreError> {
    let key_params = params![key.kind.as_str(), key.namespace, key.name];
    let live: Option<String> = conn
        .query_row(
            "SELECT uid FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
            key_params,
            |row| row.get(0),
        )
        .optional()?;
    if live.is_some() {
        return Ok(live);
    }
    Ok(conn
        .query_row(
            "SELECT uid FROM revisions WHERE kind = ?1 AND namespace = ?2 AND name = ?3
             ORDER BY seq DESC LIMIT 1",
            key_params,
            |row| row.get(0),
        )
        .optional()?)
}

pub(super) fn history(
    conn: &Connection,
    key: &ObjectKey,
) -> Result<Vec<RevisionRecord>, StoreError> {
    let uid = uid_for_key(conn, key)?.ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    records_of(conn, &uid)
}

fn records_of(conn: &Connection, uid: &str) -> Result<Vec<RevisionRecord>, StoreError> {
    let mut statement = conn.prepare(&format!(
        "SELECT {RECORD_COLUMNS} FROM revisions WHERE uid = ?1 ORDER BY revision"
    ))?;
    let mut rows = statement.query([uid])?;
    let mut records = Vec::new();
    while let Some(row) = rows.next()? {
        records.push(record_from_row(row)?);
    }
    Ok(records)
}

pub(super) fn revision(
    conn: &Connection,
    key: &ObjectKey,
    revision: u64,
) -> Result<RevisionRecord, StoreError> {
    let uid = uid_for_key(conn, key)?.ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    let not_found = |records: &[RevisionRecord]| StoreError::RevisionNotFound {
        key: key.clone(),
        revision,
        kept: describe_kept(records.iter().map(|record| record.revision)),
    };
    let records = records_of(conn, &uid)?;
    let Some(record) = records.iter().find(|record| record.revision == revision) else {
        return Err(not_found(&records));
    };
    let bytes = spec_bytes(conn, &uid, revision)?.ok_or_else(|| not_found(&records))?;
    let spec = serde_json::from_slice(&bytes).map_err(corrupt_json("revision spec"))?;
    Ok(RevisionRecord {
        spec: Some(spec),
        ..record.clone()
    })
}

/// `1-3, 7, 9-12`, or `none`.
fn describe_kept(revisions: impl IntoIterator<Item = u64>) -> String {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for revision in revisions {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == revision => *end = revision,
            _ => ranges.push((revision, revision)),
        }
    }
    if ranges.is_empty() {
        return "none".to_string();
    }
    ranges
        .iter()
        .map(|&(start, end)| {
            if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn query(
    conn: &Connection,
    query: &HistoryQuery,
) -> Result<Vec<RevisionRecord>, StoreError> {
    let mut sql = format!("SELECT {RECORD_COLUMNS} FROM revisions WHERE 1 = 1");
    let mut values: Vec<SqlValue> = Vec::new();
    if let Some(since) = query.since {
        sql.push_str(" AND time >= ?");
        values.push(SqlValue::Text(time_to_text(since)));
    }
    if let Some(kind) = query.kind {
        sql.push_str(" AND kind = ?");
        values.push(SqlValue::Text(kind.as_str().to_string()));
    }
    if let Some(class) = query.class {
        sql.push_str(" AND class = ?");
        values.push(SqlValue::Text(class.as_str().to_string()));
    }
    if !query.authors.is_empty() {
        sql.push_str(&format!(
            " AND author IN ({})",
            placeholders(query.authors.len())
        ));
        values.extend(query.authors.iter().cloned().map(SqlValue::Text));
    }
    if !query.exclude_authors.is_empty() {
        sql.push_str(&format!(
            " AND author NOT IN ({})",
            placeholders(query.exclude_authors.len())
        ));
        values.extend(query.exclude_authors.iter().cloned().map(SqlValue::Text));
    }
    match query.limit {
        Some(limit) => {
            sql.push_str(" ORDER BY time DESC, seq DESC, revision DESC LIMIT ?");
            values.push(SqlValue::Integer(to_i64(limit as u64)));
        }
        None => sql.push_str(" ORDER BY time, seq, revision"),
    }
    let mut statement = conn.prepare(&sql)?;
    let mut rows = statement.query(params_from_iter(values))?;
    let mut records = Vec::new();
    while let Some(row) = rows.next()? {
        let record = record_from_row(row)?;
        if query.admits(&record) {
            records.push(record);
        }
    }
    if query.limit.is_some() {
        records.reverse();
    }
    Ok(records)
}

fn placeholders(count: usize) -> String {
    vec!["?"; count].join(", ")
}

/// Drops what `policy` does not keep, never a live object's current
/// revision, and turns survivors whose delta base was dropped into
/// keyframes so every kept revision still decodes.
pub(super) fn compact(
    conn: &mut Connection,
    policy: CompactionPolicy,
    now: DateTime<Utc>,
) -> Result<CompactionReport, StoreError> {
    const NOT_CURRENT: &str = "NOT EXISTS (SELECT 1 FROM objects o
                                WHERE o.uid = r.uid AND o.revision = r.revision)";
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let doomed: Vec<(String, u64)> = {
        let (sql, parameter) = match policy {
            CompactionPolicy::All => return Ok(CompactionReport::default()),
            CompactionPolicy::Last { count } => (
                format!(
                    "SELECT r.uid, r.revision FROM revisions r
                     JOIN (SELECT uid, max(revision) AS newest FROM revisions GROUP BY uid) n
                       ON n.uid = r.uid
                     WHERE r.revision <= n.newest - ?1 AND {NOT_CURRENT}"
                ),
                SqlValue::Integer(to_i64(count)),
            ),
            CompactionPolicy::For { seconds } => {
                let cutoff = i64::try_from(seconds)
                    .ok()
                    .and_then(TimeDelta::try_seconds)
                    .and_then(|age| now.checked_sub_signed(age));
                let Some(cutoff) = cutoff else {
                    return Ok(CompactionReport::default());
                };
                (
                    format!(
                        "SELECT r.uid, r.revision FROM revisions r WHERE r.time < ?1 AND {NOT_CURRENT}"
                    ),
                    SqlValue::Text(time_to_text(cutoff)),
                )
            }
        };
        let mut statement = tx.prepare(&sql)?;
        statement
            .query_map([parameter], |row| Ok((row.get(0)?, to_u64(row.get(1)?))))?
            .collect::<Result<_, _>>()?
    };

    let mut by_uid: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for (uid, revision) in doomed {
        by_uid.entry(uid).or_default().insert(revision);
    }
    let mut removed = 0u64;
    for (uid, dropped) in &by_uid {
        // Survivors right after a dropped revision lose their delta base.
        let orphans: Vec<u64> = {
            let mut statement = tx.prepare(
                "SELECT revision FROM revisions WHERE uid = ?1 AND keyframe = 0 ORDER BY revision",
            )?;
            statement
                .query_map([uid], |row| Ok(to_u64(row.get(0)?)))?
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .filter(|revision| {
                    !dropped.contains(revision) && dropped.contains(&revision.saturating_sub(1))
                })
                .collect()
        };
        for revision in orphans {
            let bytes = spec_bytes(&tx, uid, revision)?.ok_or_else(|| {
                StoreError::Corrupt(format!("revision {revision} of uid {uid} does not decode"))
            })?;
            let payload = codec::encode_keyframe(&bytes)
                .map_err(|error| codec_error(uid, revision, &error))?;
            tx.execute(
                "UPDATE revisions SET payload = ?3, keyframe = 1 WHERE uid = ?1 AND revision = ?2",
                params![uid, to_i64(revision), payload],
            )?;
        }
        let mut delete =
            tx.prepare_cached("DELETE FROM revisions WHERE uid = ?1 AND revision = ?2")?;
        for revision in dropped {
            removed += delete.execute(params![uid, to_i64(*revision)])? as u64;
        }
    }
    tx.commit()?;
    Ok(CompactionReport {
        revisions_removed: removed,
    })
}

pub(super) fn size(conn: &Connection) -> Result<HistorySize, StoreError> {
    Ok(conn.query_row(
        "SELECT count(*), coalesce(sum(length(payload)), 0), coalesce(sum(raw_len), 0)
         FROM revisions",
        [],
        |row| {
            Ok(HistorySize {
                revisions: to_u64(row.get(0)?),
                stored_bytes: to_u64(row.get(1)?),
                raw_bytes: to_u64(row.get(2)?),
            })
        },
    )?)
}

pub(super) fn record_from_row(row: &Row<'_>) -> Result<RevisionRecord, StoreError> {
    Ok(RevisionRecord {
        uid: row.get(0)?,
        revision: to_u64(row.get(1)?),
        kind: kind_from_text(&row.get::<_, String>(2)?)?,
        namespace: row.get(3)?,
        name: row.get(4)?,
        time: time_from_text(&row.get::<_, String>(5)?)?,
        author: row.get(6)?,
        class: class_from_text(&row.get::<_, String>(7)?)?,
        message: row.get(8)?,
        deleted: row.get(9)?,
        spec: None,
    })
}

fn codec_error(uid: &str, revision: u64, error: &codec::CodecError) -> StoreError {
    StoreError::Corrupt(format!("revision {revision} of uid {uid}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::describe_kept;

    #[test]
    fn kept_revisions_read_as_ranges() {
        assert_eq!(describe_kept([]), "none");
        assert_eq!(describe_kept([4]), "4");
        assert_eq!(describe_kept([1, 2, 3, 7, 9, 10, 11, 12]), "1-3, 7, 9-12");
    }
}
