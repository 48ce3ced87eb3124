//! What the benchmarks' end-to-end tests share: the corral binary they
//! drive and the checks that a benchmark left nothing behind.

#![allow(dead_code)]

use std::path::PathBuf;

/// `corral` next to `corral-bench` (a binary of another package cannot be
/// a dependency); panics with how to build it when it is missing.
pub fn corral_binary() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_corral-bench"));
    let corral = bench.with_file_name("corral");
    assert!(
        corral.is_file(),
        "the corral binary is missing at {}: build it first into the same target dir and \
         profile, e.g. `cargo build -p corral-cli` (or `--release` for release tests)",
        corral.display()
    );
    corral
}

/// Runs `corral-bench ARGS --corral <corral_binary()>`; panics with its
/// output unless it succeeds and prints its machine line first. Returns
/// its pid (which names the floor's cgroups) and its stdout.
pub fn run_bench(args: &[&str]) -> (u32, String) {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_corral-bench"))
        .args(args)
        .arg("--corral")
        .arg(corral_binary())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run corral-bench");
    let pid = child.id();
    let output = child.wait_with_output().expect("wait for corral-bench");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.starts_with("machine: "), "{stdout}");
    (pid, stdout)
}

/// The line of `stdout` (a benchmark's table) that starts with `row`;
/// panics with the whole output when there is none.
pub fn row<'a>(stdout: &'a str, row: &str) -> &'a str {
    stdout
        .lines()
        .find(|line| line.starts_with(row))
        .unwrap_or_else(|| panic!("missing row {row:?} in:\n{stdout}"))
}

/// Asserts the benchmark run `pid` left nothing behind: no mount under the
/// benchmarks' temp dirs, no runc floor cgroup, no runsc sandbox or gofer
/// whose state dir is in one of those dirs.
pub fn assert_nothing_left(pid: u32) {
    let left = mounts_left();
    assert!(left.is_empty(), "mounts left behind: {left:#?}");
    assert_eq!(
        floor_cgroups(pid),
        Vec::<PathBuf>::new(),
        "floor cgroups left"
    );
    let processes = processes_left();
    assert!(
        processes.is_empty(),
        "processes left behind: {processes:#?}"
    );
}

/// runsc's processes (`runsc-sandbox`, `runsc-gofer`: a gVisor container
/// that was never deleted) whose command line names a benchmark temp dir
/// (`$TMPDIR/corral-bench-*`). Only runsc's: the benchmarks that are not
/// run one at a time (apply, scale) have etcd and corral processes of
/// their own under such dirs.
fn processes_left() -> Vec<String> {
    let tmp = std::env::temp_dir().join("corral-bench-");
    let tmp = tmp.to_string_lossy();
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.starts_with("runsc") && cmdline.contains(&*tmp))
        .collect()
}

/// Mounts under the benchmarks' temp dirs (`$TMPDIR/corral-bench-*`).
fn mounts_left() -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let tmp = std::env::temp_dir().join("corral-bench-");
    mounts
        .lines()
        .filter(|line| line.contains(&*tmp.to_string_lossy()))
        .map(str::to_string)
        .collect()
}

/// The runc floor's cgroup parent (`corral-bench-floor-<pid>`) of the
/// benchmark run `pid`, wherever it still exists.
fn floor_cgroups(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|hierarchy| hierarchy.path().join(format!("corral-bench-floor-{pid}")))
        .filter(|dir| dir.exists())
        .collect()
}
