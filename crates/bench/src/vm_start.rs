//! `corral-bench vm-start`: what a VirtualMachine costs in QEMU itself, with
//! exactly the command line the agent builds (`corral_runtime::vm::qemu_args`)
//! and the test kit's guest (Debian's cloud kernel, the busybox initramfs,
//! a fresh 64 MiB qcow2 disk):
//!
//! - **boot to marker**: from QEMU's spawn until the guest's console log
//!   shows `CORRAL-VM-BOOTED` (modules loaded) and `CORRAL-VM-READY` (disk
//!   formatted and mounted), under TCG and, when the node's KVM probe says
//!   it is usable, under KVM;
//! - **live migration downtime**: a booted guest sent (disk and memory, the
//!   agent's `migration::start`: QEMU block migration) to a second QEMU
//!   waiting with `-incoming` on a unix socket on the same machine, QEMU's
//!   own `downtime` and `total-time` from `query-migrate`. No node network
//!   and no agents: the floor under `corral vm migrate`.
//!
//! Root is not needed (no tap device); `qemu-system-x86_64` and `qemu-img`
//! are.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use corral_runtime::vm::kvm::{self, KvmProbe};
use corral_runtime::vm::migration::{self, Progress};
use corral_runtime::vm::qmp::{Monitor, QmpClient};
use corral_runtime::vm::{self, Accel, VmConfig, process};
use corral_testkit::{VM_MARKER, VM_READY_MARKER};

use crate::machine;
use crate::stats::median;

const QEMU: &str = "qemu-system-x86_64";
/// How long one boot may take before the run is given up.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Args)]
pub struct VmStartArgs {
    /// Boots measured per accelerator.
    #[arg(long, default_value_t = 5)]
    boots: usize,
    /// Live migrations measured (each of a freshly booted guest).
    #[arg(long, default_value_t = 3)]
    migrations: usize,
    /// Skip the KVM probe and measure TCG only.
    #[arg(long)]
    tcg_only: bool,
}

