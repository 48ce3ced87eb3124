//! `corral-bench reboot-recovery`: how long a lone node takes to run its
//! pods again after a reboot, from local state alone (issue 21 item 6,
//! design 0031). N busybox `sleep 3600` pods run under a `corral server`
//! and one `corral agent` ([`LoneAgent`]); the server is stopped for good;
//! then, each round, the agent is killed, the reboot is simulated exactly
//! as the end-to-end test does it ([`corral_testkit::reboot`]: containers
//! killed, every mount under the data dir and so every pod namespace gone,
//! the pods' cgroups gone) and the agent is started again. Measured from
//! the agent's spawn to the first pod, and to all N, running again: every
//! container's init alive (per runc's state) inside the pod's pinned
//! namespace, which holds the pod's address (polled every 10 ms by reading
//! files, so the poll does not take the CPU the agent needs).
//!
//! Beside it the floor: the same number of `runc run -d` of a bundle with
//! corral's default sandbox (user namespace, seccomp, fresh network
//! namespace), one after another and all at once, with no image, mount,
//! veth or address work. Last, where the agent's time went per recovery
//! step, from the pods' records (each keeps its recovery's steps with
//! their times until the API has them; the API is down here).
//!
//! Needs root, `runc` and `/bin/busybox` (busybox-static).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use clap::Args;
use corral_api::workflow::RecoveryReport;
use corral_testkit::reboot;

use crate::corral_pods::pod;
use crate::lone_agent::LoneAgent;
use crate::pod_start::{at_once, one_after_another, start_on_a_node};
use crate::runc_floor::RuncFloor;
use crate::stats::{median, percentile};
use crate::{machine, report};

/// How long the pods may take to run in the first place.
const FIRST_START_TIMEOUT: Duration = Duration::from_secs(300);

/// How long one recovery may take.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(120);

/// How often the node is looked at during a recovery.
const POLL: Duration = Duration::from_millis(10);
/// How long after its pods run every record must keep its recovery report.
const REPORTS_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct RebootRecoveryArgs {
    /// The corral binary to benchmark. Default: `corral` next to this binary
    /// (target/release/corral after `cargo build --release -p corral-cli`).
    #[arg(long, value_name = "PATH")]
    corral: Option<PathBuf>,
    /// Pods on the node.
    #[arg(long, default_value_t = 20)]
    pods: usize,
    /// Reboots measured (the floor runs as many times).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

/// One recovery: from the agent's spawn to the first and to the last pod
/// running again, and what the records say of each pod's steps.
#[derive(Debug)]
struct Round {
    first: Duration,
    all: Duration,
    /// Per pod: from the spawn to its recovery's first step, and each
    /// step's duration.
    reports: Vec<(Duration, RecoveryReport)>,
}

pub async fn run(args: RebootRecoveryArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.pods > 0 && args.rounds > 0,
        "--pods and --rounds must be at least 1"
    );
    let (corral_binary, _image_dir, image_tar) = start_on_a_node(args.corral).await?;

    let n = args.pods;
    let mut node = LoneAgent::start(&corral_binary, &image_tar).await?;
    println!("agent data dir: {}", node.data_dir().display());
    println!("{n} pods under a lone agent …");
    for i in 0..n {
        let name = format!("pod-{i:02}");
        node.client()
            .apply(&pod(&name, 0), Some("bench: create"))
            .await
            .with_context(|| format!("cannot create pod {name}"))?;
    }
    wait_all_running(&mut node, n, Instant::now(), FIRST_START_TIMEOUT).await?;
    // Killed before its start workflow is done, a pod would be started by
    // that workflow again rather than recovered.
    let deadline = Instant::now() + FIRST_START_TIMEOUT;
    while !reboot::local_records(&node.data_dir())?
        .iter()
        .all(|(_, record)| reboot::admitted(record))
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the pods run but their start workflows did not finish in {FIRST_START_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // From here on the node is alone, as after a reboot with the control
    // plane away.
    node.stop_server();
    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        node.kill_agent();
        let data_dir = node.data_dir();
        tokio::task::spawn_blocking(move || reboot::simulate_reboot(&data_dir))
            .await?
            .context("cannot simulate the reboot")?;
        let spawned_at = Utc::now();
        let started = Instant::now();
        node.start_agent()?;
        let (first, all) = wait_all_running(&mut node, n, started, RECOVERY_TIMEOUT).await?;
        let reports = wait_recovery_reports(&node.data_dir(), spawned_at).await?;
        println!(
            "round {round}: first pod running after {}, all {n} after {} (load {})",
            report::millis(first),
            report::millis(all),
            machine::load()
        );
        rounds.push(Round {
            first,
            all,
            reports,
        });
        // Let the agent finish writing what follows the last start.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    node.kill_agent();
    drop(node);

    println!(
        "floor: {n} × runc run -d with corral's sandbox, {} times …",
        args.rounds
    );
    let floor = RuncFloor::sandboxed().await?;
    let prefix = format!("corral-bench-{}", std::process::id());
    let (mut sequential, mut concurrent) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let summary =
            one_after_another(n, |i| floor.run(format!("{prefix}-reboot-seq-{round}-{i}"))).await?;
        sequential.push(summary.wall);
        floor.remove_all().await?;
        let summary = at_once(n, |i| floor.run(format!("{prefix}-reboot-con-{round}-{i}"))).await?;
        concurrent.push(summary.wall);
        floor.remove_all().await?;
    }
    drop(floor);

    println!();
    println!("load at the end: {}", machine::load());
    println!();
    let all: Vec<Duration> = rounds.iter().map(|r| r.all).collect();
    let first: Vec<Duration> = rounds.iter().map(|r| r.first).collect();
    print!(
        "{}",
        table(
            &[
                (format!("corral: agent start → all {n} pods running"), all),
                ("corral: agent start → first pod running".to_string(), first),
                (
                    format!("floor: {n} × runc run -d (corral's sandbox), one after another"),
                    sequential
                ),
                (
                    format!("floor: {n} × runc run -d (corral's sandbox), all at once"),
                    concurrent.clone()
                ),
            ],
            &concurrent,
        )
    );
    println!();
    print!("{}", step_table(&rounds));
    Ok(())
}

