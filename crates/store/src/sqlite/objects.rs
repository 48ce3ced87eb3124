//! Object reads, and the object writes the writer thread applies inside
//! its group transaction: each takes the store revision the writer hands
//! it, writes the object, appends its watch event and, when the spec
//! changed, a history revision. They never commit, and they do not record
//! the store revision: the writer does, once per group.
//!
//! Each write first reads, checks and encodes everything it will write,
//! and only then writes: a write that fails for its own reasons (a
//! conflict, a missing or existing object, unreadable history) has changed
//! nothing, so the rest of its group goes on without it and without a
//! savepoint per write (whose sub-journal copied every page a write
//! touched). A statement failing once the rows are being written fails
//! the whole group ([`Failure::Group`]).

use std::borrow::Cow;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use corral_api::{Kind, Object, ObjectKey};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::encoded::EncodedParts;
use super::events;
use super::history::{self, EncodedRevision, NewRevision};
use super::schema::{self, META_REVISION, corrupt_json, to_i64};
use super::specs::SpecCache;
use super::writer::Written;
use crate::codec;
use crate::{ChangeMeta, EventType, ListContinue, ListPage, ListResult, StoreError, WatchEvent};

/// A write applied (not yet committed): the caller's answer and the watch
/// event to broadcast after the commit.
pub(super) struct Applied {
    pub written: Written,
    /// The change's watch event, broadcast as it is after the commit.
    pub event: Option<Arc<WatchEvent>>,
}

/// The spec bytes the writer knows without decoding history: the cache of
/// earlier groups and writes, and what this write stages.
pub(super) struct Specs<'a> {
    pub cache: &'a SpecCache,
    pub staged: &'a mut SpecCache,
}

impl Specs<'_> {
    /// The bytes of `revision` of `uid`, from the cache or else decoded
    /// from history; `None` when that revision is not kept.
    fn bytes<'c>(
        &'c self,
        conn: &Connection,
        uid: &str,
        revision: u64,
    ) -> Result<Option<Cow<'c, [u8]>>, StoreError> {
        if let Some(bytes) = self.cache.get(uid, revision) {
            return Ok(Some(Cow::Borrowed(bytes)));
        }
        Ok(history::spec_bytes(conn, uid, revision)?.map(Cow::Owned))
    }

    /// Encodes revision `new.revision` with `spec`, delta-encoded against
    /// the previous revision, and stages its bytes for the next write.
    fn encode<'n>(
        &mut self,
        conn: &Connection,
        new: &'n NewRevision<'n>,
        spec: &serde_json::Value,
    ) -> Result<EncodedRevision<'n>, StoreError> {
        self.encode_bytes(conn, new, spec_bytes(spec)?)
    }

    /// [`Specs::encode`] of a spec already encoded as JSON.
    fn encode_bytes<'n>(
        &mut self,
        conn: &Connection,
        new: &'n NewRevision<'n>,
        bytes: Vec<u8>,
    ) -> Result<EncodedRevision<'n>, StoreError> {
        let previous = if codec::is_keyframe_revision(new.revision) {
            None
        } else {
            self.bytes(conn, new.uid, new.revision - 1)?
        };
        let encoded = history::encode(new, &bytes, previous.as_deref())?;
        self.staged.stage(new.uid, new.revision, bytes);
        Ok(encoded)
    }
}

/// A spec as JSON, the bytes history stores and the cache keeps. The
/// serializer is deterministic (object keys sorted), so two specs are
/// equal when their bytes are.
fn spec_bytes(spec: &serde_json::Value) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(spec).map_err(corrupt_json("spec"))
}

/// How a write of a group failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// Before it wrote anything: the write fails alone.
    Alone(StoreError),
    /// While it was writing its rows: what it wrote cannot be taken back
    /// alone, so the whole group rolls back and fails.
    Group(StoreError),
}

impl From<StoreError> for Failure {
    /// Errors are the write's own unless mapped to [`Failure::Group`].
    fn from(error: StoreError) -> Self {
        Failure::Alone(error)
    }
}

