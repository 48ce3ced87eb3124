//! Loading a [`Dump`] (another backend's whole store) into an empty etcd
//! prefix: `corral migrate`. Revisions are written one transaction each,
//! in the order the source wrote them, through the same encoder as live
//! writes (so a record's `seq` keeps the source's order and specs are
//! delta-compressed as usual); then the history keys, the live objects,
//! the tokens and the step logs. Objects come last: until they are
//! written nothing is visible to a server, and an import that fails half
//! way is retried into a fresh prefix.

use std::collections::BTreeMap;

use corral_api::ObjectKey;
use corral_store::dump::Dump;
use corral_store::{ChangeMeta, StoreError};
use etcd_client::{GetOptions, Txn, TxnOp};

use crate::history::{self, NewRevision};
use crate::objects::body;
use crate::{EtcdStore, records, unavailable};

/// Step log entries written per append.
const STEP_LOG_CHUNK: usize = 500;

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
        let operations = history::append_ops(
            store,
            &NewRevision {
                uid: &record.uid,
                revision: record.revision,
                key: &key,
                change: &change,
                deleted: record.deleted,
            },
            spec,
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
    for object in &dump.objects {
        let operation = TxnOp::put(store.keys.object(&object.key()), body(object)?, None);
        commit(store, vec![operation]).await?;
    }
    for token in &dump.tokens {
        records::put_token(store, token.clone()).await?;
    }
    for chunk in dump.step_logs.chunks(STEP_LOG_CHUNK) {
        records::append_step_logs(store, chunk).await?;
    }
    Ok(())
}

async fn commit(store: &EtcdStore, operations: Vec<TxnOp>) -> Result<(), StoreError> {
    store
        .kv()
        .txn(Txn::new().and_then(operations))
        .await
        .map_err(unavailable)?;
    Ok(())
}