/// A QEMU this benchmark started: killed and reaped when dropped.
struct Qemu {
    child: Child,
    config: VmConfig,
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent's configuration of the test guest in `dir`.
fn config(dir: &Path, name: &str, accel: Accel, assets: &corral_testkit::VmAssets) -> VmConfig {
    VmConfig {
        name: format!("bench-{name}"),
        cpus: 1,
        memory_bytes: 256 << 20,
        accel,
        kernel: Some(assets.kernel.clone()),
        initrd: Some(assets.initramfs.clone()),
        cmdline: Some("console=ttyS0 quiet corral.count=1".into()),
        disk: Some(dir.join(format!("{name}.qcow2"))),
        data_disks: Vec::new(),
        tap: None,
        mac: vm::mac_for(name),
        extra_nics: Vec::new(),
        console_socket: dir.join(format!("{name}.console.sock")),
        console_log: dir.join(format!("{name}.console.log")),
        qmp_socket: dir.join(format!("{name}.qmp.sock")),
        incoming: None,
        // QEMU's own seccomp filter (`-sandbox`), as the agent runs it; the
        // rest of the agent's confinement (its uid, mount namespace and
        // cgroup) is not applied by the benchmark.
        sandboxed: true,
    }
}

/// Spawns QEMU with `config` (a fresh 64 MiB disk and console log first:
/// QEMU appends to the log, and an earlier run's markers must not count).
fn spawn(config: VmConfig) -> anyhow::Result<Qemu> {
    for path in [
        &config.console_log,
        &config.console_socket,
        &config.qmp_socket,
    ] {
        let _ = std::fs::remove_file(path);
    }
    if let Some(disk) = &config.disk {
        let _ = std::fs::remove_file(disk);
        process::create_disk(disk, 64 << 20, None).context("create the guest's disk")?;
    }
    let log = config.console_log.with_extension("qemu.log");
    let output = std::fs::File::create(&log).context("create QEMU's log")?;
    let child = Command::new(QEMU)
        .args(vm::qemu_args(&config))
        .stdin(Stdio::null())
        .stdout(output.try_clone()?)
        .stderr(output)
        .spawn()
        .with_context(|| format!("start {QEMU}"))?;
    Ok(Qemu { child, config })
}

/// Waits until `marker` is in the console log; how long since `began`.
fn await_marker(qemu: &mut Qemu, marker: &str, began: Instant) -> anyhow::Result<Duration> {
    loop {
        let text = std::fs::read(&qemu.config.console_log).unwrap_or_default();
        if String::from_utf8_lossy(&text).contains(marker) {
            return Ok(began.elapsed());
        }
        if let Some(status) = qemu.child.try_wait()? {
            bail!("QEMU exited ({status}) before the guest printed {marker}");
        }
        if began.elapsed() > BOOT_TIMEOUT {
            bail!("no {marker} within {BOOT_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One boot: (spawn → booted, spawn → ready).
fn boot_once(
    dir: &Path,
    accel: Accel,
    assets: &corral_testkit::VmAssets,
) -> anyhow::Result<(Duration, Duration)> {
    let began = Instant::now();
    let mut qemu = spawn(config(dir, "boot", accel, assets))?;
    let booted = await_marker(&mut qemu, VM_MARKER, began)?;
    let ready = await_marker(&mut qemu, VM_READY_MARKER, began)?;
    Ok((booted, ready))
}

/// Connects to a QMP socket QEMU may not have made yet.
fn monitor(socket: &Path) -> anyhow::Result<QmpClient> {
    let began = Instant::now();
    loop {
        match QmpClient::connect(socket) {
            Ok(client) => return Ok(client),
            Err(_) if began.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(error) => return Err(error).context("connect to QMP"),
        }
    }
}

/// One migration of a booted guest: (downtime, total time) as QEMU says.
fn migrate_once(
    dir: &Path,
    accel: Accel,
    assets: &corral_testkit::VmAssets,
) -> anyhow::Result<(Duration, Duration)> {
    let began = Instant::now();
    let mut source = spawn(config(dir, "source", accel, assets))?;
    await_marker(&mut source, VM_READY_MARKER, began)?;
    let incoming: PathBuf = dir.join("incoming.sock");
    let _ = std::fs::remove_file(&incoming);
    let mut target_config = config(dir, "target", accel, assets);
    target_config.incoming = Some(incoming.clone());
    let target = spawn(target_config)?;
    let began = Instant::now();
    while !incoming.exists() {
        if began.elapsed() > Duration::from_secs(10) {
            bail!("the target QEMU never listened on {}", incoming.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client = monitor(&source.config.qmp_socket)?.slow(Duration::from_secs(30));
    migration::start(&mut client, &incoming).context("start the migration")?;
    let began = Instant::now();
    let (downtime, total) = loop {
        match migration::progress(&migration::query(&mut client)?) {
            Progress::Completed {
                downtime_ms,
                total_ms,
            } => break (downtime_ms, total_ms),
            Progress::Failed(why) => bail!("the migration failed: {why}"),
            _ if began.elapsed() > Duration::from_secs(300) => {
                bail!("the migration took over 300 s")
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let state = monitor(&target.config.qmp_socket)?.query_status()?;
    if !state.running {
        bail!("the target does not run the guest after the migration ({state:?})");
    }
    drop(source);
    Ok((
        Duration::from_millis(downtime),
        Duration::from_millis(total),
    ))
}

fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

fn spread(mut samples: Vec<Duration>, show: fn(Duration) -> String) -> String {
    samples.sort_unstable();
    let (Some(mid), Some(min), Some(max)) = (median(&samples), samples.first(), samples.last())
    else {
        return "| - | - | - |".into();
    };
    format!("| {} | {} | {} |", show(mid), show(*min), show(*max))
}

fn millis(duration: Duration) -> String {
    format!("{} ms", duration.as_millis())
}

pub async fn run(args: VmStartArgs) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(&args)).await?
}

fn run_blocking(args: &VmStartArgs) -> anyhow::Result<()> {
    let assets = corral_testkit::vm_assets();
    let dir = tempfile::tempdir()?;
    let mut accels = vec![Accel::Tcg];
    let kvm_verdict = if args.tcg_only {
        "not probed (--tcg-only)".to_string()
    } else {
        let verdict = kvm::probe(Path::new(QEMU), dir.path(), Duration::from_secs(5));
        if verdict == KvmProbe::Usable {
            accels.push(Accel::Kvm);
        }
        verdict.feature()
    };
    println!("machine: {}", machine::describe());
    println!("load before: {}", machine::load());
    println!("KVM: {kvm_verdict}");
    println!();
    println!("| QEMU spawn → | median | min | max |");
    println!("|---|---:|---:|---:|");
    for accel in &accels {
        let (mut booted, mut ready) = (Vec::new(), Vec::new());
        for _ in 0..args.boots {
            let (b, r) = boot_once(dir.path(), *accel, &assets)?;
            booted.push(b);
            ready.push(r);
        }
        println!("| `{VM_MARKER}` ({accel}) {}", spread(booted, seconds));
        println!(
            "| `{VM_READY_MARKER}` ({accel}, disk formatted and mounted) {}",
            spread(ready, seconds)
        );
    }
    if args.migrations > 0 {
        let accel = *accels.last().unwrap_or(&Accel::Tcg);
        let (mut downtimes, mut totals) = (Vec::new(), Vec::new());
        for _ in 0..args.migrations {
            let (downtime, total) = migrate_once(dir.path(), accel, &assets)?;
            downtimes.push(downtime);
            totals.push(total);
        }
        println!(
            "| live migration downtime ({accel}, 64 MiB disk + 256 MiB guest) {}",
            spread(downtimes, millis)
        );
        println!(
            "| live migration total time ({accel}) {}",
            spread(totals, millis)
        );
    }
    println!();
    println!("load after: {}", machine::load());
    Ok(())
}
