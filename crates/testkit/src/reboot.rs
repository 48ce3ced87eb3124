//! A node's reboot, simulated, and what its agent runs, read from local
//! state and the kernel: shared by the reboot-recovery end-to-end test
//! (`crates/cli/tests/reboot_recovery.rs`) and `corral-bench
//! reboot-recovery`, so both measure the same thing.
//!
//! [`simulate_reboot`] leaves a node's data dir as a reboot does: every
//! container killed (runc's state dirs stay: they are on the data dir), every
//! mount below the data dir gone (overlay rootfs, the pinned namespace
//! files, the data tmpfs, the tmpfs of read-only containers' files) and
//! with them every pod namespace and veth, the pods' cgroups gone; the
//! files (pod records, images) as they were.
//!
//! [`pods_running`] says, per pod record, whether the pod runs: each
//! container meant to run has a live init (runc's `state.json`, checked
//! against the process's start time as `runc state` does, and no longer
//! waiting in `runc create`) inside the pod's pinned network namespace,
//! which holds the pod's address. It reads files only (`/proc`, runc's
//! state, the records), so polling it does not take the CPU from what it
//! measures, as spawning `runc state` and `nsenter ip` per pod would.

use std::collections::BTreeSet;
use std::net::Ipv6Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long the killed containers may take to die.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a reboot could not be simulated.
#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    #[error("cannot run runc under {root}")]
    Runc {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no containers to kill under {0}")]
    NoContainers(PathBuf),
    #[error("containers still running {KILL_TIMEOUT:?} after SIGKILL: {0:?}")]
    StillRunning(Vec<String>),
    #[error("cannot read the pod records under {path}")]
    Records {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pod record {path} is not JSON")]
    Record {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("pod record {0} names no network namespace")]
    NoNamespace(PathBuf),
    #[error("after the reboot {path} should be a plain file, but {state}")]
    Namespace { path: PathBuf, state: &'static str },
}

/// What a reboot does to the node's runtime state under `data_dir`:
/// processes, mounts, namespaces and cgroups go; files stay. Returns how
/// many containers were killed.
pub fn simulate_reboot(data_dir: &Path) -> Result<usize, RebootError> {
    let root = data_dir.join("runc");
    let runc = |args: &[&str]| {
        Command::new("runc")
            .arg(format!("--root={}", root.display()))
            .args(args)
            .output()
            .map_err(|source| RebootError::Runc {
                root: root.clone(),
                source,
            })
    };
    let listed = String::from_utf8_lossy(&runc(&["list", "-q"])?.stdout).into_owned();
    let ids: Vec<String> = listed.lines().map(|id| id.trim().to_string()).collect();
    if ids.is_empty() {
        return Err(RebootError::NoContainers(root));
    }
    for id in &ids {
        runc(&["kill", id, "KILL"])?;
    }
    // Their state dirs stay (they are on the data dir, not on /run), as
    // after a power cut: runc sees them stopped.
    let deadline = Instant::now() + KILL_TIMEOUT;
    loop {
        let mut alive = Vec::new();
        for id in &ids {
            if !String::from_utf8_lossy(&runc(&["state", id])?.stdout).contains("stopped") {
                alive.push(id.clone());
            }
        }
        if alive.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return Err(RebootError::StillRunning(alive));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    corral_runtime::mounts::unmount_all_under(data_dir);
    for pod in std::fs::read_dir(data_dir.join("pods"))
        .into_iter()
        .flatten()
        .flatten()
    {
        remove_cgroup(&Path::new("corral").join(pod.file_name()));
    }
    for (path, record) in local_records(data_dir)? {
        let netns = record["netns"]
            .as_str()
            .map(PathBuf::from)
            .ok_or_else(|| RebootError::NoNamespace(path.clone()))?;
        if !netns.exists() {
            return Err(RebootError::Namespace {
                path: netns,
                state: "it is gone (a reboot keeps the file)",
            });
        }
        if corral_runtime::oci::netns::exists(&netns) {
            return Err(RebootError::Namespace {
                path: netns,
                state: "a namespace is still mounted on it",
            });
        }
    }
    Ok(ids.len())
}

/// Removes the cgroup directory `relative` (e.g. `corral/<uid>`) and its
/// direct children in every hierarchy under `/sys/fs/cgroup` (each cgroup
/// v1 hierarchy, and cgroup v2 mounted there itself). Only empty cgroups
/// can be removed; others stay.
pub fn remove_cgroup(relative: &Path) {
    let hierarchies: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .collect();
    for hierarchy in hierarchies
        .iter()
        .map(PathBuf::as_path)
        .chain([Path::new("/sys/fs/cgroup")])
    {
        let dir = hierarchy.join(relative);
        for child in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if child.file_type().is_ok_and(|kind| kind.is_dir()) {
                let _ = std::fs::remove_dir(child.path());
            }
        }
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Every pod record of the agent's local state (`DATA/agent/pods/*.json`)
/// with its path, sorted by pod name.
pub fn local_records(data_dir: &Path) -> Result<Vec<(PathBuf, Value)>, RebootError> {
    let dir = data_dir.join("agent").join("pods");
    let entries = std::fs::read_dir(&dir).map_err(|source| RebootError::Records {
        path: dir.clone(),
        source,
    })?;
    let mut records = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|source| RebootError::Records {
            path: path.clone(),
            source,
        })?;
        let record = current_record(&bytes).map_err(|source| RebootError::Record {
            path: path.clone(),
            source,
        })?;
        records.push((path, record));
    }
    records.sort_by_key(|(_, record)| pod_name(record).to_string());
    Ok(records)
}

/// A record file's current record, as the agent reads it
/// (`corral_agent::state`, design 0049): its last whole line, or the file
/// as one JSON document.
fn current_record(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let whole = bytes
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(&bytes[..0], |end| &bytes[..end]);
    let last = whole.rsplit(|b| *b == b'\n').next().unwrap_or_default();
    match serde_json::from_slice::<Value>(last) {
        Ok(record) if record.is_object() => Ok(record),
        _ => serde_json::from_slice(bytes),
    }
}

fn pod_name(record: &Value) -> &str {
    record["pod"]["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
}

/// What the node runs of one pod, from its local record and the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub pod: String,
    /// The runtime ids of its running containers, by container name.
    pub runtime_ids: Vec<(String, String)>,
    /// Restarts recorded per container (a reboot is no crash).
    pub restarts: Vec<u64>,
    pub address: String,
}

/// Per pod record (sorted by pod name): what runs, or what is missing.
pub fn pods_running(data_dir: &Path) -> Result<Vec<Result<Running, String>>, RebootError> {
    Ok(local_records(data_dir)?
        .iter()
        .map(|(_, record)| running_locally(data_dir, record))
        .collect())
}

/// Every one of `pods` pod records running; otherwise the first thing
/// missing.
pub fn all_running(data_dir: &Path, pods: usize) -> Result<Vec<Running>, String> {
    let each = pods_running(data_dir).map_err(|error| error.to_string())?;
    if each.len() != pods {
        return Err(format!("{} pod records, not {pods}", each.len()));
    }
    each.into_iter().collect()
}

/// Whether the node has admitted the pod's revision (its start workflow
/// done): a record killed before that is started again by that workflow,
/// not recovered.
pub fn admitted(record: &Value) -> bool {
    record["admittedRevision"].as_u64().is_some_and(|admitted| {
        admitted > 0 && Some(admitted) == record["pod"]["metadata"]["revision"].as_u64()
    })
}

/// The pod's containers meant to run run (per runc's state) in its live
/// namespace, which has the pod's address; otherwise what is missing.
pub fn running_locally(data_dir: &Path, record: &Value) -> Result<Running, String> {
    let name = pod_name(record);
    let netns = record["netns"]
        .as_str()
        .ok_or(format!("{name}: no netns recorded"))?;
    let namespace = std::fs::metadata(netns)
        .ok()
        .filter(|_| corral_runtime::oci::netns::exists(Path::new(netns)))
        .map(|meta| (meta.dev(), meta.ino()))
        .ok_or(format!("{name}: {netns} is no namespace"))?;
    let address = record["address"]
        .as_str()
        .ok_or(format!("{name}: no address in the record"))?;
    let wanted: Ipv6Addr = address
        .parse()
        .map_err(|_| format!("{name}: {address} is no IPv6 address"))?;
    let containers = record["containers"]
        .as_object()
        .filter(|containers| !containers.is_empty())
        .ok_or(format!("{name}: no container recorded"))?;
    let (mut runtime_ids, mut restarts) = (Vec::new(), Vec::new());
    for (container, entry) in containers {
        if entry["running"] != true {
            continue;
        }
        let runtime_id = entry["runtimeId"]
            .as_str()
            .ok_or(format!("{name}/{container}: no runtime id"))?;
        entry["pid"]
            .as_u64()
            .ok_or(format!("{name}/{container}: no pid recorded"))?;
        let pid = live_init(&data_dir.join("runc"), runtime_id)
            .map_err(|why| format!("{name}/{container}: {runtime_id} {why}"))?;
        let inside = std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .map(|meta| (meta.dev(), meta.ino()))
            .map_err(|e| format!("{name}/{container}: its init's namespace: {e}"))?;
        if inside != namespace {
            return Err(format!(
                "{name}/{container}: its init is not in the namespace pinned at {netns}"
            ));
        }
        runtime_ids.push((container.clone(), runtime_id.to_string()));
        restarts.push(entry["restarts"].as_u64().unwrap_or(0));
        if !addresses(pid).contains(&wanted) {
            return Err(format!("{name}: {address} is not in its namespace"));
        }
    }
    if runtime_ids.is_empty() {
        return Err(format!("{name}: no container is meant to run"));
    }
    Ok(Running {
        pod: name.to_string(),
        runtime_ids,
        restarts,
        address: address.to_string(),
    })
}

/// The pid of container `id`'s init when runc would say `running`: its
/// state names a process alive with the recorded start time (not a pid
/// reused), and `runc start` has run (no `exec.fifo` left).
fn live_init(root: &Path, id: &str) -> Result<u32, &'static str> {
    let dir = root.join(id);
    let state: Value = std::fs::read(dir.join("state.json"))
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok())
        .ok_or("has no runc state")?;
    let pid = state["init_process_pid"]
        .as_u64()
        .and_then(|pid| u32::try_from(pid).ok())
        .filter(|pid| *pid > 0)
        .ok_or("has no init pid")?;
    let started = state["init_process_start"].as_u64();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|_| "is stopped")?;
    // Field 22 (starttime), counted after the command's closing `)`, which
    // is field 2; field 3 (state) says whether it is a zombie.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    if fields.first() == Some(&"Z") {
        return Err("is stopped (a zombie)");
    }
    if fields.get(19).and_then(|t| t.parse::<u64>().ok()) != started {
        return Err("is stopped (its pid belongs to another process)");
    }
    if dir.join("exec.fifo").exists() {
        return Err("is created, not started");
    }
    Ok(pid)
}

