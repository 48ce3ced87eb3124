//! Real containers under runc (root): logs, exit codes, state, exec, kill,
//! delete, cgroup limits, read-only rootfs, and a shared pod network
//! namespace.

mod common;

use std::fs;
use std::time::Duration;

use common::{
    args, busybox_fixture, container_id, create, read_log, remove_cgroup, run_detached, wait_exit,
    wait_until,
};
use corral_runtime::bundle::{
    ContainerConfig, NetworkNamespace, ProcessOverrides, UserIds, merge_process,
    resolve_user_in_rootfs,
};
use corral_runtime::oci::netns::NetnsManager;
use corral_runtime::oci::reap::{self, ExitStatus};
use corral_runtime::oci::{ExecSpec, OciRuntime, Signal, Status};
use corral_testkit::{Defer, unique_name};

fn config_for(
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
    .expect("merge process");
    let mut config =
        ContainerConfig::new(id, &rootfs.mounted.rootfs, Vec::new()).with_process(process);
    config.user = resolve_user_in_rootfs(
        fixture.image.config.user.as_deref().unwrap_or(""),
        &rootfs.mounted.rootfs,
    )
    .expect("resolve user");
    config.hostname = Some("corral-test".into());
    config
}

#[test]
fn echo_goes_to_the_log_and_exit_code_is_collected() {
    let fixture = busybox_fixture();
    reap::become_subreaper().expect("subreaper");
    let runc = fixture.runc();
    let id = container_id("echo");
    let rootfs = fixture.mount(&id);
    let config = config_for(
        &fixture,
        &id,
        &rootfs,
        &[
            "sh",
            "-c",
            "echo hello from corral; echo to-stderr >&2; hostname",
        ],
    );
    let container = create(&runc, &rootfs, &config);
    let state = runc.state(&id).expect("state").expect("exists");
    assert_eq!(state.status, Status::Created);
    assert_eq!(state.pid, Some(container.pid));

    runc.start(&id).expect("start");
    assert_eq!(wait_exit(container.pid), ExitStatus::Exited(0));
    let log = read_log(&container.log);
    assert!(log.contains("hello from corral\n"), "log: {log:?}");
    assert!(log.contains("to-stderr\n"), "log: {log:?}");
    assert!(log.contains("corral-test\n"), "log: {log:?}");
    assert!(wait_until(Duration::from_secs(5), || {
        runc.state(&id).ok().flatten().map(|s| s.status) == Some(Status::Stopped)
    }));
    runc.delete(&id, false).expect("delete");
    assert_eq!(runc.state(&id).expect("state"), None);
}

/// runc runs from a sealed in-memory copy of itself, and a container's
/// process starts as `runc init` from that very copy: runc saw the seals
/// and skipped its own read-only bind mount and second exec.
#[test]
fn a_container_process_starts_from_the_sealed_copy_of_runc() {
    let fixture = busybox_fixture();
    reap::become_subreaper().expect("subreaper");
    let runc = fixture.runc();
    assert!(runc.sealed.is_some(), "runc was found and copied");
    let id = container_id("sealed");
    let rootfs = fixture.mount(&id);
    let config = config_for(&fixture, &id, &rootfs, &["true"]);
    let container = create(&runc, &rootfs, &config);
    // Created, not started: its process is still `runc init`.
    let exe = fs::read_link(format!("/proc/{}/exe", container.pid)).expect("its executable");
    assert!(
        exe.to_string_lossy().starts_with("/memfd:corral-runc"),
        "runc init runs {exe:?}, not the sealed copy"
    );
}

#[test]
fn failing_command_reports_its_exit_code() {
    let fixture = busybox_fixture();
    reap::become_subreaper().expect("subreaper");
    let runc = fixture.runc();
    let id = container_id("fail");
    let rootfs = fixture.mount(&id);
    let config = config_for(&fixture, &id, &rootfs, &["sh", "-c", "exit 3"]);
    let container = create(&runc, &rootfs, &config);
    runc.start(&id).expect("start");
    assert_eq!(wait_exit(container.pid), ExitStatus::Exited(3));
}

