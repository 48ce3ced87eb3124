//! Time and identifiers, behind traits so that tests are deterministic.

use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

pub trait IdGenerator: Send + Sync + 'static {
    /// A new object uid.
    fn uid(&self) -> String;
}

/// Random version-4 UUIDs.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomIds;

impl IdGenerator for RandomIds {
    fn uid(&self) -> String {
        uuid::Uuid::new_v4().to_string()
    }
}

/// Sequential ids `uid-1`, `uid-2`, … for tests.
#[derive(Debug, Default)]
pub struct SequentialIds {
    next: AtomicU64,
}

impl IdGenerator for SequentialIds {
    fn uid(&self) -> String {
        format!("uid-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }
}
