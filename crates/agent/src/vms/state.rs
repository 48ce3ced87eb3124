//! What the agent remembers of each VM it runs: one JSON file per VM under
//! `DATA/agent/vms/`, written atomically (temporary file, fsync, rename).

use std::collections::BTreeSet;
use std::fs;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use corral_api::{Object, ObjectKey};
use serde::{Deserialize, Serialize};

use crate::state::{LocalState, StateError};

/// One VM as this node runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmRecord {
    /// The VM as last admitted (its spec is the one QEMU runs).
    pub vm: Object,
    /// The revision QEMU runs; 0 before the first start.
    #[serde(default)]
    pub admitted_revision: u64,
    /// QEMU's pid while it runs.
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    /// The console log's length when QEMU last started: the boot marker
    /// is looked for after it.
    #[serde(default)]
    pub console_offset: u64,
    /// Whether the guest printed its boot marker since it last started.
    #[serde(default)]
    pub booted: bool,
    /// QEMU exits after which the agent started it again.
    #[serde(default)]
    pub restarts: u32,
    #[serde(default)]
    pub last_exit: Option<i32>,
    /// The VM's own network namespace, once created.
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// The guest was live-migrated to another node: QEMU here is not
    /// started again.
    #[serde(default)]
    pub migrated_away: bool,
    /// The guest's IPv4 egress address from the node-local range, once
    /// chosen (kept across restarts, so the guest keeps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_ipv4: Option<std::net::Ipv4Addr>,
    /// The host uid and gid QEMU runs as (its id range's first id), once
    /// allocated.
    #[serde(default)]
    pub host_id: Option<u32>,
    /// How QEMU was confined when it last started (`status.sandbox`).
    #[serde(default)]
    pub sandbox: Option<corral_api::kinds::VmSandboxStatus>,
}

impl VmRecord {
    pub fn new(vm: Object) -> Self {
        VmRecord {
            vm,
            admitted_revision: 0,
            pid: None,
            started_at: None,
            console_offset: 0,
            booted: false,
            restarts: 0,
            last_exit: None,
            netns: None,
            migrated_away: false,
            egress_ipv4: None,
            host_id: None,
            sandbox: None,
        }
    }
}

/// The IPv4 egress addresses the node's pods (`pods`) and VMs (`vms`)
/// hold, but `own`'s: what a new pod or VM must not take. A record that
/// cannot be read is an error, not "none taken": an address chosen past it
/// could be one a running pod or VM already has.
pub fn egress_addresses_taken(
    pods: &LocalState,
    vms: &VmState,
    own: &ObjectKey,
) -> Result<BTreeSet<Ipv4Addr>, StateError> {
    let pods = pods
        .neighbours()?
        .into_iter()
        .filter(|pod| pod.key != *own)
        .filter_map(|pod| pod.egress_ipv4);
    let vms = vms
        .load_all()?
        .into_iter()
        .filter(|record| record.vm.key() != *own)
        .filter_map(|record| record.egress_ipv4);
    Ok(pods.chain(vms).collect())
}

/// The VM records on disk.
#[derive(Debug, Clone)]
pub struct VmState {
    dir: PathBuf,
}

fn file_name(key: &ObjectKey) -> String {
    format!("{}_{}.json", key.namespace, key.name)
}

