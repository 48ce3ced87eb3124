//! Measures the SQLite store directly (no HTTP, no admission):
//!
//! - `writes [C…]`: apply-like writes (a ~500-byte pod spec whose env
//!   changes every time, so every write is a new spec revision with a
//!   history delta and a watch event) from C concurrent tasks, each on its
//!   own pod; prints writes/s and latency percentiles per C.
//! - `list N`: creates N small pods, then times `list` of all of them and a
//!   walk of 500-object pages (`list_page`).
//! - `revisions [N…]`: gives one pod N revisions, then times reading one
//!   revision with its spec (`revision`, what `diff`, rollback and a
//!   Secret's clean-up read) and its whole history (`history`).
//!
//! `cargo run --release -p corral-store --example store_bench -- writes 1 16`
//! Numbers go to `docs/BENCHMARKS.md` with the machine they ran on.

use std::time::{Duration, Instant};

use chrono::Utc;
use corral_api::{AuthorClass, Kind, Object};
use corral_store::sqlite::SqliteStore;
use corral_store::{ChangeMeta, Store};
use serde_json::json;

/// Writes per client count.
const WRITES: usize = 2000;

fn change() -> ChangeMeta {
    ChangeMeta {
        author: "bench".into(),
        class: AuthorClass::External,
        message: String::new(),
        time: Utc::now(),
        always_record: false,
    }
}

fn pod(name: &str, revision: usize) -> Object {
    let spec = json!({
        "containers": [{
            "name": "app",
            "image": "registry.example.com/bench/app:1.24.3",
            "command": ["/usr/local/bin/app"],
            "args": ["--listen=:8080", "--log-format=json", "--cache-dir=/var/cache/app"],
            "env": {
                "BENCH_REVISION": revision.to_string(),
                "DATABASE_URL": "postgres://app@db.default.svc:5432/app",
                "FEATURE_FLAGS": "search,recommendations,new-checkout",
                "LOG_LEVEL": "info",
            },
            "ports": [8080, 9090],
            "resources": {"cpu": "500m", "memory": "256Mi"},
        }],
    });
    let mut object = Object::new(Kind::Pod, Some("bench"), name, spec);
    object.metadata.uid = format!("uid-{name}");
    object.metadata.created_at = Some(Utc::now());
    object
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

async fn writes(store: &SqliteStore, clients: usize) {
    let per_client = WRITES / clients;
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let store = store.clone();
            tokio::spawn(async move {
                let name = format!("c{clients}-{client}");
                let mut object = store
                    .create(pod(&name, 0), &change())
                    .await
                    .expect("create");
                let mut latencies = Vec::with_capacity(per_client);
                for revision in 1..=per_client {
                    let expected = object.metadata.resource_version;
                    let mut next = pod(&name, revision);
                    next.metadata = object.metadata.clone();
                    let start = Instant::now();
                    object = store
                        .update(next, expected, &change())
                        .await
                        .expect("update");
                    latencies.push(start.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("writer task"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    println!(
        "writes C={clients}: {} writes in {:.2} s = {:.0} writes/s; p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        latencies.len(),
        elapsed.as_secs_f64(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.9).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
    );
}

async fn list(store: &SqliteStore, count: usize) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..16)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                for index in (task..count).step_by(16) {
                    let object = Object::new(
                        Kind::Pod,
                        Some("bench"),
                        &format!("pod-{index:05}"),
                        json!({"containers": [{"name": "app", "image": "busybox"}]}),
                    );
                    let mut object = object;
                    object.metadata.uid = format!("uid-{index}");
                    store.create(object, &change()).await.expect("create");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("creator task");
    }
    println!(
        "created {count} pods in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    for round in 0..3 {
        let start = Instant::now();
        let listed = store.list(Kind::Pod, None).await.expect("list");
        println!(
            "list {} pods (round {round}): {:.1} ms",
            listed.objects.len(),
            start.elapsed().as_secs_f64() * 1e3
        );
    }
    pages(store).await;
}

async fn pages(store: &SqliteStore) {
    for round in 0..3 {
        let start = Instant::now();
        let (mut total, mut pages, mut after) = (0, 0, None);
        loop {
            let page = store
                .list_page(Kind::Pod, None, 500, after.as_ref())
                .await
                .expect("page");
            total += page.objects.len();
            pages += 1;
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        println!(
            "list {total} pods in {pages} pages of 500 (round {round}): {:.1} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
}

/// The median of `rounds` timings of `read`.
async fn median_of<F, Fut>(rounds: usize, mut read: F) -> Duration
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut timings = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let start = Instant::now();
        read(round as u64).await;
        timings.push(start.elapsed());
    }
    timings.sort();
    percentile(&timings, 0.5)
}

async fn revisions(store: &SqliteStore, count: usize) {
    let name = format!("revisions-{count}");
    let mut object = store
        .create(pod(&name, 0), &change())
        .await
        .expect("create");
    for revision in 1..count {
        let mut next = pod(&name, revision);
        next.metadata = object.metadata.clone();
        object = store
            .update(next, object.metadata.resource_version, &change())
            .await
            .expect("update");
    }
    let key = object.key();
    let middle = (count as u64 / 2).max(1);
    let one = median_of(31, |round| {
        let (store, key) = (store.clone(), key.clone());
        let revision = (middle + round % 8).min(count as u64);
        async move {
            store.revision(&key, revision).await.expect("revision");
        }
    })
    .await;
    let all = median_of(11, |_| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            store.history(&key).await.expect("history");
        }
    })
    .await;
    println!(
        "revisions N={count}: one revision with its spec {:.3} ms, the whole history {:.3} ms (medians)",
        one.as_secs_f64() * 1e3,
        all.as_secs_f64() * 1e3,
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("bench.db")).expect("open store");
    match args.first().map(String::as_str) {
        Some("writes") => {
            let counts: Vec<usize> = args[1..]
                .iter()
                .map(|count| count.parse().expect("a client count"))
                .collect();
            for clients in if counts.is_empty() {
                vec![1, 16]
            } else {
                counts
            } {
                writes(&store, clients).await;
            }
        }
        Some("list") => {
            let count = args.get(1).map_or(10_000, |n| n.parse().expect("a count"));
            list(&store, count).await;
        }
        Some("revisions") => {
            let counts: Vec<usize> = args[1..]
                .iter()
                .map(|count| count.parse().expect("a revision count"))
                .collect();
            for count in if counts.is_empty() {
                vec![100, 1_000, 10_000]
            } else {
                counts
            } {
                revisions(&store, count.max(1)).await;
            }
        }
        _ => eprintln!("usage: store_bench writes [C…] | list [N] | revisions [N…]"),
    }
}
