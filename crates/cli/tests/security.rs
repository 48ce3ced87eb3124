//! End-to-end acceptance of the default container sandbox, two-party
//! opt-in and gVisor, with real runc/runsc containers on one node, looked
//! at from inside (`corral exec`) and from the host (`/proc`). Needs root,
//! runc, runsc and busybox-static; fails (never skips) without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Cluster, wait_for};

fn pod(name: &str, extra_spec: &str, command: &str) -> String {
    format!(
        "kind: Pod
metadata: {{name: {name}}}
spec:
{extra_spec}  containers:
    - name: main
      image: local/busybox:1
      command: [sh, -c, \"{command}\"]
"
    )
}

fn running(cluster: &Cluster, name: &str) {
    wait_for(
        &format!("pod/{name} to run"),
        Duration::from_secs(60),
        || {
            let pod = cluster.get_json(&format!("pod/{name}"));
            (pod["status"]["phase"] == "Running"
                && pod["status"]["containers"][0]["state"] == "running")
                .then_some(())
        },
    );
}

/// Runs `script` in the pod's container; (exit code, stdout + stderr).
fn sh(cluster: &Cluster, name: &str, script: &str) -> (i32, String) {
    let output = cluster.corral(&["exec", &format!("pod/{name}"), "--", "sh", "-c", script]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

fn sh_ok(cluster: &Cluster, name: &str, script: &str) -> String {
    let (code, text) = sh(cluster, name, script);
    assert_eq!(code, 0, "`{script}` in pod/{name}: {text}");
    text
}

/// The value of `field` in a `/proc/PID/status` text.
fn status_field<'a>(status: &'a str, field: &str) -> &'a str {
    status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

/// The host pid of the process whose command line is exactly `argv`.
fn host_pid(argv: &[&str]) -> u32 {
    let wanted = argv.join("\0") + "\0";
    wait_for(
        "the container process on the host",
        Duration::from_secs(10),
        || {
            std::fs::read_dir("/proc")
                .ok()?
                .flatten()
                .find_map(|entry| {
                    let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                    let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
                    (cmdline == wanted.as_bytes()).then_some(pid)
                })
        },
    )
}

const STANDARD_DEV: &[&str] = &[
    "console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr",
    "stdin", "stdout", "tty", "urandom", "zero",
];

#[test]
fn a_default_container_is_sandboxed() {
    let cluster = &common::start_node();
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("sandboxed.yaml", &pod("sandboxed", "", "exec sleep 3601")),
    ]);
    running(cluster, "sandboxed");

    let inside = sh_ok(cluster, "sandboxed", "id -u; id -g; cat /proc/self/status");
    let mut lines = inside.lines();
    let uid: u32 = lines.next().unwrap().trim().parse().unwrap();
    assert_ne!(uid, 0, "runs as non-root inside: {inside}");
    assert_eq!(uid, 65_534, "busybox's user is root, so nobody: {inside}");
    assert_eq!(
        status_field(&inside, "CapEff"),
        "0000000000000000",
        "{inside}"
    );
    assert_eq!(
        status_field(&inside, "CapBnd"),
        "0000000000000000",
        "{inside}"
    );
    assert_eq!(status_field(&inside, "NoNewPrivs"), "1", "{inside}");
    assert_eq!(status_field(&inside, "Seccomp"), "2", "{inside}");

    // From the host: the container's process runs as an unprivileged host
    // uid from the pod's own range.
    let pid = host_pid(&["sleep", "3601"]);
    let host = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let host_uid: u32 = status_field(&host, "Uid")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(host_uid, 0, "{host}");
    assert!(
        host_uid >= 1 << 20,
        "a uid from the pod's range: {host_uid}"
    );
    let uid_map = sh_ok(cluster, "sandboxed", "cat /proc/self/uid_map");
    let fields: Vec<u32> = uid_map
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    assert_eq!(fields[0], 0, "{uid_map}");
    assert_eq!(fields[1] + 65_534, host_uid, "{uid_map}");

    let (code, text) = sh(cluster, "sandboxed", "mount -t tmpfs none /mnt");
    assert_ne!(code, 0, "mount must fail: {text}");
    let (code, text) = sh(cluster, "sandboxed", "unshare -U true");
    assert_ne!(code, 0, "unshare -U must fail: {text}");
    assert!(
        text.contains("Operation not permitted"),
        "refused by seccomp: {text}"
    );
    let (code, text) = sh(cluster, "sandboxed", "touch /written");
    assert_ne!(code, 0, "the rootfs is read-only: {text}");
    // The scratch directories are writable, by the container's own user.
    for scratch in ["/tmp", "/var/tmp", "/run"] {
        let owner = sh_ok(
            cluster,
            "sandboxed",
            &format!(
                "echo hi > {scratch}/ok && cat {scratch}/ok && stat -c '%u %a' {scratch}/ok {scratch}"
            ),
        );
        let lines: Vec<&str> = owner.lines().collect();
        assert_eq!(lines[0], "hi", "{scratch}: {owner}");
        assert!(lines[1].starts_with("65534 "), "{scratch}: {owner}");
        assert_eq!(lines[2], "0 1777", "{scratch}: {owner}");
    }

    let dev = sh_ok(cluster, "sandboxed", "ls -A /dev");
    for entry in dev.split_whitespace() {
        assert!(
            STANDARD_DEV.contains(&entry),
            "/dev holds only the standard nodes, found {entry:?} in {dev}"
        );
    }
    // Masked where the kernel has it (bound over by /dev/null), absent
    // where it does not: either way not one byte of kernel memory.
    let kcore = sh(
        cluster,
        "sandboxed",
        "head -c 16 /proc/kcore 2>/dev/null | wc -c",
    );
    assert_eq!(kcore.1.trim(), "0", "/proc/kcore yields nothing: {kcore:?}");
    let (code, text) = sh(cluster, "sandboxed", "echo 1 > /proc/sys/kernel/panic");
    assert_ne!(code, 0, "/proc/sys is read-only: {text}");

    let explained = cluster.ok(&["explain-security", "pod/sandboxed"]);
    assert!(explained.contains("non-root"), "{explained}");
}

