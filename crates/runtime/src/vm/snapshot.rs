//! Snapshots inside a VM's qcow2 disk (QEMU's internal snapshots): while
//! QEMU runs they are taken, restored and deleted through its monitor
//! (`savevm`, `loadvm`, `delvm`: the disk *and* the guest's memory and
//! devices, so a restored guest resumes where it was); while it does not,
//! through `qemu-img snapshot` (the disk only). The list is the disk's
//! own table, read with `qemu-img info -U` (shared, so also while QEMU
//! holds the disk).

use std::path::Path;
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

use super::process::{VmError, run};
use super::qmp::{Monitor, QmpError};

/// One snapshot in a disk's table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotInfo {
    pub name: String,
    /// Bytes of saved machine state; 0 for a disk-only snapshot.
    #[serde(default)]
    pub vm_state_size: u64,
    /// When it was taken (seconds since the epoch).
    #[serde(default)]
    pub date_sec: i64,
}

impl SnapshotInfo {
    /// Whether it holds the guest's memory (restoring it resumes the guest).
    pub fn has_memory(&self) -> bool {
        self.vm_state_size > 0
    }
}

/// Why a snapshot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(
        "snapshot name {name:?} is not allowed: use letters, digits, '-', '_' and '.' (at most 64)"
    )]
    Name { name: String },
    #[error(transparent)]
    Monitor(#[from] QmpError),
    #[error(transparent)]
    Disk(#[from] VmError),
    #[error("cannot read the snapshot table of {disk}")]
    Table {
        disk: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A snapshot name safe on an HMP command line and in `qemu-img`.
pub fn check_name(name: &str) -> Result<(), SnapshotError> {
    let fine = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if fine {
        Ok(())
    } else {
        Err(SnapshotError::Name {
            name: name.to_string(),
        })
    }
}

/// Takes `name` of the running machine: disk, memory and devices.
pub fn save_running(monitor: &mut dyn Monitor, name: &str) -> Result<(), SnapshotError> {
    check_name(name)?;
    monitor.human(&format!("savevm {name}"))?;
    Ok(())
}

/// Returns the running machine to `name` (which must hold memory).
pub fn load_running(monitor: &mut dyn Monitor, name: &str) -> Result<(), SnapshotError> {
    check_name(name)?;
    monitor.human(&format!("loadvm {name}"))?;
    Ok(())
}

/// Deletes `name` from the running machine's disks.
pub fn delete_running(monitor: &mut dyn Monitor, name: &str) -> Result<(), SnapshotError> {
    check_name(name)?;
    monitor.human(&format!("delvm {name}"))?;
    Ok(())
}

/// What `qemu-img snapshot` does to a disk QEMU does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offline {
    Create,
    Apply,
    Delete,
}

/// `qemu-img snapshot -c|-a|-d NAME DISK`.
pub fn offline(disk: &Path, action: Offline, name: &str) -> Result<(), SnapshotError> {
    check_name(name)?;
    let flag = match action {
        Offline::Create => "-c",
        Offline::Apply => "-a",
        Offline::Delete => "-d",
    };
    run(Command::new("qemu-img")
        .args(["snapshot", "-q", flag, name])
        .arg(disk))?;
    Ok(())
}

/// The snapshot table of `disk` (`qemu-img info -U`: readable while QEMU
/// holds the disk).
pub fn list_offline(disk: &Path) -> Result<Vec<SnapshotInfo>, SnapshotError> {
    let output = run(Command::new("qemu-img")
        .args(["info", "-U", "--output=json"])
        .arg(disk))?;
    table(&output, &disk.display().to_string())
}

/// The `snapshots` of a `qemu-img info --output=json` answer.
fn table(json: &str, disk: &str) -> Result<Vec<SnapshotInfo>, SnapshotError> {
    let failed = |source| SnapshotError::Table {
        disk: disk.to_string(),
        source,
    };
    let info: Value = serde_json::from_str(json).map_err(failed)?;
    let snapshots = info
        .get("snapshots")
        .cloned()
        .unwrap_or(Value::Array(Vec::new()));
    serde_json::from_value(snapshots).map_err(failed)
}

#[cfg(test)]
mod tests;
