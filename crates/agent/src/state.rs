//! The agent's local state: everything it needs to run its pods with the
//! control plane gone, even across its own restart. One JSON file per pod
//! under `DATA/agent/pods/`, written atomically (temporary file, fsync,
//! rename, fsync of the directory).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use corral_api::kinds::ContainerExit;
use corral_api::{Object, ObjectKey};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("local state file {path} is corrupt")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// What the agent remembers of one pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    /// The pod as last seen; its spec is the one the node runs once
    /// `admitted_revision` equals its revision.
    pub pod: Object,
    /// The spec revision this node runs; 0 before the first start.
    #[serde(default)]
    pub admitted_revision: u64,
    /// The container images of the last few revisions (newest last): image
    /// retention keeps them so a rollback starts without a registry.
    #[serde(default)]
    pub recent_images: Vec<Vec<String>>,
    #[serde(default)]
    pub containers: BTreeMap<String, ContainerRecord>,
    /// Images pulled for a revision not yet admitted (kept from GC), as
    /// agents before [`crate::images::Pulls`] recorded them: read, no
    /// longer written (cleared when the pod admits a revision).
    #[serde(default)]
    pub pulling: Vec<String>,
    /// The last generation started per container name, kept when a
    /// container is stopped so its next runtime id is new.
    #[serde(default)]
    pub generations: BTreeMap<String, u64>,
    /// The pod's network namespace, once created.
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// The pod's IPv4 egress address (node-local, never in the API).
    #[serde(default)]
    pub egress_ipv4: Option<std::net::Ipv4Addr>,
    /// The pod's IPv6 address as wired (`status.address`, kept so the pod
    /// is wired again from local state alone after a reboot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<std::net::Ipv6Addr>,
    /// A recovery of the pod after its sandbox was found stale (a reboot),
    /// kept until the API has it (`corral why` shows it as the `recover`
    /// workflow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<crate::recovery::RecoveryReport>,
}

/// One container of a pod as the agent last ran it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecord {
    /// The runtime's container id; changes on every (re)start.
    pub runtime_id: String,
    /// Hash of everything the container was started from; a different hash
    /// in a new revision means the container must restart.
    pub config_hash: String,
    /// Incremented on every start, part of the runtime id.
    pub generation: u64,
    pub started_at: Option<DateTime<Utc>>,
    /// Restarts after exits (not counting restarts for a new revision).
    pub restarts: u32,
    pub exit_code: Option<i32>,
    /// The init process's pid while running.
    pub pid: Option<u32>,
    /// Whether the container is meant to run (false once it exited for good).
    pub running: bool,
    #[serde(default)]
    pub ready: bool,
    /// When the container may be started again after an exit (backoff).
    #[serde(default)]
    pub restart_after: Option<DateTime<Utc>>,
    /// Its last exit, kept across restarts (for `status` and `why`).
    #[serde(default)]
    pub last_exit: Option<ContainerExit>,
    /// Why the node stopped it, set just before it does (the liveness
    /// probe's error); becomes the exit's cause.
    #[serde(default)]
    pub stop_cause: Option<String>,
    /// Why the last attempt to start it again failed.
    #[serde(default)]
    pub start_error: Option<String>,
    /// The readiness probe's error while it keeps the container unready.
    #[serde(default)]
    pub readiness_error: Option<String>,
    /// Why the node restarted it in place though it was running: an env
    /// value it takes from a Secret or Config changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_restart: Option<String>,
}

/// The directory of pod records.
#[derive(Debug, Clone)]
pub struct LocalState {
    dir: PathBuf,
}

fn file_name(key: &ObjectKey) -> String {
    format!("{}_{}.json", key.namespace, key.name)
}

impl LocalState {
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StateError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| StateError::Io {
            action: "create",
            path: dir.clone(),
            source,
        })?;
        Ok(LocalState { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every pod record, sorted by key.
    pub fn load_all(&self) -> Result<Vec<PodRecord>, StateError> {
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
            let text = fs::read_to_string(&path).map_err(|source| StateError::Io {
                action: "read",
                path: path.clone(),
                source,
            })?;
            let record: PodRecord = serde_json::from_str(&text)
                .map_err(|source| StateError::Corrupt { path, source })?;
            records.push(record);
        }
        records.sort_by_key(|r| r.pod.key());
        Ok(records)
    }

    /// Writes a record durably before returning.
    pub fn save(&self, record: &PodRecord) -> Result<(), StateError> {
        let path = self.dir.join(file_name(&record.pod.key()));
        let text = serde_json::to_vec_pretty(record).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        write_atomically(&path, &text)
    }

    /// Forgets the pod at `key` if the record there is still the one with
    /// `uid` (a pod recreated under the same name keeps its new record).
    pub fn remove_if_uid(&self, key: &ObjectKey, uid: &str) -> Result<(), StateError> {
        let path = self.dir.join(file_name(key));
        let current_uid = fs::read_to_string(&path)
            .ok()
            .and_then(|text| serde_json::from_str::<PodRecord>(&text).ok())
            .map(|record| record.pod.metadata.uid);
        match current_uid {
            Some(current) if current != uid => Ok(()),
            _ => self.remove(key),
        }
    }

    pub fn remove(&self, key: &ObjectKey) -> Result<(), StateError> {
        let path = self.dir.join(file_name(key));
        match fs::remove_file(&path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(StateError::Io {
                action: "remove",
                path,
                source: error,
            }),
            _ => Ok(()),
        }
    }
}

/// Writes `bytes` to `path` durably: a temporary file, fsync, rename,
/// fsync of the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let temporary = path.with_extension("tmp");
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| StateError::Io {
            action,
            path,
            source,
        }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut file = fs::File::create(&temporary).map_err(io("create", &temporary))?;
    file.write_all(bytes).map_err(io("write", &temporary))?;
    file.sync_all().map_err(io("fsync", &temporary))?;
    fs::rename(&temporary, path).map_err(io("rename", path))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let state = LocalState::open(dir.path()).unwrap();
        let pod = Object::new(
            corral_api::Kind::Pod,
            Some("a"),
            "web",
            serde_json::json!({}),
        );
        let mut record = PodRecord {
            pod,
            admitted_revision: 1,
            recent_images: vec![vec!["busybox".into()]],
            pulling: Vec::new(),
            containers: BTreeMap::new(),
            generations: BTreeMap::new(),
            netns: None,
            egress_ipv4: None,
            address: None,
            recovery: None,
        };
        record.containers.insert(
            "web".into(),
            ContainerRecord {
                runtime_id: "x-web-1".into(),
                config_hash: "h".into(),
                generation: 1,
                started_at: None,
                restarts: 2,
                exit_code: Some(1),
                pid: None,
                running: true,
                ready: false,
                restart_after: None,
                last_exit: None,
                stop_cause: None,
                start_error: None,
                readiness_error: None,
                data_restart: None,
            },
        );
        state.save(&record).unwrap();
        let reopened = LocalState::open(dir.path()).unwrap();
        assert_eq!(reopened.load_all().unwrap(), vec![record.clone()]);
        reopened.remove(&record.pod.key()).unwrap();
        reopened.remove(&record.pod.key()).unwrap();
        assert!(reopened.load_all().unwrap().is_empty());
    }
}
