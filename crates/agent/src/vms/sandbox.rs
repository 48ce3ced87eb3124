//! Each VM's QEMU confined ([`corral_runtime::vm::sandbox`]): its own host
//! uid and gid (the first id of an id range held as `vm:UID` in the
//! node's table, beside the pods', so no pod or other VM ever shares it;
//! kept in the VM's record), the VM's files and disks owned by it, its
//! cgroup with the spec's limits ([`super::cgroup`]), and the mounts its
//! private namespace holds. What was applied is the VM's
//! `status.sandbox`.

use std::path::{Path, PathBuf};

use corral_api::kinds::VmSandboxStatus;
use corral_runtime::vm::sandbox::{self, Mount, SECCOMP_OPTIONS, Sandbox};
use corral_runtime::vm::{VmConfig, process};

use super::cgroup::{self, Limits};
use super::workload::{VmWorkload, typed_spec};

/// The id-range holder name of the VM with `uid`.
pub fn range_holder(uid: &str) -> String {
    format!("vm:{uid}")
}

/// `DATA/agent/vm-root`: an empty directory each QEMU mounts its private
/// root on, inside its own mount namespace.
pub fn root_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("agent").join("vm-root")
}

/// `program` as `execvp` would find it on `PATH`.
fn resolve(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Gives `path` (and, for a directory, everything in it) to `id`.
fn own(path: &Path, id: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(id), Some(id))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            own(&entry?.path(), id)?;
        }
    }
    Ok(())
}

/// What `mounts` lets QEMU write.
fn writable(mounts: &[Mount]) -> Vec<String> {
    mounts
        .iter()
        .filter_map(|mount| match mount {
            Mount::Bind {
                path,
                writable: true,
            } => Some(path.display().to_string()),
            _ => None,
        })
        .collect()
}

/// A sentence on what QEMU's mount namespace holds.
fn describe(mounts: &[Mount]) -> String {
    let read_only: Vec<String> = mounts
        .iter()
        .filter_map(|mount| match mount {
            Mount::Bind {
                path,
                writable: false,
            } => Some(path.display().to_string()),
            _ => None,
        })
        .collect();
    let devices: Vec<&str> = mounts
        .iter()
        .filter_map(|mount| match mount {
            Mount::Device { name, .. } => Some(*name),
            _ => None,
        })
        .collect();
    format!(
        "private, over a read-only tmpfs root; read-only: {}; devices: {}; /proc; nothing else of the host",
        read_only.join(", "),
        devices.join(", ")
    )
}

impl VmWorkload {
    /// The VM's host uid (and gid), allocated once.
    fn host_id(&mut self) -> Result<u32, String> {
        let id = self
            .ctx
            .agent
            .id_ranges
            .allocate(&range_holder(&self.uid()))?;
        if self.record.host_id != Some(id) {
            self.record.host_id = Some(id);
            self.save();
        }
        Ok(id)
    }

