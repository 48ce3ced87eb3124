//! Object reads and writes. Every write is one etcd transaction that
//! compares the object key's `mod_revision` (or absence), puts the object
//! and, when the spec changed, the new history revision; the transaction's
//! revision is the write's `resourceVersion`.

use corral_api::{Kind, Object, ObjectKey};
use corral_store::{ChangeMeta, ListContinue, ListPage, ListResult, StoreError};
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnResponse};

use crate::history::{self, NewRevision};
use crate::keys::store_revision;
use crate::leader::Fence;
use crate::{EtcdStore, corrupt_json, unavailable};

/// The stored object and its key's etcd `mod_revision`.
pub(crate) async fn get(
    store: &EtcdStore,
    key: &ObjectKey,
) -> Result<Option<(Object, i64)>, StoreError> {
    let mut response = store
        .kv()
        .get(store.keys.object(key), None)
        .await
        .map_err(unavailable)?;
    response
        .take_kvs()
        .first()
        .map(|kv| Ok((object_from_kv(kv)?, kv.mod_revision())))
        .transpose()
}

pub(crate) async fn list(
    store: &EtcdStore,
    kind: Kind,
    namespace: Option<&str>,
) -> Result<ListResult, StoreError> {
    let mut response = store
        .kv()
        .get(
            store.keys.objects(Some(kind), namespace),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .map_err(unavailable)?;
    let revision = response
        .header()
        .map(|header| header.revision())
        .unwrap_or_default();
    let mut objects = response
        .take_kvs()
        .iter()
        .map(object_from_kv)
        .collect::<Result<Vec<_>, _>>()?;
    // Key order puts `a-b/` before `a/`; the contract is namespace, then name.
    objects.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    Ok(ListResult {
        objects,
        resource_version: store_revision(revision),
    })
}

/// One page in key order: a range from the key after `after` (or the
/// prefix) to the prefix's end, one more key than asked to tell whether
/// another page follows.
pub(crate) async fn list_page(
    store: &EtcdStore,
    kind: Kind,
    namespace: Option<&str>,
    limit: usize,
    after: Option<&ListContinue>,
) -> Result<ListPage, StoreError> {
    let limit = limit.max(1);
    let prefix = store.keys.objects(Some(kind), namespace);
    let end = prefix_end(prefix.as_bytes());
    let mut start = prefix.clone().into_bytes();
    if let Some(after) = after {
        // The smallest key greater than the token's object key.
        let mut key = store
            .keys
            .object(&ObjectKey {
                kind,
                namespace: after.namespace.clone(),
                name: after.name.clone(),
            })
            .into_bytes();
        key.push(0);
        start = start.max(key);
    }
    let mut objects = Vec::new();
    let (revision, more) = if start >= end {
        (None, false)
    } else {
        let options = GetOptions::new()
            .with_range(end)
            .with_limit(i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX));
        let mut response = store
            .kv()
            .get(start, Some(options))
            .await
            .map_err(unavailable)?;
        let revision = response.header().map(|header| header.revision());
        let kvs = response.take_kvs();
        let more = kvs.len() > limit || response.more();
        for kv in kvs.iter().take(limit) {
            objects.push(object_from_kv(kv)?);
        }
        (revision, more)
    };
    let revision = match revision {
        Some(revision) => revision,
        None => store.header_revision().await?,
    };
    let next = if more {
        objects.last().map(ListContinue::after)
    } else {
        None
    };
    Ok(ListPage {
        objects,
        resource_version: store_revision(revision),
        next,
    })
}

/// The first key after every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    // Only a prefix of 0xff bytes gets here: range to the end of the keys.
    vec![0]
}

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
    let mut operations = vec![
        TxnOp::put(object_key.clone(), body(&object)?, None),
        TxnOp::put(
            store.keys.history_key(&key),
            object.metadata.uid.clone(),
            None,
        ),
    ];
    operations.extend(
        history::append_ops(
            store,
            &NewRevision {
                uid: &object.metadata.uid,
                revision: 1,
                key: &key,
                change,
                deleted: false,
            },
            &object.spec,
        )
        .await?,
    );
    let mut compares = vec![Compare::version(object_key, CompareOp::Equal, 0)];
    compares.extend(fence.iter().map(Fence::compare));
    let response = commit(store, compares, operations).await?;
    if !response.succeeded() {
        return Err(refusal(store, fence.as_ref(), StoreError::AlreadyExists { key }).await);
    }
    object.metadata.resource_version = written_revision(&response)?;
    store
        .after_write(change.time, object.metadata.resource_version)
        .await;
    Ok(object)
}

