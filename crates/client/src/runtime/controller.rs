//! Reconciling keys from a [`WorkQueue`], one key at a time per worker.

use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::WorkQueue;

/// What a reconcile asks for when it succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until the key changes again.
    Done,
    /// Look at the key again after this long (a deadline, a poll of
    /// something outside the API).
    RequeueAfter(Duration),
}

/// Runs `reconcile` on keys from `queue` with `workers` concurrent workers
/// until `shutdown`. A key is never reconciled by two workers at once. A
/// failed reconcile is logged and retried with the key's backoff; a
/// successful one resets the backoff.
pub async fn run<K, F, Fut, E>(
    name: &'static str,
    queue: WorkQueue<K>,
    workers: usize,
    shutdown: CancellationToken,
    reconcile: F,
) where
    K: Clone + Eq + Hash + std::fmt::Debug + Send + 'static,
    F: Fn(K) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Action, E>> + Send,
    E: Display,
{
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let (queue, shutdown, reconcile) = (queue.clone(), shutdown.clone(), reconcile.clone());
        tasks.spawn(async move {
            loop {
                let key = tokio::select! {
                    key = queue.next() => key,
                    () = shutdown.cancelled() => return,
                };
                match reconcile(key.clone()).await {
                    Ok(Action::Done) => queue.forget(&key),
                    Ok(Action::RequeueAfter(delay)) => {
                        queue.forget(&key);
                        queue.add_after(key.clone(), delay);
                    }
                    Err(error) => {
                        let wait = queue.retry(key.clone());
                        tracing::debug!(controller = name, key = ?key, %error, ?wait,
                            "reconcile failed; retrying");
                    }
                }
                queue.done(&key);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failures_are_retried_and_requeues_come_back() {
        let queue = WorkQueue::new();
        let calls = Arc::new(AtomicU32::new(0));
        let shutdown = CancellationToken::new();
        let runner = {
            let (calls, shutdown) = (calls.clone(), shutdown.clone());
            tokio::spawn(run("test", queue.clone(), 2, shutdown, move |key: &str| {
                let calls = calls.clone();
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst);
                    match (key, n) {
                        ("k", 0) => Err("first try fails"),
                        ("k", 1) => Ok(Action::RequeueAfter(Duration::from_secs(3))),
                        _ => Ok(Action::Done),
                    }
                }
            }))
        };
        queue.add("k");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3, "fail, requeue, done");
        shutdown.cancel();
        runner.await.expect("runner ends");
    }
}
