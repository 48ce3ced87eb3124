//! What the node does to a running VM without a new QEMU: a revision that
//! changes only what [`VirtualMachineSpec::machine`] leaves out (snapshots,
//! a restore, a power action, the grace period) is applied in place by
//! `node/restart-vm`; any other change restarts QEMU (clean stop, start).
//!
//! - **Snapshots** are QEMU's internal snapshots in the VM's qcow2 disk:
//!   one newly listed is taken (`savevm`, with the guest's memory, while
//!   QEMU runs; `qemu-img snapshot -c`, the disk only, otherwise), one no
//!   longer listed is deleted.
//! - **A restore** (a newer `spec.restore.at`) returns the running guest to
//!   a snapshot with memory (`loadvm`: it resumes where it was), or stops
//!   QEMU, applies a disk-only snapshot and boots again.
//! - **Disk sizes**: a larger `disk.size` or `dataDisks[i].size` grows
//!   that disk (`block_resize` on its drive while QEMU runs, `qemu-img
//!   resize` otherwise); a smaller one fails (the API server refuses it
//!   before it gets here, [`corral_api::validate_update`]).
//! - **Power**: `reset` presses the reset button (`system_reset`), `restart`
//!   stops cleanly and starts again; `spec.running: false` stops the VM
//!   and keeps it, `true` starts it again ([`super::running`]).
//!
//! What QEMU reports is read here too: its run state (`query-status`) and
//! the disk's snapshot table, both shown in the VM's status.

use std::path::PathBuf;
use std::time::Duration;

use corral_api::kinds::{PowerAction, VirtualMachineSpec};
use corral_runtime::vm::qmp::{Monitor, QmpClient, RunState};
use corral_runtime::vm::snapshot::{self, Offline, SnapshotInfo};
use corral_runtime::vm::{DISK_ID, data_disk_id, process};
use serde_json::{Value, json};

use super::running::{RunChange, run_change};
use super::workload::{VmWorkload, typed_spec};

/// How long `savevm` / `loadvm` may take (the guest's memory is copied
/// under TCG).
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a status query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a request stamped `desired` is newer than the one done
/// (`admitted`): RFC 3339 times in UTC compare as text, and a rollback to
/// an older request does not repeat it.
fn newer(desired: Option<&str>, admitted: Option<&str>) -> bool {
    match (desired, admitted) {
        (Some(desired), Some(admitted)) => desired > admitted,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// One thing done to the VM in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InPlace {
    /// Delete a snapshot no longer listed.
    Delete(String),
    /// Return to a snapshot.
    Restore(SnapshotInfo),
    /// Take a snapshot newly listed.
    Take(String),
    /// Grow a disk.
    Grow(Resize),
    Reset,
    Restart,
}

/// The disk's size in a spec (`None`: the default).
fn disk_size(spec: &VirtualMachineSpec) -> Option<u64> {
    spec.disk
        .as_ref()
        .and_then(|d| d.size)
        .map(|size| size.bytes)
}

/// A disk whose size a revision changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resize {
    /// QEMU's `-drive id` for it.
    pub drive: String,
    /// The spec's field, for messages.
    pub field: String,
    /// Where it is in `VirtualMachineSpec::data_disks` (`None`: `disk`).
    pub data_disk: Option<usize>,
    /// The size the desired revision asks for.
    pub bytes: u64,
}

/// The disks whose size changes from `admitted` to `desired`: `disk` when
/// its `size` changed (only a changed spec size is looked at, so a `local`
/// volume made larger by an earlier VM is never touched), and each data
/// disk kept (same name and volume) whose size changed.
pub fn resizes(admitted: &VirtualMachineSpec, desired: &VirtualMachineSpec) -> Vec<Resize> {
    let mut found = Vec::new();
    if let Some(bytes) = disk_size(desired)
        && disk_size(admitted) != Some(bytes)
    {
        found.push(Resize {
            drive: DISK_ID.to_string(),
            field: "spec.disk.size".to_string(),
            data_disk: None,
            bytes,
        });
    }
    for (index, disk) in desired.data_disks.iter().enumerate() {
        let before = admitted
            .data_disks
            .iter()
            .find(|d| d.name == disk.name && d.volume == disk.volume);
        if before.is_some_and(|before| before.size_bytes() != disk.size_bytes()) {
            found.push(Resize {
                drive: data_disk_id(index),
                field: format!("spec.dataDisks[{index}].size"),
                data_disk: Some(index),
                bytes: disk.size_bytes(),
            });
        }
    }
    found
}

