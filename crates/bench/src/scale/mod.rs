//! `corral-bench scale`: how the control plane's costs grow with the number
//! of running pods, like Kubernetes' kubemark. One real `corral server`
//! (SQLite, or etcd) with its built-in controllers; N hollow nodes
//! ([`crate::hollow`]) in this process that join, heartbeat and run their
//! pods' node steps through the real API without containers. For each pod
//! count in turn it creates the missing pods and measures how fast they
//! start, then, with every pod running and every node heartbeating, the
//! server's idle CPU and memory, the CPU and latency of applies, `corral
//! get pods -o json`, and the store's size on disk.
//!
//! Only the server process is measured as "server" (its controllers and
//! workflow driver run in it); the hollow nodes' CPU is this process's and
//! is reported apart. A size whose pods do not all run within `--budget`
//! ends the run with a message; the sizes measured so far are printed.

mod measure;
mod stages;
mod table;
pub(crate) mod workload;

pub(crate) use measure::{cpu_time, reaped_children_cpu_time};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use corral_api::Kind;
use corral_api::kinds::{NodePhase, NodeStatus};
use corral_client::Client;

use crate::hollow::{HollowCluster, HollowOptions, NodeSettings};
use crate::machine;
use crate::processes::{CorralProcess, EtcdProcess};
use measure::{ApplyTarget, CpuWindow};
use table::{ApplyMeasure, SizeResult};
use workload::RunningPods;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatastoreChoice {
    Sqlite,
    Etcd,
    Both,
}

#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// The corral binary to benchmark. Default: `corral` next to this binary.
    #[arg(long, value_name = "PATH")]
    corral: Option<PathBuf>,
    /// Hollow nodes (default 100; 10 with --quick).
    #[arg(long)]
    nodes: Option<usize>,
    /// Running pod counts to measure at, increasing (default
    /// 0,1000,3000,10000; 0,200 with --quick).
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    #[arg(long, value_enum, default_value = "sqlite")]
    datastore: DatastoreChoice,
    /// Applies measured at each size, one client (default 200; 100 with --quick).
    #[arg(long)]
    applies: Option<usize>,
    /// Seconds of idle CPU measured at each size (default 10; 5 with --quick).
    #[arg(long)]
    idle_seconds: Option<u64>,
    /// A small run: 10 nodes, sizes 0,200, 100 applies, 5 idle seconds.
    #[arg(long)]
    quick: bool,
    /// How long one size's pods may take to all run; past it the run ends
    /// with what was measured.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    budget: Duration,
    /// Clients creating pods at once.
    #[arg(long, default_value_t = 32)]
    creators: usize,
    /// Pods each hollow node works on at once.
    #[arg(long, default_value_t = 4)]
    node_parallelism: usize,
    /// Time between a hollow node's heartbeats (the agent's is 5 s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    heartbeat: Duration,
}

/// The run's settings once `--quick` and the defaults are applied.
#[derive(Debug, Clone)]
struct Plan {
    corral: PathBuf,
    nodes: usize,
    sizes: Vec<usize>,
    applies: usize,
    idle: Duration,
    budget: Duration,
    creators: usize,
    node: NodeSettings,
}

impl ScaleArgs {
    fn plan(self) -> anyhow::Result<Plan> {
        let quick = self.quick;
        let nodes = self.nodes.unwrap_or(if quick { 10 } else { 100 });
        let sizes = self.sizes.unwrap_or_else(|| {
            if quick {
                vec![0, 200]
            } else {
                vec![0, 1000, 3000, 10_000]
            }
        });
        anyhow::ensure!(nodes > 0, "--nodes must be at least 1");
        anyhow::ensure!(
            !sizes.is_empty() && sizes.windows(2).all(|pair| pair[0] < pair[1]),
            "--sizes must be increasing pod counts"
        );
        let largest = sizes.last().copied().unwrap_or(0);
        // Room for every pod, with a tenth to spare, and never fewer slots
        // than a real node offers.
        let per_node = largest.div_ceil(nodes);
        let pod_capacity = u32::try_from(per_node + per_node / 10 + 1)
            .unwrap_or(u32::MAX)
            .max(corral_agent::node::MAX_PODS);
        Ok(Plan {
            corral: match self.corral {
                Some(path) => path,
                None => crate::apply::default_corral_binary()?,
            },
            nodes,
            sizes,
            applies: self.applies.unwrap_or(if quick { 100 } else { 200 }).max(1),
            idle: Duration::from_secs(
                self.idle_seconds
                    .unwrap_or(if quick { 5 } else { 10 })
                    .max(1),
            ),
            budget: self.budget,
            creators: self.creators.max(1),
            node: NodeSettings {
                index: 0,
                pod_capacity,
                heartbeat: self.heartbeat,
                parallel_pods: self.node_parallelism.max(1),
            },
        })
    }
}

