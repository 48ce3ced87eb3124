//! A VM's disks on the node: where its boot disk and its further disks
//! live (a `local` volume, or the VM's directory), and making them once —
//! an empty disk, an overlay over an image, or a clone — kept across
//! restarts.

use std::path::PathBuf;

use corral_api::kinds::VirtualMachineSpec;
use corral_runtime::vm::process;

use super::boot::{self, DISK_PATH};
use super::workload::{DEFAULT_DISK_BYTES, VmWorkload, typed_spec};

impl VmWorkload {
    /// The disk's host path and, for an image disk, its backing file.
    pub(super) async fn disk(
        &self,
        spec: &VirtualMachineSpec,
    ) -> Result<Option<(PathBuf, Option<PathBuf>)>, String> {
        let Some(disk) = &spec.disk else {
            return Ok(None);
        };
        if let Some(volume) = &disk.volume {
            return Ok(Some((
                self.ctx.volumes_dir.join(volume).join("disk.qcow2"),
                None,
            )));
        }
        if disk.clone.is_some() {
            // Made once by `ensure_disk` from the source VM's disk.
            return Ok(Some((
                self.ctx.vm_dir(&self.uid()).join("disk.qcow2"),
                None,
            )));
        }
        let Some(image) = disk.image.clone() else {
            return Err("spec.disk sets none of volume, image or clone".into());
        };
        let runner = self.ctx.agent.runner.clone();
        let backing =
            tokio::task::spawn_blocking(move || boot::artifact(&runner, &image, DISK_PATH))
                .await
                .map_err(|e| e.to_string())??;
        Ok(Some((
            self.ctx.vm_dir(&self.uid()).join("disk.qcow2"),
            Some(backing),
        )))
    }

    /// The VM's further disks, by name: in their `local` volume, else in
    /// the VM's directory.
    pub(super) fn data_disks(&self, spec: &VirtualMachineSpec) -> Vec<(String, PathBuf)> {
        spec.data_disks
            .iter()
            .map(|disk| {
                let path = match &disk.volume {
                    Some(volume) => self.ctx.volumes_dir.join(volume).join("disk.qcow2"),
                    None => self
                        .ctx
                        .vm_dir(&self.uid())
                        .join("disks")
                        .join(format!("{}.qcow2", disk.name)),
                };
                (disk.name.clone(), path)
            })
            .collect()
    }

    /// Creates the VM's disks unless they exist (kept across restarts).
    pub(super) async fn ensure_disk(&mut self) -> Result<Option<String>, String> {
        let spec = typed_spec(&self.desired).ok_or("the VM's spec does not decode")?;
        for ((_, path), disk) in self.data_disks(&spec).into_iter().zip(&spec.data_disks) {
            let size = disk.size.map_or(DEFAULT_DISK_BYTES, |m| m.bytes);
            tokio::task::spawn_blocking(move || process::create_disk(&path, size, None))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| crate::chain(&e))?;
        }
        let Some((path, backing)) = self.disk(&spec).await? else {
            return Ok(Some("no disk".into()));
        };
        let size = spec
            .disk
            .as_ref()
            .and_then(|d| d.size)
            .map_or(DEFAULT_DISK_BYTES, |m| m.bytes);
        let shown = path.display().to_string();
        if let Some(clone) = spec.disk.as_ref().and_then(|d| d.clone.as_ref())
            && !path.exists()
        {
            return self.make_clone(clone, &path, size).await.map(Some);
        }
        let created = tokio::task::spawn_blocking(move || {
            process::create_disk(&path, size, backing.as_deref())
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| crate::chain(&e))?;
        Ok(Some(format!(
            "{} {shown}",
            if created { "created" } else { "kept" }
        )))
    }
}