/// What a revision from `admitted` to `desired` does in place, in order,
/// given the disk's snapshot table and the size each resized disk has
/// now: deletions, the restore, new snapshots, growing disks, the power
/// action (none for a VM whose spec does not run it: there is no guest
/// to restart or reset, and the API refuses asking for one).
pub fn plan(
    admitted: &VirtualMachineSpec,
    desired: &VirtualMachineSpec,
    existing: &[SnapshotInfo],
    disk_bytes: &[(Resize, u64)],
) -> Result<Vec<InPlace>, String> {
    let listed = |name: &str| desired.snapshots.iter().any(|s| s.name == name);
    let mut steps: Vec<InPlace> = existing
        .iter()
        .filter(|s| !listed(&s.name))
        .map(|s| InPlace::Delete(s.name.clone()))
        .collect();
    let restore = desired.restore.as_ref().filter(|r| {
        newer(
            Some(&r.at),
            admitted.restore.as_ref().map(|a| a.at.as_str()),
        )
    });
    if let Some(restore) = restore {
        let info = existing
            .iter()
            .find(|s| s.name == restore.snapshot)
            .ok_or_else(|| format!("snapshot {} is not in the VM's disk", restore.snapshot))?;
        steps.push(InPlace::Restore(info.clone()));
    }
    steps.extend(
        desired
            .snapshots
            .iter()
            .filter(|wanted| !existing.iter().any(|s| s.name == wanted.name))
            .map(|wanted| InPlace::Take(wanted.name.clone())),
    );
    for (resize, actual) in disk_bytes {
        if resize.bytes < *actual {
            return Err(format!(
                "{} asks for {} bytes but the disk has {actual}: a disk only grows",
                resize.field, resize.bytes
            ));
        }
        if resize.bytes > *actual {
            steps.push(InPlace::Grow(resize.clone()));
        }
    }
    let power = desired
        .power
        .as_ref()
        .filter(|p| newer(Some(&p.at), admitted.power.as_ref().map(|a| a.at.as_str())))
        .filter(|_| desired.runs());
    if let Some(power) = power {
        steps.push(match power.action {
            PowerAction::Reset => InPlace::Reset,
            PowerAction::Restart => InPlace::Restart,
        });
    }
    Ok(steps)
}

impl VmWorkload {
    pub(super) fn qmp_socket(&self) -> PathBuf {
        self.ctx.vm_dir(&self.uid()).join("qmp.sock")
    }

