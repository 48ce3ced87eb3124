//! Tokens, node leases, sealed values and workflow step logs: plain keys outside the
//! object space, so they never show up in watches.
//!
//! One `append_step_logs` call writes one key per object uid it mentions
//! (`P/steplogs/{uid}/{uuid}`, a JSON array), all in one transaction.
//! Reading orders entries by time, then by the etcd revision of the append
//! that wrote them, then by their place in it — the order they were
//! appended in.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use corral_api::workflow::StepLogEntry;
use corral_store::{
    LeaseRecord, STEP_LOG_ENTRIES_KEPT, SealedRecord, StepLogFilter, StoreError, TokenRecord,
};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse,
};

use crate::{EtcdStore, corrupt_json, unavailable};

/// etcd refuses transactions of more than 128 operations by default.
pub(crate) const MAX_TXN_OPS: usize = 128;

pub(crate) async fn put_token(store: &EtcdStore, token: TokenRecord) -> Result<(), StoreError> {
    let value = serde_json::to_vec(&token).map_err(corrupt_json("token"))?;
    store
        .kv()
        .put(store.keys.token(&token.hash), value, None)
        .await
        .map_err(unavailable)?;
    Ok(())
}

pub(crate) async fn renew_lease(store: &EtcdStore, lease: LeaseRecord) -> Result<(), StoreError> {
    let value = serde_json::to_vec(&lease).map_err(corrupt_json("lease"))?;
    store
        .kv()
        .put(store.keys.lease(&lease.name), value, None)
        .await
        .map_err(unavailable)?;
    Ok(())
}

pub(crate) async fn find_lease(
    store: &EtcdStore,
    name: &str,
) -> Result<Option<LeaseRecord>, StoreError> {
    let mut response = store
        .kv()
        .get(store.keys.lease(name), None)
        .await
        .map_err(unavailable)?;
    response
        .take_kvs()
        .first()
        .map(|kv| serde_json::from_slice(kv.value()).map_err(corrupt_json("lease")))
        .transpose()
}

pub(crate) async fn find_token(
    store: &EtcdStore,
    hash: &str,
) -> Result<Option<TokenRecord>, StoreError> {
    let mut response = store
        .kv()
        .get(store.keys.token(hash), None)
        .await
        .map_err(unavailable)?;
    response
        .take_kvs()
        .first()
        .map(|kv| serde_json::from_slice(kv.value()).map_err(corrupt_json("token")))
        .transpose()
}

pub(crate) async fn list_tokens(store: &EtcdStore) -> Result<Vec<TokenRecord>, StoreError> {
    let mut tokens = store
        .range(&store.keys.token(""))
        .await?
        .iter()
        .map(|kv| serde_json::from_slice(kv.value()).map_err(corrupt_json("token")))
        .collect::<Result<Vec<TokenRecord>, _>>()?;
    tokens.sort_by(|a, b| (a.created_at, &a.hash).cmp(&(b.created_at, &b.hash)));
    Ok(tokens)
}

/// Compare-and-swap on the record's `mod_revision`: a token revoked (or
/// rewritten) since it was read is left alone.
pub(crate) async fn touch_token(
    store: &EtcdStore,
    hash: &str,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let key = store.keys.token(hash);
    let mut response = store
        .kv()
        .get(key.clone(), None)
        .await
        .map_err(unavailable)?;
    let Some(kv) = response.take_kvs().into_iter().next() else {
        return Ok(());
    };
    let mut record: TokenRecord =
        serde_json::from_slice(kv.value()).map_err(corrupt_json("token"))?;
    record.last_used_at = Some(at);
    let value = serde_json::to_vec(&record).map_err(corrupt_json("token"))?;
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            kv.mod_revision(),
        )])
        .and_then([TxnOp::put(key, value, None)]);
    store.kv().txn(txn).await.map_err(unavailable)?;
    Ok(())
}

pub(crate) async fn delete_tokens(store: &EtcdStore, hashes: &[String]) -> Result<(), StoreError> {
    for chunk in hashes.chunks(MAX_TXN_OPS) {
        let operations: Vec<TxnOp> = chunk
            .iter()
            .map(|hash| TxnOp::delete(store.keys.token(hash), None))
            .collect();
        store
            .kv()
            .txn(Txn::new().and_then(operations))
            .await
            .map_err(unavailable)?;
    }
    Ok(())
}

pub(crate) async fn get_sealed(
    store: &EtcdStore,
    name: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let mut response = store
        .kv()
        .get(store.keys.sealed(name), None)
        .await
        .map_err(unavailable)?;
    Ok(response.take_kvs().first().map(|kv| kv.value().to_vec()))
}

pub(crate) async fn list_sealed(
    store: &EtcdStore,
    prefix: &str,
) -> Result<Vec<SealedRecord>, StoreError> {
    let root = store.keys.sealed("");
    let mut records = Vec::new();
    for kv in store.range(&store.keys.sealed(prefix)).await? {
        let key = kv.key_str().map_err(|error| {
            StoreError::Corrupt(format!("etcd: a sealed value's key is not UTF-8: {error}"))
        })?;
        let name = key.strip_prefix(&root).unwrap_or(key).to_string();
        records.push(SealedRecord {
            name,
            value: kv.value().to_vec(),
        });
    }
    records.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(records)
}

