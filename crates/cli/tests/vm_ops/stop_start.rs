//! `corral vm stop|start` on the ACPI guest of
//! `snapshots_restore_reset_and_a_clean_stop`: the VM is kept while
//! stopped, stays stopped across an agent restart, and boots again with
//! its data (docs/design/0041-vm-stop-start.md).

use std::time::{Duration, Instant};

use corral_testkit::VM_READY_MARKER;
use serde_json::Value;

use super::{common, console_log, type_line, wait_running};

/// QEMU's pid from a VM's status message (`qemu pid N under …`).
fn qemu_pid(vm: &Value) -> u32 {
    let message = vm["status"]["message"].as_str().unwrap_or_default();
    message
        .strip_prefix("qemu pid ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no QEMU pid in {message:?}"))
}

/// Whether process `pid` is the QEMU of the VM with `uid` (QEMU's `-name`
/// is `corral-` and the uid's first 12 letters and digits).
fn is_qemu_of(pid: u32, uid: &str) -> bool {
    let short: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&format!("corral-{short}")))
}

/// `corral vm stop`: QEMU gone, the VM kept (Stopped, same uid, its disk
/// there), explained, still stopped after the agent restarted; a second
/// stop writes nothing; `corral vm start` boots it again from its disk.
pub fn stop_keep_and_start(cluster: &mut common::Cluster, target: &str, uid: &str, disk: &str) {
    let vm = wait_running(cluster, target);
    let pid = qemu_pid(&vm);
    assert!(is_qemu_of(pid, uid), "pid {pid} is not the VM's QEMU");
    let seen = type_line(
        cluster,
        target,
        "echo kept > /mnt/kept; sync; test -e /mnt/kept && echo WROTE-KEPT-$((6*7))",
    );
    assert!(seen.contains("WROTE-KEPT-42"), "{seen}");
    let log = console_log(cluster, uid);
    let boots = |log: &std::path::Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches(VM_READY_MARKER)
            .count()
    };
    let boots_before = boots(&log);

    let began = Instant::now();
    let out = cluster.ok(&["vm", "stop", target, "-m", "maintenance"]);
    eprintln!(
        "vm stop (guest with an ACPI handler) took {:?}",
        began.elapsed()
    );
    assert!(out.contains("vm stop: maintenance"), "{out}");
    let vm = common::wait_for(
        &format!("{target} to be Stopped"),
        Duration::from_secs(60),
        || {
            let vm = cluster.get_json(target);
            (vm["status"]["phase"] == "Stopped").then_some(vm)
        },
    );
    assert_eq!(vm["status"]["runState"], "stopped", "{vm}");
    assert_eq!(vm["spec"]["running"], false, "{vm}");
    assert_eq!(vm["metadata"]["uid"].as_str(), Some(uid), "{vm}");
    assert!(!is_qemu_of(pid, uid), "QEMU (pid {pid}) still runs");
    // Its disk, its node and its address are kept.
    let volume_disk = cluster
        .data_dir
        .path()
        .join("volumes")
        .join(disk)
        .join("disk.qcow2");
    assert!(volume_disk.exists(), "{} is gone", volume_disk.display());
    assert!(vm["status"]["node"].is_string(), "{vm}");
    assert!(vm["status"]["address"].is_string(), "{vm}");
    let table = cluster.ok(&["get", target]);
    assert!(
        table.lines().next().unwrap_or_default().contains("PHASE"),
        "{table}"
    );
    assert!(table.contains(" Stopped "), "{table}");
    let described = cluster.ok(&["describe", target]);
    assert!(
        described.contains("Stopped (its spec keeps it stopped: spec.running: false"),
        "{described}"
    );
    // Why: stopped because the spec asks, by the person who asked.
    let history: Vec<Value> = serde_json::from_str(&cluster.ok(&["history", target, "-o", "json"]))
        .expect("history -o json is JSON");
    let stop = history.last().expect("a revision in history");
    assert_eq!(stop["message"], "vm stop: maintenance", "{stop}");
    let author = stop["author"].as_str().unwrap_or_default();
    let why = cluster.ok(&["why", target]);
    let first = why.lines().next().unwrap_or_default();
    assert!(
        first.contains("is stopped because its spec asks for it (spec.running: false)"),
        "{why}"
    );
    assert!(
        first.contains(&format!(
            "asked for by {author} in revision {}",
            stop["revision"]
        )),
        "{why}"
    );
    assert!(why.contains("stopped as its spec asks"), "{why}");

    // A second stop says so and writes nothing.
    let revision = vm["metadata"]["revision"].clone();
    let out = cluster.ok(&["vm", "stop", target]);
    assert!(out.contains("already stopped"), "{out}");
    assert_eq!(cluster.get_json(target)["metadata"]["revision"], revision);

    // A restart, a reset or a migration of a stopped VM is refused,
    // naming the field; a snapshot of it holds its disk (no memory).
    for (args, field) in [
        (vec!["vm", "restart", target], "spec.power"),
        (vec!["vm", "reset", target], "spec.power"),
        (
            vec!["vm", "migrate", target, "--to", "elsewhere"],
            "spec.migration",
        ),
    ] {
        let refused = cluster.fails(&args);
        assert!(
            refused.contains(&format!("{field}: the VM is stopped (spec.running: false)")),
            "{args:?}: {refused}"
        );
    }
    assert_eq!(cluster.get_json(target)["metadata"]["revision"], revision);
    cluster.ok(&["vm", "snapshot", target, "while-stopped"]);
    let list = cluster.ok(&["vm", "snapshot", "list", target]);
    let row = list
        .lines()
        .find(|line| line.starts_with("while-stopped "))
        .unwrap_or_else(|| panic!("no while-stopped in the list:\n{list}"));
    assert_eq!(row.split_whitespace().nth(1), Some("no"), "{list}");

    // The agent restarts (with the server: `corral up`): still stopped.
    assert!(cluster.terminate(), "corral up did not stop cleanly");
    cluster.restart();
    std::thread::sleep(Duration::from_secs(10));
    let vm = cluster.get_json(target);
    assert_eq!(vm["status"]["phase"], "Stopped", "{vm}");
    assert_eq!(boots(&log), boots_before, "the guest booted again");

    // Start: a fresh boot, with what it wrote before the stop.
    let out = cluster.ok(&["vm", "start", target]);
    assert!(out.contains("vm start"), "{out}");
    let vm = wait_running(cluster, target);
    assert_ne!(qemu_pid(&vm), pid);
    assert_eq!(boots(&log), boots_before + 1);
    let seen = type_line(
        cluster,
        target,
        "test -e /mnt/kept && echo STILL-KEPT-$((6*7)) || echo LOST-$((6*7))",
    );
    assert!(seen.contains("STILL-KEPT-42"), "{seen}");
    // (Its bare name is enough.)
    let name = target.strip_prefix("vm/").unwrap_or(target);
    let out = cluster.ok(&["vm", "start", name]);
    assert!(out.contains("already running"), "{out}");
    let history = cluster.ok(&["history", target]);
    assert!(history.contains("vm stop: maintenance"), "{history}");
    assert!(history.contains("vm start"), "{history}");
    cluster.ok(&["vm", "snapshot", "delete", target, "while-stopped"]);

    // A guest that powers itself off while its spec says it runs is a
    // QEMU exit like any other: the node starts it again (a restart
    // counted, no revision).
    let restarts = |vm: &Value| {
        let message = vm["status"]["message"].as_str().unwrap_or_default();
        message
            .rsplit("restarts ")
            .next()
            .and_then(|n| n.trim().parse::<u32>().ok())
            .unwrap_or_else(|| panic!("no restart count in {message:?}"))
    };
    let before = restarts(&wait_running(cluster, target));
    let revision = cluster.get_json(target)["metadata"]["revision"].clone();
    // (The console ends with QEMU: its answer does not matter.)
    let _ = cluster.corral_with_stdin(&["console", target], Some("poweroff -f\n"));
    let vm = common::wait_for(
        "the powered-off guest to run again",
        Duration::from_secs(120),
        || {
            let vm = cluster.get_json(target);
            (vm["status"]["phase"] == "Running" && restarts(&vm) == before + 1).then_some(vm)
        },
    );
    assert_eq!(vm["metadata"]["revision"], revision, "{vm}");
}