    /// Runs `operation` against QEMU's monitor on a blocking thread.
    async fn with_monitor<T: Send + 'static>(
        &self,
        timeout: Duration,
        operation: impl FnOnce(&mut QmpClient) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let socket = self.qmp_socket();
        tokio::task::spawn_blocking(move || {
            let mut client = QmpClient::connect(&socket)
                .map_err(|e| crate::chain(&e))?
                .slow(timeout);
            operation(&mut client)
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// The VM's disk (snapshots live in it).
    async fn disk_path(&self, spec: &VirtualMachineSpec) -> Result<PathBuf, String> {
        self.disk(spec)
            .await?
            .map(|(path, _)| path)
            .ok_or_else(|| "the VM has no disk to keep snapshots in".to_string())
    }

    /// `node/restart-vm`: the desired revision, in place when only
    /// in-place fields changed, else with a new QEMU; a revision that
    /// stops the VM (`spec.running: false`) stops QEMU cleanly after the
    /// in-place changes (so a snapshot of it still holds the guest's
    /// memory) and keeps the VM ([`super::running`]). Returns a note.
    pub(super) async fn apply_revision(&mut self) -> Result<String, String> {
        let desired = typed_spec(&self.desired).ok_or("the VM's spec does not decode")?;
        let admitted = typed_spec(&self.record.vm);
        let qemu_runs = self.record.pid.is_some() && self.record.admitted_revision > 0;
        let change = run_change(qemu_runs, admitted.as_ref(), &desired);
        let mut notes = Vec::new();
        if matches!(change, RunChange::Start | RunChange::Template) {
            self.ensure_disk().await?;
            notes.push(self.start().await?);
        }
        let admitted = admitted.unwrap_or_else(|| desired.clone());
        notes.extend(self.apply_in_place(&admitted, &desired).await?);
        match change {
            RunChange::Stop => notes.push(self.stop_kept().await?),
            RunChange::StayStopped if notes.is_empty() => {
                notes.push(super::running::KEPT_STOPPED.to_string());
            }
            _ => {}
        }
        // The revision is now the admitted one even when nothing restarted.
        self.record.vm = self.desired.clone();
        self.record.admitted_revision = self.desired.metadata.revision;
        self.save();
        self.refresh_snapshots().await;
        if notes.is_empty() {
            notes.push("nothing to do in place".into());
        }
        Ok(notes.join("; "))
    }

    async fn apply_in_place(
        &mut self,
        admitted: &VirtualMachineSpec,
        desired: &VirtualMachineSpec,
    ) -> Result<Vec<String>, String> {
        let snapshots = !admitted.snapshots.is_empty() || !desired.snapshots.is_empty();
        let resized = resizes(admitted, desired);
        let disk = if snapshots || !resized.is_empty() {
            Some(self.disk_path(desired).await?)
        } else {
            None
        };
        let existing = match (&disk, snapshots) {
            (Some(disk), true) => self.snapshot_table(disk).await?,
            _ => Vec::new(),
        };
        let data_disks = self.data_disks(desired);
        let mut paths = std::collections::BTreeMap::new();
        let mut disk_bytes = Vec::new();
        for resize in resized {
            let path = match resize.data_disk {
                None => disk.clone().ok_or("the VM has no disk")?,
                Some(index) => data_disks
                    .get(index)
                    .map(|(_, path)| path.clone())
                    .ok_or_else(|| format!("{} names no disk", resize.field))?,
            };
            let probed = path.clone();
            let actual = tokio::task::spawn_blocking(move || process::disk_size(&probed))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| crate::chain(&e))?;
            paths.insert(resize.drive.clone(), path);
            disk_bytes.push((resize, actual));
        }
        let mut notes = Vec::new();
        for step in plan(admitted, desired, &existing, &disk_bytes)? {
            let disk = || disk.as_deref().ok_or("the VM has no disk");
            notes.push(match step {
                InPlace::Delete(name) => {
                    self.delete_snapshot(disk()?, &name).await?;
                    format!("snapshot {name} deleted")
                }
                InPlace::Restore(info) => self.restore_snapshot(disk()?, &info).await?,
                InPlace::Take(name) => self.take_snapshot(disk()?, &name).await?,
                InPlace::Grow(resize) => {
                    let path = paths.get(&resize.drive).ok_or("the VM has no such disk")?;
                    self.grow(path, &resize).await?
                }
                InPlace::Reset => {
                    self.with_monitor(QUERY_TIMEOUT * 5, |monitor| {
                        monitor.system_reset().map_err(|e| crate::chain(&e))
                    })
                    .await?;
                    self.awaiting_boot_again();
                    "reset".to_string()
                }
                InPlace::Restart => {
                    let stopped = self.stop().await?;
                    let started = self.start().await?;
                    format!("restarted: {stopped}; {started}")
                }
            });
        }
        Ok(notes)
    }

    /// The guest boots again in the same QEMU: the boot marker is awaited
    /// after the console's current end.
    fn awaiting_boot_again(&mut self) {
        let log = self.ctx.vm_dir(&self.uid()).join("console.log");
        self.record.console_offset = std::fs::metadata(log).map_or(0, |m| m.len());
        self.record.booted = false;
        self.save();
    }

    async fn snapshot_table(&self, disk: &std::path::Path) -> Result<Vec<SnapshotInfo>, String> {
        let disk = disk.to_path_buf();
        tokio::task::spawn_blocking(move || snapshot::list_offline(&disk))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| crate::chain(&e))
    }

    /// `qemu-img snapshot` on the VM's disk and its data disks (those of
    /// them that hold the snapshot, for an apply or a delete: a data disk
    /// added later has none).
    async fn offline(
        &self,
        disk: &std::path::Path,
        action: Offline,
        name: &str,
    ) -> Result<(), String> {
        let data_disks: Vec<PathBuf> = typed_spec(&self.desired)
            .map(|spec| {
                self.data_disks(&spec)
                    .into_iter()
                    .map(|(_, path)| path)
                    .collect()
            })
            .unwrap_or_default();
        let (disk, name) = (disk.to_path_buf(), name.to_string());
        tokio::task::spawn_blocking(move || {
            snapshot::offline(&disk, action, &name)?;
            for data in data_disks {
                let holds = action == Offline::Create
                    || snapshot::list_offline(&data)?
                        .iter()
                        .any(|s| s.name == name);
                if holds {
                    snapshot::offline(&data, action, &name)?;
                }
            }
            Ok::<_, snapshot::SnapshotError>(())
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| crate::chain(&e))
    }

    /// Grows one disk: through QEMU while it runs (the guest sees the new
    /// size at once), else the file. Returns a note naming the disk.
    async fn grow(&self, disk: &std::path::Path, resize: &Resize) -> Result<String, String> {
        let bytes = resize.bytes;
        let what = match resize.data_disk {
            None => "disk".to_string(),
            Some(_) => format!("disk {}", resize.drive),
        };
        if self.record.pid.is_none() {
            let disk = disk.to_path_buf();
            tokio::task::spawn_blocking(move || process::grow_disk(&disk, bytes))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| crate::chain(&e))?;
            return Ok(format!("{what} grown to {bytes} bytes"));
        }
        let drive = resize.drive.clone();
        self.with_monitor(QUERY_TIMEOUT * 5, move |monitor| {
            monitor
                .block_resize(&drive, bytes)
                .map_err(|e| crate::chain(&e))
        })
        .await?;
        Ok(format!(
            "{what} grown to {bytes} bytes while the guest runs"
        ))
    }