pub async fn run(args: ScaleArgs) -> anyhow::Result<()> {
    let datastores: &[&str] = match args.datastore {
        DatastoreChoice::Sqlite => &["sqlite"],
        DatastoreChoice::Etcd => &["etcd"],
        DatastoreChoice::Both => &["sqlite", "etcd"],
    };
    let plan = args.plan()?;
    println!("machine: {}", machine::describe());
    println!("corral: {}", plan.corral.display());
    println!(
        "{} hollow nodes ({} pod slots each, heartbeat every {:?}, {} pods at once per node); sizes {:?}; {} applies; {:?} idle; budget {:?} per size",
        plan.nodes,
        plan.node.pod_capacity,
        plan.node.heartbeat,
        plan.node.parallel_pods,
        plan.sizes,
        plan.applies,
        plan.idle,
        plan.budget
    );
    let mut tables = Vec::new();
    for datastore in datastores {
        let results = run_on(&plan, datastore).await?;
        tables.push((datastore, results));
    }
    println!();
    println!("load at the end: {}", machine::load());
    for (datastore, (results, note)) in tables {
        println!();
        println!("### {datastore}: {} hollow nodes", plan.nodes);
        println!();
        print!("{}", table::render(&results, plan.nodes));
        if let Some(note) = note {
            println!();
            println!("{note}");
        }
    }
    Ok(())
}

