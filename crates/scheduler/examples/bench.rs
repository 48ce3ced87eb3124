//! In-process scheduler benchmark: 10,000 workloads placed one by one onto
//! 5,000 simulated nodes, for each strategy.
//!
//! ```text
//! cargo run --release -p corral-scheduler --example bench [-- --nodes N --pods N]
//! ```
//!
//! Prints decisions per second and p50/p99/max decision time, next to
//! Kubernetes' scheduler_perf (680–810 pods/s at 5,000 nodes) and Nomad's
//! C1M (about 3,750 placements/s). Inputs are generated from a fixed seed,
//! so every run schedules the same cluster.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use corral_api::kinds::{NodeCapacity, NodePhase, RuntimeClass};
use corral_api::quantity::{Cpu, Memory};
use corral_api::{Kind, ObjectKey};
use corral_scheduler::{KVM_FEATURE, NodeInfo, Request, Scheduler, Snapshot, Strategy};

const KUBERNETES_LOW: f64 = 680.0;
const KUBERNETES_HIGH: f64 = 810.0;
const NOMAD_C1M: f64 = 3750.0;

/// splitmix64: small, fixed-seed, good enough to vary the inputs.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const ZONES: [&str; 5] = ["home", "office", "rack-a", "rack-b", "edge"];

fn nodes(count: usize, random: &mut Random) -> Vec<NodeInfo> {
    let sizes: [(u64, u64); 5] = [(4, 8), (8, 16), (16, 64), (32, 128), (64, 256)];
    (0..count)
        .map(|i| {
            let (cores, gib) = *random.pick(&sizes);
            let mut node = NodeInfo::ready(
                &format!("node-{i:05}"),
                NodeCapacity {
                    cpu: Cpu {
                        millis: cores * 1000,
                    },
                    memory: Memory { bytes: gib << 30 },
                    pods: 110,
                },
            );
            node.labels = BTreeMap::from([
                ("zone".to_string(), random.pick(&ZONES).to_string()),
                ("disk".to_string(), random.pick(&["ssd", "hdd"]).to_string()),
            ]);
            if random.below(2) == 0 {
                node.runtimes.push(RuntimeClass::Gvisor);
            }
            if random.below(10) < 3 {
                node.features.insert(KVM_FEATURE.into(), "usable".into());
            }
            match random.below(100) {
                0 => node.phase = NodePhase::Silent,
                1 => node.unschedulable = true,
                _ => {}
            }
            node
        })
        .collect()
}

fn requests(count: usize, nodes: usize, random: &mut Random) -> Vec<Request> {
    (0..count)
        .map(|i| {
            let kind = if random.below(100) < 3 {
                Kind::VirtualMachine
            } else {
                Kind::Pod
            };
            let mut request = Request::new(ObjectKey::new(kind, None, &format!("w-{i:05}")));
            request.cpu = Cpu {
                millis: *random.pick(&[100, 250, 500, 1000, 2000]),
            };
            request.memory = Memory {
                bytes: *random.pick(&[64u64, 128, 256, 512, 1024, 4096]) << 20,
            };
            match random.below(100) {
                0..15 => {
                    request
                        .selector
                        .insert("zone".into(), random.pick(&ZONES).to_string());
                }
                15..20 => request.runtime = Some(RuntimeClass::Gvisor),
                20..23 => request.host_ports = vec![*random.pick(&[80, 443, 8080, 9090])],
                23..24 => {
                    request.node = Some(format!("node-{:05}", random.below(nodes as u64)));
                }
                24..27 => {
                    request.local_volumes = vec![format!("vol-{}", random.below(200))];
                }
                _ => {}
            }
            request.wants_kvm = kind == Kind::VirtualMachine;
            request
        })
        .collect()
}

/// CPU time this thread has run, from `/proc/thread-self/schedstat` (ns);
/// with other work on the machine it is the fairer clock for throughput.
fn thread_cpu_time() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