pub(super) fn load(conn: &Connection, key: &ObjectKey) -> Result<Option<Object>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT body FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
    )?;
    let mut rows = statement.query(params![key.kind.as_str(), key.namespace, key.name])?;
    match rows.next()? {
        Some(row) => Ok(Some(parse_object(body_of(row)?)?)),
        None => Ok(None),
    }
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
        // Two forms, so that both seek in the primary key.
        let mut statement;
        let mut rows = match namespace {
            Some(namespace) => {
                statement = tx.prepare_cached(
                    "SELECT body FROM objects WHERE kind = ?1 AND namespace = ?2 ORDER BY name",
                )?;
                statement.query(params![kind.as_str(), namespace])?
            }
            None => {
                statement = tx.prepare_cached(
                    "SELECT body FROM objects WHERE kind = ?1 ORDER BY namespace, name",
                )?;
                statement.query(params![kind.as_str()])?
            }
        };
        while let Some(row) = rows.next()? {
            objects.push(parse_object(body_of(row)?)?);
        }
    }
    tx.commit()?;
    Ok(ListResult {
        objects,
        resource_version,
    })
}

/// One page in (namespace, name) order, read in one transaction; one more
/// row than asked says whether another page follows.
pub(super) fn list_page(
    conn: &mut Connection,
    kind: Kind,
    namespace: Option<&str>,
    limit: usize,
    after: Option<&ListContinue>,
) -> Result<ListPage, StoreError> {
    let limit = limit.max(1);
    let tx = conn.transaction()?;
    let resource_version = schema::get_meta(&tx, META_REVISION)?;
    let mut objects = Vec::with_capacity(limit.min(4096));
    let mut more = false;
    {
        // Both forms walk the primary key (kind, namespace, name).
        let (after_namespace, after_name) = after
            .map(|after| (after.namespace.as_str(), after.name.as_str()))
            .unwrap_or(("", ""));
        let fetch = to_i64(limit as u64 + 1);
        let mut statement;
        let mut rows = match namespace {
            Some(namespace) => {
                // A token from another namespace starts this one afresh
                // or not at all, as (namespace, name) order says.
                let after_name = match after_namespace.cmp(namespace) {
                    std::cmp::Ordering::Less => "",
                    std::cmp::Ordering::Equal => after_name,
                    std::cmp::Ordering::Greater => {
                        return Ok(ListPage {
                            objects,
                            resource_version,
                            next: None,
                        });
                    }
                };
                statement = tx.prepare_cached(
                    "SELECT body FROM objects
                     WHERE kind = ?1 AND namespace = ?2 AND name > ?3
                     ORDER BY name LIMIT ?4",
                )?;
                statement.query(params![kind.as_str(), namespace, after_name, fetch])?
            }
            None => {
                statement = tx.prepare_cached(
                    "SELECT body FROM objects
                     WHERE kind = ?1 AND (namespace, name) > (?2, ?3)
                     ORDER BY namespace, name LIMIT ?4",
                )?;
                statement.query(params![kind.as_str(), after_namespace, after_name, fetch])?
            }
        };
        while let Some(row) = rows.next()? {
            if objects.len() == limit {
                more = true;
                break;
            }
            objects.push(parse_object(body_of(row)?)?);
        }
    }
    tx.commit()?;
    let next = if more {
        objects.last().map(ListContinue::after)
    } else {
        None
    };
    Ok(ListPage {
        objects,
        resource_version,
        next,
    })
}

pub(super) fn create(
    conn: &Connection,
    specs: &mut Specs<'_>,
    mut object: Object,
    parts: EncodedParts,
    change: &ChangeMeta,
    resource_version: u64,
) -> Result<Applied, Failure> {
    let key = object.key();
    if exists(conn, &key)? {
        return Err(StoreError::AlreadyExists { key }.into());
    }
    normalize_namespace(&mut object, &key);
    object.metadata.revision = 1;
    object.metadata.resource_version = resource_version;
    let uid = object.metadata.uid.clone();
    let new = NewRevision {
        uid: &uid,
        revision: 1,
        key: &key,
        change,
        deleted: false,
        seq: resource_version,
    };
    let body = parts.body(&object)?;
    let revision = specs.encode_bytes(conn, &new, parts.into_spec())?;
    // Nothing is written before this point.
    Rows {
        resource_version,
        revision: Some(&revision),
        key: &key,
        object: ObjectRow::Insert(&object),
        body: &body,
        event_type: EventType::Added,
        change,
    }
    .write(conn)
    .map_err(Failure::Group)?;
    Ok(applied(EventType::Added, object, body))
}

