//! The watch-event window on etcd: watch history *is* etcd's MVCC history,
//! so keeping a window means compacting etcd, as the Kubernetes API server
//! does. After a write, at most once per second of write time, the store
//! compacts etcd through the newest store revision that is either more
//! than `count` revisions behind the write or older than `max_age`.
//!
//! etcd does not know when a revision was written, so the store samples
//! `(time, revision)` of its own writes, one per second of write time, and
//! takes the newest sample older than the cutoff. Several servers on one
//! etcd each compact by their own samples; compaction only ever moves
//! forward, so the smallest window wins. The decision here is pure; the
//! store runs the compaction (see [`crate::EtcdStore::after_write`]).

use std::collections::VecDeque;

use chrono::{DateTime, TimeDelta, Utc};
use corral_store::EventWindow;

/// How far write time must move before the window is applied again.
const CHECK_EVERY: TimeDelta = TimeDelta::seconds(1);

/// The window's settings and what the store has learnt from its writes.
#[derive(Debug, Default)]
pub(crate) struct WindowState {
    window: EventWindow,
    /// `(time, store revision)` of writes, oldest first, one per second.
    samples: VecDeque<(DateTime<Utc>, u64)>,
    last_check: Option<DateTime<Utc>>,
    /// The newest store revision this store compacted through.
    compacted_through: u64,
}

impl WindowState {
    pub fn set_window(&mut self, window: EventWindow) {
        self.window = EventWindow {
            count: window.count.max(1),
            ..window
        };
        // Apply the new window at the next write.
        self.last_check = None;
    }

    /// Records the write of store revision `revision` at `time`; returns
    /// the store revision to compact through, when that is due and moves
    /// the window forward.
    pub fn after_write(&mut self, time: DateTime<Utc>, revision: u64) -> Option<u64> {
        if self
            .samples
            .back()
            .is_none_or(|(last, _)| time >= *last + CHECK_EVERY)
        {
            self.samples.push_back((time, revision));
        }
        let due = self
            .last_check
            .is_none_or(|last| time >= last + CHECK_EVERY || time < last);
        if !due {
            return None;
        }
        self.last_check = Some(time);
        let mut through = revision.saturating_sub(self.window.count);
        if let Some(cutoff) = TimeDelta::from_std(self.window.max_age)
            .ok()
            .and_then(|age| time.checked_sub_signed(age))
        {
            while let Some(&(sampled, sampled_revision)) = self.samples.front() {
                if sampled >= cutoff {
                    break;
                }
                through = through.max(sampled_revision);
                self.samples.pop_front();
            }
        }
        // Never the write itself: a watch from it must still work.
        let through = through.min(revision.saturating_sub(1));
        if through > self.compacted_through {
            self.compacted_through = through;
            Some(through)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use std::time::Duration;

    fn second(second: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .expect("valid time")
            + TimeDelta::seconds(second)
    }

    fn state(count: u64, max_age_seconds: u64) -> WindowState {
        let mut state = WindowState::default();
        state.set_window(EventWindow {
            count,
            max_age: Duration::from_secs(max_age_seconds),
        });
        state
    }

    #[test]
    fn the_count_window_trails_the_newest_write() {
        let mut window = state(5, 3600);
        let mut compactions = Vec::new();
        for revision in 1..=12 {
            let second = i64::try_from(revision).expect("small") * 2;
            compactions.push(window.after_write(super::tests::second(second), revision));
        }
        let expected: Vec<Option<u64>> = (1..=12u64)
            .map(|revision| (revision > 5).then(|| revision - 5))
            .collect();
        assert_eq!(compactions, expected);
    }

    #[test]
    fn checks_run_at_most_once_a_second_of_write_time() {
        let mut window = state(5, 3600);
        assert_eq!(window.after_write(second(0), 10), Some(5));
        assert_eq!(window.after_write(second(0), 20), None, "same second");
        assert_eq!(window.after_write(second(1), 30), Some(25));
    }

    #[test]
    fn the_age_window_drops_what_is_older_than_max_age() {
        let mut window = state(10_000, 600);
        for (minute, revision) in [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)] {
            assert_eq!(window.after_write(second(minute * 60), revision), None);
        }
        // At minute 13 the cutoff is minute 3: revisions 1..=3 are older.
        assert_eq!(window.after_write(second(13 * 60), 6), Some(3));
        assert_eq!(
            window.after_write(second(13 * 60 + 2), 7),
            Some(4),
            "by 13:02 the write of minute 3 has aged out too"
        );
        assert_eq!(window.after_write(second(13 * 60 + 4), 8), None);
        assert_eq!(window.after_write(second(16 * 60), 9), Some(5));
    }
}
