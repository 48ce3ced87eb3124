//! The cgroups a node's pods and VMs leave behind once their processes are
//! gone: `/corral/<uid>` (with a child per container) and `/corral/vm-<uid>`
//! in every hierarchy. The agent leaves them when it stops (its pods and
//! VMs outlive it by design); whoever throws the whole node away — `corral
//! lab down`, a test's cleanup — removes them with [`remove`].

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long to wait for killed QEMUs to leave their cgroups.
const VM_EXIT_WAIT: Duration = Duration::from_secs(2);
const VM_EXIT_POLL: Duration = Duration::from_millis(100);

/// Removes the cgroups of every pod (`<data_dir>/pods/<uid>`) and VM
/// (`<data_dir>/vms/<uid>`) of the node whose data dir is `data_dir`, in
/// every hierarchy under `/sys/fs/cgroup`. Best effort: a cgroup that
/// still holds a process is left. VMs' cgroups are retried for a moment,
/// since a QEMU killed just before takes a little while to leave.
pub fn remove(data_dir: &Path) {
    remove_under(Path::new("/sys/fs/cgroup"), data_dir);
}

fn remove_under(cgroup_root: &Path, data_dir: &Path) {
    let hierarchies: Vec<PathBuf> = children(cgroup_root).collect();
    for pod in children(&data_dir.join("pods")) {
        let Some(uid) = pod.file_name() else { continue };
        for hierarchy in &hierarchies {
            let cgroup = hierarchy.join("corral").join(uid);
            for container in children(&cgroup) {
                let _ = std::fs::remove_dir(container);
            }
            let _ = std::fs::remove_dir(&cgroup);
        }
    }
    let vms: Vec<String> = children(&data_dir.join("vms"))
        .filter_map(|vm| Some(format!("vm-{}", vm.file_name()?.to_string_lossy())))
        .collect();
    let attempts = VM_EXIT_WAIT.as_millis() / VM_EXIT_POLL.as_millis();
    for _ in 0..attempts {
        let mut left = false;
        for vm in &vms {
            for hierarchy in &hierarchies {
                let cgroup = hierarchy.join("corral").join(vm);
                left |= std::fs::remove_dir(&cgroup).is_err() && cgroup.exists();
            }
        }
        if !left {
            break;
        }
        std::thread::sleep(VM_EXIT_POLL);
    }
}

fn children(dir: &Path) -> impl Iterator<Item = PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_the_pods_and_vms_cgroups_in_every_hierarchy_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let cgroups = root.path().join("cgroup");
        let data = root.path().join("data");
        std::fs::create_dir_all(data.join("pods/p1")).unwrap();
        std::fs::create_dir_all(data.join("vms/v1")).unwrap();
        for hierarchy in ["memory", "cpu"] {
            let corral = cgroups.join(hierarchy).join("corral");
            std::fs::create_dir_all(corral.join("p1/web")).unwrap();
            std::fs::create_dir_all(corral.join("vm-v1")).unwrap();
            std::fs::create_dir_all(corral.join("other-pod")).unwrap();
        }
        remove_under(&cgroups, &data);
        for hierarchy in ["memory", "cpu"] {
            let corral = cgroups.join(hierarchy).join("corral");
            assert!(!corral.join("p1").exists(), "{hierarchy}: the pod's cgroup");
            assert!(
                !corral.join("vm-v1").exists(),
                "{hierarchy}: the VM's cgroup"
            );
            assert!(
                corral.join("other-pod").exists(),
                "{hierarchy}: another node's pod"
            );
        }
        assert!(data.join("pods/p1").exists(), "the data dir is not touched");
    }
}
