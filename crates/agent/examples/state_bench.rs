//! Measures the agent's local state directly: what a pod's start or
//! in-place update pays to learn its neighbours on the node (their IPv4
//! egress addresses, their specs).
//!
//! - `neighbours [N…]`: saves N pod records (each appended four times, as
//!   a running pod's file is), then times reading and parsing every record
//!   file (`load_all`, what a start did before) against the in-memory
//!   neighbours (`neighbours`), medians of 51.
//!
//! `cargo run --release -p corral-agent --example state_bench -- neighbours 10 100 300`
//! Numbers go to `docs/BENCHMARKS.md` with the machine they ran on.

use std::time::{Duration, Instant};

use corral_agent::state::{LocalState, PodRecord};
use corral_api::{Kind, Object};
use serde_json::json;

fn record(index: usize) -> PodRecord {
    let spec = json!({"containers": [{
        "name": "app",
        "image": "registry.example.com/bench/app:1.24.3",
        "command": ["/usr/local/bin/app"],
        "args": ["--listen=:8080", "--log-format=json"],
        "env": {"DATABASE_URL": "postgres://app@db.default.svc:5432/app", "LOG_LEVEL": "info"},
        "resources": {"cpu": "100m", "memory": "64Mi"},
    }]});
    let pod = Object::new(Kind::Pod, Some("bench"), &format!("pod-{index:04}"), spec);
    serde_json::from_value(json!({"pod": pod, "admittedRevision": 1})).expect("a pod record")
}

fn median(mut timings: Vec<Duration>) -> Duration {
    timings.sort();
    timings[timings.len() / 2]
}

fn neighbours(count: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let writer = LocalState::open(dir.path()).expect("open");
    for index in 0..count {
        let record = record(index);
        for _ in 0..4 {
            writer.save(&record).expect("save");
        }
    }
    let state = LocalState::open(dir.path()).expect("open");
    let (mut files, mut memory) = (Vec::new(), Vec::new());
    for _ in 0..51 {
        let start = Instant::now();
        let taken = state
            .load_all()
            .expect("load")
            .into_iter()
            .filter_map(|r| r.egress_ipv4);
        std::hint::black_box(taken.count());
        files.push(start.elapsed());
        let start = Instant::now();
        let taken = state
            .neighbours()
            .expect("neighbours")
            .into_iter()
            .filter_map(|n| n.egress_ipv4);
        std::hint::black_box(taken.count());
        memory.push(start.elapsed());
    }
    println!(
        "neighbours N={count}: every record file read and parsed {:.3} ms, from memory {:.3} ms (medians)",
        median(files).as_secs_f64() * 1e3,
        median(memory).as_secs_f64() * 1e3,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("neighbours") => {
            let counts: Vec<usize> = args[1..]
                .iter()
                .map(|count| count.parse().expect("a pod count"))
                .collect();
            for count in if counts.is_empty() {
                vec![10, 100, 300]
            } else {
                counts
            } {
                neighbours(count.max(1));
            }
        }
        _ => eprintln!("usage: state_bench neighbours [N…]"),
    }
}
