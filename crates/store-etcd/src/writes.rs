//! Object writes. Every write is one etcd transaction that compares the
//! object key's `mod_revision` (or absence), puts the object and, when the
//! spec changed, the new history revision; the transaction's revision is
//! the write's `resourceVersion`.
//!
//! When this store wrote the object last ([`crate::last_written`]) and the
//! caller's expected version matches, the write is that one transaction:
//! the stored object and the previous spec come from memory, and the
//! transaction also compares the key's whole value, so etcd refuses it if
//! memory is wrong. Otherwise — or when that transaction is refused — the
//! write reads the object (and, for a new revision, the delta chain) first.

use corral_api::{Object, ObjectKey};
use corral_store::{ChangeMeta, StoreError};
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnResponse};

use crate::history::{self, NewRevision};
use crate::keys::{etcd_revision, store_revision};
use crate::last_written::Written;
use crate::leader::Fence;
use crate::objects::{body, get};
use crate::{EtcdStore, unavailable};

pub(crate) async fn create(
    store: &EtcdStore,
    mut object: Object,
    change: &ChangeMeta,
) -> Result<Object, StoreError> {
    let key = object.key();
    let fence = store.fence_for(change)?;
    normalize_namespace(&mut object, &key);
    object.metadata.revision = 1;
    let object_key = store.keys.object(&key);
    let stored = body(&object)?;
    let (history, spec_bytes) = history::append_ops(
        store,
        &NewRevision {
            uid: &object.metadata.uid,
            revision: 1,
            key: &key,
            change,
            deleted: false,
        },
        &object.spec,
        None,
    )
    .await?;
    let mut operations = vec![
        TxnOp::put(object_key.clone(), stored.clone(), None),
        TxnOp::put(
            store.keys.history_key(&key),
            object.metadata.uid.clone(),
            None,
        ),
    ];
    operations.extend(history);
    let mut compares = vec![Compare::version(object_key.clone(), CompareOp::Equal, 0)];
    compares.extend(fence.iter().map(Fence::compare));
    let response = commit(store, compares, operations).await?;
    if !response.succeeded() {
        return Err(refusal(store, fence.as_ref(), StoreError::AlreadyExists { key }).await);
    }
    object.metadata.resource_version = written_revision(&response)?;
    finish(store, object_key, stored, &object, Some(spec_bytes), change).await;
    Ok(object)
}

pub(crate) async fn update(
    store: &EtcdStore,
    object: Object,
    expected: u64,
    change: &ChangeMeta,
) -> Result<Object, StoreError> {
    let key = object.key();
    let fence = store.fence_for(change)?;
    let object_key = store.keys.object(&key);
    if let Some(written) = store.last_written(&object_key, Some(etcd_revision(expected))) {
        let update = update_ops(
            store,
            &written.object,
            written.spec_bytes.as_deref(),
            object.clone(),
            change,
        )
        .await?;
        let compares = remembered(&object_key, &written, fence.as_ref());
        let response = commit(store, compares, update.operations).await?;
        if response.succeeded() {
            let mut object = update.object;
            object.metadata.resource_version = written_revision(&response)?;
            finish(
                store,
                object_key,
                update.body,
                &object,
                update.spec_bytes,
                change,
            )
            .await;
            return Ok(object);
        }
        store.forget_written(&object_key);
    }
    let (stored, mod_revision) = get(store, &key)
        .await?
        .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    check_version(&key, expected, stored.metadata.resource_version)?;
    let update = update_ops(store, &stored, None, object, change).await?;
    let target = Target {
        key: &key,
        object_key: &object_key,
        mod_revision,
        expected,
    };
    let response = commit_compared(store, fence.as_ref(), &target, update.operations).await?;
    let mut object = update.object;
    object.metadata.resource_version = written_revision(&response)?;
    finish(
        store,
        object_key,
        update.body,
        &object,
        update.spec_bytes,
        change,
    )
    .await;
    Ok(object)
}

/// An update ready to commit.
struct Update {
    /// The new object, `resourceVersion` not set yet.
    object: Object,
    body: Vec<u8>,
    operations: Vec<TxnOp>,
    /// The spec bytes of the new object's current revision, when known.
    spec_bytes: Option<Vec<u8>>,
}

/// The operations that replace `stored` by `object`: `uid`, `createdAt`
/// and `revision` come from `stored`; a changed spec (or `always_record`)
/// appends a revision, encoded against `stored_spec` when given.
async fn update_ops(
    store: &EtcdStore,
    stored: &Object,
    stored_spec: Option<&[u8]>,
    mut object: Object,
    change: &ChangeMeta,
) -> Result<Update, StoreError> {
    let key = object.key();
    normalize_namespace(&mut object, &key);
    object.metadata.uid = stored.metadata.uid.clone();
    object.metadata.created_at = stored.metadata.created_at;
    object.metadata.revision = stored.metadata.revision;
    let mut operations = Vec::new();
    let spec_bytes = if object.spec != stored.spec || change.always_record {
        object.metadata.revision += 1;
        let (history, bytes) = history::append_ops(
            store,
            &NewRevision {
                uid: &object.metadata.uid,
                revision: object.metadata.revision,
                key: &key,
                change,
                deleted: false,
            },
            &object.spec,
            stored_spec,
        )
        .await?;
        operations = history;
        Some(bytes)
    } else {
        // Same spec, same revision: its bytes are what they were.
        stored_spec.map(<[u8]>::to_vec)
    };
    let body = body(&object)?;
    operations.push(TxnOp::put(store.keys.object(&key), body.clone(), None));
    Ok(Update {
        object,
        body,
        operations,
        spec_bytes,
    })
}

