//! Spec revisions: appended delta-encoded with `corral_store::codec` (as
//! the SQLite store does), read back, queried cluster-wide and compacted.
//! A revision is two keys: its record (`P/revisions/…`) and its payload
//! (`P/specs/…`), so queries read records without payloads. The store
//! revision of the write that made a record (`seq`, which orders
//! same-time records) is its record key's `create_revision`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use corral_api::history::{CompactionPolicy, KeptRevision};
use corral_api::{HistoryQuery, ObjectKey, RevisionRecord};
use corral_store::codec;
use corral_store::{ChangeMeta, CompactionReport, HistorySize, StoreError, describe_kept};
use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::keys::store_revision;
use crate::objects::object_from_kv;
use crate::{EtcdStore, corrupt_json, unavailable};

/// Keys deleted per transaction during compaction (etcd allows 128 ops).
const DELETE_BATCH: usize = 60;

/// One revision about to be appended.
pub(crate) struct NewRevision<'a> {
    pub uid: &'a str,
    pub revision: u64,
    pub key: &'a ObjectKey,
    pub change: &'a ChangeMeta,
    pub deleted: bool,
}

/// A revision record as stored: the record without its spec, and the size
/// of that spec as JSON.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredRecord {
    #[serde(flatten)]
    pub record: RevisionRecord,
    pub raw_len: u64,
}

/// A record read back, with the store revision of the write that made it.
struct ReadRecord {
    record: RevisionRecord,
    raw_len: u64,
    seq: u64,
}

/// The operations that append a revision whose spec is `spec`: its record
/// and its payload, a delta against the previous revision where the codec
/// wants one. `previous` is that revision's spec JSON when the caller
/// knows it exactly as history holds it; otherwise it is read from etcd.
/// Also returns the new revision's spec JSON.
pub(crate) async fn append_ops(
    store: &EtcdStore,
    new: &NewRevision<'_>,
    spec: &serde_json::Value,
    previous: Option<&[u8]>,
) -> Result<(Vec<TxnOp>, Vec<u8>), StoreError> {
    let bytes = serde_json::to_vec(spec).map_err(corrupt_json("spec"))?;
    let read;
    let previous = if codec::is_keyframe_revision(new.revision) {
        None
    } else if previous.is_some() {
        previous
    } else {
        // Decoded from history itself, so the delta applies to exactly the
        // bytes a reader will reconstruct.
        read = spec_bytes(store, new.uid, new.revision - 1).await?;
        read.as_deref()
    };
    let payload = codec::encode(new.revision, previous, &bytes)
        .map_err(|error| codec_error(new.uid, new.revision, &error))?;
    let stored = StoredRecord {
        record: RevisionRecord {
            revision: new.revision,
            time: new.change.time,
            author: new.change.author.clone(),
            class: new.change.class,
            message: new.change.message.clone(),
            kind: new.key.kind,
            namespace: new.key.namespace.clone(),
            name: new.key.name.clone(),
            uid: new.uid.to_string(),
            deleted: new.deleted,
            spec: None,
        },
        raw_len: bytes.len() as u64,
    };
    let record = serde_json::to_vec(&stored).map_err(corrupt_json("revision record"))?;
    let operations = vec![
        TxnOp::put(store.keys.revision(new.uid, new.revision), record, None),
        TxnOp::put(store.keys.spec(new.uid, new.revision), payload, None),
    ];
    Ok((operations, bytes))
}

/// The spec bytes of one revision, decoded from the nearest keyframe at or
/// before it; `None` when that revision is not kept.
pub(crate) async fn spec_bytes(
    store: &EtcdStore,
    uid: &str,
    revision: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    // The codec puts a keyframe at least every KEYFRAME_INTERVAL revisions;
    // compaction only adds keyframes.
    let first = if revision <= 1 {
        1
    } else {
        revision - (revision - 1) % codec::KEYFRAME_INTERVAL
    };
    let mut response = store
        .kv()
        .get(
            store.keys.spec(uid, first),
            Some(GetOptions::new().with_range(store.keys.spec(uid, revision + 1))),
        )
        .await
        .map_err(unavailable)?;
    let mut chain = Vec::new();
    for kv in response.take_kvs() {
        let (key, payload) = kv.into_key_value();
        chain.push((revision_of_key(&key)?, payload));
    }
    match chain.last() {
        Some((last, _)) if *last == revision => {}
        _ => return Ok(None),
    }
    let mut start = None;
    for (index, (_, payload)) in chain.iter().enumerate() {
        if codec::is_keyframe(payload).map_err(|error| codec_error(uid, revision, &error))? {
            start = Some(index);
        }
    }
    let Some(start) = start else {
        return Err(StoreError::Corrupt(format!(
            "revision {revision} of uid {uid}: no keyframe within {} revisions",
            codec::KEYFRAME_INTERVAL
        )));
    };
    let chain = &chain[start..];
    if !chain.windows(2).all(|pair| pair[1].0 == pair[0].0 + 1) {
        return Err(StoreError::Corrupt(format!(
            "revision {revision} of uid {uid}: its delta chain has a gap"
        )));
    }
    codec::decode_chain(chain.iter().map(|(_, payload)| payload.as_slice()))
        .map(Some)
        .map_err(|error| codec_error(uid, revision, &error))
}

