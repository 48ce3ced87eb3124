//! The writer thread: group commit.
//!
//! Callers queue [`Request`]s. The thread blocks for the first, takes
//! whatever else has queued up meanwhile (up to [`MAX_GROUP`]) and applies
//! the group in one `BEGIN IMMEDIATE` transaction. A write checks and
//! encodes everything before it writes a row, so one that fails for its
//! own reasons has changed nothing and is answered with its error while
//! the others go on (a statement failing mid-write fails the group: see
//! [`objects::Failure`]). Each object write takes the next store
//! revision from the thread, which keeps the last committed one and
//! records the group's newest once; step-log entries are numbered the
//! same way. Then a batch of new step-log entries is indexed when enough
//! have gathered, the watch-event window is applied (by the change-time
//! marks the thread keeps: [`EventPruner`]), the transaction commits
//! (`synchronous=FULL`: one fsync for the group), the group's events are
//! broadcast in store-revision order, and
//! every caller is answered. While one group is being fsynced the next one
//! queues up, so under concurrency groups grow by themselves and a single
//! writer pays no added latency.

use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};

use chrono::{DateTime, Utc};
use corral_api::workflow::StepLogEntry;
use corral_api::{Object, ObjectKey};
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

use super::encoded::EncodedParts;
use super::events::{self, EventPruner};
use super::objects::{self, Applied, Failure};
use super::schema::{self, META_REVISION, META_STEP_LOGS_SEQ};
use super::specs::SpecCache;
use super::{Database, steplogs};
use crate::{ChangeMeta, StoreError, WatchEvent};

/// Most writes in one transaction; more wait for the next group.
const MAX_GROUP: usize = 512;

/// One write, as queued.
pub(super) enum Write {
    Create {
        object: Object,
        /// Its spec and status as JSON, encoded by the caller.
        parts: EncodedParts,
        change: ChangeMeta,
        /// Step log entries written with the object, in its savepoint.
        logs: Vec<StepLogEntry>,
    },
    Update {
        object: Object,
        parts: EncodedParts,
        expected: u64,
        change: ChangeMeta,
        logs: Vec<StepLogEntry>,
    },
    Delete {
        key: ObjectKey,
        expected: Option<u64>,
        change: ChangeMeta,
    },
    StepLogs(Vec<StepLogEntry>),
}

impl Write {
    /// The time the write says it happens at, if it makes a watch event.
    fn time(&self) -> Option<DateTime<Utc>> {
        match self {
            Write::Create { change, .. }
            | Write::Update { change, .. }
            | Write::Delete { change, .. } => Some(change.time),
            Write::StepLogs(_) => None,
        }
    }
}

/// What a durable write answers.
#[derive(Debug)]
pub(super) enum Written {
    /// The object as written, shared with the change's watch event.
    Object(Arc<WatchEvent>),
    StepLogs,
}

/// A write and where its answer goes.
pub(super) struct Request {
    pub write: Write,
    pub reply: oneshot::Sender<Result<Written, StoreError>>,
}

/// The error callers get once the writer thread is gone.
pub(super) fn stopped() -> StoreError {
    StoreError::Unavailable("the sqlite writer thread has stopped".into())
}

/// The error a caller gets when the writer dropped its write unanswered.
pub(super) fn dropped() -> StoreError {
    StoreError::Unavailable(
        "the sqlite writer dropped this write without committing it (see the log)".into(),
    )
}

/// Starts the writer thread; it ends when every sender of `queue` is gone.
pub(super) fn spawn(
    db: Arc<Database>,
    queue: mpsc::Receiver<Request>,
) -> io::Result<JoinHandle<()>> {
    thread::Builder::new()
        .name("corral-sqlite-writer".into())
        .spawn(move || run(&db, &queue))
}

/// What the writer keeps between groups.
#[derive(Default)]
struct WriterState {
    specs: SpecCache,
    pruner: EventPruner,
    /// The store revision of the last committed write; read from the
    /// database when unknown (at the first group, and after a group
    /// failed). Only this thread's writes move it.
    revision: Option<u64>,
    /// The newest step-log `seq` given out, the same way.
    step_seq: Option<u64>,
    /// `PRAGMA data_version` at the last group: it moves when another
    /// connection to the file (another store opened on it, in this process
    /// or another) commits, and then what this thread keeps is read again.
    data_version: Option<i64>,
}

impl WriterState {
    /// Forgets what a group that failed may have left half-known: the
    /// next group reads it from the database again.
    fn reset(&mut self) {
        self.specs.abort();
        self.forget_counters();
    }

    /// Forgets the counters and marks kept between groups, which another
    /// writer of the file may have moved on.
    fn forget_counters(&mut self) {
        self.revision = None;
        self.step_seq = None;
        self.pruner = EventPruner::default();
    }
}

fn run(db: &Database, queue: &mpsc::Receiver<Request>) {
    let mut state = WriterState::default();
    while let Ok(first) = queue.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(request) => group.push(request),
                Err(_) => break,
            }
        }
        // A bug that panics fails its group (the transaction rolls back as
        // it unwinds, the callers' answers are dropped), not the store.
        let committed = panic::catch_unwind(AssertUnwindSafe(|| {
            commit_group(db, &mut state, group);
        }));
        if committed.is_err() {
            state.reset();
            tracing::error!("the sqlite writer panicked applying a group of writes; they failed");
        }
    }
}