pub(crate) async fn delete(
    store: &EtcdStore,
    key: &ObjectKey,
    expected: Option<u64>,
    change: &ChangeMeta,
) -> Result<Object, StoreError> {
    let fence = store.fence_for(change)?;
    let object_key = store.keys.object(key);
    if let Some(written) = store.last_written(&object_key, expected.map(etcd_revision)) {
        let operations = delete_ops(
            store,
            &written.object,
            written.spec_bytes.as_deref(),
            change,
        )
        .await?;
        let compares = remembered(&object_key, &written, fence.as_ref());
        let response = commit(store, compares, operations).await?;
        store.forget_written(&object_key);
        if response.succeeded() {
            let mut object = written.object;
            object.metadata.resource_version = written_revision(&response)?;
            store
                .after_write(change.time, object.metadata.resource_version)
                .await;
            return Ok(object);
        }
    }
    let (mut object, mod_revision) = get(store, key)
        .await?
        .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    let current = object.metadata.resource_version;
    if let Some(expected) = expected {
        check_version(key, expected, current)?;
    }
    let operations = delete_ops(store, &object, None, change).await?;
    let target = Target {
        key,
        object_key: &object_key,
        mod_revision,
        expected: expected.unwrap_or(current),
    };
    let response = commit_compared(store, fence.as_ref(), &target, operations).await?;
    store.forget_written(&object_key);
    object.metadata.resource_version = written_revision(&response)?;
    store
        .after_write(change.time, object.metadata.resource_version)
        .await;
    Ok(object)
}

/// The operations that delete `stored`: a deletion record repeating the
/// last spec under the next revision (encoded against `stored_spec` when
/// given), and the key's removal.
async fn delete_ops(
    store: &EtcdStore,
    stored: &Object,
    stored_spec: Option<&[u8]>,
    change: &ChangeMeta,
) -> Result<Vec<TxnOp>, StoreError> {
    let key = stored.key();
    let (mut operations, _) = history::append_ops(
        store,
        &NewRevision {
            uid: &stored.metadata.uid,
            revision: stored.metadata.revision + 1,
            key: &key,
            change,
            deleted: true,
        },
        &stored.spec,
        stored_spec,
    )
    .await?;
    operations.push(TxnOp::delete(store.keys.object(&key), None));
    Ok(operations)
}

/// After a successful write: remember it for the next one and apply the
/// event window.
async fn finish(
    store: &EtcdStore,
    object_key: String,
    body: Vec<u8>,
    object: &Object,
    spec_bytes: Option<Vec<u8>>,
    change: &ChangeMeta,
) {
    let resource_version = object.metadata.resource_version;
    store.remember_written(
        object_key,
        Written {
            mod_revision: etcd_revision(resource_version),
            body,
            object: object.clone(),
            spec_bytes,
        },
    );
    store.after_write(change.time, resource_version).await;
}

/// The compares of a write built on what this store remembers: the key is
/// still at that `mod_revision` and holds exactly that value (and the
/// fence holds).
fn remembered(object_key: &str, written: &Written, fence: Option<&Fence>) -> Vec<Compare> {
    let mut compares = vec![
        Compare::mod_revision(object_key, CompareOp::Equal, written.mod_revision),
        Compare::value(object_key, CompareOp::Equal, written.body.clone()),
    ];
    compares.extend(fence.map(Fence::compare));
    compares
}

/// The object a write replaces: its key, etcd key, the `mod_revision` it
/// was read at and the `resourceVersion` the caller expected.
struct Target<'a> {
    key: &'a ObjectKey,
    object_key: &'a str,
    mod_revision: i64,
    expected: u64,
}

/// Commits `operations` if the object key is still at its `mod_revision`
/// (and the fence holds); otherwise reports what changed.
async fn commit_compared(
    store: &EtcdStore,
    fence: Option<&Fence>,
    target: &Target<'_>,
    operations: Vec<TxnOp>,
) -> Result<TxnResponse, StoreError> {
    let mut compares = vec![Compare::mod_revision(
        target.object_key,
        CompareOp::Equal,
        target.mod_revision,
    )];
    compares.extend(fence.map(Fence::compare));
    let response = commit(store, compares, operations).await?;
    if response.succeeded() {
        return Ok(response);
    }
    let key = target.key;
    let lost = match get(store, key).await? {
        None => StoreError::NotFound { key: key.clone() },
        Some((stored, _)) => StoreError::Conflict {
            key: key.clone(),
            expected: target.expected,
            actual: stored.metadata.resource_version,
        },
    };
    Err(refusal(store, fence, lost).await)
}

/// Why a transaction failed: the fence's refusal if the fence no longer
/// holds, else `other`.
async fn refusal(store: &EtcdStore, fence: Option<&Fence>, other: StoreError) -> StoreError {
    match fence {
        Some(fence) => match fence.check(&store.client).await {
            Err(refused) => refused,
            Ok(()) => other,
        },
        None => other,
    }
}

async fn commit(
    store: &EtcdStore,
    compares: Vec<Compare>,
    operations: Vec<TxnOp>,
) -> Result<TxnResponse, StoreError> {
    store
        .kv()
        .txn(Txn::new().when(compares).and_then(operations))
        .await
        .map_err(unavailable)
}

/// The store revision a successful write transaction made.
fn written_revision(response: &TxnResponse) -> Result<u64, StoreError> {
    response
        .header()
        .map(|header| store_revision(header.revision()))
        .ok_or_else(|| StoreError::Corrupt("etcd answered a write without a header".into()))
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