/// What an update needs of the stored object, from its row's columns:
/// its body is not read.
struct StoredHead {
    uid: String,
    revision: u64,
    resource_version: u64,
    created_at: Option<DateTime<Utc>>,
}

fn load_head(conn: &Connection, key: &ObjectKey) -> Result<Option<StoredHead>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT uid, revision, resource_version, created_at FROM objects
         WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
    )?;
    let mut rows = statement.query(params![key.kind.as_str(), key.namespace, key.name])?;
    let Some(row) = rows.next()? else {
        return Ok(None);
    };
    let created_at: Option<String> = row.get(3)?;
    Ok(Some(StoredHead {
        uid: row.get(0)?,
        revision: schema::to_u64(row.get(1)?),
        resource_version: schema::to_u64(row.get(2)?),
        created_at: created_at
            .as_deref()
            .map(schema::time_from_text)
            .transpose()?,
    }))
}

/// Whether `bytes` (a spec as JSON) is the spec of the stored object:
/// compared with the writer's cached bytes of its current revision, or else
/// with the spec in its stored body.
fn is_stored_spec(
    conn: &Connection,
    specs: &Specs<'_>,
    key: &ObjectKey,
    stored: &StoredHead,
    bytes: &[u8],
) -> Result<bool, StoreError> {
    if let Some(cached) = specs.cache.get(&stored.uid, stored.revision) {
        return Ok(cached == bytes);
    }
    #[derive(serde::Deserialize)]
    struct StoredSpec {
        #[serde(default)]
        spec: serde_json::Value,
    }
    let mut statement = conn.prepare_cached(
        "SELECT body FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
    )?;
    let mut rows = statement.query(params![key.kind.as_str(), key.namespace, key.name])?;
    let row = rows
        .next()?
        .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    let stored: StoredSpec =
        serde_json::from_str(body_of(row)?).map_err(corrupt_json("stored object"))?;
    Ok(spec_bytes(&stored.spec)? == bytes)
}

pub(super) fn update(
    conn: &Connection,
    specs: &mut Specs<'_>,
    mut object: Object,
    parts: EncodedParts,
    expected: u64,
    change: &ChangeMeta,
    resource_version: u64,
) -> Result<Applied, Failure> {
    let key = object.key();
    let stored = load_head(conn, &key)?.ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    check_version(&key, expected, stored.resource_version)?;
    normalize_namespace(&mut object, &key);
    let spec_changed =
        change.always_record || !is_stored_spec(conn, specs, &key, &stored, parts.spec())?;
    object.metadata.uid = stored.uid;
    object.metadata.created_at = stored.created_at;
    object.metadata.revision = stored.revision;
    object.metadata.resource_version = resource_version;
    if spec_changed {
        object.metadata.revision += 1;
    }
    let uid = object.metadata.uid.clone();
    let new = NewRevision {
        uid: &uid,
        revision: object.metadata.revision,
        key: &key,
        change,
        deleted: false,
        seq: resource_version,
    };
    let body = parts.body(&object)?;
    let revision = if spec_changed {
        Some(specs.encode_bytes(conn, &new, parts.into_spec())?)
    } else {
        None
    };
    // Nothing is written before this point.
    Rows {
        resource_version,
        revision: revision.as_ref(),
        key: &key,
        object: ObjectRow::Update(&object),
        body: &body,
        event_type: EventType::Modified,
        change,
    }
    .write(conn)
    .map_err(Failure::Group)?;
    Ok(applied(EventType::Modified, object, body))
}

pub(super) fn delete(
    conn: &Connection,
    specs: &mut Specs<'_>,
    key: &ObjectKey,
    expected: Option<u64>,
    change: &ChangeMeta,
    resource_version: u64,
) -> Result<Applied, Failure> {
    let mut object = load(conn, key)?.ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    if let Some(expected) = expected {
        check_version(key, expected, object.metadata.resource_version)?;
    }
    let uid = object.metadata.uid.clone();
    // The deletion record repeats the last spec under the next revision.
    let new = NewRevision {
        uid: &uid,
        revision: object.metadata.revision + 1,
        key,
        change,
        deleted: true,
        seq: resource_version,
    };
    let revision = specs.encode(conn, &new, &object.spec)?;
    specs.staged.stage_removal(&uid);
    object.metadata.resource_version = resource_version;
    let body = serde_json::to_string(&object).map_err(corrupt_json("object"))?;
    // Nothing is written before this point.
    Rows {
        resource_version,
        revision: Some(&revision),
        key,
        object: ObjectRow::Delete,
        body: &body,
        event_type: EventType::Deleted,
        change,
    }
    .write(conn)
    .map_err(Failure::Group)?;
    Ok(applied(EventType::Deleted, object, body))
}

