//! `corral-bench`: benchmarks of corral, each measured side by side in one
//! run against the floor (what the hardware or kernel costs at minimum) and a
//! peer (etcd, runc, podman …), printing medians, p99 and ratios with the
//! machine noted. Results are recorded in `docs/BENCHMARKS.md`.
//!
//! One module per benchmark (`apply`, `pod_start`, `volume_start`,
//! `reboot_recovery`, `scale`, `vm_start`) over shared helpers:
//! `processes` starts and always stops the systems under test, `node`
//! removes the containers, mounts and cgroups they leave, `load` drives
//! concurrent clients, `stats` summarises latencies, `report` prints tables.
//! `pod_start` uses `corral_pods` (a corral node and its pod watch,
//! `pod_watch`), `runc_floor` and `podman_peer`; `reboot_recovery` a
//! `lone_agent` (a server and one agent); `scale` runs `hollow`
//! nodes (simulated agents, like kubemark) against a real server. It asserts nothing about
//! speed: performance is measured, not asserted in tests.

/// The allocator of corral's own binary (`crates/cli`): the benchmark's
/// clients stand in for `corral apply` and corral's other clients, and its
/// hollow nodes for agents, all of which run with it. Both rows of a
/// comparison share the process, so the peer's client gets it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod apply;
mod corral_pods;
mod hollow;
mod load;
mod lone_agent;
mod machine;
mod node;
mod pod_start;
mod pod_watch;
mod podman_peer;
mod processes;
mod reboot_recovery;
mod report;
mod runc_floor;
mod scale;
mod stats;
mod vm_start;
mod volume_start;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};

/// Benchmarks of corral against the floor and a peer, in one run.
#[derive(Debug, Parser)]
#[command(name = "corral-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Spec revisions per second through corral's API, next to etcd puts of
    /// the same bytes (HTTP gateway and etcdctl) and an fdatasync floor.
    Apply(apply::ApplyArgs),
    /// Pod start latency (apply → all containers running, seen through a
    /// watch), one after another and at once, next to bare `runc run -d`
    /// and `podman run -d` of the same image; in-place update against
    /// delete + create; `corral up`'s memory with the pods running. Root.
    PodStart(pod_start::PodStartArgs),
    /// Reboot recovery of a lone node: N pods under a `corral agent` whose
    /// server is down; the reboot simulated as the end-to-end test does;
    /// agent start → first and all pods running again, per round, next to
    /// N `runc run -d` with corral's sandbox. Root.
    RebootRecovery(reboot_recovery::RebootRecoveryArgs),
    /// Pod start latency with an `emptyDir` volume next to a volume of the
    /// example plugin dirvol (examples/volume-plugins). Root and jq.
    VolumeStart(volume_start::VolumeStartArgs),
    /// The control plane at scale: a real `corral server` (SQLite and/or
    /// etcd) with N hollow nodes (simulated agents speaking the real node
    /// protocol, no containers) in this process; at each running pod
    /// count, pods started per second, idle server CPU, RSS, CPU and
    /// latency per apply, `corral get pods -o json` and the store's size.
    Scale(scale::ScaleArgs),
    /// A VM in QEMU itself, with the agent's command line and the test
    /// kit's guest: spawn to boot marker under TCG (and KVM where the
    /// probe says it works), and live-migration downtime between two QEMUs
    /// on this machine.
    VmStart(vm_start::VmStartArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let benchmark = async {
        match cli.command {
            Command::Apply(args) => apply::run(args).await,
            Command::PodStart(args) => pod_start::run(args).await,
            Command::RebootRecovery(args) => reboot_recovery::run(args).await,
            Command::VolumeStart(args) => volume_start::run(args).await,
            Command::Scale(args) => scale::run(args).await,
            Command::VmStart(args) => vm_start::run(args).await,
        }
    };
    // On SIGINT/SIGTERM the benchmark future is dropped, which drops the
    // process guards inside it: everything started is killed and reaped.
    let result = tokio::select! {
        result = benchmark => result,
        signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("corral-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGINT or SIGTERM with the signal's name.
async fn interrupted() -> &'static str {
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!(
            "corral-bench: cannot install signal handlers; Ctrl-C may leave processes behind"
        );
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    }
}