    async fn take_snapshot(&self, disk: &std::path::Path, name: &str) -> Result<String, String> {
        if self.record.pid.is_none() {
            self.offline(disk, Offline::Create, name).await?;
            return Ok(format!(
                "snapshot {name} taken (disk only: QEMU is not running)"
            ));
        }
        let owned = name.to_string();
        self.with_monitor(SNAPSHOT_TIMEOUT, move |monitor| {
            snapshot::save_running(monitor, &owned).map_err(|e| crate::chain(&e))
        })
        .await?;
        Ok(format!("snapshot {name} taken (disk and memory)"))
    }

    async fn delete_snapshot(&self, disk: &std::path::Path, name: &str) -> Result<(), String> {
        if self.record.pid.is_none() {
            return self.offline(disk, Offline::Delete, name).await;
        }
        let owned = name.to_string();
        self.with_monitor(SNAPSHOT_TIMEOUT, move |monitor| {
            snapshot::delete_running(monitor, &owned).map_err(|e| crate::chain(&e))
        })
        .await
    }

    async fn restore_snapshot(
        &mut self,
        disk: &std::path::Path,
        info: &SnapshotInfo,
    ) -> Result<String, String> {
        let name = info.name.clone();
        if self.record.pid.is_some() && info.has_memory() {
            self.with_monitor(SNAPSHOT_TIMEOUT, move |monitor| {
                snapshot::load_running(monitor, &name).map_err(|e| crate::chain(&e))
            })
            .await?;
            return Ok(format!(
                "restored snapshot {} (disk and memory): the guest resumes where it was",
                info.name
            ));
        }
        let was_running = self.record.pid.is_some();
        let stopped = self.stop().await?;
        self.offline(disk, Offline::Apply, &name).await?;
        let mut note = format!("restored snapshot {name} (disk only)");
        if was_running {
            note = format!("{note}: {stopped}; {}", self.start().await?);
        }
        Ok(note)
    }

    /// Reads the disk's snapshot table for the status (empty when there is
    /// no disk yet or it cannot be read: the next change reads it again).
    pub(super) async fn refresh_snapshots(&mut self) {
        let Some(spec) = typed_spec(&self.record.vm) else {
            return;
        };
        let disk = match self.disk_path(&spec).await {
            Ok(disk) if disk.exists() => disk,
            _ => {
                self.snapshots = Some(Vec::new());
                return;
            }
        };
        self.snapshots = Some(match self.snapshot_table(&disk).await {
            Ok(table) => table,
            Err(error) => {
                tracing::warn!(vm = %self.key(), %error, "cannot read the disk's snapshots");
                Vec::new()
            }
        });
    }

    /// Asks QEMU for its run state (`None` when it does not answer).
    pub(super) async fn query_run_state(&self) -> Option<RunState> {
        self.record.pid?;
        self.with_monitor(QUERY_TIMEOUT, |monitor| {
            monitor
                .query_status()
                .map(|status| status.status)
                .map_err(|e| crate::chain(&e))
        })
        .await
        .ok()
    }

    /// `status.snapshots`: the disk's table as the node last read it.
    pub(super) fn snapshots_status(&self) -> Value {
        let Some(table) = &self.snapshots else {
            return Value::Null;
        };
        Value::Array(
            table
                .iter()
                .map(|s| {
                    let taken = chrono::DateTime::from_timestamp(s.date_sec, 0)
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
                    json!({"name": s.name, "memory": s.has_memory(), "takenAt": taken})
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests;
