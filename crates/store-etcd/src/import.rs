//! Loading a [`Dump`] (another backend's whole store) into an empty etcd
//! prefix: `corral migrate`. Revisions are written one transaction each,
//! in the order the source wrote them, through the same encoder as live
//! writes (so a record's `seq` keeps the source's order and specs are
//! delta-compressed as usual); then the history keys, the tokens, the step
//! logs, and the live objects last: until they are written nothing is
//! visible to a server, and an import that fails half way is retried into
//! a fresh prefix.

use std::collections::BTreeMap;

use corral_api::ObjectKey;
use corral_api::workflow::StepLogEntry;
use corral_store::dump::Dump;
use corral_store::{ChangeMeta, StoreError};
use etcd_client::{GetOptions, Txn, TxnOp};

use crate::history::{self, NewRevision};
use crate::objects::body;
use crate::{EtcdStore, records, unavailable};

/// At most this many step log entries, and about this many bytes of
/// them, per append (etcd refuses requests over 1.5 MiB by default).
const STEP_LOG_CHUNK: usize = 500;
const STEP_LOG_CHUNK_BYTES: usize = 512 * 1024;

/// Why an import did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(
        "the etcd prefix {prefix} already holds {keys} keys: migrate only into an empty prefix (choose another with ?prefix=)"
    )]
    NotEmpty { prefix: String, keys: i64 },
    #[error("revision {revision} of uid {uid} has no spec in the dump")]
    MissingSpec { uid: String, revision: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub(crate) async fn import(store: &EtcdStore, dump: &Dump) -> Result<(), ImportError> {
    let root = store.keys.root();
    let existing = store
        .kv()
        .get(
            root.clone(),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .map_err(unavailable)?
        .count();
    if existing > 0 {
        return Err(ImportError::NotEmpty {
            prefix: root,
            keys: existing,
        });
    }
    // The uid each key's history shows: the live object's, else the one
    // written last under that key.
    let mut history_keys: BTreeMap<ObjectKey, String> = BTreeMap::new();
    for record in &dump.revisions {
        let spec = record
            .spec
            .as_ref()
            .ok_or_else(|| ImportError::MissingSpec {
                uid: record.uid.clone(),
                revision: record.revision,
            })?;
        let key = ObjectKey::new(record.kind, Some(&record.namespace), &record.name);
        let change = ChangeMeta {
            author: record.author.clone(),
            class: record.class,
            message: record.message.clone(),
            time: record.time,
            always_record: false,
        };
        let (operations, _) = history::append_ops(
            store,
            &NewRevision {
                uid: &record.uid,
                revision: record.revision,
                key: &key,
                change: &change,
                deleted: record.deleted,
            },
            spec,
            None,
        )
        .await?;
        commit(store, operations).await?;
        history_keys.insert(key, record.uid.clone());
    }
    for object in &dump.objects {
        history_keys.insert(object.key(), object.metadata.uid.clone());
    }
    let operations: Vec<TxnOp> = history_keys
        .iter()
        .map(|(key, uid)| TxnOp::put(store.keys.history_key(key), uid.clone(), None))
        .collect();
    for chunk in operations.chunks(records::MAX_TXN_OPS) {
        commit(store, chunk.to_vec()).await?;
    }
    for token in &dump.tokens {
        records::put_token(store, token.clone()).await?;
    }
    for chunk in dump.sealed.chunks(records::MAX_TXN_OPS) {
        records::write_sealed(store, chunk, &[]).await?;
    }
    for chunk in step_log_chunks(&dump.step_logs) {
        records::append_step_logs(store, chunk).await?;
    }
    for object in &dump.objects {
        let operation = TxnOp::put(store.keys.object(&object.key()), body(object)?, None);
        commit(store, vec![operation]).await?;
    }
    Ok(())
}

/// `entries` in order, cut into appends small enough for one etcd request.
fn step_log_chunks(entries: &[StepLogEntry]) -> Vec<&[StepLogEntry]> {
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (index, entry) in entries.iter().enumerate() {
        let size = entry.message.len()
            + entry.step.len()
            + entry.workflow_id.len()
            + entry
                .fields
                .values()
                .map(|v| v.to_string().len())
                .sum::<usize>()
            + 128;
        if index > start && (index - start >= STEP_LOG_CHUNK || bytes + size > STEP_LOG_CHUNK_BYTES)
        {
            chunks.push(&entries[start..index]);
            (start, bytes) = (index, 0);
        }
        bytes += size;
    }
    if start < entries.len() {
        chunks.push(&entries[start..]);
    }
    chunks
}

async fn commit(store: &EtcdStore, operations: Vec<TxnOp>) -> Result<(), StoreError> {
    store
        .kv()
        .txn(Txn::new().and_then(operations))
        .await
        .map_err(unavailable)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(message: String) -> StepLogEntry {
        StepLogEntry {
            time: chrono::DateTime::UNIX_EPOCH,
            object_uid: "u".into(),
            workflow_id: "start-1".into(),
            workflow: "start".into(),
            step: "s".into(),
            owner: "o".into(),
            level: corral_api::workflow::LogLevel::Info,
            message,
            fields: Default::default(),
        }
    }

    #[test]
    fn step_logs_are_cut_by_count_and_by_size_in_order() {
        let small: Vec<StepLogEntry> = (0..1200).map(|i| entry(format!("line {i}"))).collect();
        let chunks = step_log_chunks(&small);
        assert_eq!(
            chunks.iter().map(|c| c.len()).collect::<Vec<_>>(),
            [500, 500, 200]
        );
        let big: Vec<StepLogEntry> = (0..10).map(|_| entry("x".repeat(200 * 1024))).collect();
        let chunks = step_log_chunks(&big);
        assert!(chunks.len() >= 4, "{}", chunks.len());
        assert!(chunks.iter().all(|c| c.len() <= 2));
        let flat: Vec<&StepLogEntry> = chunks.iter().flat_map(|c| c.iter()).collect();
        assert_eq!(flat.len(), 10);
        assert!(step_log_chunks(&[]).is_empty());
    }
}
