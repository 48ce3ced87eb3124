//! End to end: `corral-bench pod-start` with tiny numbers starts corral,
//! runc, runsc and podman containers, prints every row, and leaves no
//! container, mount or cgroup behind. Root only; it needs the `corral`
//! binary built into the same target dir and profile, `runc`, `runsc`, `podman` and
//! `/bin/busybox`, and fails with a clear message when one is missing.

mod common;

#[test]
fn pod_start_benchmark_runs_end_to_end() {
    corral_testkit::require_root();
    corral_testkit::require_tool("runc");
    corral_testkit::require_tool("runsc");
    corral_testkit::require_tool("podman");
    corral_testkit::require_tool("/bin/busybox");
    let (pid, stdout) = common::run_bench(&[
        "pod-start",
        "--sequential",
        "2",
        "--concurrent",
        "2",
        "--updates",
        "2",
    ]);
    for (system, concurrency) in [
        ("corral: apply → running (watch)", "1 at a time"),
        ("corral: apply → running (watch)", "2 at once"),
        ("floor: runc run -d", "1 at a time"),
        ("floor: runc run -d", "2 at once"),
        ("corral, runtime: gvisor", "1 at a time"),
        ("floor: runsc run -d", "1 at a time"),
        ("peer: podman run -d", "1 at a time"),
        ("peer: podman run -d", "2 at once"),
        ("corral: in-place update (env)", "1 at a time"),
        ("corral: delete + create", "1 at a time"),
        ("peer: podman rm -f + run -d", "1 at a time"),
    ] {
        let row = format!("| {system} | {concurrency} | 2 |");
        assert!(stdout.contains(&row), "missing row {row:?} in:\n{stdout}");
    }
    assert!(stdout.contains("VmRSS"), "{stdout}");
    // Where the time went, per step, from the step logs.
    for row in [
        "| node/register | node |",
        "| node/create-sandbox | node |",
        "| node/start-containers | node |",
        "| node/stop-changed-containers | node |",
    ] {
        assert!(
            stdout.contains(row),
            "missing step row {row:?} in:\n{stdout}"
        );
    }
    // Nothing left: no mount under the benchmark's temp dirs, no floor cgroup.
    common::assert_nothing_left(pid);
}