/// The revision number at the end of a `…/{revision:020}` key.
fn revision_of_key(key: &[u8]) -> Result<u64, StoreError> {
    let text = String::from_utf8_lossy(key);
    text.rsplit('/')
        .next()
        .and_then(|last| last.parse().ok())
        .ok_or_else(|| StoreError::Corrupt(format!("history key {text:?} has no revision")))
}

/// The uid whose history `key` shows: the newest object created under it
/// (live or deleted).
async fn uid_for_key(store: &EtcdStore, key: &ObjectKey) -> Result<Option<String>, StoreError> {
    let mut response = store
        .kv()
        .get(store.keys.history_key(key), None)
        .await
        .map_err(unavailable)?;
    Ok(response
        .take_kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
}

pub(crate) async fn history(
    store: &EtcdStore,
    key: &ObjectKey,
) -> Result<Vec<RevisionRecord>, StoreError> {
    let uid = uid_for_key(store, key)
        .await?
        .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    records_of(store, &uid).await
}

/// The newest `limit` records of the object at `key`, oldest first: the
/// last keys of its range (the revision in a key is zero-padded).
pub(crate) async fn recent_history(
    store: &EtcdStore,
    key: &ObjectKey,
    limit: usize,
) -> Result<Vec<RevisionRecord>, StoreError> {
    let uid = uid_for_key(store, key)
        .await?
        .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    let newest = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Key, SortOrder::Descend)
        .with_limit(i64::try_from(limit.max(1)).unwrap_or(i64::MAX));
    let mut response = store
        .kv()
        .get(store.keys.revisions(Some(&uid)), Some(newest))
        .await
        .map_err(unavailable)?;
    let mut records = response
        .take_kvs()
        .iter()
        .map(|kv| read_record(kv).map(|read| read.record))
        .collect::<Result<Vec<_>, _>>()?;
    records.reverse();
    Ok(records)
}

async fn records_of(store: &EtcdStore, uid: &str) -> Result<Vec<RevisionRecord>, StoreError> {
    let kvs = store.range(&store.keys.revisions(Some(uid))).await?;
    kvs.iter()
        .map(|kv| read_record(kv).map(|read| read.record))
        .collect()
}

fn read_record(kv: &KeyValue) -> Result<ReadRecord, StoreError> {
    let stored: StoredRecord =
        serde_json::from_slice(kv.value()).map_err(corrupt_json("revision record"))?;
    Ok(ReadRecord {
        record: stored.record,
        raw_len: stored.raw_len,
        seq: store_revision(kv.create_revision()),
    })
}

pub(crate) async fn revision(
    store: &EtcdStore,
    key: &ObjectKey,
    revision: u64,
) -> Result<RevisionRecord, StoreError> {
    let uid = uid_for_key(store, key)
        .await?
        .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    // One record and its delta chain; every record is read only to say, on
    // a miss, which revisions are kept.
    let mut response = store
        .kv()
        .get(store.keys.revision(&uid, revision), None)
        .await
        .map_err(unavailable)?;
    let record = match response.take_kvs().first() {
        Some(kv) => Some(read_record(kv)?.record),
        None => None,
    };
    let bytes = match record {
        Some(_) => spec_bytes(store, &uid, revision).await?,
        None => None,
    };
    let (Some(record), Some(bytes)) = (record, bytes) else {
        let records = records_of(store, &uid).await?;
        return Err(StoreError::RevisionNotFound {
            key: key.clone(),
            revision,
            kept: describe_kept(records.iter().map(|record| record.revision)),
        });
    };
    let spec = serde_json::from_slice(&bytes).map_err(corrupt_json("revision spec"))?;
    Ok(RevisionRecord {
        spec: Some(spec),
        ..record
    })
}

/// Every record, ordered by time, then the write that made it, then
/// revision.
async fn all_records(store: &EtcdStore) -> Result<Vec<ReadRecord>, StoreError> {
    let kvs = store.range(&store.keys.revisions(None)).await?;
    let mut records = kvs.iter().map(read_record).collect::<Result<Vec<_>, _>>()?;
    records.sort_by(|a, b| {
        (a.record.time, a.seq, a.record.revision).cmp(&(b.record.time, b.seq, b.record.revision))
    });
    Ok(records)
}