impl VmState {
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StateError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| StateError::Io {
            action: "create",
            path: dir.clone(),
            source,
        })?;
        Ok(VmState { dir })
    }

    pub fn load_all(&self) -> Result<Vec<VmRecord>, StateError> {
        let entries = fs::read_dir(&self.dir).map_err(|source| StateError::Io {
            action: "list",
            path: self.dir.clone(),
            source,
        })?;
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let bytes = fs::read(&path).map_err(|source| StateError::Io {
                action: "read",
                path: path.clone(),
                source,
            })?;
            let record = serde_json::from_slice(&bytes)
                .map_err(|source| StateError::Corrupt { path, source })?;
            records.push(record);
        }
        Ok(records)
    }

    /// Writes a record durably before returning (as pod records are).
    pub fn save(&self, record: &VmRecord) -> Result<(), StateError> {
        let path = self.dir.join(file_name(&record.vm.key()));
        let bytes = serde_json::to_vec_pretty(record).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        crate::state::write_atomically(&path, &bytes)
    }

    pub fn remove(&self, key: &ObjectKey) -> Result<(), StateError> {
        let path = self.dir.join(file_name(key));
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StateError::Io {
                action: "remove",
                path,
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::Kind;

    #[test]
    fn records_survive_reopening_and_removal_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let state = VmState::open(dir.path()).unwrap();
        let mut record = VmRecord::new(Object::new(
            Kind::VirtualMachine,
            Some("default"),
            "builder",
            serde_json::json!({}),
        ));
        record.pid = Some(42);
        state.save(&record).unwrap();
        let again = VmState::open(dir.path()).unwrap().load_all().unwrap();
        assert_eq!(again, vec![record.clone()]);
        state.remove(&record.vm.key()).unwrap();
        state.remove(&record.vm.key()).unwrap();
        assert!(state.load_all().unwrap().is_empty());
    }

    fn pod_record(name: &str, egress: [u8; 4]) -> crate::state::PodRecord {
        let mut record = crate::state::PodRecord::new(Object::new(
            Kind::Pod,
            Some("default"),
            name,
            serde_json::json!({}),
        ));
        record.egress_ipv4 = Some(Ipv4Addr::from(egress));
        record
    }

    #[test]
    fn egress_taken_is_every_pod_and_vm_but_the_asker_and_an_unreadable_record_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let pods = LocalState::open(dir.path().join("pods")).unwrap();
        let vms = VmState::open(dir.path().join("vms")).unwrap();
        let web = pod_record("web", [10, 0, 0, 2]);
        pods.save(&web).unwrap();
        pods.save(&pod_record("db", [10, 0, 0, 3])).unwrap();
        let mut vm = VmRecord::new(Object::new(
            Kind::VirtualMachine,
            Some("default"),
            "builder",
            serde_json::json!({}),
        ));
        vm.egress_ipv4 = Some(Ipv4Addr::new(10, 0, 0, 4));
        vms.save(&vm).unwrap();
        let taken = |own: &ObjectKey| egress_addresses_taken(&pods, &vms, own).unwrap();
        let all = |last: &[u8]| -> BTreeSet<Ipv4Addr> {
            last.iter().map(|l| Ipv4Addr::new(10, 0, 0, *l)).collect()
        };
        assert_eq!(taken(&web.pod.key()), all(&[3, 4]));
        assert_eq!(taken(&vm.vm.key()), all(&[2, 3]));
        // A VM and a pod of one name are two objects.
        let pod_named_builder = ObjectKey::new(Kind::Pod, Some("default"), "builder");
        assert_eq!(taken(&pod_named_builder), all(&[2, 3, 4]));

        // A VM record that does not parse: no address is chosen past it.
        let broken = dir.path().join("vms").join("default_broken.json");
        fs::write(&broken, b"{not json").unwrap();
        let error = egress_addresses_taken(&pods, &vms, &web.pod.key()).unwrap_err();
        assert!(error.to_string().contains("default_broken.json"), "{error}");
        fs::remove_file(&broken).unwrap();
        // Nor past a pod record that does not parse (read on first use).
        let fresh = LocalState::open(dir.path().join("pods")).unwrap();
        fs::write(
            dir.path().join("pods").join("default_cut.json"),
            b"{\"pod\":",
        )
        .unwrap();
        let error = egress_addresses_taken(&fresh, &vms, &web.pod.key()).unwrap_err();
        assert!(error.to_string().contains("default_cut.json"), "{error}");
    }
}
