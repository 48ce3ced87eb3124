//! Where a pod's cgroups are (`/corral/<uid>` in every hierarchy, a child
//! per container generation) and what the agent reads of them.

/// A container's cgroup below each hierarchy's root: one per generation,
/// so a container stopped for a new revision can be deleted from the
/// runtime while its successor already starts.
pub fn container_path(uid: &str, container: &str, generation: u64) -> String {
    format!("corral/{uid}/{container}-{generation}")
}

/// Whether the kernel's OOM killer killed a process of the container's
/// memory cgroup ([`container_path`], or `corral/<uid>/<container>` for one an
/// older agent started): the `oom_kill` count of cgroup v2's
/// `memory.events` or v1's `memory.oom_control`. Read when the container's
/// exit is noticed, before runc removes the cgroup.
pub fn oom_killed(uid: &str, container: &str, generation: u64) -> bool {
    let paths = [
        container_path(uid, container, generation),
        format!("corral/{uid}/{container}"),
    ];
    paths.iter().any(|path| {
        let v2 = format!("/sys/fs/cgroup/{path}/memory.events");
        let v1 = format!("/sys/fs/cgroup/memory/{path}/memory.oom_control");
        [v2, v1]
            .iter()
            .any(|file| std::fs::read_to_string(file).is_ok_and(|text| oom_kill_count(&text) > 0))
    })
}

/// The `oom_kill N` line of a memory controller's counters.
fn oom_kill_count(text: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix("oom_kill "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

/// Removes the pod's cgroup directories (`/corral/<uid>` in every
/// hierarchy) once its containers are gone; runc removes only the
/// containers' own.
pub fn remove_pod(uid: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for hierarchy in hierarchies.flatten() {
        let pod = hierarchy.path().join("corral").join(uid);
        if let Ok(children) = std::fs::read_dir(&pod) {
            for child in children.flatten().filter(|c| c.path().is_dir()) {
                let _ = std::fs::remove_dir(child.path());
            }
        }
        let _ = std::fs::remove_dir(&pod);
    }
}

#[cfg(test)]
mod tests {
    use super::oom_kill_count;

    #[test]
    fn oom_kills_are_read_from_either_cgroup_version() {
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(v2), 1);
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(oom_kill_count(v1), 3);
        assert_eq!(oom_kill_count("oom_kill_disable 0\nunder_oom 0\n"), 0);
    }
}
