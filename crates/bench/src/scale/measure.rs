//! What `corral-bench scale` reads off the machine and the server: a
//! process's CPU time (`utime + stime` from `/proc/PID/stat`) and memory
//! (`VmRSS`, `VmHWM`), the size of files on disk, the latency and CPU cost
//! of applies, and the wall time of `corral get pods -o json`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use corral_api::{Kind, Object};
use corral_client::Client;
use serde_json::json;

use crate::stats::Summary;

/// Clock ticks per second of `/proc/PID/stat` times (`getconf CLK_TCK`;
/// 100 on every Linux this runs on, and the fallback).
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
            .filter(|ticks: &f64| *ticks > 0.0)
            .unwrap_or(100.0)
    })
}

/// CPU time (user + system, all threads) process `pid` has used, or this
/// process's with `None`.
pub fn cpu_time(pid: Option<u32>) -> anyhow::Result<Duration> {
    stat_cpu(pid, Whose::Own)
}

/// CPU time (user + system) of the children process `pid` (`None`: this
/// one) waited for, and of theirs: the commands it ran and reaped.
pub fn reaped_children_cpu_time(pid: Option<u32>) -> anyhow::Result<Duration> {
    stat_cpu(pid, Whose::ReapedChildren)
}

/// Which CPU times of a `/proc/PID/stat` line.
#[derive(Debug, Clone, Copy)]
enum Whose {
    /// `utime + stime` (fields 14 and 15): the process's threads.
    Own,
    /// `cutime + cstime` (fields 16 and 17): its waited-for children.
    ReapedChildren,
}

fn stat_cpu(pid: Option<u32>, whose: Whose) -> anyhow::Result<Duration> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let ticks = parse_cpu_ticks(&text, whose).with_context(|| format!("cannot parse {path}"))?;
    Ok(Duration::from_secs_f64(ticks as f64 / clock_ticks()))
}

/// The two CPU times `whose` names of a `/proc/PID/stat` line, summed. The
/// command name (field 2) is in parentheses and may hold spaces, so fields
/// are counted after its closing one.
fn parse_cpu_ticks(stat: &str, whose: Whose) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3 (state): utime is field 14.
    let first = match whose {
        Whose::Own => 11,
        Whose::ReapedChildren => 13,
    };
    let user: u64 = fields.get(first)?.parse().ok()?;
    let system: u64 = fields.get(first + 1)?.parse().ok()?;
    Some(user + system)
}

/// CPU time of several processes (`None`: this one) over the same wall
/// time, measured from [`CpuWindow::start`] to [`CpuWindow::stop`].
#[derive(Debug)]
pub struct CpuWindow {
    pids: Vec<Option<u32>>,
    before: Vec<Duration>,
    started: Instant,
}

/// What a [`CpuWindow`] saw: the wall time and each process's CPU time.
#[derive(Debug, Clone)]
pub struct CpuUsage {
    pub wall: Duration,
    pub cpu: Vec<Duration>,
}

impl CpuUsage {
    /// Process `index`'s CPU as a percentage of one core.
    pub fn percent(&self, index: usize) -> f64 {
        let wall = self.wall.as_secs_f64();
        if wall > 0.0 {
            self.cpu[index].as_secs_f64() / wall * 100.0
        } else {
            0.0
        }
    }
}

impl CpuWindow {
    pub fn start(pids: &[Option<u32>]) -> anyhow::Result<Self> {
        let before = pids
            .iter()
            .map(|pid| cpu_time(*pid))
            .collect::<anyhow::Result<_>>()?;
        Ok(CpuWindow {
            pids: pids.to_vec(),
            before,
            started: Instant::now(),
        })
    }

    pub fn stop(&self) -> anyhow::Result<CpuUsage> {
        let wall = self.started.elapsed();
        let cpu = self
            .pids
            .iter()
            .zip(&self.before)
            .map(|(pid, before)| Ok(cpu_time(*pid)?.saturating_sub(*before)))
            .collect::<anyhow::Result<_>>()?;
        Ok(CpuUsage { wall, cpu })
    }
}

/// `VmRSS` and `VmHWM` (peak) of process `pid`, in bytes.
pub fn memory(pid: u32) -> anyhow::Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .with_context(|| format!("no {name} in {path}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The summed size of the files that exist among `paths`.
pub fn files_size(paths: &[PathBuf]) -> u64 {
    paths
        .iter()
        .filter_map(|path| std::fs::metadata(path).ok())
        .map(|meta| meta.len())
        .sum()
}

/// What a series of measured applies changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyTarget {
    /// A `Policy` whose namespace list names a namespace no pod lives in:
    /// a new spec revision each time, but no workflow, no controller acts
    /// on it and no pod watcher is sent it, so the cost is the API's and
    /// the store's alone.
    Policy,
    /// A label of one running pod (in its own namespace, bound to a hollow
    /// node): a metadata-only write (no revision, no workflow) that every
    /// pod watcher is sent — the controllers, which then run a round, and
    /// every hollow node.
    PodLabel,
}

/// The namespace of the pod [`ApplyTarget::PodLabel`] changes (not the
/// benchmark's pods' namespace, so it is not counted among them).
pub const APPLY_NAMESPACE: &str = "scale-apply";

impl ApplyTarget {
    pub fn describe(self) -> &'static str {
        match self {
            ApplyTarget::Policy => "Policy",
            ApplyTarget::PodLabel => "pod label",
        }
    }

    /// The object's `sequence`-th version: each differs from the last.
    pub fn object(self, sequence: u64) -> Object {
        match self {
            ApplyTarget::Policy => Object::new(
                Kind::Policy,
                None,
                "scale-apply",
                json!({"namespaces": [format!("scale-apply-{sequence}")]}),
            ),
            ApplyTarget::PodLabel => {
                let spec = super::workload::pod_spec();
                let mut pod = Object::new(Kind::Pod, Some(APPLY_NAMESPACE), "scale-apply", spec);
                pod.metadata
                    .labels
                    .insert("scale-apply".to_string(), sequence.to_string());
                pod
            }
        }
    }
}

