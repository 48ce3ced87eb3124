//! A work queue of keys: each key is queued at most once, never handed to
//! two workers at once, may be requeued after a delay, and backs off
//! exponentially while its reconciles keep failing.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The first wait after a failure; it doubles per consecutive failure.
const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// The longest wait after failures.
const BACKOFF_MAX: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct State<K> {
    ready: VecDeque<K>,
    /// Keys in `ready`.
    queued: HashSet<K>,
    /// Keys a worker holds now.
    active: HashSet<K>,
    /// Active keys added again meanwhile: queued when their worker is done.
    again: HashSet<K>,
    /// Keys due later, by time (and a sequence number for equal times).
    delayed: BTreeMap<(Instant, u64), K>,
    sequence: u64,
    failures: HashMap<K, u32>,
}

#[derive(Debug)]
struct Shared<K> {
    state: Mutex<State<K>>,
    wake: Notify,
}

/// A queue shared by the handlers that fill it and the workers that drain
/// it. Cheap to clone.
#[derive(Debug)]
pub struct WorkQueue<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            shared: self.shared.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    pub fn new() -> Self {
        WorkQueue {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    ready: VecDeque::new(),
                    queued: HashSet::new(),
                    active: HashSet::new(),
                    again: HashSet::new(),
                    delayed: BTreeMap::new(),
                    sequence: 0,
                    failures: HashMap::new(),
                }),
                wake: Notify::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        // Every critical section leaves the state consistent.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `key` now (once, however often it is added before a worker
    /// takes it; after its worker is done if one holds it).
    pub fn add(&self, key: K) {
        let mut state = self.lock();
        if state.active.contains(&key) {
            state.again.insert(key);
            return;
        }
        if state.queued.insert(key.clone()) {
            state.ready.push_back(key);
            drop(state);
            self.shared.wake.notify_one();
        }
    }

    /// Queues `key` once `delay` has passed.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let mut state = self.lock();
        state.sequence += 1;
        let slot = (Instant::now() + delay, state.sequence);
        state.delayed.insert(slot, key);
        drop(state);
        // A waiting worker recomputes its nearest deadline.
        self.shared.wake.notify_waiters();
        self.shared.wake.notify_one();
    }

    /// Records a failed reconcile of `key` and queues it again after its
    /// backoff, which doubles with each consecutive failure. Returns the
    /// wait.
    pub fn retry(&self, key: K) -> Duration {
        let wait = {
            let mut state = self.lock();
            let failures = state.failures.entry(key.clone()).or_insert(0);
            *failures = failures.saturating_add(1);
            backoff(*failures)
        };
        self.add_after(key, wait);
        wait
    }

    /// Forgets `key`'s failures: its next failure waits the base backoff.
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Hands out the next key, waiting for one; the caller must call
    /// [`WorkQueue::done`] with it when finished.
    pub async fn next(&self) -> K {
        loop {
            let notified = self.shared.wake.notified();
            tokio::pin!(notified);
            // Register interest before looking, so an add in between wakes us.
            notified.as_mut().enable();
            let nearest = {
                let mut state = self.lock();
                promote_due(&mut state, Instant::now());
                if let Some(key) = state.ready.pop_front() {
                    state.queued.remove(&key);
                    state.active.insert(key.clone());
                    return key;
                }
                state.delayed.keys().next().map(|(at, _)| *at)
            };
            match nearest {
                Some(at) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Releases `key`; if it was added meanwhile it is queued again.
    pub fn done(&self, key: &K) {
        let mut state = self.lock();
        state.active.remove(key);
        if state.again.remove(key) && state.queued.insert(key.clone()) {
            state.ready.push_back(key.clone());
            drop(state);
            self.shared.wake.notify_one();
        }
    }

    /// Keys queued now or later (not those a worker holds).
    pub fn len(&self) -> usize {
        let state = self.lock();
        state.ready.len() + state.delayed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Moves every delayed key due at `now` to the ready queue.
fn promote_due<K: Clone + Eq + Hash>(state: &mut State<K>, now: Instant) {
    while let Some(entry) = state.delayed.first_entry() {
        if entry.key().0 > now {
            break;
        }
        let key = entry.remove();
        if state.active.contains(&key) {
            state.again.insert(key);
        } else if state.queued.insert(key.clone()) {
            state.ready.push_back(key);
        }
    }
}

fn backoff(failures: u32) -> Duration {
    let factor = 1u32
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u32::MAX);
    BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_key_is_queued_once_and_held_by_one_worker() {
        let queue = WorkQueue::new();
        queue.add("a");
        queue.add("a");
        queue.add("b");
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.next().await, "a");
        queue.add("a"); // while active: comes back after done
        assert_eq!(queue.next().await, "b");
        assert!(queue.is_empty());
        queue.done(&"a");
        assert_eq!(queue.next().await, "a");
        queue.done(&"a");
        queue.done(&"b");
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_come_when_due() {
        let queue = WorkQueue::new();
        let start = Instant::now();
        queue.add_after("late", Duration::from_secs(5));
        queue.add_after("soon", Duration::from_secs(1));
        assert_eq!(queue.next().await, "soon");
        assert_eq!(start.elapsed().as_secs(), 1);
        assert_eq!(queue.next().await, "late");
        assert_eq!(start.elapsed().as_secs(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn an_add_wakes_a_waiting_worker() {
        let queue: WorkQueue<&str> = WorkQueue::new();
        let worker = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.next().await })
        };
        tokio::task::yield_now().await;
        queue.add_after("x", Duration::from_secs(60));
        queue.add("now");
        assert_eq!(worker.await.expect("worker"), "now");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_until_forgotten() {
        let queue = WorkQueue::new();
        assert_eq!(queue.retry("k"), Duration::from_millis(100));
        assert_eq!(queue.retry("k"), Duration::from_millis(200));
        assert_eq!(queue.retry("k"), Duration::from_millis(400));
        queue.forget(&"k");
        assert_eq!(queue.retry("k"), Duration::from_millis(100));
        for _ in 0..20 {
            queue.retry("k");
        }
        assert_eq!(queue.retry("k"), BACKOFF_MAX);
    }
}
