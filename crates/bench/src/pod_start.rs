//! `corral-bench pod-start`: how long a pod takes from the API request to
//! all its containers running, observed through a watch, next to the same
//! busybox `sleep 3600` started by bare `runc run -d` (the floor), by `runc
//! run -d` of a bundle with corral's default sandbox (seccomp allowlist, no
//! capabilities, unprivileged user, own user namespace: the runtime's price
//! of the sandbox; once more with the pause between starts that corral's
//! one-at-a-time starts leave, to show what that pause costs runc on the
//! machine) and by `podman run -d` (a peer), and corral's gVisor pods next to bare `runsc
//! run -detach` (their floor). N containers one after another, then M at once,
//! for each system in turn (removing the N before the M), each after one
//! untimed warm-up start (reported apart). Then corral's
//! in-place update (an env change) against delete + create of the same pod,
//! with `podman rm -f` + `run -d` as the peer's replacement, and the
//! resident memory of `corral up` with M pods running. Last, where corral's
//! time went: per workflow step, the median wait from ready to claimed and
//! run from claimed to done, from the benchmark pods' step logs.
//!
//! Needs root (corral's node agent and runc run containers), `runc`,
//! `runsc`, `/bin/busybox` (busybox-static) and, for the peer, `podman`;
//! without podman the peer rows (without runsc its floor row) are left out
//! and the reason is printed.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;

use crate::corral_pods::{CorralNode, StepTimes};
use crate::podman_peer::Podman;
use crate::report::{self, Row};
use crate::runc_floor::RuncFloor;
use crate::stats::Summary;
use crate::{apply, machine};

const CORRAL: &str = "corral: apply → running (watch)";
const GVISOR: &str = "corral, runtime: gvisor";
const FLOOR: &str = "floor: runc run -d";
const RUNSC_FLOOR: &str = "floor: runsc run -d";
const SANDBOXED_FLOOR: &str = "floor: runc run -d, corral's sandbox";
const SPACED_FLOOR: &str = "floor: runc run -d, corral's sandbox, spaced as corral's starts";
const PODMAN: &str = "peer: podman run -d";
const UPDATE: &str = "corral: in-place update (env)";
const RECREATE: &str = "corral: delete + create";
const PODMAN_REPLACE: &str = "peer: podman rm -f + run -d";

#[derive(Debug, Args)]
pub struct PodStartArgs {
    /// The corral binary to benchmark. Default: `corral` next to this binary
    /// (target/release/corral after `cargo build --release -p corral-cli`).
    #[arg(long, value_name = "PATH")]
    corral: Option<PathBuf>,
    /// Containers started one after another, per system.
    #[arg(long, default_value_t = 50)]
    sequential: usize,
    /// Containers started at once, per system.
    #[arg(long, default_value_t = 20)]
    concurrent: usize,
    /// In-place updates, and delete + create cycles, of one pod.
    #[arg(long, default_value_t = 10)]
    updates: usize,
}

