//! Object reads, and the stored form of an object (see [`crate::writes`]
//! for writes).

use corral_api::{Kind, Object, ObjectKey};
use corral_store::{ListContinue, ListPage, ListResult, StoreError};
use etcd_client::{GetOptions, KeyValue};

use crate::keys::store_revision;
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
