//! Removing what containers leave on this machine: runc containers under a
//! `--root`, mounts below a directory, and cgroup directories. Shared by the
//! corral node (whose agent keeps containers running after it stops, by
//! design) and the runc floor. Best effort: every step is tried even when an
//! earlier one failed, and nothing outside the given paths is touched.

use std::path::Path;
use std::process::{Command, Stdio};

/// Removes what `corral up --data-dir data_dir` left: containers of both
/// runtimes (runc, runsc), every mount below the data dir (overlay rootfs,
/// network namespace files), and the cgroups `/corral/<uid>` of every pod
/// under `data_dir/pods` and of `extra_uids`, in every hierarchy.
pub fn cleanup(data_dir: &Path, extra_uids: &[String]) {
    for (binary, state) in [("runc", "runc"), ("runsc", "runsc")] {
        let root = data_dir.join(state);
        if root.exists() {
            delete_all_containers(binary, &root);
        }
    }
    kill_runsc_below(data_dir);
    corral_runtime::mounts::unmount_all_under(data_dir);
    let mut uids: Vec<String> = std::fs::read_dir(data_dir.join("pods"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    uids.extend(extra_uids.iter().cloned());
    uids.sort();
    uids.dedup();
    for uid in uids {
        remove_cgroup(&Path::new("corral").join(uid));
    }
}

/// Kills gVisor sandbox and gofer processes of containers under
/// `data_dir` that `runsc delete --force` left (pods still being torn down
/// when corral stopped), and a KVM probe's QEMU the agent had running.
fn kill_runsc_below(data_dir: &Path) {
    for (pid, cmdline) in processes_naming(data_dir) {
        if cmdline.starts_with("runsc") || cmdline.starts_with("qemu-system") {
            kill(&pid);
        }
    }
}

/// Every process whose command line names `dir`: its pid and command line
/// (arguments joined by NUL). A scan of the process table, for clean-ups.
pub fn processes_naming(dir: &Path) -> Vec<(String, String)> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).into_owned();
            let pid = entry.file_name().to_string_lossy().into_owned();
            (cmdline.contains(&needle) && pid.parse::<u32>().is_ok()).then_some((pid, cmdline))
        })
        .collect()
}

/// `kill -9 PID`.
pub fn kill(pid: &str) {
    let _ = Command::new("kill").arg("-9").arg(pid).status();
}

/// `runc --root ROOT list`, then `delete --force` of each.
pub fn delete_all_containers(binary: &str, root: &Path) {
    let listed = Command::new(binary)
        .arg(format!("--root={}", root.display()))
        // `--quiet`, not `-q`: runsc knows only the long flag, and its
        // usage text on stdout would list no container.
        .args(["list", "--quiet"])
        .stderr(Stdio::null())
        .output();
    let Ok(listed) = listed else {
        return;
    };
    for id in String::from_utf8_lossy(&listed.stdout).lines() {
        let _ = Command::new(binary)
            .arg(format!("--root={}", root.display()))
            .args(["delete", "--force", id.trim()])
            .stderr(Stdio::null())
            .status();
    }
}

/// Removes the cgroup directory `relative` (e.g. `corral/<uid>`) and its
/// direct children in every hierarchy ([`corral_testkit::reboot::remove_cgroup`]).
pub fn remove_cgroup(relative: &Path) {
    corral_testkit::reboot::remove_cgroup(relative);
}
