//! Watch: one etcd watch on the objects prefix from the requested
//! revision, with the previous value so deletions carry the last state.
//!
//! etcd replays history and then streams live changes with no gap and no
//! duplicate. If the stream breaks (a member died, the connection dropped),
//! the watch reopens itself from the last revision it saw, on whichever
//! member answers, for up to [`RESUME_TIMEOUT`]; the caller notices
//! nothing. A start revision etcd has compacted away is
//! [`StoreError::Expired`].

use std::collections::VecDeque;
use std::time::Duration;

use corral_store::{EventType, StoreError, WatchEvent, WatchFilter, WatchStream};
use etcd_client::{EventType as EtcdEventType, WatchOptions, WatchResponse};
use tokio::time::Instant;

use crate::keys::{etcd_revision, store_revision};
use crate::objects::{object_at, object_from_kv};
use crate::{EtcdStore, unavailable};

/// How long a broken watch keeps trying to reopen before it fails.
const RESUME_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between reopen attempts.
const RESUME_PAUSE: Duration = Duration::from_millis(200);

struct WatchState {
    store: EtcdStore,
    filter: WatchFilter,
    /// The newest store revision delivered or known not to pass the filter.
    cursor: u64,
    stream: Option<etcd_client::WatchStream>,
    pending: VecDeque<WatchEvent>,
    finished: bool,
}

pub(crate) async fn watch(
    store: &EtcdStore,
    filter: WatchFilter,
    after: u64,
) -> Result<WatchStream, StoreError> {
    let stream = open_retrying(store, &filter, after).await?;
    let state = WatchState {
        store: store.clone(),
        filter,
        cursor: after,
        stream: Some(stream),
        pending: VecDeque::new(),
        finished: false,
    };
    Ok(Box::pin(futures::stream::unfold(state, next_event)))
}

async fn open(
    store: &EtcdStore,
    filter: &WatchFilter,
    after: u64,
) -> Result<etcd_client::WatchStream, StoreError> {
    let options = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(etcd_revision(after + 1));
    store
        .client
        .clone()
        .watch(store.keys.objects(filter.kind, None), Some(options))
        .await
        .map_err(unavailable)
}

async fn next_event(mut state: WatchState) -> Option<(Result<WatchEvent, StoreError>, WatchState)> {
    loop {
        if state.finished {
            return None;
        }
        if let Some(event) = state.pending.pop_front() {
            state.cursor = state.cursor.max(event.resource_version());
            return Some((Ok(event), state));
        }
        let Some(stream) = state.stream.as_mut() else {
            match reopen(&state).await {
                Ok(stream) => state.stream = Some(stream),
                Err(error) => {
                    state.finished = true;
                    return Some((Err(error), state));
                }
            }
            continue;
        };
        match stream.message().await {
            Ok(Some(response)) => {
                if let Err(error) = take_events(&mut state, &response) {
                    state.finished = true;
                    return Some((Err(error), state));
                }
            }
            Ok(None) | Err(_) => state.stream = None,
        }
    }
}

/// Queues the response's events that pass the filter; a cancellation is
/// an error (compaction) or a reason to reopen.
fn take_events(state: &mut WatchState, response: &WatchResponse) -> Result<(), StoreError> {
    if response.canceled() {
        if response.compact_revision() > 0 {
            return Err(StoreError::Expired {
                requested: state.cursor,
                // etcd keeps its compaction revision watchable: everything
                // before it is gone.
                compacted: store_revision(response.compact_revision()).saturating_sub(1),
            });
        }
        tracing::warn!(
            reason = response.cancel_reason(),
            "etcd cancelled a watch; reopening"
        );
        state.stream = None;
        return Ok(());
    }
    for event in response.events() {
        let Some(kv) = event.kv() else { continue };
        let (event_type, object) = match event.event_type() {
            EtcdEventType::Put => {
                let event_type = if kv.version() == 1 {
                    EventType::Added
                } else {
                    EventType::Modified
                };
                (event_type, object_from_kv(kv)?)
            }
            EtcdEventType::Delete => {
                let previous = event.prev_kv().ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "etcd reported the deletion at revision {} without the deleted value",
                        kv.mod_revision()
                    ))
                })?;
                (
                    EventType::Deleted,
                    object_at(previous.value(), kv.mod_revision())?,
                )
            }
        };
        let resource_version = object.metadata.resource_version;
        if resource_version <= state.cursor {
            continue;
        }
        if state.filter.admits(&object) {
            state.pending.push_back(WatchEvent::new(event_type, object));
        } else if state.pending.is_empty() {
            state.cursor = resource_version;
        }
    }
    Ok(())
}

/// Opens the watch again after the last revision seen.
async fn reopen(state: &WatchState) -> Result<etcd_client::WatchStream, StoreError> {
    open_retrying(&state.store, &state.filter, state.cursor).await
}

/// Opens the watch, retrying until [`RESUME_TIMEOUT`]: the client's
/// balancer may first hand the request to a member that just died.
async fn open_retrying(
    store: &EtcdStore,
    filter: &WatchFilter,
    after: u64,
) -> Result<etcd_client::WatchStream, StoreError> {
    let deadline = Instant::now() + RESUME_TIMEOUT;
    loop {
        match open(store, filter, after).await {
            Ok(stream) => return Ok(stream),
            Err(error) if Instant::now() >= deadline => return Err(error),
            Err(error) => {
                tracing::warn!(%error, cursor = after, "opening an etcd watch");
                tokio::time::sleep(RESUME_PAUSE).await;
            }
        }
    }
}
