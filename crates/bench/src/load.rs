//! Driving a load: C concurrent clients share N operations, each client
//! running its share back to back, and every operation's latency is kept.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::stats::Summary;

/// How many of `requests` operations client `client` (of `clients`) runs:
/// an even split, the first clients taking one more when it does not divide.
pub fn share(requests: usize, clients: usize, client: usize) -> usize {
    requests / clients + usize::from(client < requests % clients)
}

/// Runs `requests` operations over `clients` concurrent tokio tasks.
/// `operation(client, sequence)` performs one operation; the first error
/// aborts the run. Returns the latencies and the wall time of the whole run.
pub async fn run<F, Fut>(requests: usize, clients: usize, operation: F) -> anyhow::Result<Summary>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    anyhow::ensure!(clients > 0, "need at least one client");
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let operation = operation.clone();
            let count = share(requests, clients, client);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(count);
                for sequence in 0..count {
                    let start = Instant::now();
                    operation(client, sequence)
                        .await
                        .with_context(|| format!("client {client}, operation {sequence}"))?;
                    latencies.push(start.elapsed());
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    let mut latencies: Vec<Duration> = Vec::with_capacity(requests);
    let mut first_error = None;
    // Join every task, even after an error, so none outlives the run.
    for task in tasks {
        match task.await.context("a load task panicked") {
            Ok(Ok(client_latencies)) => latencies.extend(client_latencies),
            Ok(Err(error)) | Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    let wall = started.elapsed();
    if let Some(error) = first_error {
        return Err(error);
    }
    Summary::new(latencies, wall).context("no operations were run")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn shares_add_up() {
        for (requests, clients) in [(2000, 16), (20, 3), (5, 8), (0, 2)] {
            let total: usize = (0..clients).map(|c| share(requests, clients, c)).sum();
            assert_eq!(total, requests, "{requests} over {clients}");
        }
        assert_eq!(share(20, 3, 0), 7);
        assert_eq!(share(20, 3, 2), 6);
    }

    #[tokio::test]
    async fn runs_every_operation_once() {
        let done = Arc::new(AtomicUsize::new(0));
        let counter = done.clone();
        let summary = run(50, 4, move |_, _| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
        .await
        .unwrap();
        assert_eq!(summary.count, 50);
        assert_eq!(done.load(Ordering::SeqCst), 50);
    }

    #[tokio::test]
    async fn an_error_fails_the_run() {
        let result = run(10, 2, |client, sequence| async move {
            anyhow::ensure!(!(client == 1 && sequence == 3), "boom");
            Ok(())
        })
        .await;
        assert!(result.is_err());
    }
}
