//! The driver: brings running workflow instances up to the clock —
//! timeouts, retries that are due, and the states that follow — and puts
//! a pod whose update failed back on its previous revision when it asked
//! for that.
//!
//! It lists nothing on a timer. It follows pods, VirtualMachines and nodes
//! through the watch cache, keeps an index of each object's nearest
//! deadline (a running step's timeout, a failed step's retry), and sleeps
//! until the nearest one; it removes an object being deleted when its stop
//! workflow succeeded; an object is read and ticked only when its
//! deadline is due. Owners' transitions already derive the states that
//! follow them in the same write, so the driver has nothing to do between
//! deadlines.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use corral_api::watch::EventType;
use corral_api::workflow::{StoredWorkflows, WorkflowOutcome};
use corral_api::{AuthorClass, Kind, Object, ObjectKey};
use corral_store::{ChangeMeta, StoreError};
use futures::StreamExt;
use futures::stream::SelectAll;
use tokio_util::sync::CancellationToken;

use super::{hydrate, put_stored, stored_status};
use crate::watchcache::{CachedObject, ListRequest, Scope};
use crate::{Server, SharedServer};

/// The kinds whose objects carry workflow instances.
const KINDS: [Kind; 3] = [Kind::Pod, Kind::VirtualMachine, Kind::Node];

/// How long the driver waits before following the cache again after it
/// failed to.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Each object's nearest deadline, and the objects by deadline.
#[derive(Debug, Default)]
struct Deadlines {
    by_key: HashMap<ObjectKey, DateTime<Utc>>,
    by_time: BTreeSet<(DateTime<Utc>, ObjectKey)>,
}

impl Deadlines {
    fn set(&mut self, key: ObjectKey, deadline: Option<DateTime<Utc>>) {
        if let Some(old) = self.by_key.remove(&key) {
            self.by_time.remove(&(old, key.clone()));
        }
        if let Some(deadline) = deadline {
            self.by_time.insert((deadline, key.clone()));
            self.by_key.insert(key, deadline);
        }
    }

    fn nearest(&self) -> Option<DateTime<Utc>> {
        self.by_time.first().map(|(at, _)| *at)
    }

    /// Removes and returns every key due at `now`.
    fn due(&mut self, now: DateTime<Utc>) -> Vec<ObjectKey> {
        let mut due = Vec::new();
        while let Some((at, _)) = self.by_time.first() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.by_time.pop_first() {
                self.by_key.remove(&key);
                due.push(key);
            }
        }
        due
    }
}

/// Follows the cache and ticks objects at their deadlines until
/// `shutdown` is cancelled.
pub async fn drive(server: SharedServer, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        tokio::select! {
            ended = follow(&server) => {
                if let Err(error) = ended {
                    tracing::warn!(%error, "workflow driver lost its feed; following again");
                }
            }
            () = shutdown.cancelled() => break,
        }
        tokio::select! {
            () = tokio::time::sleep(RETRY) => {}
            () = shutdown.cancelled() => break,
        }
    }
    tracing::debug!("workflow driver stopped");
}

/// One run of the driver: lists the kinds once, then follows their
/// changes until the cache's feed ends.
async fn follow(server: &Server) -> Result<(), crate::error::ApiError> {
    let mut deadlines = Deadlines::default();
    let mut feeds = SelectAll::new();
    let mut after = None;
    for kind in KINDS {
        let request = ListRequest {
            kind,
            scope: Scope::default(),
            limit: None,
            continue_token: None,
        };
        let page = server.cache.list(&request).await?;
        let start = *after.get_or_insert(page.resource_version);
        for object in &page.items {
            note(server, &mut deadlines, kind, object).await;
        }
        let Some(changes) = server.cache.watch(kind, Scope::default(), start).await? else {
            return Err(crate::error::ApiError::Gone(
                "the watch cache moved on".into(),
            ));
        };
        feeds.push(changes.map(move |change| (kind, change)).boxed());
    }
    loop {
        let sleep = deadlines.nearest().map(|at| {
            let wait = (at - server.clock.now()).to_std().unwrap_or_default();
            tokio::time::sleep(wait)
        });
        tokio::select! {
            change = feeds.next() => match change {
                Some((kind, Ok((event_type, object)))) => {
                    if event_type == EventType::Deleted {
                        deadlines.set(key_of(kind, &object), None);
                    } else {
                        note(server, &mut deadlines, kind, &object).await;
                    }
                }
                Some((_, Err(gone))) => {
                    return Err(crate::error::ApiError::Gone(gone.0));
                }
                None => return Ok(()),
            },
            () = async { if let Some(sleep) = sleep { sleep.await } else { std::future::pending().await } } => {
                let now = server.clock.now();
                for key in deadlines.due(now) {
                    match tick_key(server, &key, now).await {
                        Ok(()) => {}
                        Err(error) => tracing::warn!(object = %key, %error, "workflow tick failed"),
                    }
                    // The write (or a concurrent one) comes back through the
                    // feed and sets the next deadline; a failed tick tries
                    // again shortly.
                    if let Ok(Some(object)) = server.store.get(&key).await {
                        let soonest = now + chrono::TimeDelta::milliseconds(100);
                        deadlines.set(key, object_deadline(&object).map(|at| at.max(soonest)));
                    }
                }
            }
        }
    }
}

fn key_of(kind: Kind, object: &CachedObject) -> ObjectKey {
    ObjectKey::new(kind, Some(&object.namespace), &object.name)
}