/// The IPv6 addresses of the network namespace `pid` is in.
fn addresses(pid: u32) -> BTreeSet<Ipv6Addr> {
    std::fs::read_to_string(format!("/proc/{pid}/net/if_inet6"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|hex| u128::from_str_radix(hex, 16).ok())
        .map(Ipv6Addr::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_without_a_namespace_is_not_running() {
        let record = serde_json::json!({
            "pod": {"metadata": {"name": "web"}},
            "containers": {},
        });
        let missing = running_locally(Path::new("/nonexistent"), &record).unwrap_err();
        assert_eq!(missing, "web: no netns recorded");
    }

    #[test]
    fn this_process_has_loopback_addresses_or_none() {
        let own = addresses(std::process::id());
        assert!(
            own.is_empty() || own.contains(&Ipv6Addr::LOCALHOST),
            "{own:?}"
        );
    }

    #[test]
    fn the_current_record_is_the_last_whole_line_or_the_whole_file() {
        let first = br#"{"pod": {"metadata": {"name": "web"}}, "admittedRevision": 1}"#;
        let second = br#"{"pod": {"metadata": {"name": "web"}}, "admittedRevision": 2}"#;
        let appended = [&first[..], b"\n", second, b"\n", br#"{"pod": {"#].concat();
        assert_eq!(current_record(&appended).unwrap()["admittedRevision"], 2);
        let pretty = b"{\n  \"pod\": {},\n  \"admittedRevision\": 3\n}";
        assert_eq!(current_record(pretty).unwrap()["admittedRevision"], 3);
        assert!(current_record(b"{\n").is_err());
    }
}
