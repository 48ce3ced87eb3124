//! Owners and their dependents: deleting an owner deletes the objects whose
//! `metadata.owner` names it (and theirs, in turn), or orphans them.
//!
//! Dependents are found through the watch cache's index by owner uid
//! ([`crate::watchcache::WatchCache::dependents`]), never by reading every
//! object. The owner is deleted first, so its controller cannot make new
//! dependents while the old ones go; a dependent created after that is
//! refused, because [`check_owner`] wants its owner to exist.
//!
//! Each dependent's deletion is its own revision in history, authored by
//! whoever deleted the owner, with the message `deleted with pd/web`. A
//! dependent is deleted as a direct delete would be: a pod through its own
//! `stop` workflow ([`crate::deletion`]), so it is gone when that finishes.

use std::collections::VecDeque;

use corral_api::{Cascade, Object, ObjectKey};
use corral_store::{ChangeMeta, StoreError};

use crate::Server;
use crate::error::ApiError;
use crate::workflows::{self, WriteError};

/// How many times orphaning one dependent retries a concurrent write.
const ORPHAN_ATTEMPTS: usize = 5;

/// Reads the `cascade` query parameter: `delete` (or absent) or `orphan`.
pub fn parse(given: Option<&str>) -> Result<Cascade, ApiError> {
    match given.filter(|given| !given.is_empty()) {
        None => Ok(Cascade::Delete),
        Some(given) => given
            .parse()
            .map_err(|error: corral_api::UnknownCascade| ApiError::BadRequest(error.to_string())),
    }
}

/// What happened to an owner's dependents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub deleted: Vec<ObjectKey>,
    pub orphaned: Vec<ObjectKey>,
}

/// The change recorded on a dependent deleted with `owner`: the owner's
/// author and class, and a message naming the owner (and the owner's
/// message, if it had one).
pub fn deleted_with(owner: &ObjectKey, change: &ChangeMeta) -> ChangeMeta {
    with_message(change, format!("deleted with {owner}"))
}

/// The change recorded on a dependent orphaned by deleting `owner`.
pub fn orphaned_by(owner: &ObjectKey, change: &ChangeMeta) -> ChangeMeta {
    let mut change = with_message(change, format!("orphaned: {owner} was deleted"));
    // Only metadata changes, and history should still show it.
    change.always_record = true;
    change
}

fn with_message(change: &ChangeMeta, message: String) -> ChangeMeta {
    let message = if change.message.is_empty() {
        message
    } else {
        format!("{message}: {}", change.message)
    };
    ChangeMeta {
        message,
        always_record: false,
        ..change.clone()
    }
}

/// Applies `cascade` to the dependents of `owner`, which was just deleted
/// with `change`. Deleting goes down the whole tree (a dependent's
/// dependents too); orphaning touches the direct dependents only.
pub async fn follow(
    server: &Server,
    owner: &Object,
    cascade: Cascade,
    change: &ChangeMeta,
) -> Result<Outcome, ApiError> {
    let mut outcome = Outcome::default();
    let mut owners = VecDeque::from([owner.clone()]);
    while let Some(owner) = owners.pop_front() {
        let owner_key = owner.key();
        for key in server.cache.dependents(&owner.metadata.uid).await? {
            let Some(stored) = server.store.get(&key).await? else {
                continue;
            };
            // The index may lag a write that changed the owner.
            let named = stored.metadata.owner.as_ref().map(|named| &named.uid);
            if named != Some(&owner.metadata.uid) {
                continue;
            }
            match cascade {
                Cascade::Delete => {
                    // Through the dependent's own stop workflow, if its
                    // kind has one; its dependents follow now either way.
                    let change = deleted_with(&owner_key, change);
                    let request = crate::deletion::Request::default();
                    match crate::deletion::delete(server, &key, &request, &change).await {
                        Ok(deleted) => {
                            outcome.deleted.push(key);
                            owners.push_back(deleted.object().clone());
                        }
                        Err(ApiError::NotFound(_)) => {}
                        Err(error) => return Err(unfinished(&owner_key, &key, error)),
                    }
                }
                Cascade::Orphan => {
                    orphan(server, stored, &owner_key, change)
                        .await
                        .map_err(|error| unfinished(&owner_key, &key, error))?;
                    outcome.orphaned.push(key);
                }
            }
        }
    }
    Ok(outcome)
}