struct Run {
    build: Duration,
    total: Duration,
    cpu: Option<Duration>,
    placed: usize,
    /// Refusals by the most common cause among their nodes.
    refused: BTreeMap<&'static str, usize>,
    decisions: Vec<Duration>,
    /// The decisions that placed the workload, apart.
    placements: Vec<Duration>,
}

fn run(snapshot: &Snapshot, requests: &[Request], strategy: Strategy) -> Run {
    let started = Instant::now();
    let mut scheduler = Scheduler::new(snapshot, strategy);
    let build = started.elapsed();
    let mut decisions = Vec::with_capacity(requests.len());
    let mut placements = Vec::with_capacity(requests.len());
    let mut placed = 0;
    let mut refused = BTreeMap::new();
    let cpu_before = thread_cpu_time();
    let started = Instant::now();
    for request in requests {
        let decision = Instant::now();
        let outcome = scheduler.place(request);
        let took = decision.elapsed();
        decisions.push(took);
        match outcome {
            Ok(_) => {
                placed += 1;
                placements.push(took);
            }
            Err(unschedulable) => {
                let cause = unschedulable.causes().first().map_or("no nodes", |c| c.0);
                *refused.entry(cause).or_default() += 1;
            }
        }
    }
    let total = started.elapsed();
    let cpu = thread_cpu_time()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    decisions.sort_unstable();
    placements.sort_unstable();
    Run {
        build,
        total,
        cpu,
        placed,
        refused,
        decisions,
        placements,
    }
}

fn percentile(sorted: &[Duration], percent: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() * percent / 100).min(sorted.len() - 1)]
}

fn argument(name: &str, default: usize) -> usize {
    let arguments: Vec<String> = std::env::args().collect();
    arguments
        .iter()
        .position(|a| a == name)
        .and_then(|i| arguments.get(i + 1))
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into())
}

fn main() {
    let node_count = argument("--nodes", 5_000);
    let pod_count = argument("--pods", 10_000);
    let mut random = Random(0x00C0_88A1);
    let snapshot = Snapshot {
        nodes: nodes(node_count, &mut random),
        ..Snapshot::default()
    };
    let requests = requests(pod_count, node_count, &mut random);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "corral-scheduler bench: {pod_count} workloads onto {node_count} nodes, one thread \
         ({}, {cores} cores, load average {})",
        cpu_model(),
        load_average()
    );
    for strategy in [Strategy::Spread, Strategy::BinPack] {
        let run = run(&snapshot, &requests, strategy);
        let rate = pod_count as f64 / run.total.as_secs_f64();
        println!();
        println!("strategy {strategy:?}");
        println!("  index build      {:>10.2?}", run.build);
        println!(
            "  placed/refused   {:>10} / {} (each refusal carries every node's reason: {:?})",
            run.placed,
            run.refused.values().sum::<usize>(),
            run.refused
        );
        println!("  total            {:>10.2?}", run.total);
        println!("  decisions/s      {rate:>10.0}   (wall clock)");
        if let Some(cpu) = run.cpu {
            println!(
                "  decisions/cpu-s  {:>10.0}   ({cpu:.2?} on cpu)",
                pod_count as f64 / cpu.as_secs_f64()
            );
        }
        for (label, sorted) in [("all", &run.decisions), ("placed", &run.placements)] {
            println!(
                "  decision time    p50 {:.2?}  p99 {:.2?}  max {:.2?}  ({label} decisions)",
                percentile(sorted, 50),
                percentile(sorted, 99),
                sorted.last().copied().unwrap_or_default()
            );
        }
        println!(
            "  wall-clock rate vs Kubernetes scheduler_perf (680-810/s): {:.1}x-{:.1}x",
            rate / KUBERNETES_HIGH,
            rate / KUBERNETES_LOW
        );
        println!(
            "  wall-clock rate vs Nomad C1M (~3,750/s): {:.1}x",
            rate / NOMAD_C1M
        );
    }
}
