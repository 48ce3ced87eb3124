//! Watch: replay of the event table, then live events from the broadcast
//! channel, with no gap and no duplicate.
//!
//! The receiver subscribes before the table is read, so every event is
//! either committed before the read (and in the table) or sent after it (and
//! in the receiver). `cursor` is the newest store revision already delivered
//! or known not to pass the filter; anything at or below it is skipped. A
//! receiver that lags falls back to reading the table from the cursor.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::TryStreamExt;
use rusqlite::{Connection, params};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::events;
use super::objects::parse_object;
use super::schema::{self, META_EVENTS_COMPACTED, META_REVISION, to_i64, to_u64};
use super::{Database, read};
use crate::{SharedWatchStream, StoreError, WatchEvent, WatchFilter, WatchStream};

/// Store revisions whose events are read from the table at a time while
/// catching up.
const BATCH: u64 = 512;

struct WatchState {
    db: Arc<Database>,
    receiver: broadcast::Receiver<Arc<WatchEvent>>,
    filter: WatchFilter,
    cursor: u64,
    catching_up: bool,
    pending: VecDeque<WatchEvent>,
    finished: bool,
}

/// One read from the table.
struct Batch {
    events: Vec<WatchEvent>,
    /// Whether the read reached the newest event.
    complete: bool,
    /// The newest store revision the read covered: every event through it
    /// that passes the filter is in `events` (the store revision when the
    /// table was read, if `complete`).
    through: u64,
}

pub(super) async fn watch(
    db: Arc<Database>,
    filter: WatchFilter,
    after: u64,
) -> Result<WatchStream, StoreError> {
    // A live event is copied out of the broadcast (other watchers share
    // it); one read from the table is this watcher's own.
    let shared = watch_shared(db, filter, after).await?;
    Ok(Box::pin(shared.map_ok(Arc::unwrap_or_clone)))
}

pub(super) async fn watch_shared(
    db: Arc<Database>,
    filter: WatchFilter,
    after: u64,
) -> Result<SharedWatchStream, StoreError> {
    let receiver = db.events.subscribe();
    let compacted = read(Arc::clone(&db), |conn| {
        schema::get_meta(conn, META_EVENTS_COMPACTED)
    })
    .await?;
    if after < compacted {
        return Err(StoreError::Expired {
            requested: after,
            compacted,
        });
    }
    let state = WatchState {
        db,
        receiver,
        filter,
        cursor: after,
        catching_up: true,
        pending: VecDeque::new(),
        finished: false,
    };
    Ok(Box::pin(futures::stream::unfold(state, next_event)))
}

async fn next_event(
    mut state: WatchState,
) -> Option<(Result<Arc<WatchEvent>, StoreError>, WatchState)> {
    loop {
        if state.finished {
            return None;
        }
        if let Some(event) = state.pending.pop_front() {
            state.cursor = state.cursor.max(event.resource_version());
            return Some((Ok(Arc::new(event)), state));
        }
        if state.catching_up {
            let (filter, cursor) = (state.filter.clone(), state.cursor);
            let batch = read(Arc::clone(&state.db), move |conn| {
                read_batch(conn, &filter, cursor)
            })
            .await;
            match batch {
                Ok(batch) => {
                    // Everything committed through `batch.through` was in
                    // the table: the events read are delivered first, and
                    // live events at or below it are duplicates.
                    state.catching_up = !batch.complete;
                    state.cursor = state.cursor.max(batch.through);
                    state.pending.extend(batch.events);
                }
                Err(error) => {
                    state.finished = true;
                    return Some((Err(error), state));
                }
            }
            continue;
        }
        match state.receiver.recv().await {
            Ok(event) => {
                let resource_version = event.resource_version();
                if resource_version <= state.cursor {
                    continue;
                }
                state.cursor = resource_version;
                if state.filter.admits(&event.object) {
                    return Some((Ok(event), state));
                }
            }
            Err(RecvError::Lagged(_)) => state.catching_up = true,
            Err(RecvError::Closed) => return None,
        }
    }
}

fn read_batch(
    conn: &mut Connection,
    filter: &WatchFilter,
    cursor: u64,
) -> Result<Batch, StoreError> {
    let tx = conn.transaction()?;
    let compacted = schema::get_meta(&tx, META_EVENTS_COMPACTED)?;
    if cursor < compacted {
        return Err(StoreError::Expired {
            requested: cursor,
            compacted,
        });
    }
    let store_revision = schema::get_meta(&tx, META_REVISION)?;
    // The next BATCH store revisions, found by their slots in the ring; a
    // slot that holds another revision (one a ring behind, not yet
    // overwritten) is skipped by the revision bounds.
    let through = store_revision.min(cursor.saturating_add(BATCH));
    let mut events = Vec::new();
    {
        let mut statement = tx.prepare_cached(
            "SELECT resource_version, type, body FROM events
             WHERE slot BETWEEN ?1 AND ?2
               AND resource_version > ?3 AND resource_version <= ?4
               AND (?5 IS NULL OR kind = ?5)
               AND (?6 IS NULL OR namespace = ?6)
               AND (?7 IS NULL OR name = ?7)
             ORDER BY slot",
        )?;
        for (first_slot, last_slot) in events::slot_ranges(cursor.saturating_add(1), through) {
            let mut rows = statement.query(params![
                first_slot,
                last_slot,
                to_i64(cursor),
                to_i64(through),
                filter.kind.map(|kind| kind.as_str()),
                filter.namespace,
                filter.name,
            ])?;
            while let Some(row) = rows.next()? {
                let resource_version = to_u64(row.get(0)?);
                let event_type = events::event_type_from_text(&row.get::<_, String>(1)?)?;
                let object = parse_object(&row.get::<_, String>(2)?)?;
                if object.metadata.resource_version != resource_version {
                    return Err(StoreError::Corrupt(format!(
                        "event {resource_version} holds an object at resourceVersion {}",
                        object.metadata.resource_version
                    )));
                }
                events.push(WatchEvent::new(event_type, object));
            }
        }
    }
    tx.commit()?;
    Ok(Batch {
        complete: through == store_revision,
        through,
        events,
    })
}
