//! A backend conformance suite: every [`Store`] implementation (SQLite now,
//! etcd later) runs these same checks, which use nothing but the trait (and
//! [`EventRetention`] to make old watch events expire).
//!
//! The checks panic with a message naming the broken rule, so they are meant
//! for tests: `run_all(|| async { MyStore::fresh() }).await`. Each check gets
//! a fresh, empty store from the factory.
//!
//! The contract beyond the trait's own docs, as checked here:
//! - `history` and `revision` of a key that never existed are `NotFound`.
//! - every write (including a status-only or metadata-only one) takes the
//!   next store revision and emits one watch event; only a spec change adds
//!   a history record.
//! - the `Deleted` event and the object `delete` returns carry the
//!   deletion's store revision and keep the last spec revision.
//! - step log entries are kept per object uid and read back ordered by
//!   time, ties in the order they were appended.
//! - sealed values are opaque bytes by name, outside the object space.
//! - `compact_history` keeps a live object's current revision whatever the
//!   policy; a deleted object's records may all go.
//! - `list_page` walks cover every object present throughout exactly once,
//!   names ascending within a namespace; a continue position survives the
//!   deletion of its own object.
//! - the event window drops events more than `count` revisions behind the
//!   newest write, or older than `max_age` before its time.

mod history;
mod objects;
mod pages;
mod sealed;
mod steplogs;
mod watch;
mod window;

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use corral_api::{AuthorClass, Kind, Object, ObjectKey};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::{ChangeMeta, EventWindow, Store, StoreError, WatchEvent, WatchStream};

pub use history::{
    check_compaction_for, check_compaction_keep, check_compaction_last, check_history_queries,
    check_leases, check_tokens,
};
pub use objects::{
    check_create_get_list, check_delete_and_recreate, check_spec_revisions, check_update_cas,
};
pub use pages::{check_list_continue_after_changes, check_list_pages};
pub use sealed::check_sealed;
pub use steplogs::{check_step_log_trim, check_step_logs};
pub use watch::{check_watch_expired, check_watch_filtered, check_watch_live, check_watch_replay};
pub use window::{check_event_window_age, check_event_window_count};

/// What the suite needs beyond [`Store`]: a way to make a backend forget old
/// watch events, as its own retention (or etcd's compaction) would.
#[async_trait]
pub trait EventRetention {
    /// Forgets the watch events up to and including store revision
    /// `through`.
    async fn compact_events(&self, through: u64) -> Result<(), StoreError>;

    /// Keeps watch events for this window from the next write on.
    fn set_event_window(&self, window: EventWindow);
}

/// Runs every check, each against a fresh store from `fresh`.
pub async fn run_all<S, F, Fut>(mut fresh: F)
where
    S: Store + EventRetention,
    F: FnMut() -> Fut,
    Fut: Future<Output = S>,
{
    check_create_get_list(&fresh().await).await;
    check_list_pages(&fresh().await).await;
    check_list_continue_after_changes(&fresh().await).await;
    check_update_cas(&fresh().await).await;
    check_spec_revisions(&fresh().await).await;
    check_delete_and_recreate(&fresh().await).await;
    check_watch_replay(&fresh().await).await;
    check_watch_live(&fresh().await).await;
    check_watch_filtered(&fresh().await).await;
    check_watch_expired(&fresh().await).await;
    check_event_window_count(&fresh().await).await;
    check_event_window_age(&fresh().await).await;
    check_history_queries(&fresh().await).await;
    check_compaction_last(&fresh().await).await;
    check_compaction_for(&fresh().await).await;
    check_compaction_keep(&fresh().await).await;
    check_tokens(&fresh().await).await;
    check_leases(&fresh().await).await;
    check_step_logs(&fresh().await).await;
    check_step_log_trim(&fresh().await).await;
    check_sealed(&fresh().await).await;
}

/// How long a check waits for an event that must come.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a check waits to be sure an event does not come.
const QUIET_PERIOD: Duration = Duration::from_millis(300);

/// A fixed point in time; checks count minutes from it.
fn base_time() -> DateTime<Utc> {
    // INVARIANT: a valid, unambiguous UTC date.
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
        .single()
        .expect("valid base time")
}

fn at_minute(minute: i64) -> DateTime<Utc> {
    base_time() + TimeDelta::minutes(minute)
}

fn change(author: &str, class: AuthorClass, minute: i64) -> ChangeMeta {
    ChangeMeta {
        author: author.to_string(),
        class,
        message: format!("{author} at minute {minute}"),
        time: at_minute(minute),
        always_record: false,
    }
}

fn alice(minute: i64) -> ChangeMeta {
    change("alice", AuthorClass::External, minute)
}

/// An object as a caller creates it: uid and createdAt set, the rest blank.
fn new_object(kind: Kind, namespace: Option<&str>, name: &str, uid: &str, spec: Value) -> Object {
    let mut object = Object::new(kind, namespace, name, spec);
    object.metadata.uid = uid.to_string();
    object.metadata.created_at = Some(base_time());
    object
}

fn pod(namespace: &str, name: &str, uid: &str, image: &str) -> Object {
    new_object(Kind::Pod, Some(namespace), name, uid, pod_spec(image))
}

fn pod_spec(image: &str) -> Value {
    json!({"containers": [{"name": "main", "image": image, "env": {"A": "1"}}]})
}

fn key(kind: Kind, namespace: Option<&str>, name: &str) -> ObjectKey {
    ObjectKey::new(kind, namespace, name)
}

/// Applies `edit` to the stored object and writes it back with CAS.
async fn edit(
    store: &dyn Store,
    key: &ObjectKey,
    change: &ChangeMeta,
    edit: impl FnOnce(&mut Object),
) -> Object {
    let mut object = store
        .get(key)
        .await
        .expect("get before edit")
        .unwrap_or_else(|| panic!("{key} exists before edit"));
    let expected = object.metadata.resource_version;
    edit(&mut object);
    store
        .update(object, expected, change)
        .await
        .unwrap_or_else(|error| panic!("update of {key}: {error}"))
}

async fn next_event(stream: &mut WatchStream) -> WatchEvent {
    match tokio::time::timeout(EVENT_TIMEOUT, stream.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(error))) => panic!("watch failed: {error}"),
        Ok(None) => panic!("watch ended early"),
        Err(_) => panic!("no watch event within {EVENT_TIMEOUT:?}"),
    }
}

async fn assert_quiet(stream: &mut WatchStream, context: &str) {
    if let Ok(item) = tokio::time::timeout(QUIET_PERIOD, stream.next()).await {
        let what = match item {
            Some(Ok(event)) => format!(
                "{:?} of {} at {}",
                event.event_type,
                event.object.key(),
                event.resource_version()
            ),
            Some(Err(error)) => format!("error {error}"),
            None => "end of stream".to_string(),
        };
        panic!("{context}: expected no more watch events, got {what}");
    }
}
