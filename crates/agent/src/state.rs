//! The agent's local state: everything it needs to run its pods with the
//! control plane gone, even across its own restart. One file per pod under
//! `DATA/agent/pods/`, one JSON record per line, the last whole line
//! current (design 0049). A pod's first record is written atomically
//! (temporary file, fsync, rename, fsync of the directory); each later one
//! is appended and fdatasynced, and the file is written again whole, with
//! the newest record alone, once it passes [`FOLD_AT`] bytes.
//!
//! What a pod's neighbours on the node hold that a start or an update must
//! respect (their IPv4 egress addresses, their specs) is also kept in
//! memory ([`LocalState::neighbours`]): read from the files once, on first
//! use, then kept current by every save and removal, so a pod's start does
//! not read and parse every record file on the node.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use corral_api::kinds::{ContainerExit, PodSpec};
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

impl StateError {
    /// The failure of `action` on `path`, for `map_err`.
    pub fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Self + use<> {
        let path = path.to_path_buf();
        move |source| StateError::Io {
            action,
            path,
            source,
        }
    }

    /// JSON at `path` that does not fit, for `map_err`.
    pub fn corrupt(path: &Path) -> impl FnOnce(serde_json::Error) -> Self + use<> {
        let path = path.to_path_buf();
        move |source| StateError::Corrupt { path, source }
    }
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

impl PodRecord {
    /// A pod this node has not run yet: nothing admitted, nothing chosen.
    pub fn new(pod: Object) -> Self {
        PodRecord {
            pod,
            admitted_revision: 0,
            recent_images: Vec::new(),
            containers: BTreeMap::new(),
            pulling: Vec::new(),
            generations: BTreeMap::new(),
            netns: None,
            egress_ipv4: None,
            address: None,
            recovery: None,
        }
    }
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

/// What a pod on the node holds that its neighbours must respect, as its
/// record last saved it.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighbour {
    pub key: ObjectKey,
    /// Its IPv4 egress address, taken for it alone.
    pub egress_ipv4: Option<std::net::Ipv4Addr>,
    /// Its spec as last seen (`None` for one that does not parse).
    pub spec: Option<Arc<PodSpec>>,
}

impl Neighbour {
    fn of(record: &PodRecord) -> Self {
        Neighbour {
            key: record.pod.key(),
            egress_ipv4: record.egress_ipv4,
            spec: record.pod.typed_spec().ok().map(Arc::new),
        }
    }
}

/// The record files' neighbours by pod; `None` until first read.
type NeighbourIndex = Arc<Mutex<Option<BTreeMap<ObjectKey, Neighbour>>>>;

/// The directory of pod records.
///
/// Each pod's record is saved and removed by the one task that runs the
/// pod (never two saves of one pod at once), through this type only: the
/// in-memory neighbours stay what the files say.
#[derive(Debug, Clone)]
pub struct LocalState {
    dir: PathBuf,
    neighbours: NeighbourIndex,
}

fn file_name(key: &ObjectKey) -> String {
    format!("{}_{}.json", key.namespace, key.name)
}

impl LocalState {
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StateError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(StateError::io("create", &dir))?;
        Ok(LocalState {
            dir,
            neighbours: NeighbourIndex::default(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every pod record, sorted by key.
    pub fn load_all(&self) -> Result<Vec<PodRecord>, StateError> {
        let entries = fs::read_dir(&self.dir).map_err(StateError::io("list", &self.dir))?;
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let bytes = fs::read(&path).map_err(StateError::io("read", &path))?;
            records.push(parse_record(&path, &bytes)?);
        }
        records.sort_by_key(|r| r.pod.key());
        Ok(records)
    }

    /// Every pod's [`Neighbour`], sorted by key, from memory (the record
    /// files are read on the first call only). A caller leaves its own pod
    /// out by key.
    pub fn neighbours(&self) -> Result<Vec<Neighbour>, StateError> {
        let mut index = self.lock_neighbours();
        if index.is_none() {
            // Read under the lock: a save meanwhile waits to update what
            // this read found, so none is missed.
            let read = self
                .load_all()?
                .iter()
                .map(|record| (record.pod.key(), Neighbour::of(record)))
                .collect();
            *index = Some(read);
        }
        Ok(index
            .as_ref()
            .map(|pods| pods.values().cloned().collect())
            .unwrap_or_default())
    }

    fn lock_neighbours(&self) -> std::sync::MutexGuard<'_, Option<BTreeMap<ObjectKey, Neighbour>>> {
        self.neighbours
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes a record durably before returning.
    pub fn save(&self, record: &PodRecord) -> Result<(), StateError> {
        let path = self.dir.join(file_name(&record.pod.key()));
        let mut line = serde_json::to_vec(record).map_err(StateError::corrupt(&path))?;
        line.push(b'\n');
        append_record(&path, &line)?;
        if let Some(index) = self.lock_neighbours().as_mut() {
            index.insert(record.pod.key(), Neighbour::of(record));
        }
        Ok(())
    }

    /// The record of the pod at `key` (`None`: there is none), read from
    /// its one file.
    pub fn load(&self, key: &ObjectKey) -> Result<Option<PodRecord>, StateError> {
        let path = self.dir.join(file_name(key));
        match fs::read(&path) {
            Ok(bytes) => parse_record(&path, &bytes).map(Some),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(StateError::io("read", &path)(error)),
        }
    }

    /// Forgets the pod at `key` if the record there is still the one with
    /// `uid` (a pod recreated under the same name keeps its new record).
    pub fn remove_if_uid(&self, key: &ObjectKey, uid: &str) -> Result<(), StateError> {
        let path = self.dir.join(file_name(key));
        let current_uid = fs::read(&path)
            .ok()
            .and_then(|bytes| parse_record(&path, &bytes).ok())
            .map(|record| record.pod.metadata.uid);
        match current_uid {
            Some(current) if current != uid => Ok(()),
            _ => self.remove(key),
        }
    }

    pub fn remove(&self, key: &ObjectKey) -> Result<(), StateError> {
        let path = self.dir.join(file_name(key));
        match fs::remove_file(&path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                Err(StateError::io("remove", &path)(error))
            }
            _ => {
                if let Some(index) = self.lock_neighbours().as_mut() {
                    index.remove(key);
                }
                Ok(())
            }
        }
    }
}

/// A record file's size past which the next record is written whole.
pub const FOLD_AT: u64 = 16 * 1024;

/// Appends `line` (one record and its newline) to the record file at
/// `path` and fdatasyncs it. A file that is new, has grown past
/// [`FOLD_AT`], or does not end with a newline (a record a crash cut short,
/// or one file written whole before records were appended) is written
/// again whole with `line` alone, atomically.
fn append_record(path: &Path, line: &[u8]) -> Result<(), StateError> {
    let io = |action| StateError::io(action, path);
    let mut file = match OpenOptions::new().read(true).append(true).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return write_atomically(path, line);
        }
        Err(source) => return Err(io("open")(source)),
    };
    let len = file.metadata().map_err(io("stat"))?.len();
    let mut last = [0u8; 1];
    let clean = len > 0
        && file
            .read_exact_at(&mut last, len - 1)
            .is_ok_and(|()| last[0] == b'\n');
    if !clean || len + line.len() as u64 > FOLD_AT {
        return write_atomically(path, line);
    }
    file.write_all(line).map_err(io("append to"))?;
    file.sync_data().map_err(io("fdatasync"))
}