/// A program that writes to its read-only root is told how to give it
/// somewhere to write.
#[test]
fn a_write_to_the_read_only_root_says_how_to_fix_it() {
    let cluster = &common::start_node();
    let manifest = pod(
        "writer",
        "  restartPolicy: Never\n",
        "echo state > /etc/app.state",
    );
    cluster.ok(&["apply", "-f", &cluster.manifest("writer.yaml", &manifest)]);
    let why = wait_for(
        "why pod/writer to explain the failed write",
        Duration::from_secs(60),
        || {
            let why = cluster.ok(&["why", "pod/writer"]);
            why.contains("read-only file system").then_some(why)
        },
    );
    assert!(
        why.contains("exited with code") && why.contains("give the path it writes a volume"),
        "{why}"
    );
    // Which is what a volume under a scratch directory does.
    let with_volume = "kind: Pod
metadata: {name: keeper}
spec:
  volumes: [{name: state, emptyDir: {}}]
  containers:
    - name: main
      image: local/busybox:1
      command: [sh, -c, 'echo kept > /run/state/app && echo scratch > /run/pid && exec sleep 3600']
      mounts: [{volume: state, path: /run/state}]
";
    cluster.ok(&["apply", "-f", &cluster.manifest("keeper.yaml", with_volume)]);
    running(cluster, "keeper");
    assert_eq!(
        sh_ok(cluster, "keeper", "cat /run/state/app /run/pid"),
        "kept\nscratch\n"
    );
}