pub async fn run(args: PodStartArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.sequential > 0 && args.concurrent > 0 && args.updates > 0,
        "--sequential, --concurrent and --updates must be at least 1"
    );
    let (corral_binary, _image_dir, image_tar) = start_on_a_node(args.corral).await?;

    let (n, m, updates) = (args.sequential, args.concurrent, args.updates);
    let mut starts = Vec::new();
    let mut replacements = Vec::new();
    let mut memory = Vec::new();
    // One untimed warm-up start per system before its rows (first image
    // use, first cgroup, node registration); reported on its own line.
    let mut warm_up = Vec::new();

    // corral
    let mut node = CorralNode::start(&corral_binary, &image_tar).await?;
    let (idle_rss, _) = node.rss_kib()?;
    warm_up.push(format!(
        "corral {}",
        report::millis(node.start_pod("warm-up".into()).await?)
    ));
    println!("{CORRAL}: {n} one after another …");
    let mut breakdowns = Vec::new();
    let mut times = StepTimes::default();
    node.collect_object_step_times(&node.node_key().await?, "join", &mut times)
        .await?;
    breakdowns
        .push(times.table("corral up's node, join workflow (before the first pod can be placed)"));
    let mut times = StepTimes::default();
    node.collect_step_times("warm-up", "start", &mut times)
        .await?;
    breakdowns.push(times.table("the first pod after launch (warm-up), start workflow"));
    let corral_pid = Some(node.process.pid());
    let (summary, corral_cpu) = cpu_per_start(corral_pid, n, async {
        one_after_another(n, |i| node.start_pod(format!("seq-{i}"))).await
    })
    .await?;
    let mut cpu_lines = vec![format!("{CORRAL}, 1 at a time: {corral_cpu}")];
    let corral_one_at_a_time = summary.median;
    starts.push(row(CORRAL, 1, summary));
    let mut times = StepTimes::default();
    for i in 0..n {
        node.collect_step_times(&format!("seq-{i}"), "start", &mut times)
            .await?;
    }
    breakdowns.push(times.table(&format!("{CORRAL}, 1 at a time, start workflow")));
    node.delete_all_pods().await?;
    println!("{CORRAL}: {m} at once …");
    let summary = at_once(m, |i| node.start_pod(format!("con-{i}"))).await?;
    starts.push(row(CORRAL, m, summary));
    let mut times = StepTimes::default();
    for i in 0..m {
        node.collect_step_times(&format!("con-{i}"), "start", &mut times)
            .await?;
    }
    breakdowns.push(times.table(&format!("{CORRAL}, {m} at once, start workflow")));
    // Let status reports and the watch settle before reading memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss, peak) = node.rss_kib()?;
    memory.push(format!(
        "corral up (API server + controllers + node agent in one process) VmRSS: \
         {} idle, {} with {m} pods running (VmHWM peak so far {})",
        mib(idle_rss),
        mib(rss),
        mib(peak)
    ));
    println!("{UPDATE} and {RECREATE}: {updates} each …");
    node.start_pod("upd".into()).await?;
    let summary = one_after_another(updates, |i| node.update_pod("upd", i + 1)).await?;
    replacements.push(row(UPDATE, 1, summary));
    let mut times = StepTimes::default();
    node.collect_step_times("upd", "update", &mut times).await?;
    breakdowns.push(times.table(&format!("{UPDATE}, update workflow")));
    let summary = one_after_another(updates, |i| node.recreate_pod("upd", i + 1)).await?;
    replacements.push(row(RECREATE, 1, summary));
    node.process.ensure_running()?;
    node.delete_all_pods().await?;
    // gVisor last: tearing its sandboxes down keeps the agent busy for
    // a while after the API forgets the pods (see docs/BENCHMARKS.md).
    println!("{GVISOR}: {n} one after another …");
    node.start_pod_under("warm-up-gvisor".into(), Some("gvisor"))
        .await?;
    let summary = one_after_another(n, |i| {
        node.start_pod_under(format!("gvisor-{i}"), Some("gvisor"))
    })
    .await?;
    let gvisor = row(GVISOR, 1, summary);
    starts.push(gvisor.clone());
    let mut gvisor_rows = vec![gvisor];
    node.process.ensure_running()?;
    node.delete_all_pods().await?;
    drop(node);

    // runc
    let floor = RuncFloor::new().await?;
    let prefix = format!("corral-bench-{}", std::process::id());
    println!("{FLOOR}: {n} one after another, then {m} at once …");
    warm_up.push(format!(
        "runc {}",
        report::millis(floor.run(format!("{prefix}-warm-up")).await?)
    ));
    let summary = one_after_another(n, |i| floor.run(format!("{prefix}-seq-{i}"))).await?;
    starts.push(row(FLOOR, 1, summary));
    floor.remove_all().await?;
    let summary = at_once(m, |i| floor.run(format!("{prefix}-con-{i}"))).await?;
    starts.push(row(FLOOR, m, summary));
    floor.remove_all().await?;
    drop(floor);

    // runc with corral's default sandbox in the bundle
    let floor = RuncFloor::sandboxed().await?;
    println!("{SANDBOXED_FLOOR}: {n} one after another, then {m} at once …");
    warm_up.push(format!(
        "runc with corral's sandbox {}",
        report::millis(floor.run(format!("{prefix}-sandboxed-warm-up")).await?)
    ));
    let (summary, floor_cpu) = cpu_per_start(None, n, async {
        one_after_another(n, |i| floor.run(format!("{prefix}-sandboxed-seq-{i}"))).await
    })
    .await?;
    cpu_lines.push(format!(
        "{SANDBOXED_FLOOR}, 1 at a time: {} in runc (this benchmark runs and reaps it)",
        report::millis(floor_cpu.reaped)
    ));
    // The same starts with the pause a corral start leaves between its
    // `runc run`s (the rest of its median): on some machines a runc started
    // after a pause takes far longer than one started right after another
    // (its move into the container's cgroup waits out an RCU grace period
    // when nothing took the kernel's lock for that lately; corral's agent
    // takes it ahead of its own starts, design 0052, this floor does not).
    let spacing = corral_one_at_a_time.saturating_sub(summary.median);
    starts.push(row(SANDBOXED_FLOOR, 1, summary));
    floor.remove_all().await?;
    println!(
        "{SPACED_FLOOR}: {n} one after another, {} apart …",
        report::millis(spacing)
    );
    let summary = one_after_another(n, |i| {
        let id = format!("{prefix}-spaced-{i}");
        let floor = &floor;
        async move {
            tokio::time::sleep(spacing).await;
            floor.run(id).await
        }
    })
    .await?;
    starts.push(row(SPACED_FLOOR, 1, summary));
    floor.remove_all().await?;
    let summary = at_once(m, |i| floor.run(format!("{prefix}-sandboxed-con-{i}"))).await?;
    starts.push(row(SANDBOXED_FLOOR, m, summary));
    floor.remove_all().await?;
    drop(floor);

    // runsc: the floor of the gVisor row (one at a time, as that row)
    let runsc_note = match RuncFloor::runsc().await {
        Ok(floor) => {
            println!("{RUNSC_FLOOR}: {n} one after another …");
            warm_up.push(format!(
                "runsc {}",
                report::millis(floor.run(format!("{prefix}-gvisor-warm-up")).await?)
            ));
            let summary =
                one_after_another(n, |i| floor.run(format!("{prefix}-gvisor-{i}"))).await?;
            gvisor_rows.push(row(RUNSC_FLOOR, 1, summary));
            floor.remove_all().await?;
            "runsc floor measured".to_string()
        }
        Err(error) => format!("UNAVAILABLE, no runsc floor row: {error:#}"),
    };

    // podman
    let podman_note = match Podman::start(&image_tar).await {
        Ok(podman) => {
            println!("{PODMAN}: {n} one after another, then {m} at once …");
            warm_up.push(format!(
                "podman {}",
                report::millis(podman.run("warm-up".into()).await?)
            ));
            let summary = one_after_another(n, |i| podman.run(format!("seq-{i}"))).await?;
            starts.push(row(PODMAN, 1, summary));
            podman.remove_all().await?;
            let summary = at_once(m, |i| podman.run(format!("con-{i}"))).await?;
            starts.push(row(PODMAN, m, summary));
            let (containers, conmon) = podman.conmon_rss_kib().await?;
            memory.push(format!(
                "podman (no daemon): {} VmRSS summed over the {containers} conmon monitors",
                mib(conmon)
            ));
            println!("{PODMAN_REPLACE}: {updates} …");
            podman.run("upd".into()).await?;
            let summary = one_after_another(updates, |_| podman.replace("upd")).await?;
            replacements.push(row(PODMAN_REPLACE, 1, summary));
            podman.remove_all().await?;
            format!("image {}", podman.image)
        }
        Err(error) => format!("UNAVAILABLE, no peer rows: {error:#}"),
    };

    println!();
    println!("load at the end: {}", machine::load());
    println!("podman: {podman_note}");
    println!("runsc: {runsc_note}");
    println!(
        "untimed warm-up start, the first after launch: {}",
        warm_up.join(", ")
    );
    println!();
    print!(
        "{}",
        report::latency_table(
            &starts,
            &[
                (FLOOR, "runc"),
                (SANDBOXED_FLOOR, "sandboxed runc"),
                (PODMAN, "podman")
            ]
        )
    );
    println!();
    // gVisor against its own floor (and runc's, from the table above).
    if let Some(runc) = starts.iter().find(|r| r.system == FLOOR && r.clients == 1) {
        gvisor_rows.push(runc.clone());
    }
    print!(
        "{}",
        report::latency_table(&gvisor_rows, &[(RUNSC_FLOOR, "runsc"), (FLOOR, "runc")])
    );
    println!();
    print!(
        "{}",
        report::latency_table(&replacements, &[(RECREATE, "delete+create")])
    );
    println!();
    for line in memory {
        println!("{line}");
    }
    println!();
    println!(
        "CPU per start over the row (/proc/PID/stat; `runc init` becomes the container and is counted in neither):"
    );
    for line in cpu_lines {
        println!("- {line}");
    }
    // Where corral's time goes, step by step (corral analyze blame, summed).
    for table in breakdowns {
        println!();
        print!("{table}");
    }
    Ok(())
}