pub(crate) async fn query(
    store: &EtcdStore,
    query: &HistoryQuery,
) -> Result<Vec<RevisionRecord>, StoreError> {
    let mut records: Vec<RevisionRecord> = all_records(store)
        .await?
        .into_iter()
        .map(|read| read.record)
        .filter(|record| query.admits(record))
        .collect();
    if let Some(limit) = query.limit {
        let skip = records.len().saturating_sub(limit);
        records.drain(..skip);
    }
    Ok(records)
}

/// Drops what `policy` does not keep, never a live object's current
/// revision, and first turns survivors whose delta base is about to go
/// into keyframes, so every kept revision still decodes (also if this is
/// interrupted halfway).
pub(crate) async fn compact(
    store: &EtcdStore,
    policy: CompactionPolicy,
    now: DateTime<Utc>,
) -> Result<CompactionReport, StoreError> {
    if policy == CompactionPolicy::All {
        return Ok(CompactionReport::default());
    }
    let records = all_records(store).await?;
    let current: HashMap<String, u64> = store
        .range(&store.keys.objects(None, None))
        .await?
        .iter()
        .map(|kv| object_from_kv(kv).map(|o| (o.metadata.uid, o.metadata.revision)))
        .collect::<Result<_, _>>()?;
    let mut revisions: BTreeMap<&str, Vec<KeptRevision>> = BTreeMap::new();
    for read in &records {
        revisions
            .entry(&read.record.uid)
            .or_default()
            .push(KeptRevision {
                revision: read.record.revision,
                time: read.record.time,
            });
    }
    let mut by_uid: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut kept: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for (uid, revisions) in &revisions {
        let dropped = policy.doomed(revisions, current.get(*uid).copied(), now);
        kept.insert(
            uid.to_string(),
            revisions
                .iter()
                .map(|kept| kept.revision)
                .filter(|revision| !dropped.contains(revision))
                .collect(),
        );
        if !dropped.is_empty() {
            by_uid.insert(uid.to_string(), dropped);
        }
    }
    let mut removed = 0u64;
    let mut trimmed = 0u64;
    for (uid, kept) in &kept {
        trimmed += crate::records::trim_step_logs(store, uid, !kept.is_empty()).await?;
    }
    for (uid, dropped) in &by_uid {
        let survivors = kept.get(uid).cloned().unwrap_or_default();
        for revision in survivors
            .iter()
            .filter(|revision| dropped.contains(&revision.saturating_sub(1)))
        {
            let bytes = spec_bytes(store, uid, *revision).await?.ok_or_else(|| {
                StoreError::Corrupt(format!("revision {revision} of uid {uid} does not decode"))
            })?;
            let payload = codec::encode_keyframe(&bytes)
                .map_err(|error| codec_error(uid, *revision, &error))?;
            store
                .kv()
                .put(store.keys.spec(uid, *revision), payload, None)
                .await
                .map_err(unavailable)?;
        }
        let dropped: Vec<u64> = dropped.iter().copied().collect();
        for batch in dropped.chunks(DELETE_BATCH) {
            let operations: Vec<TxnOp> = batch
                .iter()
                .flat_map(|revision| {
                    [
                        TxnOp::delete(store.keys.revision(uid, *revision), None),
                        TxnOp::delete(store.keys.spec(uid, *revision), None),
                    ]
                })
                .collect();
            store
                .kv()
                .txn(Txn::new().and_then(operations))
                .await
                .map_err(unavailable)?;
            removed += batch.len() as u64;
        }
    }
    Ok(CompactionReport {
        revisions_removed: removed,
        step_log_entries_removed: trimmed,
    })
}

pub(crate) async fn size(store: &EtcdStore) -> Result<HistorySize, StoreError> {
    let mut size = HistorySize::default();
    for kv in store.range(&store.keys.revisions(None)).await? {
        size.revisions += 1;
        size.raw_bytes += read_record(&kv)?.raw_len;
    }
    for kv in store.range(&store.keys.specs(None)).await? {
        size.stored_bytes += kv.value().len() as u64;
    }
    Ok(size)
}

fn codec_error(uid: &str, revision: u64, error: &codec::CodecError) -> StoreError {
    StoreError::Corrupt(format!("revision {revision} of uid {uid}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::revision_of_key;

    #[test]
    fn history_keys_end_in_their_revision() {
        assert_eq!(
            revision_of_key(b"/corral/specs/uid-1/00000000000000000042").unwrap(),
            42
        );
        assert!(revision_of_key(b"/corral/specs/uid-1/x").is_err());
    }
}