/// Files the object's nearest deadline; a pod whose update failed and that
/// asked for automatic rollback is rolled back.
async fn note(server: &Server, deadlines: &mut Deadlines, kind: Kind, cached: &CachedObject) {
    // Among the newest changes the cache keeps it decoded: no parse.
    let object = match server.cache.shared(cached) {
        Ok(object) => object,
        Err(error) => {
            tracing::warn!(object = %key_of(kind, cached), %error, "unreadable cached object");
            return;
        }
    };
    if kind == Kind::Pod {
        match super::rollback::maybe_roll_back(server, &object).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(error) => tracing::warn!(object = %object.key(), %error, "rollback check failed"),
        }
    }
    if kind == Kind::Node && node_is_gone(&object) {
        match crate::deletion::release_lost_node(server, &object).await {
            Ok(_) if object.metadata.deleting.is_some() => return,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(node = %object.metadata.name, %error, "cannot remove what was being deleted on a lost node");
            }
        }
    }
    let key = object.key();
    let deadline = object_deadline(&object);
    if object.metadata.deleting.is_some() {
        match crate::deletion::finish(server, object.into_object()).await {
            Ok(crate::deletion::Outcome::Removed(_)) => return,
            Ok(crate::deletion::Outcome::Stopping(_)) => {}
            Err(error) => tracing::warn!(object = %key, %error, "cannot remove a stopped object"),
        }
    }
    deadlines.set(key, deadline);
}

/// Whether a Node is Lost or forgotten: its agent answers no steps.
fn node_is_gone(node: &Object) -> bool {
    let lost = node
        .typed_status::<corral_api::kinds::NodeStatus>()
        .is_ok_and(|status| status.phase == corral_api::kinds::NodePhase::Lost);
    lost || node
        .typed_spec::<corral_api::kinds::NodeSpec>()
        .is_ok_and(|spec| spec.forgotten)
}

/// The nearest deadline of the object's running instances.
fn object_deadline(object: &Object) -> Option<DateTime<Utc>> {
    // Only running instances have deadlines: those that finished are not
    // decoded.
    let running = StoredWorkflows::running_of(&object.status).ok()?;
    running
        .iter()
        .filter_map(|(_, instance)| corral_workflow::stored_deadline(instance))
        .min()
}

/// Reads the object at `key` and brings its running instances up to `now`.
async fn tick_key(server: &Server, key: &ObjectKey, now: DateTime<Utc>) -> Result<(), StoreError> {
    let Some(object) = server.store.get(key).await? else {
        return Ok(());
    };
    tick_object(server, object, now).await.map(|_| ())
}

/// One round over every object (tests drive the engine with it): ticks
/// every running instance at the server clock's `now`. Returns how many
/// objects were written. It lists everything, so nothing but tests call it.
pub async fn tick_all(server: &Server) -> Result<usize, StoreError> {
    let now = server.clock.now();
    let mut written = 0;
    for kind in KINDS {
        let listed = server.store.list(kind, None).await?;
        for object in listed.objects {
            if kind == Kind::Pod && super::rollback::maybe_roll_back(server, &object).await? {
                written += 1;
                continue;
            }
            if object.metadata.deleting.is_some()
                && matches!(
                    crate::deletion::finish(server, object.clone()).await?,
                    crate::deletion::Outcome::Removed(_)
                )
            {
                written += 1;
                continue;
            }
            if tick_object(server, object, now).await? {
                written += 1;
            }
        }
    }
    Ok(written)
}

async fn tick_object(
    server: &Server,
    mut object: Object,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let mut status = match stored_status(&object) {
        Ok(status) => status,
        Err(error) => {
            tracing::warn!(object = %object.key(), %error, "unreadable status.workflow not ticked");
            return Ok(false);
        }
    };
    let mut logs = Vec::new();
    let mut changed = false;
    let uid = object.metadata.uid.clone();
    for stored in &mut status.instances {
        if stored.outcome != WorkflowOutcome::Running {
            continue;
        }
        let mut instance = match hydrate(server, stored, &uid).await {
            Ok(instance) => instance,
            Err(error) => {
                tracing::warn!(object = %object.key(), instance = %stored.id, %error,
                    "instance without its definition not ticked");
                continue;
            }
        };
        let before = instance.clone();
        logs.extend(corral_workflow::tick(&mut instance, now));
        if instance != before {
            *stored = corral_workflow::dehydrate(&instance, &stored.definition);
            changed = true;
        }
    }
    if !changed {
        return Ok(false);
    }
    let key = object.key();
    put_stored(&mut object, &status);
    let expected = object.metadata.resource_version;
    let change = ChangeMeta {
        author: corral_workflow::ENGINE_OWNER.to_string(),
        class: AuthorClass::System,
        message: String::new(),
        time: now,
        always_record: false,
    };
    match server
        .store
        .update_logged(object, expected, &change, &logs)
        .await
    {
        Ok(_) => Ok(true),
        Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {
            tracing::debug!(object = %key, "changed meanwhile; ticked again at its next deadline");
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + seconds, 0)
            .single()
            .expect("a valid time")
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Kind::Pod, Some("default"), name)
    }

    #[test]
    fn deadlines_come_due_in_order_and_can_move() {
        let mut deadlines = Deadlines::default();
        deadlines.set(key("a"), Some(at(30)));
        deadlines.set(key("b"), Some(at(10)));
        deadlines.set(key("c"), Some(at(20)));
        deadlines.set(key("c"), Some(at(40)));
        deadlines.set(key("b"), None);
        assert_eq!(deadlines.nearest(), Some(at(30)));
        assert!(deadlines.due(at(29)).is_empty());
        assert_eq!(deadlines.due(at(35)), [key("a")]);
        assert_eq!(deadlines.due(at(100)), [key("c")]);
        assert_eq!(deadlines.nearest(), None);
    }
}