/// A whole i386 program (118 bytes, no libc): an ELF header, one
/// loadable segment, code that writes "ok\n" to stdout with `int 0x80`
/// and exits 0.
fn i386_program() -> Vec<u8> {
    const BASE: u32 = 0x0804_8000;
    const CODE_AT: u32 = 52 + 32;
    let code_len = 31;
    let message = b"ok\n";
    let size = CODE_AT + code_len + 3;
    let mut elf = b"\x7fELF\x01\x01\x01".to_vec();
    elf.resize(16, 0);
    for half in [2u16, 3] {
        elf.extend(half.to_le_bytes()); // executable, i386
    }
    for word in [1, BASE + CODE_AT, 52, 0, 0] {
        elf.extend(word.to_le_bytes()); // version, entry, phoff, shoff, flags
    }
    for half in [52u16, 32, 1, 0, 0, 0] {
        elf.extend(half.to_le_bytes()); // header sizes, one program header
    }
    for word in [1, 0, BASE, BASE, size, size, 5, 0x1000] {
        elf.extend(word.to_le_bytes()); // PT_LOAD of the whole file, r-x
    }
    let mut code = Vec::new();
    for (opcode, operand) in [
        (0xb8u8, 4u32),
        (0xbb, 1),
        (0xb9, BASE + CODE_AT + code_len),
        (0xba, 3),
    ] {
        code.push(opcode); // mov eax/ebx/ecx/edx: write(1, message, 3)
        code.extend(operand.to_le_bytes());
    }
    code.extend([0xcd, 0x80, 0xb8, 1, 0, 0, 0, 0x31, 0xdb, 0xcd, 0x80]); // int 0x80; exit(0)
    assert_eq!(code.len(), code_len as usize);
    elf.extend(code);
    elf.extend(message);
    assert_eq!(elf.len(), size as usize);
    elf
}

/// A shell command writing `bytes` to `path` with busybox's `printf`
/// (octal escapes inside double quotes), then making it executable.
fn write_program(path: &str, bytes: &[u8]) -> String {
    let escaped: String = bytes.iter().map(|b| format!("\\{b:03o}")).collect();
    format!("printf \"{escaped}\" > {path} && chmod 755 {path}")
}

/// The default profile admits x86_64 system calls only: a 32-bit program
/// is killed at its first call, `why` says what to ask for, and the
/// `32-bit-syscalls` relaxation (both halves) lets it run.
#[test]
fn a_32_bit_program_runs_only_with_the_32_bit_syscalls_relaxation() {
    let cluster = &common::start_node();
    let write = write_program("/tmp/i386", &i386_program());
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("native.yaml", &pod("native", "", "exec sleep 3604")),
    ]);
    running(cluster, "native");
    let (_, text) = sh(
        cluster,
        "native",
        &format!("{write} && /tmp/i386; echo rc=$?"),
    );
    assert!(text.contains("rc=159"), "killed by SIGSYS: {text}");
    assert!(!text.contains("ok"), "{text}");

    // As a container's own program: its exit says what to ask for.
    let failing = format!(
        "kind: Pod
metadata: {{name: old32}}
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: local/busybox:1
      command: [sh, -c, '{write} && exec /tmp/i386']
"
    );
    cluster.ok(&["apply", "-f", &cluster.manifest("old32.yaml", &failing)]);
    let why = wait_for(
        "why pod/old32 to explain the SIGSYS",
        Duration::from_secs(60),
        || {
            let why = cluster.ok(&["why", "pod/old32"]);
            why.contains("SIGSYS").then_some(why)
        },
    );
    assert!(why.contains("32-bit-syscalls"), "{why}");

    common::grant(cluster, "legacy", &["32-bit-syscalls"]);
    let relaxed = pod(
        "legacy",
        "  security: {relax: [32-bit-syscalls]}\n",
        "exec sleep 3605",
    );
    cluster.ok(&["apply", "-f", &cluster.manifest("legacy.yaml", &relaxed)]);
    running(cluster, "legacy");
    let ran = sh_ok(cluster, "legacy", &format!("{write} && /tmp/i386"));
    assert_eq!(ran, "ok\n");
    let explained = cluster.ok(&["explain-security", "pod/legacy"]);
    assert!(
        explained.contains("allowed (i386, x32)") && explained.contains("Policy legacy"),
        "{explained}"
    );
    let explained = cluster.ok(&["explain-security", "pod/native"]);
    assert!(explained.contains("refused (x86_64 only)"), "{explained}");
}