/// What a run of applies measured.
#[derive(Debug, Clone)]
pub struct ApplyResult {
    pub latency: Summary,
    /// The server's CPU time during the run.
    pub server_cpu: Duration,
}

/// Applies `count` versions of `target`'s object one after another with
/// one client, numbering them on from `*sequence`; measures each apply's
/// latency and the server's CPU over the run.
pub async fn applies(
    client: &Client,
    server_pid: u32,
    target: ApplyTarget,
    count: usize,
    sequence: &mut u64,
) -> anyhow::Result<ApplyResult> {
    let window = CpuWindow::start(&[Some(server_pid)])?;
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        *sequence += 1;
        let object = target.object(*sequence);
        let started = Instant::now();
        client
            .apply(&object, Some("scale benchmark"))
            .await
            .with_context(|| format!("apply {} of a {} failed", *sequence, target.describe()))?;
        latencies.push(started.elapsed());
    }
    let usage = window.stop()?;
    Ok(ApplyResult {
        latency: Summary::new(latencies, usage.wall).context("no applies were run")?,
        server_cpu: usage.cpu[0],
    })
}

/// The median wall time of `runs` runs of `corral get pods -o json` with
/// the config at `config` (stdout discarded), and the first run's error.
pub async fn get_pods(corral: &Path, config: &Path, runs: usize) -> anyhow::Result<Duration> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let output = tokio::process::Command::new(corral)
            .args(["get", "pods", "-o", "json"])
            .env("CORRAL_CONFIG", config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output()
            .await
            .context("cannot run corral get pods")?;
        let elapsed = started.elapsed();
        if !output.status.success() {
            bail!(
                "corral get pods -o json failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        times.push(elapsed);
    }
    times.sort_unstable();
    crate::stats::median(&times).context("no runs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_counted_after_the_command_name() {
        // Fields 14 and 15 are 7 and 5; the name holds a space and a ')'.
        // Fields 16 and 17 (the reaped children's) are 3 and 4.
        let stat = "1234 (corral (x) y) S 1 2 3 4 5 6 7 8 9 10 7 5 3 4 20 0 9 0 100 200 300";
        assert_eq!(parse_cpu_ticks(stat, Whose::Own), Some(12));
        assert_eq!(parse_cpu_ticks(stat, Whose::ReapedChildren), Some(7));
        assert_eq!(parse_cpu_ticks("1234 (short) S 1", Whose::Own), None);
        assert_eq!(
            parse_cpu_ticks(
                "1234 (short) S 1 2 3 4 5 6 7 8 9 10 7 5 3",
                Whose::ReapedChildren
            ),
            None
        );
    }

    #[test]
    fn this_process_has_used_some_cpu_and_memory() {
        // Spin until the kernel has counted a tick: on a loaded machine
        // 30 ms of wall time may hold no whole tick of this thread's CPU.
        let deadline = Instant::now() + Duration::from_secs(10);
        while cpu_time(None).expect("own cpu time") == Duration::ZERO && Instant::now() < deadline {
            let spin = Instant::now();
            while spin.elapsed() < Duration::from_millis(30) {}
        }
        assert!(cpu_time(None).expect("own cpu time") > Duration::ZERO);
        let (rss, peak) = memory(std::process::id()).expect("own memory");
        assert!(rss > 0 && peak >= rss);
    }

    #[test]
    fn a_child_waited_for_counts_as_reaped() {
        let before = reaped_children_cpu_time(None).expect("children's cpu time");
        // Busy children until the kernel has counted a tick of theirs.
        let deadline = Instant::now() + Duration::from_secs(20);
        while reaped_children_cpu_time(None).expect("children's cpu time") == before
            && Instant::now() < deadline
        {
            let status = std::process::Command::new("sh")
                .args(["-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"])
                .status()
                .expect("sh runs");
            assert!(status.success());
        }
        assert!(reaped_children_cpu_time(None).expect("children's cpu time") > before);
    }

    #[test]
    fn usage_is_a_share_of_one_core() {
        let usage = CpuUsage {
            wall: Duration::from_secs(10),
            cpu: vec![Duration::from_millis(500)],
        };
        assert!((usage.percent(0) - 5.0).abs() < 1e-9);
    }

    #[test]
    fn every_policy_is_a_new_spec_and_every_pod_a_new_label_only() {
        let policy = ApplyTarget::Policy;
        assert_ne!(policy.object(1).spec, policy.object(2).spec);
        assert_eq!(policy.object(1).key(), policy.object(2).key());
        let pod = ApplyTarget::PodLabel;
        assert_eq!(pod.object(1).spec, pod.object(2).spec);
        assert_ne!(pod.object(1).metadata.labels, pod.object(2).metadata.labels);
        assert_eq!(pod.object(1).key(), pod.object(2).key());
        assert_eq!(pod.object(1).key().namespace, APPLY_NAMESPACE);
    }
}