pub(crate) async fn update(
    store: &EtcdStore,
    mut object: Object,
    expected: u64,
    change: &ChangeMeta,
) -> Result<Object, StoreError> {
    let key = object.key();
    let fence = store.fence_for(change)?;
    let (stored, mod_revision) = get(store, &key)
        .await?
        .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    check_version(&key, expected, stored.metadata.resource_version)?;
    normalize_namespace(&mut object, &key);
    object.metadata.uid = stored.metadata.uid;
    object.metadata.created_at = stored.metadata.created_at;
    object.metadata.revision = stored.metadata.revision;
    let object_key = store.keys.object(&key);
    let mut operations = Vec::new();
    if object.spec != stored.spec || change.always_record {
        object.metadata.revision += 1;
        operations = history::append_ops(
            store,
            &NewRevision {
                uid: &object.metadata.uid,
                revision: object.metadata.revision,
                key: &key,
                change,
                deleted: false,
            },
            &object.spec,
        )
        .await?;
    }
    operations.push(TxnOp::put(object_key.clone(), body(&object)?, None));
    let target = Target {
        key: &key,
        object_key: &object_key,
        mod_revision,
        expected,
    };
    let response = commit_compared(store, fence.as_ref(), &target, operations).await?;
    object.metadata.resource_version = written_revision(&response)?;
    store
        .after_write(change.time, object.metadata.resource_version)
        .await;
    Ok(object)
}

pub(crate) async fn delete(
    store: &EtcdStore,
    key: &ObjectKey,
    expected: Option<u64>,
    change: &ChangeMeta,
) -> Result<Object, StoreError> {
    let fence = store.fence_for(change)?;
    let (mut object, mod_revision) = get(store, key)
        .await?
        .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    let current = object.metadata.resource_version;
    if let Some(expected) = expected {
        check_version(key, expected, current)?;
    }
    let object_key = store.keys.object(key);
    // The deletion record repeats the last spec under the next revision.
    let mut operations = history::append_ops(
        store,
        &NewRevision {
            uid: &object.metadata.uid,
            revision: object.metadata.revision + 1,
            key,
            change,
            deleted: true,
        },
        &object.spec,
    )
    .await?;
    operations.push(TxnOp::delete(object_key.clone(), None));
    let target = Target {
        key,
        object_key: &object_key,
        mod_revision,
        expected: expected.unwrap_or(current),
    };
    let response = commit_compared(store, fence.as_ref(), &target, operations).await?;
    object.metadata.resource_version = written_revision(&response)?;
    store
        .after_write(change.time, object.metadata.resource_version)
        .await;
    Ok(object)
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

/// The stored bytes: the object with `resourceVersion` 0, which readers
/// replace with the key's `mod_revision`.
pub(crate) fn body(object: &Object) -> Result<Vec<u8>, StoreError> {
    let mut stored = object.clone();
    stored.metadata.resource_version = 0;
    serde_json::to_vec(&stored).map_err(corrupt_json("object"))
}

/// The object in a key-value, its `resourceVersion` from `mod_revision`.
pub(crate) fn object_from_kv(kv: &KeyValue) -> Result<Object, StoreError> {
    object_at(kv.value(), kv.mod_revision())
}

/// Parses stored object bytes and sets the `resourceVersion` of the etcd
/// revision that wrote (or deleted) it.
pub(crate) fn object_at(value: &[u8], etcd_revision_of_write: i64) -> Result<Object, StoreError> {
    let mut object: Object =
        serde_json::from_slice(value).map_err(corrupt_json("stored object"))?;
    object.metadata.resource_version = store_revision(etcd_revision_of_write);
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::etcd_revision;
    use serde_json::json;

    #[test]
    fn a_prefix_ends_at_its_last_byte_plus_one() {
        assert_eq!(prefix_end(b"/corral/objects/Pod/"), b"/corral/objects/Pod0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn stored_bodies_take_their_version_from_etcd() {
        let mut object = Object::new(Kind::Pod, Some("default"), "web", json!({"a": 1}));
        object.metadata.resource_version = 41;
        let bytes = body(&object).unwrap();
        let read = object_at(&bytes, etcd_revision(41)).unwrap();
        assert_eq!(read, object);
    }
}