#[test]
fn relaxations_need_both_halves() {
    let cluster = &common::start_node();
    let root_pod = pod(
        "rooted",
        "  security: {relax: [run-as-root]}\n",
        "exec sleep 3602",
    );

    // The pod asks, nobody grants: refused, naming the missing Policy.
    let refused = cluster.fails(&["apply", "-f", &cluster.manifest("rooted.yaml", &root_pod)]);
    assert!(
        refused.contains("pod asks for run-as-root but no Policy grants it to namespace default"),
        "{refused}"
    );
    assert!(cluster.fails(&["get", "pod/rooted"]).contains("not found"));

    // A Policy grants, the pod does not ask: the default sandbox.
    common::grant(cluster, "root-ok", &["run-as-root"]);
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("plain.yaml", &pod("plain", "", "exec sleep 3603")),
    ]);
    running(cluster, "plain");
    assert_eq!(sh_ok(cluster, "plain", "id -u").trim(), "65534");
    let explained = cluster.ok(&["explain-security", "pod/plain"]);
    assert!(
        explained.contains(
            "Policy root-ok grants run-as-root to namespace default but the pod does not ask for it"
        ),
        "{explained}"
    );

    // Both halves: granted, and shown by explain-security.
    cluster.ok(&["apply", "-f", &cluster.manifest("rooted.yaml", &root_pod)]);
    running(cluster, "rooted");
    assert_eq!(sh_ok(cluster, "rooted", "id -u").trim(), "0");
    // Root inside its own user namespace only: no capabilities, and the
    // host sees an unprivileged uid.
    let status = sh_ok(cluster, "rooted", "cat /proc/self/status");
    assert_eq!(status_field(&status, "CapEff"), "0000000000000000");
    let pid = host_pid(&["sleep", "3602"]);
    let host = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert_ne!(
        status_field(&host, "Uid").split_whitespace().next(),
        Some("0")
    );
    let explained = cluster.ok(&["explain-security", "pod/rooted"]);
    assert!(
        explained.contains("root (0)") && explained.contains("Policy root-ok (run-as-root)"),
        "{explained}"
    );
}

#[test]
fn gvisor_pods_run_under_runsc() {
    let cluster = &common::start_node();
    wait_for("the node to report gVisor", Duration::from_secs(30), || {
        let node = cluster.ok(&["get", "node", "-o", "json"]);
        node.contains("\"gvisor\"").then_some(())
    });
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest(
            "gvisor.yaml",
            &pod("boxed", "  runtime: gvisor\n", "exec sleep 3604"),
        ),
    ]);
    running(cluster, "boxed");
    let dmesg = sh_ok(cluster, "boxed", "dmesg");
    assert!(
        dmesg.contains("gVisor"),
        "the kernel inside is gVisor's: {dmesg}"
    );
    assert_eq!(sh_ok(cluster, "boxed", "id -u").trim(), "65534");

    // A Policy makes gVisor the namespace's default: a pod naming no
    // runtime gets it, written into its spec.
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest(
            "sandboxed-ns.yaml",
            "kind: Policy
metadata: {name: gvisor-default}
spec:
  namespaces: [boxes]
  defaultRuntime: gvisor
",
        ),
    ]);
    cluster.ok(&[
        "apply",
        "-n",
        "boxes",
        "-f",
        &cluster.manifest("defaulted.yaml", &pod("defaulted", "", "exec sleep 3605")),
    ]);
    let boxed = || -> serde_json::Value {
        let text = cluster.ok(&["get", "pod/defaulted", "-n", "boxes", "-o", "json"]);
        serde_json::from_str(&text).unwrap()
    };
    let spec = boxed();
    assert_eq!(spec["spec"]["runtime"], "gvisor", "{spec}");
    wait_for("pod/defaulted to run", Duration::from_secs(60), || {
        let pod = boxed();
        (pod["status"]["phase"] == "Running").then_some(())
    });
    let output = cluster.corral(&["exec", "-n", "boxes", "pod/defaulted", "--", "dmesg"]);
    let dmesg = String::from_utf8_lossy(&output.stdout);
    assert!(dmesg.contains("gVisor"), "{dmesg}");
}

