//! Spec revisions: appending them delta-encoded, reading them back,
//! cluster-wide queries and compaction.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use corral_api::history::{CompactionPolicy, KeptRevision};
use corral_api::{HistoryQuery, ObjectKey, RevisionRecord};
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params, params_from_iter};

use super::schema::{
    class_from_text, corrupt_json, kind_from_text, time_from_text, time_to_text, to_i64, to_u64,
};
use super::steplogs;
use crate::codec;
use crate::{ChangeMeta, HistorySize, STEP_LOG_ENTRIES_KEPT, StoreError, describe_kept};

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

/// A revision ready to insert: encoded, with nothing written yet, so that
/// what can fail about it (the codec) fails before its write changes
/// anything.
pub(super) struct EncodedRevision<'a> {
    new: &'a NewRevision<'a>,
    payload: Vec<u8>,
    keyframe: bool,
    raw_len: usize,
}

/// Encodes a revision whose spec is `bytes` (JSON) as a delta against
/// `previous` (the bytes of the revision before, as history decodes them)
/// where the codec wants one.
pub(super) fn encode<'a>(
    new: &'a NewRevision<'a>,
    bytes: &[u8],
    previous: Option<&[u8]>,
) -> Result<EncodedRevision<'a>, StoreError> {
    let payload = codec::encode(new.revision, previous, bytes)
        .map_err(|error| codec_error(new.uid, new.revision, &error))?;
    let keyframe =
        codec::is_keyframe(&payload).map_err(|error| codec_error(new.uid, new.revision, &error))?;
    Ok(EncodedRevision {
        new,
        payload,
        keyframe,
        raw_len: bytes.len(),
    })
}