/// The CPU a process used over a row of starts, per start.
#[derive(Debug, Clone, Copy)]
struct CpuPerStart {
    /// Its own threads'.
    own: Duration,
    /// The commands it ran and reaped (runc, namespace helpers).
    reaped: Duration,
}

impl std::fmt::Display for CpuPerStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} in its own threads, {} in the commands it ran and reaped (runc, namespace helpers)",
            report::millis(self.own),
            report::millis(self.reaped)
        )
    }
}

/// Runs `work`, a row of `count` starts, and returns its result with the
/// CPU per start of process `pid` (`None`: this one).
async fn cpu_per_start<T>(
    pid: Option<u32>,
    count: usize,
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(T, CpuPerStart)> {
    let read = || -> anyhow::Result<(Duration, Duration)> {
        Ok((
            crate::scale::cpu_time(pid)?,
            crate::scale::reaped_children_cpu_time(pid)?,
        ))
    };
    let (own_before, reaped_before) = read()?;
    let result = work.await?;
    let (own, reaped) = read()?;
    Ok((
        result,
        CpuPerStart {
            own: own.saturating_sub(own_before) / apply::count(count),
            reaped: reaped.saturating_sub(reaped_before) / apply::count(count),
        },
    ))
}

pub(crate) fn row(system: &str, clients: usize, summary: Summary) -> Row {
    Row {
        system: system.into(),
        clients,
        summary,
    }
}

/// Runs `operation(0..count)` one after another; each returns its latency.
pub(crate) async fn one_after_another<F, Fut>(count: usize, operation: F) -> anyhow::Result<Summary>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<Duration>>,
{
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(count);
    for index in 0..count {
        latencies.push(
            operation(index)
                .await
                .with_context(|| format!("operation {index}"))?,
        );
    }
    Summary::new(latencies, started.elapsed()).context("no operations were run")
}

/// Runs `operation(0..count)` all at once (concurrently on this task, each
/// timing itself from its first poll); the first error fails the run after
/// every operation finished.
pub(crate) async fn at_once<F, Fut>(count: usize, operation: F) -> anyhow::Result<Summary>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<Duration>>,
{
    let started = Instant::now();
    let results = futures::future::join_all((0..count).map(&operation)).await;
    let wall = started.elapsed();
    let latencies = results
        .into_iter()
        .enumerate()
        .map(|(index, result)| result.with_context(|| format!("operation {index}")))
        .collect::<anyhow::Result<Vec<Duration>>>()?;
    Summary::new(latencies, wall).context("no operations were run")
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// What every benchmark of pods on a real node does first: fails unless
/// root; finds the corral binary (`corral` next to this one by default);
/// prints the machine and the binary; writes the busybox image (OCI
/// layout) into a temp dir, returned to be kept until the end.
pub(crate) async fn start_on_a_node(
    corral: Option<PathBuf>,
) -> anyhow::Result<(PathBuf, tempfile::TempDir, PathBuf)> {
    ensure_root()?;
    let corral_binary = match corral {
        Some(path) => path,
        None => apply::default_corral_binary()?,
    };
    println!("machine: {}", machine::describe());
    println!("corral: {}", corral_binary.display());
    let image_dir = tempfile::Builder::new()
        .prefix("corral-bench-image-")
        .tempdir()?;
    let dir = image_dir.path().to_path_buf();
    let image_tar = tokio::task::spawn_blocking(move || {
        corral_testkit::busybox_image_tar(&dir, corral_testkit::ImageFormat::OciLayout)
    })
    .await
    .context("cannot write the busybox image (is busybox-static installed?)")?;
    Ok((corral_binary, image_dir, image_tar))
}

/// Fails unless the effective user is root.
fn ensure_root() -> anyhow::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1));
    if effective != Some("0") {
        bail!(
            "this benchmark needs root: corral's node agent and runc run containers (run it with sudo)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn at_once_runs_every_operation_concurrently() {
        let started = Instant::now();
        let summary = at_once(5, |i| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(Duration::from_millis(i as u64))
        })
        .await
        .unwrap();
        assert_eq!(summary.count, 5);
        assert_eq!(summary.max, Duration::from_millis(4));
        assert!(started.elapsed() < Duration::from_millis(200));
    }

    #[tokio::test]
    async fn an_error_fails_either_mode() {
        let fail = |i: usize| async move {
            anyhow::ensure!(i != 1, "boom");
            Ok(Duration::ZERO)
        };
        assert!(one_after_another(3, fail).await.is_err());
        assert!(at_once(3, fail).await.is_err());
    }
}