/// Clears `dependent`'s owner, retrying when someone wrote in between.
async fn orphan(
    server: &Server,
    mut dependent: Object,
    owner: &ObjectKey,
    change: &ChangeMeta,
) -> Result<(), ApiError> {
    let change = orphaned_by(owner, change);
    for _ in 0..ORPHAN_ATTEMPTS {
        let mut next = dependent.clone();
        next.metadata.owner = None;
        let expected = dependent.metadata.resource_version;
        match workflows::update(server, &dependent, next, expected, &change).await {
            Ok(_) => return Ok(()),
            Err(WriteError::Store(StoreError::Conflict { .. })) => {
                match server.store.get(&dependent.key()).await? {
                    Some(fresh) if fresh.metadata.owner.is_some() => dependent = fresh,
                    _ => return Ok(()),
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
    Err(ApiError::Conflict(format!(
        "{} kept changing while its owner was cleared",
        dependent.key()
    )))
}

/// The owner is gone but a dependent is not done: say which, so the
/// caller can finish by hand.
fn unfinished(owner: &ObjectKey, dependent: &ObjectKey, error: ApiError) -> ApiError {
    ApiError::Internal(format!(
        "{owner} was deleted, but its dependent {dependent} was not dealt with: {error}"
    ))
}

/// An object naming an owner must name one that exists, with that uid: a
/// controller acting on a deleted owner would otherwise leave dependents
/// nobody deletes.
pub async fn check_owner(server: &Server, object: &Object) -> Result<(), ApiError> {
    let Some(owner) = &object.metadata.owner else {
        return Ok(());
    };
    let key = owner.key(object.metadata.namespace.as_deref());
    match server.store.get(&key).await? {
        Some(stored) if owner.names(&stored) => Ok(()),
        Some(stored) => Err(ApiError::Conflict(format!(
            "metadata.owner names {key} with uid {}, but {key} now has uid {}: the owner was deleted and created again",
            owner.uid, stored.metadata.uid
        ))),
        None => Err(ApiError::Conflict(format!(
            "metadata.owner names {key}, which does not exist"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::{AuthorClass, Kind};

    fn change(message: &str) -> ChangeMeta {
        ChangeMeta {
            author: "alice".into(),
            class: AuthorClass::External,
            message: message.into(),
            time: chrono::DateTime::UNIX_EPOCH,
            always_record: false,
        }
    }

    #[test]
    fn cascade_policies_parse_and_refuse_others() {
        assert_eq!(parse(None).ok(), Some(Cascade::Delete));
        assert_eq!(parse(Some("")).ok(), Some(Cascade::Delete));
        assert_eq!(parse(Some("Orphan")).ok(), Some(Cascade::Orphan));
        let error = parse(Some("foreground")).expect_err("not a policy");
        assert_eq!(
            error.to_string(),
            "cascade: \"foreground\" is not a cascade policy; expected delete or orphan"
        );
    }

    #[test]
    fn dependents_changes_name_their_owner_and_keep_the_author() {
        let owner = ObjectKey::new(Kind::PinnedDeployment, None, "web");
        let deleted = deleted_with(&owner, &change(""));
        assert_eq!(deleted.message, "deleted with pd/web");
        assert_eq!(deleted.author, "alice");
        assert!(!deleted.always_record);
        let deleted = deleted_with(&owner, &change("replaced by api"));
        assert_eq!(deleted.message, "deleted with pd/web: replaced by api");
        let orphaned = orphaned_by(&owner, &change(""));
        assert_eq!(orphaned.message, "orphaned: pd/web was deleted");
        assert!(
            orphaned.always_record,
            "an orphaning is recorded in history"
        );
    }
}