/// Waits until all `pods` run (checking the agent is alive); returns when
/// the first and when the last was seen running, from `started`.
async fn wait_all_running(
    node: &mut LoneAgent,
    pods: usize,
    started: Instant,
    timeout: Duration,
) -> anyhow::Result<(Duration, Duration)> {
    let mut first = None;
    loop {
        let data_dir = node.data_dir();
        let each = tokio::task::spawn_blocking(move || reboot::pods_running(&data_dir)).await?;
        let at = started.elapsed();
        // A record being written is not read as missing: look again.
        if let Ok(each) = each {
            let running = each.iter().filter(|pod| pod.is_ok()).count();
            if running > 0 && first.is_none() {
                first = Some(at);
            }
            if each.len() == pods && running == pods {
                return Ok((first.unwrap_or(at), at));
            }
            if at > timeout {
                let missing: Vec<String> = each.into_iter().filter_map(Result::err).collect();
                bail!(
                    "{running} of {pods} pods running after {timeout:?}; missing: {}",
                    missing.join("; ")
                );
            }
        } else if at > timeout {
            bail!("cannot read the pod records after {timeout:?}");
        }
        node.ensure_agent_running()?;
        tokio::time::sleep(POLL).await;
    }
}

/// Each record's recovery, once every record keeps one: a pod runs (the
/// last recovery step started its containers) a moment before the agent
/// saves its record with the report.
async fn wait_recovery_reports(
    data_dir: &Path,
    spawned_at: DateTime<Utc>,
) -> anyhow::Result<Vec<(Duration, RecoveryReport)>> {
    let deadline = Instant::now() + REPORTS_TIMEOUT;
    loop {
        let dir = data_dir.to_path_buf();
        match tokio::task::spawn_blocking(move || recovery_reports(&dir, spawned_at)).await? {
            Ok(reports) => return Ok(reports),
            Err(error) if Instant::now() >= deadline => {
                return Err(error.context(format!(
                    "the pods ran but not every record kept its recovery within {REPORTS_TIMEOUT:?}"
                )));
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Each record's recovery, with the time from `spawned_at` to its start.
fn recovery_reports(
    data_dir: &Path,
    spawned_at: DateTime<Utc>,
) -> anyhow::Result<Vec<(Duration, RecoveryReport)>> {
    let mut reports = Vec::new();
    for (path, record) in reboot::local_records(data_dir)? {
        let recovery = record
            .get("recovery")
            .with_context(|| format!("{} keeps no recovery", path.display()))?;
        let report: RecoveryReport = serde_json::from_value(recovery.clone())
            .with_context(|| format!("the recovery in {}", path.display()))?;
        reports.push((between(spawned_at, report.started_at), report));
    }
    Ok(reports)
}

fn between(from: DateTime<Utc>, to: DateTime<Utc>) -> Duration {
    (to - from).to_std().unwrap_or_default()
}

/// p50 and p90 (nearest rank) of samples, and the extremes.
fn spread(samples: &[Duration]) -> Option<(Duration, Duration, Duration, Duration)> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    Some((
        median(&sorted)?,
        percentile(&sorted, 90.0)?,
        *sorted.first()?,
        *sorted.last()?,
    ))
}

/// A Markdown table of rounds per row: p50, p90, min, max, and the p50
/// against the at-once floor's.
fn table(rows: &[(String, Vec<Duration>)], floor: &[Duration]) -> String {
    let mut out = String::from(
        "| what | rounds | p50 | p90 | min | max | p50 ÷ floor at once |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let floor_p50 = spread(floor).map(|s| s.0);
    for (what, samples) in rows {
        let Some((p50, p90, min, max)) = spread(samples) else {
            continue;
        };
        let ratio = floor_p50
            .filter(|floor| !floor.is_zero())
            .map_or("-".to_string(), |floor| {
                format!("{:.2}×", p50.as_secs_f64() / floor.as_secs_f64())
            });
        out.push_str(&format!(
            "| {what} | {} | {} | {} | {} | {} | {ratio} |\n",
            samples.len(),
            report::millis(p50),
            report::millis(p90),
            report::millis(min),
            report::millis(max),
        ));
    }
    out
}

/// Where the recoveries' time went, per step over every pod and round,
/// from the records: the wait from the agent's spawn to a pod's recovery
/// start, then each step's duration.
fn step_table(rounds: &[Round]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut samples: std::collections::BTreeMap<String, Vec<Duration>> = Default::default();
    let mut waits = Vec::new();
    for (wait, report) in rounds.iter().flat_map(|round| &round.reports) {
        waits.push(*wait);
        for step in &report.steps {
            if !order.contains(&step.step) {
                order.push(step.step.clone());
            }
            samples
                .entry(step.step.clone())
                .or_default()
                .push(between(step.started_at, step.finished_at));
        }
    }
    let mut out = format!(
        "Where the time went: per pod recovery ({} over all rounds), from the records\n\n\
         | step | p50 | p90 | max |\n|---|---:|---:|---:|\n",
        waits.len()
    );
    let mut line = |what: &str, samples: &[Duration]| {
        if let Some((p50, p90, _, max)) = spread(samples) {
            out.push_str(&format!(
                "| {what} | {} | {} | {} |\n",
                report::millis(p50),
                report::millis(p90),
                report::millis(max)
            ));
        }
    };
    line("agent spawned → the pod's recovery began", &waits);
    for step in &order {
        line(step, &samples[step]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|v| Duration::from_millis(*v)).collect()
    }

    #[test]
    fn the_table_shows_the_spread_and_the_ratio_to_the_floor() {
        let text = table(
            &[
                ("corral".to_string(), ms(&[300, 100, 200])),
                ("floor".to_string(), ms(&[50, 50])),
            ],
            &ms(&[50, 50]),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[2],
            "| corral | 3 | 200.00 ms | 300.00 ms | 100.00 ms | 300.00 ms | 4.00× |"
        );
        assert!(lines[3].ends_with("| 1.00× |"), "{}", lines[3]);
    }
}