/// All or none: one transaction, refused when it would exceed etcd's limit
/// of operations per transaction.
pub(crate) async fn write_sealed(
    store: &EtcdStore,
    put: &[SealedRecord],
    remove: &[String],
) -> Result<(), StoreError> {
    let mut operations: Vec<TxnOp> = put
        .iter()
        .map(|record| TxnOp::put(store.keys.sealed(&record.name), record.value.clone(), None))
        .collect();
    operations.extend(
        remove
            .iter()
            .map(|name| TxnOp::delete(store.keys.sealed(name), None)),
    );
    if operations.is_empty() {
        return Ok(());
    }
    if operations.len() > MAX_TXN_OPS {
        return Err(StoreError::Unavailable(format!(
            "etcd: {} sealed values in one write; etcd takes at most {MAX_TXN_OPS} per transaction",
            operations.len()
        )));
    }
    store
        .kv()
        .txn(Txn::new().and_then(operations))
        .await
        .map_err(unavailable)?;
    Ok(())
}

pub(crate) async fn append_step_logs(
    store: &EtcdStore,
    entries: &[StepLogEntry],
) -> Result<(), StoreError> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut by_uid: BTreeMap<&str, Vec<&StepLogEntry>> = BTreeMap::new();
    for entry in entries {
        by_uid.entry(&entry.object_uid).or_default().push(entry);
    }
    let mut operations = Vec::with_capacity(by_uid.len());
    for (uid, entries) in by_uid {
        let value = serde_json::to_vec(&entries).map_err(corrupt_json("step log entries"))?;
        let batch = uuid::Uuid::new_v4().to_string();
        operations.push(TxnOp::put(store.keys.step_log(uid, &batch), value, None));
    }
    // All or none up to etcd's limit; an append about more objects than
    // that is split (each object's entries still land whole).
    for chunk in operations.chunks(MAX_TXN_OPS) {
        store
            .kv()
            .txn(Txn::new().and_then(chunk.to_vec()))
            .await
            .map_err(unavailable)?;
    }
    Ok(())
}

/// Trims the step log of `uid` for a compaction: to its newest
/// [`STEP_LOG_ENTRIES_KEPT`] appends (each at least one entry, so at least
/// that many entries stay), or to nothing once no revision of it is left.
/// Returns how many entries went.
pub(crate) async fn trim_step_logs(
    store: &EtcdStore,
    uid: &str,
    revisions_left: bool,
) -> Result<u64, StoreError> {
    let prefix = store.keys.step_logs(Some(uid));
    if !revisions_left {
        let every = DeleteOptions::new().with_prefix().with_prev_key();
        return deleted_entries(store, vec![TxnOp::delete(prefix, Some(every))]).await;
    }
    let mut keys = store
        .kv()
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .map_err(unavailable)?
        .take_kvs();
    let Some(excess) = keys.len().checked_sub(STEP_LOG_ENTRIES_KEPT) else {
        return Ok(0);
    };
    // Appends in the order they were made.
    keys.sort_by_key(KeyValue::create_revision);
    let mut removed = 0;
    for batch in keys[..excess].chunks(MAX_TXN_OPS) {
        let operations = batch
            .iter()
            .map(|kv| TxnOp::delete(kv.key(), Some(DeleteOptions::new().with_prev_key())))
            .collect();
        removed += deleted_entries(store, operations).await?;
    }
    Ok(removed)
}

/// Runs step-log deletions in one transaction; returns the entries they
/// removed.
async fn deleted_entries(store: &EtcdStore, operations: Vec<TxnOp>) -> Result<u64, StoreError> {
    let response = store
        .kv()
        .txn(Txn::new().and_then(operations))
        .await
        .map_err(unavailable)?;
    let mut removed = 0;
    for answer in response.op_responses() {
        if let TxnOpResponse::Delete(deleted) = answer {
            for kv in deleted.prev_kvs() {
                let entries: Vec<serde_json::Value> =
                    serde_json::from_slice(kv.value()).map_err(corrupt_json("step log entries"))?;
                removed += entries.len() as u64;
            }
        }
    }
    Ok(removed)
}

pub(crate) async fn step_logs(
    store: &EtcdStore,
    uid: &str,
    filter: &StepLogFilter,
) -> Result<Vec<StepLogEntry>, StoreError> {
    let mut ordered = Vec::new();
    for kv in store.range(&store.keys.step_logs(Some(uid))).await? {
        let entries: Vec<StepLogEntry> =
            serde_json::from_slice(kv.value()).map_err(corrupt_json("step log entries"))?;
        for (place, entry) in entries.into_iter().enumerate() {
            ordered.push((entry.time, kv.create_revision(), place, entry));
        }
    }
    ordered.sort_by_key(|a| (a.0, a.1, a.2));
    Ok(ordered
        .into_iter()
        .map(|(_, _, _, entry)| entry)
        .filter(|entry| filter.admits(entry))
        .collect())
}
