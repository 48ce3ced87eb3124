//! Read connections: a small pool of read-only connections to a database
//! file, so `get`, `list` and watch replays run while the writer commits.
//! An in-memory database cannot be opened twice; its reads share the write
//! connection.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use rusqlite::Connection;

use super::{Database, schema};
use crate::StoreError;

/// Idle read connections kept for reuse; more are opened when needed and
/// closed when the pool is full.
const MAX_IDLE: usize = 4;

pub(super) struct Readers {
    /// The database file; `None` for an in-memory database.
    path: Option<PathBuf>,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    pub fn new(path: Option<PathBuf>) -> Readers {
        Readers {
            path,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `work` on a read connection (blocking).
    pub fn with<T>(
        &self,
        db: &Database,
        work: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some(path) = &self.path else {
            return work(&mut db.writer());
        };
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut conn = match idle {
            Some(conn) => conn,
            None => schema::open_reader(path)?,
        };
        let result = work(&mut conn);
        // A connection left inside a transaction (an error mid-read) is
        // not reused.
        if conn.is_autocommit() {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
        result
    }
}