/// Appends an encoded revision.
pub(super) fn insert(conn: &Connection, encoded: &EncodedRevision<'_>) -> Result<(), StoreError> {
    let new = encoded.new;
    conn.prepare_cached(
        "INSERT INTO revisions (uid, revision, kind, namespace, name, time, author, class,
                                message, deleted, keyframe, payload, raw_len, seq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
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
        encoded.keyframe,
        encoded.payload,
        to_i64(encoded.raw_len as u64),
        to_i64(new.seq),
    ])?;
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
    // Every uid under the key is deleted. A deleted uid's newest revision
    // is its deletion record, and compaction drops a uid's revisions oldest
    // first, so a uid with any history left still has that record.
    Ok(conn
        .query_row(
            "SELECT uid FROM revisions INDEXED BY revisions_deleted_key
             WHERE kind = ?1 AND namespace = ?2 AND name = ?3 AND deleted = 1
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

/// The newest `limit` records of the object at `key`, oldest first.
pub(super) fn recent_history(
    conn: &Connection,
    key: &ObjectKey,
    limit: usize,
) -> Result<Vec<RevisionRecord>, StoreError> {
    let uid = uid_for_key(conn, key)?.ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    let mut statement = conn.prepare_cached(&format!(
        "SELECT {RECORD_COLUMNS} FROM revisions WHERE uid = ?1 ORDER BY revision DESC LIMIT ?2"
    ))?;
    let mut rows = statement.query(params![uid, to_i64(limit.max(1) as u64)])?;
    let mut records = Vec::new();
    while let Some(row) = rows.next()? {
        records.push(record_from_row(row)?);
    }
    records.reverse();
    Ok(records)
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
    // One row and its delta chain; every record is read only to say, on a
    // miss, which revisions are kept.
    let not_found = || -> StoreError {
        match records_of(conn, &uid) {
            Ok(records) => StoreError::RevisionNotFound {
                key: key.clone(),
                revision,
                kept: describe_kept(records.iter().map(|record| record.revision)),
            },
            Err(error) => error,
        }
    };
    let mut statement = conn.prepare_cached(&format!(
        "SELECT {RECORD_COLUMNS} FROM revisions WHERE uid = ?1 AND revision = ?2"
    ))?;
    let mut rows = statement.query(params![uid, to_i64(revision)])?;
    let Some(row) = rows.next()? else {
        return Err(not_found());
    };
    let record = record_from_row(row)?;
    let bytes = spec_bytes(conn, &uid, revision)?.ok_or_else(not_found)?;
    let spec = serde_json::from_slice(&bytes).map_err(corrupt_json("revision spec"))?;
    Ok(RevisionRecord {
        spec: Some(spec),
        ..record
    })
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

/// Objects whose history one compaction transaction handles.
const COMPACTION_BATCH: usize = 500;

/// Step-log entries after which a compaction transaction ends its batch.
const TRIMMED_PER_BATCH: u64 = 20_000;

/// What one batch of a compaction did.
pub(super) struct CompactedBatch {
    pub revisions_removed: u64,
    pub step_log_entries_removed: u64,
    /// The last uid the batch looked at; `None` when there were none left.
    pub last_uid: Option<String>,
}

/// Applies `policy` to the histories of the next [`COMPACTION_BATCH`]
/// uids after `after`, in one transaction: drops what the policy does not
/// keep (never a live object's current revision) and turns survivors whose
/// delta base was dropped into keyframes, so every kept revision still
/// decodes. Each of those uids' step logs is trimmed too
/// ([`trim_step_logs`]).
pub(super) fn compact_batch(
    conn: &mut Connection,
    policy: CompactionPolicy,
    now: DateTime<Utc>,
    after: Option<&str>,
) -> Result<CompactedBatch, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Two forms, so that a later batch seeks in the primary key instead of
    // scanning from its start.
    let batch = to_i64(COMPACTION_BATCH as u64);
    let uids: Vec<String> = match after {
        None => tx
            .prepare("SELECT DISTINCT uid FROM revisions ORDER BY uid LIMIT ?1")?
            .query_map(params![batch], |row| row.get(0))?
            .collect::<Result<_, _>>()?,
        Some(after) => tx
            .prepare("SELECT DISTINCT uid FROM revisions WHERE uid > ?1 ORDER BY uid LIMIT ?2")?
            .query_map(params![after, batch], |row| row.get(0))?
            .collect::<Result<_, _>>()?,
    };
    // Every entry findable by object, so the trims below see them all.
    steplogs::index_tail(&tx, true)?;
    let (mut removed, mut trimmed) = (0u64, 0u64);
    let mut last_uid = None;
    for uid in uids {
        let (revisions_left, revisions_removed) = compact_object(&tx, policy, now, &uid)?;
        removed += revisions_removed;
        trimmed += trim_step_logs(&tx, &uid, revisions_left)?;
        last_uid = Some(uid);
        // A first compaction of long step logs ends its batch early, so
        // writes never queue behind one huge transaction.
        if trimmed >= TRIMMED_PER_BATCH {
            break;
        }
    }
    tx.commit()?;
    Ok(CompactedBatch {
        revisions_removed: removed,
        step_log_entries_removed: trimmed,
        last_uid,
    })
}

/// Trims the step log of `uid`: to its newest [`STEP_LOG_ENTRIES_KEPT`]
/// entries (by append order), or to nothing once no revision of it is
/// left. Returns how many entries went. Every entry of `uid` must be in
/// `step_logs_by_object` ([`steplogs::index_tail`] with `every`).
fn trim_step_logs(conn: &Connection, uid: &str, revisions_left: bool) -> Result<u64, StoreError> {
    // Entries below `before` go: all of them, or those older than the
    // oldest one kept (a walk of the object's index entries from its
    // newest).
    let before = if revisions_left {
        let offset = to_i64(STEP_LOG_ENTRIES_KEPT.saturating_sub(1) as u64);
        let oldest_kept: Option<i64> = conn
            .prepare_cached(
                "SELECT seq FROM step_logs_by_object WHERE object_uid = ?1
                 ORDER BY seq DESC LIMIT 1 OFFSET ?2",
            )?
            .query_row(params![uid, offset], |row| row.get(0))
            .optional()?;
        match oldest_kept {
            Some(seq) => seq,
            None => return Ok(0),
        }
    } else {
        i64::MAX
    };
    let removed = conn
        .prepare_cached(
            "DELETE FROM step_logs WHERE seq IN
             (SELECT seq FROM step_logs_by_object WHERE object_uid = ?1 AND seq < ?2)",
        )?
        .execute(params![uid, before])?;
    conn.prepare_cached("DELETE FROM step_logs_by_object WHERE object_uid = ?1 AND seq < ?2")?
        .execute(params![uid, before])?;
    Ok(removed as u64)
}

/// Compacts the history of one uid; returns whether any revision of it is
/// left, and how many went.
fn compact_object(
    conn: &Connection,
    policy: CompactionPolicy,
    now: DateTime<Utc>,
    uid: &str,
) -> Result<(bool, u64), StoreError> {
    let mut kept = Vec::new();
    let mut deltas = BTreeSet::new();
    {
        let mut statement = conn.prepare_cached(
            "SELECT revision, time, keyframe FROM revisions WHERE uid = ?1 ORDER BY revision",
        )?;
        let mut rows = statement.query([uid])?;
        while let Some(row) = rows.next()? {
            let revision = to_u64(row.get(0)?);
            kept.push(KeptRevision {
                revision,
                time: time_from_text(&row.get::<_, String>(1)?)?,
            });
            if !row.get::<_, bool>(2)? {
                deltas.insert(revision);
            }
        }
    }
    let current: Option<u64> = conn
        .prepare_cached("SELECT revision FROM objects WHERE uid = ?1")?
        .query_row([uid], |row| row.get(0))
        .optional()?
        .map(to_u64);
    let dropped = policy.doomed(&kept, current, now);
    if dropped.is_empty() {
        return Ok((!kept.is_empty(), 0));
    }
    // Survivors right after a dropped revision lose their delta base.
    let orphans = kept.iter().map(|kept| kept.revision).filter(|revision| {
        deltas.contains(revision)
            && !dropped.contains(revision)
            && dropped.contains(&revision.saturating_sub(1))
    });
    for revision in orphans {
        let bytes = spec_bytes(conn, uid, revision)?.ok_or_else(|| {
            StoreError::Corrupt(format!("revision {revision} of uid {uid} does not decode"))
        })?;
        let payload =
            codec::encode_keyframe(&bytes).map_err(|error| codec_error(uid, revision, &error))?;
        conn.prepare_cached(
            "UPDATE revisions SET payload = ?3, keyframe = 1 WHERE uid = ?1 AND revision = ?2",
        )?
        .execute(params![uid, to_i64(revision), payload])?;
    }
    let mut delete =
        conn.prepare_cached("DELETE FROM revisions WHERE uid = ?1 AND revision = ?2")?;
    let mut removed = 0u64;
    for revision in &dropped {
        removed += delete.execute(params![uid, to_i64(*revision)])? as u64;
    }
    Ok((kept.len() > dropped.len(), removed))
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