fn commit_group(db: &Database, state: &mut WriterState, group: Vec<Request>) {
    let size = group.len();
    let (writes, replies): (Vec<Write>, Vec<_>) = group
        .into_iter()
        .map(|request| (request.write, request.reply))
        .unzip();
    let outcome = {
        let mut conn = db.writer();
        apply_group(&mut conn, db, state, writes)
    };
    let results = match outcome {
        Ok(results) => {
            state.specs.commit();
            db.commits.fetch_add(1, Ordering::Relaxed);
            db.committed_writes
                .fetch_add(results.len() as u64, Ordering::Relaxed);
            results
        }
        Err(error) => {
            state.reset();
            tracing::error!(%error, writes = size, "sqlite group commit failed");
            let message = format!("sqlite commit of a group of {size} writes failed: {error}");
            for reply in replies {
                let _ = reply.send(Err(StoreError::Unavailable(message.clone())));
            }
            return;
        }
    };
    // Committed and durable: broadcast in store-revision order (the order
    // the group applied them), then answer.
    for result in &results {
        if let Ok(Applied {
            event: Some(event), ..
        }) = result
        {
            // No receiver is fine: nobody is watching.
            let _ = db.events.send(Arc::clone(event));
        }
    }
    for (result, reply) in results.into_iter().zip(replies) {
        // A caller that went away does not mind.
        let _ = reply.send(result.map(|applied| applied.written));
    }
}

/// Applies every write of the group in one transaction and commits it.
/// The outer error means nothing was committed; the inner ones are the
/// writes that failed alone.
fn apply_group(
    conn: &mut Connection,
    db: &Database,
    state: &mut WriterState,
    writes: Vec<Write>,
) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let data_version: i64 = tx
        .prepare_cached("PRAGMA data_version")?
        .query_row([], |row| row.get(0))?;
    if state.data_version != Some(data_version) {
        state.forget_counters();
        state.data_version = Some(data_version);
    }
    let committed = match state.revision {
        Some(revision) => revision,
        None => schema::get_meta(&tx, META_REVISION)?,
    };
    let committed_seq = match state.step_seq {
        Some(seq) => seq,
        None => schema::get_meta(&tx, META_STEP_LOGS_SEQ)?,
    };
    let mut seq = committed_seq;
    // The store revision of the group's last object write so far: each
    // takes the next one, and one that fails alone takes none.
    let mut revision = committed;
    let mut results = Vec::with_capacity(writes.len());
    let mut newest_time = None;
    for write in writes {
        let time = write.time();
        let takes_revision = !matches!(write, Write::StepLogs(_));
        let mut staged = SpecCache::default();
        match apply(
            &tx,
            &state.specs,
            &mut staged,
            write,
            revision + 1,
            &mut seq,
        ) {
            Ok(applied) => {
                state.specs.take_staged(&mut staged);
                if takes_revision {
                    revision += 1;
                }
                if applied.event.is_some() {
                    newest_time = newest_time.max(time);
                }
                results.push(Ok(applied));
            }
            Err(Failure::Alone(error)) => results.push(Err(error)),
            // Dropping the transaction rolls the whole group back.
            Err(Failure::Group(error)) => return Err(error),
        }
    }
    if revision != committed {
        schema::set_meta(&tx, META_REVISION, revision)?;
    }
    if seq != committed_seq {
        schema::set_meta(&tx, META_STEP_LOGS_SEQ, seq)?;
    }
    steplogs::index_tail(&tx, false)?;
    events::prune(
        &tx,
        db.window(),
        (committed, revision),
        newest_time,
        &mut state.pruner,
    )?;
    tx.commit()?;
    state.revision = Some(revision);
    state.step_seq = Some(seq);
    Ok(results)
}

/// Applies one write of a group; an object write takes store revision
/// `next`, and its step-log entries the numbers after `seq`.
fn apply(
    conn: &Connection,
    cache: &SpecCache,
    staged: &mut SpecCache,
    write: Write,
    next: u64,
    seq: &mut u64,
) -> Result<Applied, Failure> {
    let mut specs = objects::Specs { cache, staged };
    match write {
        Write::Create {
            object,
            parts,
            change,
            logs,
        } => {
            let logs = steplogs::encode(&logs)?;
            let applied = objects::create(conn, &mut specs, object, parts, &change, next)?;
            steplogs::insert(conn, &logs, seq).map_err(Failure::Group)?;
            Ok(applied)
        }
        Write::Update {
            object,
            parts,
            expected,
            change,
            logs,
        } => {
            let logs = steplogs::encode(&logs)?;
            let applied =
                objects::update(conn, &mut specs, object, parts, expected, &change, next)?;
            steplogs::insert(conn, &logs, seq).map_err(Failure::Group)?;
            Ok(applied)
        }
        Write::Delete {
            key,
            expected,
            change,
        } => objects::delete(conn, &mut specs, &key, expected, &change, next),
        Write::StepLogs(entries) => {
            let logs = steplogs::encode(&entries)?;
            steplogs::insert(conn, &logs, seq).map_err(Failure::Group)?;
            Ok(Applied {
                written: Written::StepLogs,
                event: None,
            })
        }
    }
}
