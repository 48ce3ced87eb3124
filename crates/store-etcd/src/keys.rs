//! The key layout under the configured prefix `P` (default `/corral`), and
//! the mapping between etcd revisions and corral store revisions.
//!
//! | key                                   | value                                 |
//! |---------------------------------------|---------------------------------------|
//! | `P/objects/{kind}/{namespace}/{name}` | the object as JSON, `resourceVersion` 0 |
//! | `P/history-keys/{kind}/{ns}/{name}`   | uid of the newest object under that key |
//! | `P/revisions/{uid}/{revision:020}`    | a revision's record (author, time, …)  |
//! | `P/specs/{uid}/{revision:020}`        | the codec payload of its spec          |
//! | `P/tokens/{hash}`                     | a token record as JSON                 |
//! | `P/sealed/{name}`                     | a sealed value (encrypted bytes)       |
//! | `P/steplogs/{uid}/{uuid}`             | one append's step log entries (JSON)   |
//! | `P/leases/{node}`                     | a node's lease renewal (JSON)          |
//! | `P/leader`                            | the controller leader election         |
//!
//! An object's `resourceVersion` is its key's `mod_revision` minus one:
//! etcd counts revisions from 1 on an empty cluster, corral from 0. Every
//! write is one etcd transaction, so all keys it touches share one revision.
//! Namespaces and names never contain `/` (the API validates them), so
//! prefixes are exact.

use corral_api::{Kind, ObjectKey};

/// The key names of one store, all under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    /// Every key of this store: the prefix and a slash.
    pub fn root(&self) -> String {
        format!("{}/", self.prefix)
    }

    pub fn object(&self, key: &ObjectKey) -> String {
        format!(
            "{}/objects/{}/{}/{}",
            self.prefix,
            key.kind.as_str(),
            key.namespace,
            key.name
        )
    }

    /// Every object, of one kind, or of one kind in one namespace.
    pub fn objects(&self, kind: Option<Kind>, namespace: Option<&str>) -> String {
        match (kind, namespace) {
            (None, _) => format!("{}/objects/", self.prefix),
            (Some(kind), None) => format!("{}/objects/{}/", self.prefix, kind.as_str()),
            (Some(kind), Some(namespace)) => {
                format!("{}/objects/{}/{namespace}/", self.prefix, kind.as_str())
            }
        }
    }

    pub fn lease(&self, node: &str) -> String {
        format!("{}/leases/{node}", self.prefix)
    }

    pub fn history_key(&self, key: &ObjectKey) -> String {
        format!(
            "{}/history-keys/{}/{}/{}",
            self.prefix,
            key.kind.as_str(),
            key.namespace,
            key.name
        )
    }

    pub fn revision(&self, uid: &str, revision: u64) -> String {
        format!("{}/revisions/{uid}/{revision:020}", self.prefix)
    }

    /// Every revision record, or those of one uid.
    pub fn revisions(&self, uid: Option<&str>) -> String {
        match uid {
            Some(uid) => format!("{}/revisions/{uid}/", self.prefix),
            None => format!("{}/revisions/", self.prefix),
        }
    }

    pub fn spec(&self, uid: &str, revision: u64) -> String {
        format!("{}/specs/{uid}/{revision:020}", self.prefix)
    }

    pub fn specs(&self, uid: Option<&str>) -> String {
        match uid {
            Some(uid) => format!("{}/specs/{uid}/", self.prefix),
            None => format!("{}/specs/", self.prefix),
        }
    }

    /// A token's key; with an empty hash, the prefix of them all.
    pub fn token(&self, hash: &str) -> String {
        format!("{}/tokens/{hash}", self.prefix)
    }

    /// A sealed value's key; with an empty name, the prefix of them all.
    pub fn sealed(&self, name: &str) -> String {
        format!("{}/sealed/{name}", self.prefix)
    }

    pub fn step_log(&self, uid: &str, batch: &str) -> String {
        format!("{}/steplogs/{uid}/{batch}", self.prefix)
    }

    pub fn step_logs(&self, uid: Option<&str>) -> String {
        match uid {
            Some(uid) => format!("{}/steplogs/{uid}/", self.prefix),
            None => format!("{}/steplogs/", self.prefix),
        }
    }

    /// The election name the controller leader campaigns under.
    pub fn leader(&self) -> String {
        format!("{}/leader", self.prefix)
    }

    /// A key no write ever touches, read for the header revision.
    pub fn probe(&self) -> String {
        format!("{}/probe", self.prefix)
    }
}

/// The corral store revision of an etcd revision.
pub(crate) fn store_revision(etcd_revision: i64) -> u64 {
    u64::try_from(etcd_revision.saturating_sub(1)).unwrap_or(0)
}

/// The etcd revision of a corral store revision.
pub(crate) fn etcd_revision(store_revision: u64) -> i64 {
    i64::try_from(store_revision)
        .unwrap_or(i64::MAX - 1)
        .saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_map_both_ways() {
        assert_eq!(store_revision(1), 0, "an empty etcd is store revision 0");
        assert_eq!(store_revision(0), 0);
        for store in [0, 1, 41, 1 << 40] {
            assert_eq!(store_revision(etcd_revision(store)), store);
        }
    }

    #[test]
    fn prefixes_nest() {
        let keys = Keys::new("/corral/");
        let web = ObjectKey::new(Kind::Pod, Some("team-a"), "web");
        let object = keys.object(&web);
        assert_eq!(object, "/corral/objects/Pod/team-a/web");
        assert!(object.starts_with(&keys.objects(Some(Kind::Pod), Some("team-a"))));
        assert!(object.starts_with(&keys.objects(Some(Kind::Pod), None)));
        assert!(object.starts_with(&keys.objects(None, None)));
        assert!(
            keys.revision("u", 7)
                .starts_with(&keys.revisions(Some("u")))
        );
        assert!(
            keys.revision("u", 9) < keys.revision("u", 10),
            "revisions sort"
        );
        assert!(keys.spec("u", 7).starts_with(&keys.specs(Some("u"))));
    }
}
