//! Reboot recovery, the pure part: telling a live pod sandbox from a stale
//! record. A reboot leaves the data dir as it was — pod records naming a
//! network namespace file, runc state naming init pids, container
//! directories where the rootfs was mounted — while everything those
//! paths stood for is gone: the files under `DATA/netns` are plain empty
//! files with no namespace mounted on them, the init processes are dead
//! (their pids may even belong to someone else now), the overlay mounts
//! and cgroups are gone. An agent that trusts the paths restarts
//! containers into a namespace that no longer exists (`runc create`:
//! "can't get final child's PID from pipe: EOF") forever.
//!
//! [`judge`] decides from [`SandboxFacts`] — what the kernel says is
//! behind each path, gathered by the pod's workload (`pods/recover.rs`) —
//! whether the sandbox is live (supervision goes on as usual), never made
//! (the start workflow makes it), or stale: then the pod is recovered as a
//! whole (the `recover` workflow, [`RECOVER_STEPS`]): what is left of it
//! cleared, its namespaces made and wired again, its volumes and data
//! prepared, every container meant to run started again. No I/O here.

use std::collections::BTreeMap;

use corral_workflow::PodStep;

/// What the kernel has behind a pinned namespace file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinned {
    /// A namespace is mounted on the file.
    Live,
    /// The file is there, but no namespace is mounted on it (what a reboot
    /// leaves of a pinned namespace).
    Unmounted,
    /// No file.
    Missing,
}

/// One container the pod's record says it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerFacts {
    /// The record says it runs (or waits to restart): false once it
    /// exited for good.
    pub meant_to_run: bool,
    /// The runtime knows the container and its init process runs (`runc
    /// state` checks the pid against the process's start time, so a pid
    /// reused after a reboot does not count).
    pub init_alive: bool,
}

/// What is behind the paths of one pod's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxFacts {
    /// The recorded network namespace file, if the record names one.
    pub netns: Option<Pinned>,
    /// The user namespace pinned beside it, when the pod has one.
    pub userns: Option<Pinned>,
    pub containers: BTreeMap<String, ContainerFacts>,
}

/// What to do with a pod's sandbox when the agent starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No sandbox was made yet: the pod's workflow makes it.
    NotMade,
    /// The namespaces are there: supervision restarts what exited, as
    /// after any restart of the agent.
    Live,
    /// The record outlived its sandbox: recover the pod whole. Each reason
    /// is a sentence naming what is gone.
    Stale { reasons: Vec<String> },
}

/// Whether the sandbox behind a pod's record is live, never made, or stale.
pub fn judge(facts: &SandboxFacts) -> Verdict {
    let Some(netns) = facts.netns else {
        return Verdict::NotMade;
    };
    let mut reasons = Vec::new();
    match netns {
        Pinned::Live => {}
        Pinned::Unmounted => reasons.push(
            "its network namespace is gone (the file is there, no namespace is mounted on it)"
                .to_string(),
        ),
        Pinned::Missing => reasons.push("its network namespace file is gone".to_string()),
    }
    match facts.userns {
        Some(Pinned::Unmounted) => reasons.push(
            "its user namespace is gone (the file is there, no namespace is mounted on it)"
                .to_string(),
        ),
        Some(Pinned::Missing) => reasons.push("its user namespace file is gone".to_string()),
        Some(Pinned::Live) | None => {}
    }
    if reasons.is_empty() {
        return Verdict::Live;
    }
    let dead: Vec<&str> = facts
        .containers
        .iter()
        .filter(|(_, c)| c.meant_to_run && !c.init_alive)
        .map(|(name, _)| name.as_str())
        .collect();
    if !dead.is_empty() {
        reasons.push(format!("no init process runs for {}", dead.join(", ")));
    }
    let orphaned: Vec<&str> = facts
        .containers
        .iter()
        .filter(|(_, c)| c.init_alive)
        .map(|(name, _)| name.as_str())
        .collect();
    if !orphaned.is_empty() {
        reasons.push(format!(
            "{} still run without the pinned namespaces (stopped and started again)",
            orphaned.join(", ")
        ));
    }
    Verdict::Stale { reasons }
}

/// The node steps of the `recover` workflow, in order, as the agent runs
/// them from local state (the server's built-in `recover` definition has
/// the same steps).
pub const RECOVER_STEPS: [PodStep; 5] = [
    PodStep::CheckSandbox,
    PodStep::ClearStaleSandbox,
    PodStep::CreateSandbox,
    PodStep::PrepareVolumes,
    PodStep::StartContainers,
];

pub use corral_api::workflow::{RecoveredStep, RecoveryReport};

#[cfg(test)]
mod tests {
    use super::*;

    fn container(meant_to_run: bool, init_alive: bool) -> ContainerFacts {
        ContainerFacts {
            meant_to_run,
            init_alive,
        }
    }

    fn facts(netns: Option<Pinned>, userns: Option<Pinned>) -> SandboxFacts {
        SandboxFacts {
            netns,
            userns,
            containers: BTreeMap::from([
                ("web".to_string(), container(true, false)),
                ("done".to_string(), container(false, false)),
            ]),
        }
    }

    #[test]
    fn a_record_without_a_namespace_has_no_sandbox_to_recover() {
        assert_eq!(judge(&facts(None, None)), Verdict::NotMade);
    }

    #[test]
    fn live_namespaces_are_live_whatever_the_containers_do() {
        // A dead container in a live sandbox is an ordinary exit:
        // supervision restarts it per policy.
        assert_eq!(judge(&facts(Some(Pinned::Live), None)), Verdict::Live);
        assert_eq!(
            judge(&facts(Some(Pinned::Live), Some(Pinned::Live))),
            Verdict::Live
        );
    }

    #[test]
    fn a_file_with_no_namespace_behind_it_is_stale() {
        // What a reboot leaves: the pinned files, nothing mounted on them.
        let Verdict::Stale { reasons } =
            judge(&facts(Some(Pinned::Unmounted), Some(Pinned::Unmounted)))
        else {
            panic!("not stale");
        };
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(reasons[0].contains("network namespace is gone"));
        assert!(reasons[1].contains("user namespace is gone"));
        // Only the container meant to run is named.
        assert_eq!(reasons[2], "no init process runs for web");
    }

    #[test]
    fn a_missing_file_is_stale_too() {
        let verdict = judge(&facts(Some(Pinned::Missing), None));
        assert!(
            matches!(&verdict, Verdict::Stale { reasons } if reasons[0] == "its network namespace file is gone"),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_lost_user_namespace_makes_the_sandbox_stale() {
        let verdict = judge(&facts(Some(Pinned::Live), Some(Pinned::Missing)));
        assert!(
            matches!(&verdict, Verdict::Stale { reasons } if reasons[0] == "its user namespace file is gone"),
            "{verdict:?}"
        );
    }

    #[test]
    fn containers_running_without_their_namespaces_are_named() {
        let mut facts = facts(Some(Pinned::Unmounted), None);
        facts
            .containers
            .insert("web".to_string(), container(true, true));
        let Verdict::Stale { reasons } = judge(&facts) else {
            panic!("not stale");
        };
        assert_eq!(
            reasons.last().map(String::as_str),
            Some("web still run without the pinned namespaces (stopped and started again)")
        );
    }
}
