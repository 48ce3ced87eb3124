//! Object reads and writes, and the watch-event log each write appends to.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use corral_api::{Kind, Object, ObjectKey};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use super::Shared;
use super::history::{self, NewRevision};
use super::schema::{self, META_EVENTS_COMPACTED, META_REVISION, corrupt_json, to_i64};
use crate::{ChangeMeta, EventType, ListResult, StoreError, WatchEvent};

pub(super) fn load(conn: &Connection, key: &ObjectKey) -> Result<Option<Object>, StoreError> {
    let body: Option<String> = conn
        .query_row(
            "SELECT body FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
            params![key.kind.as_str(), key.namespace, key.name],
            |row| row.get(0),
        )
        .optional()?;
    body.map(|body| parse_object(&body)).transpose()
}

pub(super) fn list(
    conn: &mut Connection,
    kind: Kind,
    namespace: Option<&str>,
) -> Result<ListResult, StoreError> {
    // One read transaction: the objects and the revision agree.
    let tx = conn.transaction()?;
    let resource_version = schema::get_meta(&tx, META_REVISION)?;
    let mut objects = Vec::new();
    {
        let mut statement = tx.prepare(
            "SELECT body FROM objects
             WHERE kind = ?1 AND (?2 IS NULL OR namespace = ?2)
             ORDER BY namespace, name",
        )?;
        let mut rows = statement.query(params![kind.as_str(), namespace])?;
        while let Some(row) = rows.next()? {
            objects.push(parse_object(&row.get::<_, String>(0)?)?);
        }
    }
    tx.commit()?;
    Ok(ListResult {
        objects,
        resource_version,
    })
}

pub(super) fn create(
    conn: &mut Connection,
    shared: &Shared,
    mut object: Object,
    change: &ChangeMeta,
) -> Result<Object, StoreError> {
    let key = object.key();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if load(&tx, &key)?.is_some() {
        return Err(StoreError::AlreadyExists { key });
    }
    let resource_version = next_revision(&tx)?;
    normalize_namespace(&mut object, &key);
    object.metadata.revision = 1;
    object.metadata.resource_version = resource_version;
    history::append(
        &tx,
        &NewRevision {
            uid: &object.metadata.uid,
            revision: 1,
            key: &key,
            change,
            deleted: false,
            seq: resource_version,
        },
        &object.spec,
    )?;
    put(&tx, &key, &object)?;
    commit_with_event(tx, shared, &key, EventType::Added, object)
}

pub(super) fn update(
    conn: &mut Connection,
    shared: &Shared,
    mut object: Object,
    expected: u64,
    change: &ChangeMeta,
) -> Result<Object, StoreError> {
    let key = object.key();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let stored = load(&tx, &key)?.ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    check_version(&key, expected, stored.metadata.resource_version)?;
    let resource_version = next_revision(&tx)?;
    normalize_namespace(&mut object, &key);
    object.metadata.uid = stored.metadata.uid;
    object.metadata.created_at = stored.metadata.created_at;
    object.metadata.revision = stored.metadata.revision;
    object.metadata.resource_version = resource_version;
    if object.spec != stored.spec || change.always_record {
        object.metadata.revision += 1;
        history::append(
            &tx,
            &NewRevision {
                uid: &object.metadata.uid,
                revision: object.metadata.revision,
                key: &key,
                change,
                deleted: false,
                seq: resource_version,
            },
            &object.spec,
        )?;
    }
    put(&tx, &key, &object)?;
    commit_with_event(tx, shared, &key, EventType::Modified, object)
}

pub(super) fn delete(
    conn: &mut Connection,
    shared: &Shared,
    key: &ObjectKey,
    expected: Option<u64>,
    change: &ChangeMeta,
) -> Result<Object, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut object = load(&tx, key)?.ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    if let Some(expected) = expected {
        check_version(key, expected, object.metadata.resource_version)?;
    }
    let resource_version = next_revision(&tx)?;
    // The deletion record repeats the last spec under the next revision.
    history::append(
        &tx,
        &NewRevision {
            uid: &object.metadata.uid,
            revision: object.metadata.revision + 1,
            key,
            change,
            deleted: true,
            seq: resource_version,
        },
        &object.spec,
    )?;
    tx.execute(
        "DELETE FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
        params![key.kind.as_str(), key.namespace, key.name],
    )?;
    object.metadata.resource_version = resource_version;
    commit_with_event(tx, shared, key, EventType::Deleted, object)
}

