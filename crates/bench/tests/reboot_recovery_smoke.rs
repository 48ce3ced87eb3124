//! End to end: `corral-bench reboot-recovery` with two pods and two
//! rounds runs a server and a lone agent, reboots the node (simulated)
//! twice, prints every row with a number, and leaves no container, mount,
//! data dir or cgroup behind. Root only; it needs the `corral` binary
//! built into the same target dir and profile, `runc` and `/bin/busybox`,
//! and fails with a clear message when one is missing.

mod common;

use std::path::PathBuf;

#[test]
fn reboot_recovery_benchmark_runs_end_to_end() {
    corral_testkit::require_root();
    corral_testkit::require_tool("runc");
    corral_testkit::require_tool("/bin/busybox");
    let (pid, stdout) = common::run_bench(&["reboot-recovery", "--pods", "2", "--rounds", "2"]);
    for row in [
        "| corral: agent start → all 2 pods running | 2 | ",
        "| corral: agent start → first pod running | 2 | ",
        "| floor: 2 × runc run -d (corral's sandbox), one after another | 2 | ",
        "| floor: 2 × runc run -d (corral's sandbox), all at once | 2 | ",
        "| node/check-sandbox | ",
        "| node/start-containers | ",
    ] {
        let line = common::row(&stdout, row);
        assert!(line.contains(" ms |"), "no time in {line:?}");
    }
    for round in 1..=2 {
        assert!(
            stdout.contains(&format!("round {round}: first pod running after ")),
            "{stdout}"
        );
    }
    // Nothing left: the agent's data dir, any mount under the benchmark's
    // temp dirs, the floor's cgroups.
    let data_dir = stdout
        .lines()
        .find_map(|line| line.strip_prefix("agent data dir: "))
        .unwrap_or_else(|| panic!("no data dir in:\n{stdout}"));
    assert!(!PathBuf::from(data_dir).exists(), "{data_dir} is left");
    common::assert_nothing_left(pid);
}