fn exists(conn: &Connection, key: &ObjectKey) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3")?
        .query_row(params![key.kind.as_str(), key.namespace, key.name], |_| {
            Ok(())
        })
        .optional()?
        .is_some())
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

/// Stores the namespace the key uses, so `get` returns what `list` filters on.
fn normalize_namespace(object: &mut Object, key: &ObjectKey) {
    object.metadata.namespace = key.kind.is_namespaced().then(|| key.namespace.clone());
}

/// What a write does to the object's row.
enum ObjectRow<'a> {
    Insert(&'a Object),
    Update(&'a Object),
    Delete,
}

/// Everything a checked and encoded write changes.
struct Rows<'a> {
    /// The store revision it takes.
    resource_version: u64,
    /// Its history revision, when the spec changed.
    revision: Option<&'a EncodedRevision<'a>>,
    key: &'a ObjectKey,
    object: ObjectRow<'a>,
    /// The object as JSON: the row's body and the watch event's.
    body: &'a str,
    event_type: EventType,
    change: &'a ChangeMeta,
}

impl Rows<'_> {
    /// Writes the rows. An error here leaves the transaction partly written.
    fn write(&self, conn: &Connection) -> Result<(), StoreError> {
        let key = self.key;
        if let Some(revision) = self.revision {
            history::insert(conn, revision)?;
        }
        match self.object {
            ObjectRow::Insert(object) => insert_row(conn, key, object, self.body)?,
            ObjectRow::Update(object) => update_row(conn, key, object, self.body)?,
            ObjectRow::Delete => {
                conn.prepare_cached(
                    "DELETE FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
                )?
                .execute(params![key.kind.as_str(), key.namespace, key.name])?;
            }
        }
        events::insert(
            conn,
            self.resource_version,
            key,
            self.event_type,
            self.body,
            self.change.time,
        )
    }
}

/// Writes a new object row with its encoded `body`.
fn insert_row(
    conn: &Connection,
    key: &ObjectKey,
    object: &Object,
    body: &str,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO objects
         (kind, namespace, name, uid, revision, resource_version, created_at, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        key.kind.as_str(),
        key.namespace,
        key.name,
        object.metadata.uid,
        to_i64(object.metadata.revision),
        to_i64(object.metadata.resource_version),
        object.metadata.created_at.map(schema::time_to_text),
        body
    ])?;
    Ok(())
}

/// Writes the changed columns of a stored object row. An update keeps the
/// uid and the creation time, so the uid index is left alone.
fn update_row(
    conn: &Connection,
    key: &ObjectKey,
    object: &Object,
    body: &str,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE objects SET revision = ?4, resource_version = ?5, body = ?6
         WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
    )?
    .execute(params![
        key.kind.as_str(),
        key.namespace,
        key.name,
        to_i64(object.metadata.revision),
        to_i64(object.metadata.resource_version),
        body
    ])?;
    Ok(())
}

/// A written object: its watch event, which is also the caller's answer
/// (the caller copies the object out on its own thread, not the writer's).
fn applied(event_type: EventType, object: Object, body: String) -> Applied {
    let event = Arc::new(WatchEvent {
        event_type,
        object,
        encoded: Some(Arc::from(body)),
    });
    Applied {
        event: Some(Arc::clone(&event)),
        written: Written::Object(event),
    }
}

/// The `body` column (the first selected) of a row, borrowed.
fn body_of<'r>(row: &'r Row<'_>) -> Result<&'r str, StoreError> {
    row.get_ref(0)?
        .as_str()
        .map_err(|error| StoreError::Corrupt(format!("stored object body: {error}")))
}

pub(super) fn parse_object(body: &str) -> Result<Object, StoreError> {
    serde_json::from_str(body).map_err(corrupt_json("stored object"))
}