/// The deepest mount holding `path`: its mount point and file system type.
fn mount_of(path: &std::path::Path) -> (std::path::PathBuf, String) {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    corral_runtime::mounts::mounts(&table)
        .into_iter()
        .filter(|mount| path.starts_with(&mount.mount_point))
        .max_by_key(|mount| mount.mount_point.components().count())
        .map(|mount| (mount.mount_point, mount.fs_type))
        .unwrap()
}

/// The one container directory of pod `name` below `place` (`run` or
/// `containers`) of its directory on the node.
fn container_dir(cluster: &Cluster, name: &str, place: &str) -> std::path::PathBuf {
    let uid = cluster.get_json(&format!("pod/{name}"))["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = cluster.data_dir.path().join("pods").join(uid).join(place);
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "one container of pod/{name}: {entries:?}");
    entries[0].clone()
}

/// A read-only root's container files (bundle, overlay) live on a tmpfs
/// of the pod's, not on the node's disk; a writable root's stay on the
/// disk, where what the container writes goes. Neither outlives its pod.
#[test]
fn container_files_are_on_a_tmpfs_unless_the_root_is_writable() {
    let cluster = &common::start_node();
    common::grant(
        cluster,
        "writable-ok",
        &["writable-rootfs", "run-as-root", "no-user-namespace"],
    );
    // Root on the host's ids: the image's files are the host root's.
    let writable = pod(
        "writable",
        "  security: {relax: [writable-rootfs, run-as-root, no-user-namespace]}\n",
        "exec sleep 3606",
    );
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("ro.yaml", &pod("readonly", "", "exec sleep 3607")),
    ]);
    cluster.ok(&["apply", "-f", &cluster.manifest("rw.yaml", &writable)]);
    running(cluster, "readonly");
    running(cluster, "writable");

    let readonly = container_dir(cluster, "readonly", "run");
    let pod_dir = readonly.parent().unwrap().parent().unwrap().to_path_buf();
    let tmpfs = (pod_dir.join("run"), "tmpfs".to_string());
    assert_eq!(mount_of(&readonly.join("bundle")), tmpfs);
    assert_eq!(mount_of(&readonly.join("upper")), tmpfs);
    assert_eq!(mount_of(&readonly.join("rootfs")).1, "overlay");
    assert!(readonly.join("bundle/config.json").is_file());
    assert!(!pod_dir.join("containers").exists(), "nothing on the disk");

    // On the file system of the data dir itself, no mount of the pod's.
    let written = container_dir(cluster, "writable", "containers");
    let data_dir = mount_of(cluster.data_dir.path());
    assert_eq!(mount_of(&written.join("upper")), data_dir);
    assert_eq!(mount_of(&written.join("bundle")), data_dir);
    sh_ok(cluster, "writable", "echo kept > /written");
    assert_eq!(
        std::fs::read_to_string(written.join("upper/written")).unwrap(),
        "kept\n",
        "what the container writes is on the disk"
    );

    for name in ["readonly", "writable"] {
        cluster.ok(&["delete", &format!("pod/{name}")]);
    }
    wait_for("both pods to be gone", Duration::from_secs(60), || {
        ["readonly", "writable"]
            .iter()
            .all(|name| {
                !cluster
                    .corral(&["get", &format!("pod/{name}")])
                    .status
                    .success()
            })
            .then_some(())
    });
    for dir in [&pod_dir, written.parent().unwrap().parent().unwrap()] {
        assert!(!dir.exists(), "{} is removed", dir.display());
        assert!(corral_runtime::mounts::mounts_below(dir).is_empty());
    }
}
