//! One container under gVisor (`runsc`), seen from inside.

mod common;

use common::{args, busybox_fixture, container_id, create, read_log, run_detached, wait_exit};
use corral_runtime::bundle::{ContainerConfig, ProcessOverrides, merge_process};
use corral_runtime::oci::reap;
use corral_runtime::oci::{ExecSpec, ExitStatus, OciRuntime, RuncCli, Signal, Status};

/// The flags runsc needs on this machine: cgroup v1/v2 hybrid (cgroups are
/// left to the caller), no sandbox networking (the pod netns comes later).
fn runsc(fixture: &common::Fixture) -> RuncCli {
    corral_testkit::require_tool("runsc");
    RuncCli::new("runsc", fixture.dir.path().join("runsc-state")).with_global_args([
        "--rootless=false",
        "--network=none",
        "--ignore-cgroups",
    ])
}

fn config(
    fixture: &common::Fixture,
    id: &str,
    rootfs: &common::Rootfs,
    command: &[&str],
) -> ContainerConfig {
    let process = merge_process(
        &fixture.image.config,
        &ProcessOverrides {
            command: args(command),
            ..Default::default()
        },
    )
    .expect("merge");
    ContainerConfig::new(id, &rootfs.mounted.rootfs, Vec::new()).with_process(process)
}

#[test]
fn gvisor_runs_a_container_and_shows_its_kernel() {
    let fixture = busybox_fixture();
    // The sandbox pid is orphaned to us; runsc's other orphans (gofer,
    // helpers) are reaped by RuncCli's orphan sweep.
    reap::become_subreaper().expect("subreaper");
    let runtime = runsc(&fixture);
    let id = container_id("gvisor");
    let rootfs = fixture.mount(&id);
    let config = config(
        &fixture,
        &id,
        &rootfs,
        &["sh", "-c", "dmesg; echo exit-now"],
    );
    // As the agent starts a container: one `runsc run --detach`.
    let container = run_detached(&runtime, &rootfs, &config);
    let status = wait_exit(container.pid);
    let log = read_log(&container.log);
    assert_eq!(status, ExitStatus::Exited(0), "log: {log}");
    assert!(
        log.contains("gVisor"),
        "dmesg inside runsc mentions gVisor: {log}"
    );
    assert!(log.contains("exit-now"), "log: {log}");
}

#[test]
fn gvisor_exec_and_kill() {
    let fixture = busybox_fixture();
    // The sandbox pid is orphaned to us; runsc's other orphans (gofer,
    // helpers) are reaped by RuncCli's orphan sweep.
    reap::become_subreaper().expect("subreaper");
    let runtime = runsc(&fixture);
    let id = container_id("gvisor-sleep");
    let rootfs = fixture.mount(&id);
    let config = config(&fixture, &id, &rootfs, &["sleep", "300"]);
    let container = create(&runtime, &rootfs, &config);
    runtime.start(&id).expect("start");
    let state = runtime.state(&id).expect("state").expect("exists");
    assert_eq!(state.status, Status::Running);
    let out = runtime
        .exec_output(
            &id,
            &ExecSpec {
                args: args(&["uname", "-r"]),
                ..Default::default()
            },
        )
        .expect("exec");
    assert!(out.status.success(), "{out:?}");
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    assert_ne!(
        String::from_utf8_lossy(&out.stdout).trim(),
        host_release.trim(),
        "gVisor reports its own kernel release"
    );
    runtime.kill(&id, Signal::SIGKILL).expect("kill");
    // The sandbox exits with the shell convention for a signal death.
    let status = runtime.wait(&id, container.pid).expect("wait");
    assert_eq!(status, ExitStatus::Exited(137));
    assert_eq!(status.code(), ExitStatus::Signaled(9).code());
    runtime.delete(&id, true).expect("delete");
    assert_eq!(runtime.state(&id).expect("state"), None);
}