    /// Confines the QEMU about to run `config`: sets it sandboxed, gives
    /// the VM's files to its uid, makes its cgroup, plans its mounts and
    /// records them as the VM's `status.sandbox`.
    pub(super) async fn confine(&mut self, config: &mut VmConfig) -> Result<Sandbox, String> {
        let spec = typed_spec(&self.desired).ok_or("the VM's spec does not decode")?;
        let id = self.host_id()?;
        config.sandboxed = true;
        let limits = Limits {
            memory_bytes: spec.memory.bytes,
            cpus: spec.cpus,
        };
        let (uid, dir) = (self.uid(), self.ctx.vm_dir(&self.uid()));
        let root = root_dir(&self.ctx.data_dir);
        let planned = config.clone();
        let (sandbox, cgroup) = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&root)
                .map_err(|e| format!("cannot make {}: {e}", root.display()))?;
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
            let disks: Vec<PathBuf> = planned
                .disk
                .iter()
                .chain(planned.data_disks.iter().map(|(_, path)| path))
                .cloned()
                .collect();
            let mut backing = Vec::new();
            for disk in &disks {
                own(disk, id)
                    .map_err(|e| format!("cannot give {} to uid {id}: {e}", disk.display()))?;
                backing.extend(process::backing_chain(disk).map_err(|e| crate::chain(&e))?);
            }
            own(&dir, id).map_err(|e| format!("cannot give {} to uid {id}: {e}", dir.display()))?;
            let cgroup = cgroup::ensure(Path::new(cgroup::CGROUP_ROOT), &uid, limits)
                .map_err(|e| crate::chain(&e))?;
            let qemu = resolve(super::QEMU).unwrap_or_else(|| PathBuf::from(super::QEMU));
            let mut mounts = sandbox::system_mounts(&qemu);
            mounts.extend(sandbox::plan(&planned, &backing));
            Ok::<_, String>((
                Sandbox {
                    uid: id,
                    gid: id,
                    root,
                    mounts,
                    cgroups: cgroup.procs.clone(),
                },
                cgroup,
            ))
        })
        .await
        .map_err(|e| e.to_string())??;
        self.record.sandbox = Some(VmSandboxStatus {
            uid: id,
            gid: id,
            capabilities: "none (bounding, inheritable and ambient sets empty); no_new_privs"
                .into(),
            seccomp: format!("QEMU -sandbox {SECCOMP_OPTIONS}"),
            mount_namespace: describe(&sandbox.mounts),
            writable: writable(&sandbox.mounts),
            cgroup: cgroup.path,
            memory_limit_bytes: cgroup.limits.memory_limit(),
            cpu_limit: format!(
                "{} CPU ({} µs per 100000 µs)",
                spec.cpus.max(1),
                cgroup.limits.cpu_quota_us()
            ),
        });
        Ok(sandbox)
    }

    /// Starts QEMU with `config`, confined ([`super::sandbox`]); its pid
    /// and the console log's length before it (where its output begins).
    pub(super) async fn spawn_qemu(&mut self, mut config: VmConfig) -> Result<(u32, u64), String> {
        let sandbox = self.confine(&mut config).await?;
        self.save();
        let output = self.ctx.vm_dir(&self.uid()).join("qemu.log");
        let netns = self.record.netns.clone();
        let offset = std::fs::metadata(&config.console_log).map_or(0, |m| m.len());
        let pid = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(output.parent().unwrap_or(&output))
                .map_err(|e| e.to_string())?;
            process::start_sandboxed(
                std::path::Path::new(super::QEMU),
                &config,
                netns.as_deref(),
                &output,
                &sandbox,
            )
            .map_err(|e| crate::chain(&e))
        })
        .await
        .map_err(|e| e.to_string())??;
        Ok((pid, offset))
    }

    /// Gives a socket the agent made for QEMU (a migration's) to the VM's
    /// uid, so QEMU may connect to it.
    pub(super) fn hand_to_qemu(&self, path: &Path) -> Result<(), String> {
        match self.record.host_id {
            Some(id) => std::os::unix::fs::chown(path, Some(id), Some(id))
                .map_err(|e| format!("cannot give {} to uid {id}: {e}", path.display())),
            None => Ok(()),
        }
    }

    /// Frees the VM's cgroup and host id once its QEMU is gone for good.
    pub(super) fn release_sandbox(&mut self) {
        cgroup::remove(Path::new(cgroup::CGROUP_ROOT), &self.uid());
        if let Err(error) = self.ctx.agent.id_ranges.release(&range_holder(&self.uid())) {
            tracing::warn!(vm = %self.key(), error = %crate::chain(&error), "cannot release the VM's host id");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_names_what_is_read_only_and_writable() {
        let mounts = vec![
            Mount::Bind {
                path: "/usr".into(),
                writable: false,
            },
            Mount::Bind {
                path: "/d/vms/u".into(),
                writable: true,
            },
            Mount::Device {
                name: "null",
                major: 1,
                minor: 3,
                owned: false,
            },
        ];
        assert_eq!(writable(&mounts), ["/d/vms/u"]);
        let text = describe(&mounts);
        assert!(text.contains("read-only: /usr;"), "{text}");
        assert!(text.contains("devices: null;"), "{text}");
        assert!(!text.contains("/d/vms/u"), "{text}");
    }
}