/// `run --detach` starts the container in one runtime command; one that
/// exits at once keeps its status although orphan sweeps run all along
/// (it may be reaped before its pid is tracked).
#[test]
fn run_detached_collects_the_status_of_a_container_that_exits_at_once() {
    let fixture = busybox_fixture();
    reap::become_subreaper().expect("subreaper");
    let runc = fixture.runc();
    let sweeping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sweeper = {
        let sweeping = sweeping.clone();
        std::thread::spawn(move || {
            while sweeping.load(std::sync::atomic::Ordering::Relaxed) {
                reap::reap_orphans();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let stop = Defer::new(move || sweeping.store(false, std::sync::atomic::Ordering::Relaxed));
    for round in 0..5 {
        let id = container_id(&format!("run{round}"));
        let rootfs = fixture.mount(&id);
        let config = config_for(&fixture, &id, &rootfs, &["sh", "-c", "echo ran; exit 4"]);
        let container = run_detached(&runc, &rootfs, &config);
        assert_eq!(
            wait_exit(container.pid),
            ExitStatus::Exited(4),
            "round {round}"
        );
        assert!(read_log(&container.log).contains("ran\n"));
    }
    drop(stop);
    sweeper.join().expect("sweeper");
}

#[test]
fn long_running_container_state_exec_limits_kill_delete() {
    let fixture = busybox_fixture();
    reap::become_subreaper().expect("subreaper");
    let runc = fixture.runc();
    let id = container_id("sleep");
    let rootfs = fixture.mount(&id);
    let cgroup = format!("/{}", unique_name("corral-test"));
    let cleanup_cgroup = cgroup.clone();
    let _cgroup_guard = Defer::new(move || remove_cgroup(&cleanup_cgroup));
    let mut config = config_for(&fixture, &id, &rootfs, &["sleep", "300"]);
    config.cgroup_path = Some(cgroup.clone());
    config.memory_limit_bytes = Some(64 << 20);
    config.cpu_limit_millicores = Some(500);
    config.pids_limit = Some(64);
    let container = create(&runc, &rootfs, &config);
    runc.start(&id).expect("start");

    let state = runc.state(&id).expect("state").expect("exists");
    assert_eq!(state.status, Status::Running);
    assert_eq!(state.pid, Some(container.pid));
    assert!(runc.list().expect("list").iter().any(|c| c.id == id));

    let out = runc
        .exec_output(
            &id,
            &ExecSpec {
                args: args(&["id"]),
                ..Default::default()
            },
        )
        .expect("exec id");
    assert!(out.status.success(), "exec failed: {out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "uid=0(root) gid=0(root)"
    );
    let out = runc
        .exec_output(
            &id,
            &ExecSpec {
                args: args(&["sh", "-c", "id -u; echo $GREETING; pwd"]),
                env: args(&["GREETING=hi"]),
                cwd: Some("/tmp".into()),
                user: Some(UserIds {
                    uid: 65534,
                    gid: 65534,
                }),
                tty: false,
            },
        )
        .expect("exec as nobody");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "65534\nhi\n/tmp\n");

    // This machine mounts cgroup v1 controllers under /sys/fs/cgroup/<controller>.
    let memory = format!("/sys/fs/cgroup/memory{cgroup}/memory.limit_in_bytes");
    assert_eq!(
        fs::read_to_string(&memory)
            .expect("read memory limit")
            .trim(),
        (64u64 << 20).to_string()
    );
    let quota = format!("/sys/fs/cgroup/cpu{cgroup}/cpu.cfs_quota_us");
    assert_eq!(
        fs::read_to_string(&quota).expect("read cpu quota").trim(),
        "50000"
    );
    let pids = format!("/sys/fs/cgroup/pids{cgroup}/pids.max");
    assert_eq!(
        fs::read_to_string(&pids).expect("read pids.max").trim(),
        "64"
    );
    let procs = fs::read_to_string(format!("/sys/fs/cgroup/memory{cgroup}/cgroup.procs"))
        .expect("cgroup.procs");
    assert!(procs.lines().any(|p| p == container.pid.to_string()));

    runc.kill(&id, Signal::SIGKILL).expect("kill");
    assert_eq!(wait_exit(container.pid), ExitStatus::Signaled(9));
    runc.delete(&id, false).expect("delete");
    assert_eq!(runc.state(&id).expect("state"), None);
    assert!(!runc.list().expect("list").iter().any(|c| c.id == id));
    assert!(
        !std::path::Path::new(&memory).exists(),
        "runc removed the container's cgroup"
    );
    assert!(matches!(
        runc.kill(&id, Signal::SIGTERM),
        Err(corral_runtime::oci::OciError::NotFound(_))
    ));
}

#[test]
fn force_delete_stops_a_running_container() {
    let fixture = busybox_fixture();
    reap::become_subreaper().expect("subreaper");
    let runc = fixture.runc();
    let id = container_id("force");
    let rootfs = fixture.mount(&id);
    let config = config_for(&fixture, &id, &rootfs, &["sleep", "300"]);
    let container = create(&runc, &rootfs, &config);
    runc.start(&id).expect("start");
    runc.delete(&id, true).expect("force delete");
    assert_eq!(runc.state(&id).expect("state"), None);
    assert_eq!(wait_exit(container.pid), ExitStatus::Signaled(9));
}

#[test]
fn readonly_rootfs_keeps_a_writable_tmp() {
    let fixture = busybox_fixture();
    reap::become_subreaper().expect("subreaper");
    let runc = fixture.runc();
    let id = container_id("ro");
    let rootfs = fixture.mount(&id);
    let mut config = config_for(
        &fixture,
        &id,
        &rootfs,
        &[
            "sh",
            "-c",
            "touch /tmp/ok && echo tmp-writable; touch /root/nope 2>/dev/null || echo root-readonly; cat /proc/kcore | wc -c",
        ],
    );
    config.readonly_rootfs = true;
    let container = create(&runc, &rootfs, &config);
    runc.start(&id).expect("start");
    assert_eq!(wait_exit(container.pid), ExitStatus::Exited(0));
    let log = read_log(&container.log);
    assert!(log.contains("tmp-writable\n"), "log: {log:?}");
    assert!(log.contains("root-readonly\n"), "log: {log:?}");
    assert!(log.ends_with("0\n"), "/proc/kcore is masked: {log:?}");
}

#[test]
fn containers_of_a_pod_share_its_network_namespace() {
    let fixture = busybox_fixture();
    reap::become_subreaper().expect("subreaper");
    let runc = fixture.runc();
    let netns = NetnsManager::new(fixture.dir.path().join("netns"));
    let pod = unique_name("pod");
    let netns_path = netns.create(&pod).expect("create netns");
    let cleanup = netns.clone();
    let cleanup_pod = pod.clone();
    let _netns_guard = Defer::new(move || {
        let _ = cleanup.remove(&cleanup_pod);
    });

    let server_id = container_id("server");
    let server_rootfs = fixture.mount(&server_id);
    let mut server = config_for(
        &fixture,
        &server_id,
        &server_rootfs,
        &["httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/etc"],
    );
    server.network = NetworkNamespace::Join(netns_path.clone());
    let server_container = create(&runc, &server_rootfs, &server);
    runc.start(&server_id).expect("start server");

    let client_id = container_id("client");
    let client_rootfs = fixture.mount(&client_id);
    let mut client = config_for(
        &fixture,
        &client_id,
        &client_rootfs,
        &[
            "sh",
            "-c",
            "ip -o link; for i in 1 2 3 4 5 6 7 8 9 10; do wget -q -O - http://127.0.0.1:8080/passwd && exit 0; sleep 0.2; done; exit 1",
        ],
    );
    client.network = NetworkNamespace::Join(netns_path.clone());
    let client_container = create(&runc, &client_rootfs, &client);
    runc.start(&client_id).expect("start client");
    let status = wait_exit(client_container.pid);
    let log = read_log(&client_container.log);
    assert_eq!(status, ExitStatus::Exited(0), "client log: {log}");
    assert!(log.contains("root:x:0:0"), "client log: {log}");
    let links: Vec<&str> = log.lines().filter(|l| l.contains(": <")).collect();
    assert_eq!(links.len(), 1, "only lo in the pod namespace: {links:?}");
    assert!(
        links[0].contains("lo:") && links[0].contains("UP"),
        "{links:?}"
    );

    // httpd is pid 1 of its namespace: it ignores SIGTERM (no handler).
    runc.kill(&server_id, Signal::SIGKILL).expect("kill server");
    wait_exit(server_container.pid);
    drop(client_container);
    drop(server_container);
    netns.remove(&pod).expect("remove netns");
    assert!(!netns_path.exists());
}

#[test]
fn a_pods_user_namespace_maps_its_ids_owns_its_network_and_leaves_no_helper() {
    corral_testkit::require_root();
    let dir = tempfile::tempdir().expect("temp dir");
    let netns = NetnsManager::new(dir.path().join("netns"));
    let name = unique_name("userns");
    let ids = corral_runtime::oci::userns::IdRange {
        host_base: 3_000_000_000,
        size: 65_536,
    };
    let pinned = netns
        .create_with_user_namespace(&name, ids)
        .expect("create the pod's namespaces");
    let cleanup = netns.clone();
    let cleanup_name = name.clone();
    let _guard = Defer::new(move || {
        let _ = cleanup.remove(&cleanup_name);
    });
    // A process entering the pinned user namespace sees the mapping.
    let nsenter = |args: &[&str]| {
        let output = std::process::Command::new("nsenter")
            .arg(format!("--user={}", pinned.user.display()))
            .arg(format!("--net={}", pinned.net.display()))
            .args(args)
            .output()
            .expect("nsenter");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let map = nsenter(&["cat", "/proc/self/uid_map"]);
    let fields: Vec<&str> = map.split_whitespace().collect();
    assert_eq!(fields, ["0", "3000000000", "65536"], "{map}");
    // The network namespace is the pod's own, with `lo` up.
    let links = nsenter(&["ip", "-o", "link"]);
    assert_eq!(links.lines().count(), 1, "{links}");
    assert!(links.contains("lo:") && links.contains("UP"), "{links}");
    // The helper that made them is gone and reaped.
    let helpers: Vec<String> = fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|entry| fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| {
            let ppid = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .nth(1);
            ppid == Some(&std::process::id().to_string())
        })
        .collect();
    assert!(helpers.is_empty(), "children left: {helpers:?}");
}