/// Forgets watch events through `through` and records how far the log now
/// starts.
pub(super) fn compact_events(conn: &mut Connection, through: u64) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    forget_events(&tx, through)?;
    tx.commit()?;
    Ok(())
}

fn forget_events(conn: &Connection, through: u64) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM events WHERE resource_version <= ?1",
        [to_i64(through)],
    )?;
    if schema::get_meta(conn, META_EVENTS_COMPACTED)? < through {
        schema::set_meta(conn, META_EVENTS_COMPACTED, through)?;
    }
    Ok(())
}

fn check_version(key: &ObjectKey, expected: u64, actual: u64) -> Result<(), StoreError> {
    if expected == actual {
        Ok(())
    } else {
        Err(StoreError::Conflict {
            key: key.clone(),
            expected,
            actual,
        })
    }
}

/// Bumps and returns the store revision.
fn next_revision(tx: &Transaction<'_>) -> Result<u64, StoreError> {
    let next = schema::get_meta(tx, META_REVISION)? + 1;
    schema::set_meta(tx, META_REVISION, next)?;
    Ok(next)
}

/// Stores the namespace the key uses, so `get` returns what `list` filters on.
fn normalize_namespace(object: &mut Object, key: &ObjectKey) {
    object.metadata.namespace = key.kind.is_namespaced().then(|| key.namespace.clone());
}

fn put(tx: &Transaction<'_>, key: &ObjectKey, object: &Object) -> Result<(), StoreError> {
    let body = serde_json::to_string(object).map_err(corrupt_json("object"))?;
    tx.execute(
        "INSERT INTO objects (kind, namespace, name, uid, revision, resource_version, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (kind, namespace, name) DO UPDATE SET
             uid = excluded.uid, revision = excluded.revision,
             resource_version = excluded.resource_version, body = excluded.body",
        params![
            key.kind.as_str(),
            key.namespace,
            key.name,
            object.metadata.uid,
            to_i64(object.metadata.revision),
            to_i64(object.metadata.resource_version),
            body
        ],
    )?;
    Ok(())
}

/// Appends the watch event, prunes old ones, commits, then broadcasts the
/// event (still under the connection lock, so in revision order).
fn commit_with_event(
    tx: Transaction<'_>,
    shared: &Shared,
    key: &ObjectKey,
    event_type: EventType,
    object: Object,
) -> Result<Object, StoreError> {
    let resource_version = object.metadata.resource_version;
    let body = serde_json::to_string(&object).map_err(corrupt_json("object"))?;
    tx.execute(
        "INSERT INTO events (resource_version, kind, namespace, name, type, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            to_i64(resource_version),
            key.kind.as_str(),
            key.namespace,
            key.name,
            event_type_text(event_type),
            body
        ],
    )?;
    let retention = shared.event_retention.load(Ordering::Relaxed);
    if resource_version > retention {
        let through = resource_version - retention;
        // Cheap when there is nothing to drop: one seek on the primary key.
        let oldest: Option<i64> =
            tx.query_row("SELECT min(resource_version) FROM events", [], |row| {
                row.get(0)
            })?;
        if oldest.is_some_and(|oldest| oldest <= to_i64(through)) {
            forget_events(&tx, through)?;
        }
    }
    tx.commit()?;
    let event = WatchEvent {
        event_type,
        object: object.clone(),
    };
    // No receiver is fine: nobody is watching.
    let _ = shared.events.send(Arc::new(event));
    Ok(object)
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

pub(super) fn parse_object(body: &str) -> Result<Object, StoreError> {
    serde_json::from_str(body).map_err(corrupt_json("stored object"))
}