/// The current record of a record file: its last whole line (a last line
/// without its newline was cut short by a crash before it was
/// acknowledged), or the file as one JSON document (as records were
/// written before they were appended).
fn parse_record(path: &Path, bytes: &[u8]) -> Result<PodRecord, StateError> {
    let whole = bytes
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(&bytes[..0], |end| &bytes[..end]);
    let last = whole.rsplit(|b| *b == b'\n').next().unwrap_or_default();
    if let Ok(record) = serde_json::from_slice(last) {
        return Ok(record);
    }
    serde_json::from_slice(bytes).map_err(StateError::corrupt(path))
}

/// Writes `bytes` to `path` durably: a temporary file, fsync, rename,
/// fsync of the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let temporary = path.with_extension("tmp");
    let io = StateError::io;
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

    fn record() -> PodRecord {
        let pod = Object::new(
            corral_api::Kind::Pod,
            Some("a"),
            "web",
            serde_json::json!({}),
        );
        let mut record = PodRecord {
            admitted_revision: 1,
            recent_images: vec![vec!["busybox".into()]],
            ..PodRecord::new(pod)
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
        record
    }

    #[test]
    fn records_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let state = LocalState::open(dir.path()).unwrap();
        let record = record();
        state.save(&record).unwrap();
        let reopened = LocalState::open(dir.path()).unwrap();
        assert_eq!(reopened.load_all().unwrap(), vec![record.clone()]);
        reopened.remove(&record.pod.key()).unwrap();
        reopened.remove(&record.pod.key()).unwrap();
        assert!(reopened.load_all().unwrap().is_empty());
    }

    #[test]
    fn one_record_is_read_from_its_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let state = LocalState::open(dir.path()).unwrap();
        let mut record = record();
        assert_eq!(state.load(&record.pod.key()).unwrap(), None);
        state.save(&record).unwrap();
        record.admitted_revision = 2;
        state.save(&record).unwrap();
        assert_eq!(state.load(&record.pod.key()).unwrap(), Some(record.clone()));
        // Another pod's broken file is not read.
        std::fs::write(dir.path().join("a_other.json"), b"{not json").unwrap();
        assert_eq!(state.load(&record.pod.key()).unwrap(), Some(record.clone()));
        let other = ObjectKey::new(corral_api::Kind::Pod, Some("a"), "other");
        assert!(matches!(
            state.load(&other),
            Err(StateError::Corrupt { .. })
        ));
    }

    fn file_of(dir: &Path, record: &PodRecord) -> PathBuf {
        dir.join(file_name(&record.pod.key()))
    }

    #[test]
    fn later_records_are_appended_and_the_last_whole_line_is_current() {
        let dir = tempfile::tempdir().unwrap();
        let state = LocalState::open(dir.path()).unwrap();
        let mut record = record();
        state.save(&record).unwrap();
        record.admitted_revision = 2;
        state.save(&record).unwrap();
        let path = file_of(dir.path(), &record);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert_eq!(state.load_all().unwrap(), vec![record.clone()]);
        // An append a crash cut short was never acknowledged.
        let mut torn = text.clone().into_bytes();
        torn.extend_from_slice(b"{\"pod\": {\"kind\"");
        fs::write(&path, &torn).unwrap();
        assert_eq!(state.load_all().unwrap(), vec![record.clone()]);
        // The next save does not append to the torn line: it writes whole.
        record.admitted_revision = 3;
        state.save(&record).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 1);
        assert_eq!(state.load_all().unwrap(), vec![record.clone()]);
        // A whole last line that is not a record is corruption.
        fs::write(&path, b"{}\n").unwrap();
        assert!(matches!(state.load_all(), Err(StateError::Corrupt { .. })));
    }

    #[test]
    fn a_record_written_whole_before_appends_reads_and_is_folded_at_the_next_save() {
        let dir = tempfile::tempdir().unwrap();
        let state = LocalState::open(dir.path()).unwrap();
        let mut record = record();
        let path = file_of(dir.path(), &record);
        fs::write(&path, serde_json::to_vec_pretty(&record).unwrap()).unwrap();
        assert_eq!(state.load_all().unwrap(), vec![record.clone()]);
        record.admitted_revision = 5;
        state.save(&record).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 1);
        assert_eq!(state.load_all().unwrap(), vec![record.clone()]);
        state
            .remove_if_uid(&record.pod.key(), "another uid")
            .unwrap();
        assert!(path.exists(), "a record of another uid stays");
        state
            .remove_if_uid(&record.pod.key(), &record.pod.metadata.uid)
            .unwrap();
        assert!(!path.exists());
    }

    fn pod_named(name: &str, egress: Option<[u8; 4]>) -> PodRecord {
        let mut record = record();
        record.pod = Object::new(
            corral_api::Kind::Pod,
            Some("a"),
            name,
            serde_json::json!({"containers": [{"name": "c", "image": "busybox"}]}),
        );
        record.egress_ipv4 = egress.map(std::net::Ipv4Addr::from);
        record
    }

    fn egress_of(state: &LocalState) -> Vec<(String, Option<std::net::Ipv4Addr>)> {
        state
            .neighbours()
            .unwrap()
            .into_iter()
            .map(|pod| (pod.key.name, pod.egress_ipv4))
            .collect()
    }

    #[test]
    fn neighbours_are_read_once_then_follow_every_save_and_removal() {
        let dir = tempfile::tempdir().unwrap();
        let before = LocalState::open(dir.path()).unwrap();
        let one = pod_named("one", Some([10, 0, 0, 2]));
        before.save(&one).unwrap();
        // Another agent's records, found on the first call.
        let state = LocalState::open(dir.path()).unwrap();
        assert_eq!(
            egress_of(&state),
            [("one".into(), Some([10, 0, 0, 2].into()))]
        );
        let neighbour = &state.neighbours().unwrap()[0];
        assert_eq!(
            neighbour
                .spec
                .as_deref()
                .map(|spec| spec.containers[0].image.as_str()),
            Some("busybox")
        );
        // Saved and removed through the state: in memory at once.
        let mut two = pod_named("two", None);
        state.save(&two).unwrap();
        two.egress_ipv4 = Some([10, 0, 0, 3].into());
        state.save(&two).unwrap();
        assert_eq!(
            egress_of(&state),
            [
                ("one".into(), Some([10, 0, 0, 2].into())),
                ("two".into(), Some([10, 0, 0, 3].into()))
            ]
        );
        state.remove_if_uid(&one.pod.key(), "another uid").unwrap();
        assert_eq!(egress_of(&state).len(), 2, "a record of another uid stays");
        state
            .remove_if_uid(&one.pod.key(), &one.pod.metadata.uid)
            .unwrap();
        assert_eq!(
            egress_of(&state),
            [("two".into(), Some([10, 0, 0, 3].into()))]
        );
        // The files are not read again: a record written past the state is
        // not seen (the agent writes every record through it).
        before.save(&pod_named("three", None)).unwrap();
        assert_eq!(egress_of(&state).len(), 1);
        assert_eq!(state.load_all().unwrap().len(), 2);
        // A clone shares what it knows.
        let clone = state.clone();
        clone.remove(&two.pod.key()).unwrap();
        assert!(egress_of(&state).is_empty());
    }

    #[test]
    fn a_record_file_past_its_size_is_written_whole_again() {
        let dir = tempfile::tempdir().unwrap();
        let state = LocalState::open(dir.path()).unwrap();
        let mut record = record();
        let path = file_of(dir.path(), &record);
        // Revisions of two digits: every line is as long.
        record.admitted_revision = 10;
        let line = serde_json::to_vec(&record).unwrap().len() as u64 + 1;
        let fits = FOLD_AT / line;
        assert!(fits > 2 && 10 + fits < 100, "{fits} lines fit");
        for revision in 10..10 + fits {
            record.admitted_revision = revision;
            state.save(&record).unwrap();
        }
        let lines = fs::read_to_string(&path).unwrap().lines().count() as u64;
        assert_eq!(lines, fits);
        record.admitted_revision = 10 + fits;
        state.save(&record).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 1);
        assert_eq!(state.load_all().unwrap(), vec![record]);
    }
}