/// Measures every size on one datastore; returns the sizes measured and,
/// when the run ended early, why.
async fn run_on(plan: &Plan, datastore: &str) -> anyhow::Result<(Vec<SizeResult>, Option<String>)> {
    println!();
    println!("== {datastore}: starting corral server");
    let etcd = match datastore {
        "etcd" => Some(EtcdProcess::start().await?),
        _ => None,
    };
    let mut server_args = vec!["server".to_string()];
    if let Some(etcd) = &etcd {
        server_args.push("--datastore".into());
        server_args.push(format!(
            "etcd://{}",
            etcd.client_url.trim_start_matches("http://")
        ));
    }
    let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let mut server = CorralProcess::start_with(&plan.corral, &server_args).await?;
    let admin = Client::new(&server.config)?;
    let options = HollowOptions {
        nodes: plan.nodes,
        name_prefix: "hollow".into(),
        node: plan.node.clone(),
    };
    let started = Instant::now();
    let hollow = HollowCluster::start(&admin, &server.config, &options).await?;
    let joined = started.elapsed();
    hollow
        .wait_ready(&admin, Duration::from_secs(300))
        .await
        .context("the hollow nodes did not all become Ready")?;
    println!(
        "{} hollow nodes joined in {:.1} s and were all Ready {:.1} s after the first join",
        plan.nodes,
        joined.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let running = RunningPods::start(&admin).await?;
    let server_pid = server.pid();
    let etcd_pid = etcd.as_ref().map(EtcdProcess::pid);
    let store_files = match &etcd {
        Some(etcd) => vec![etcd.data_dir().join("member/snap/db")],
        None => ["store.db", "store.db-wal", "store.db-shm"]
            .iter()
            .map(|name| server.data_dir().join(name))
            .collect(),
    };
    // The objects measured applies change exist (the pod runs) before the
    // first measurement.
    let mut sequence = 0;
    for target in [ApplyTarget::Policy, ApplyTarget::PodLabel] {
        measure::applies(&admin, server_pid, target, 1, &mut sequence).await?;
    }
    wait_running(
        &admin,
        &ApplyTarget::PodLabel.object(0),
        Duration::from_secs(120),
    )
    .await?;

    let mut results = Vec::new();
    let mut have = 0;
    for &size in &plan.sizes {
        let mut result = SizeResult {
            pods: size,
            ..SizeResult::default()
        };
        let mut started_from = None;
        if size > have {
            started_from = Some(have);
            println!("{datastore}, {size} pods: creating {} pods", size - have);
            let window = CpuWindow::start(&[None, Some(server_pid)])?;
            let first_create = Instant::now();
            let deadline = first_create + plan.budget;
            let created =
                workload::create_pods(&admin, have..size, plan.creators, deadline).await?;
            let creating = first_create.elapsed();
            println!(
                "{datastore}, {size} pods: {created} created in {:.1} s ({:.1} creates/s from {} clients)",
                creating.as_secs_f64(),
                created as f64 / creating.as_secs_f64().max(f64::EPSILON),
                plan.creators
            );
            let reached = running.reached(size, deadline).await;
            let usage = window.stop()?;
            server.ensure_running()?;
            let Some(reached) = reached else {
                let note = format!(
                    "**{size} pods not reached**: within the budget of {:?}, {} of {} pods were created and {} seen running ({:.1} pods/s); the measurements at {size} pods and larger were skipped. Hollow nodes: {}.",
                    plan.budget,
                    have + created,
                    size,
                    running.count(),
                    (running.count() - have) as f64 / plan.budget.as_secs_f64(),
                    hollow.counters().describe()
                );
                println!("{note}");
                return Ok((results, Some(note)));
            };
            let elapsed = reached.saturating_duration_since(first_create);
            result.pods_per_second = Some((size - have) as f64 / elapsed.as_secs_f64());
            result.bench_cpu_starting = Some(usage.percent(0));
            result.server_cpu_starting = Some(usage.percent(1));
            println!(
                "{datastore}, {size} pods: all running {:.1} s after the first create ({:.1} pods/s)",
                elapsed.as_secs_f64(),
                result.pods_per_second.unwrap_or_default()
            );
            have = size;
        }
        if !hollow.wait_idle(Duration::from_secs(60)).await {
            println!(
                "{datastore}, {size} pods: hollow nodes still busy after 60 s; measuring anyway"
            );
        }
        if let Some(first_new) = started_from {
            let pods = admin
                .list(Kind::Pod, Some(workload::NAMESPACE), None)
                .await?;
            let first = workload::pod(first_new).metadata.name;
            let new: Vec<_> = pods
                .items
                .into_iter()
                .filter(|pod| pod.metadata.name >= first)
                .collect();
            let sampled = stages::sample(&admin, &new).await;
            print!("{datastore}, {size} pods: {}", stages::report(&sampled));
        }
        // Let the workflow driver finish the last instances.
        tokio::time::sleep(Duration::from_secs(2)).await;
        measure_size(plan, &admin, &server, etcd_pid, &mut sequence, &mut result).await?;
        result.store_bytes = measure::files_size(&store_files);
        result.nodes_ready = ready_nodes(&admin).await?;
        server.ensure_running()?;
        println!(
            "{datastore}, {size} pods: idle {:.1} %, RSS {:.1} MiB, CPU per apply {:.2} ms (Policy) {:.2} ms (pod label), p99 {:.2} / {:.2} ms, get pods {:.2} s; hollow nodes: {}",
            result.idle_cpu,
            result.rss as f64 / f64::from(1 << 20),
            result.policy.cpu.as_secs_f64() * 1000.0,
            result.pod_label.cpu.as_secs_f64() * 1000.0,
            result
                .policy
                .latency
                .map_or(0.0, |s| s.p99.as_secs_f64() * 1000.0),
            result
                .pod_label
                .latency
                .map_or(0.0, |s| s.p99.as_secs_f64() * 1000.0),
            result.get_pods.as_secs_f64(),
            hollow.counters().describe()
        );
        results.push(result);
    }
    drop(running);
    drop(hollow);
    Ok((results, None))
}

/// The measurements with every pod running: idle CPU, memory, applies and
/// `corral get pods`.
async fn measure_size(
    plan: &Plan,
    admin: &Client,
    server: &CorralProcess,
    etcd_pid: Option<u32>,
    sequence: &mut u64,
    result: &mut SizeResult,
) -> anyhow::Result<()> {
    let server_pid = server.pid();
    let mut pids = vec![Some(server_pid), None];
    pids.extend(etcd_pid.map(Some));
    let window = CpuWindow::start(&pids)?;
    tokio::time::sleep(plan.idle).await;
    let idle = window.stop()?;
    result.idle_cpu = idle.percent(0);
    result.bench_idle_cpu = idle.percent(1);
    result.etcd_idle_cpu = etcd_pid.map(|_| idle.percent(2));
    (result.rss, result.peak_rss) = measure::memory(server_pid)?;

    let idle_share = idle.cpu[0].as_secs_f64() / idle.wall.as_secs_f64().max(1e-9);
    let applies = u32::try_from(plan.applies).unwrap_or(u32::MAX);
    for target in [ApplyTarget::Policy, ApplyTarget::PodLabel] {
        let applied = measure::applies(admin, server_pid, target, plan.applies, sequence).await?;
        let idle_during = Duration::from_secs_f64(idle_share * applied.latency.wall.as_secs_f64());
        let measured = ApplyMeasure {
            cpu: applied.server_cpu / applies,
            cpu_less_idle: applied.server_cpu.saturating_sub(idle_during) / applies,
            latency: Some(applied.latency),
        };
        match target {
            ApplyTarget::Policy => result.policy = measured,
            ApplyTarget::PodLabel => result.pod_label = measured,
        }
    }

    let config = server.config_path();
    result.get_pods = measure::get_pods(&plan.corral, &config, 3).await?;
    Ok(())
}

/// Waits until `pod` is running (as its hollow node reports it).
async fn wait_running(
    admin: &Client,
    pod: &corral_api::Object,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let current = admin.get(&pod.key()).await?;
        if current
            .typed_status::<corral_api::kinds::PodStatus>()
            .is_ok_and(|status| crate::pod_watch::is_running(&status))
        {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "pod {} not running after {timeout:?}: {}",
            pod.key(),
            current.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many nodes are Ready now.
async fn ready_nodes(admin: &Client) -> anyhow::Result<usize> {
    let nodes = admin.list(Kind::Node, None, None).await?.items;
    Ok(nodes
        .iter()
        .filter(|node| {
            node.typed_status::<NodeStatus>()
                .is_ok_and(|status| status.phase == NodePhase::Ready)
        })
        .count())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ScaleArgs,
    }

    fn plan(args: &[&str]) -> anyhow::Result<Plan> {
        let mut argv = vec!["scale", "--corral", "/bin/true"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)?.args.plan()
    }

    #[test]
    fn defaults_quick_and_explicit_values() {
        let full = plan(&[]).expect("defaults");
        assert_eq!((full.nodes, full.applies), (100, 200));
        assert_eq!(full.sizes, [0, 1000, 3000, 10_000]);
        assert_eq!(full.node.pod_capacity, 111, "100 a node, a tenth spare");
        let quick = plan(&["--quick"]).expect("quick");
        assert_eq!((quick.nodes, quick.sizes.clone()), (10, vec![0, 200]));
        assert_eq!(quick.node.pod_capacity, corral_agent::node::MAX_PODS);
        let mixed = plan(&["--quick", "--nodes", "3", "--sizes", "0,10"]).expect("mixed");
        assert_eq!((mixed.nodes, mixed.sizes), (3, vec![0, 10]));
        assert!(plan(&["--sizes", "10,5"]).is_err());
        assert!(plan(&["--nodes", "0"]).is_err());
    }
}
