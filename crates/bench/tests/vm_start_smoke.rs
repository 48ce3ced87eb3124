//! End to end: `corral-bench vm-start` with tiny numbers boots the test
//! kit's guest under TCG, migrates one to a second QEMU, prints every row
//! with a number in it, and leaves no QEMU of its own running. Needs
//! `qemu-system-x86_64`, `qemu-img` and the test kit's VM assets; fails
//! with a clear message when one is missing.

mod common;

use std::process::Command;

/// QEMUs whose command line names the benchmark's guests.
fn bench_qemus() -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .filter(|cmdline| {
            let text = String::from_utf8_lossy(cmdline);
            text.contains("qemu-system")
                && ["bench-source", "bench-target", "bench-boot"]
                    .iter()
                    .any(|name| text.contains(name))
        })
        .count()
}

#[test]
fn vm_start_benchmark_boots_and_migrates_a_guest() {
    corral_testkit::require_tool("qemu-system-x86_64");
    corral_testkit::require_tool("qemu-img");
    corral_testkit::vm_assets();
    let before = bench_qemus();
    let output = Command::new(env!("CARGO_BIN_EXE_corral-bench"))
        .args([
            "vm-start",
            "--boots",
            "1",
            "--migrations",
            "1",
            "--tcg-only",
        ])
        .output()
        .expect("run corral-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "corral-bench vm-start failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for row in [
        "| `CORRAL-VM-BOOTED` (tcg) | ",
        "| `CORRAL-VM-READY` (tcg, disk formatted and mounted) | ",
        "| live migration downtime (tcg, ",
        "| live migration total time (tcg) | ",
    ] {
        let line = common::row(&stdout, row);
        assert!(
            !line.contains("| - |") && line.chars().any(|c| c.is_ascii_digit()),
            "{line}"
        );
    }
    assert_eq!(bench_qemus(), before, "a QEMU of the benchmark is left");
}
