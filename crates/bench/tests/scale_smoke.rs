//! End to end: `corral-bench scale` starts `corral server`, joins hollow
//! nodes, starts pods on them, measures every row and prints the table. It
//! needs the `corral` binary built into the same target dir and profile (a
//! binary of another package cannot be a dependency) and fails with a clear
//! message when it is missing. About 15 s on a debug build.

mod common;

use std::process::Command;

use common::corral_binary;

#[test]
fn scale_benchmark_runs_end_to_end() {
    let output = Command::new(env!("CARGO_BIN_EXE_corral-bench"))
        .args([
            "scale",
            "--nodes",
            "2",
            "--sizes",
            "0,6",
            "--applies",
            "5",
            "--idle-seconds",
            "1",
            "--budget",
            "120s",
            "--corral",
        ])
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
    assert!(stdout.contains("### sqlite: 2 hollow nodes"), "{stdout}");
    assert!(
        stdout
            .contains("| pods running | 0 | 6 | goal (issue 14, at 10,000 pods) | met at 6 pods |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| hollow nodes Ready | 2 of 2 | 2 of 2 |"),
        "{stdout}"
    );
    assert!(stdout.contains("node/start-containers"), "{stdout}");
    assert!(!stdout.contains("not reached"), "{stdout}");
}
