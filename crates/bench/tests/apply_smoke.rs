//! End to end: `corral-bench apply` starts corral and etcd, runs every row,
//! prints the table and leaves no process behind. It needs the `corral`
//! binary built into the same target dir and profile (a binary of another
//! package cannot be a dependency), plus `etcd` and `etcdctl`; it fails with
//! a clear message when one is missing.

mod common;

use std::process::Command;

use common::corral_binary;

fn require_tool(name: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "{name} is not installed (Debian: apt-get install etcd-server etcd-client)"
    );
}

#[test]
fn apply_benchmark_runs_end_to_end() {
    require_tool("etcd");
    require_tool("etcdctl");
    let output = Command::new(env!("CARGO_BIN_EXE_corral-bench"))
        .args(["apply", "--requests", "20", "--clients", "1,2", "--corral"])
        .arg(corral_binary())
        .output()
        .expect("run corral-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.starts_with("machine: "), "{stdout}");
    for system in [
        "corral apply",
        "etcd v3 HTTP put",
        "etcdctl put (process per op)",
        "floor: write+fdatasync",
    ] {
        for clients in [1, 2] {
            let row = format!("| {system} | {clients} | 20 |");
            assert!(stdout.contains(&row), "missing row {row:?} in:\n{stdout}");
        }
    }
}
